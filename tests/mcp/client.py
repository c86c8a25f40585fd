"""Drives examples/mcp_orders with the official Python MCP SDK.

    python client.py stdio|http EXAMPLE

The store comes from the environment (IDEM_STORE and friends, passed to
every server this script starts). IDEM_TEST_STORE_DOWN / IDEM_TEST_STORE_UP,
when set, are shell commands that stop and start the store. Every check is
an assert; the last line is "N passed, 0 failed".
"""

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import asynccontextmanager

import httpx2
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

MODE, EXAMPLE = sys.argv[1], sys.argv[2]
PASSED = []


def check(name):
    PASSED.append(name)
    print(f"ok {name}", file=sys.stderr, flush=True)


def key():
    return "k-" + uuid.uuid4().hex


def order(amount=5, **extra):
    return {"amount": amount, "currency": "EUR", **extra}


class Server:
    """One example process: stdio (spawned by the SDK through a shell that
    writes its pid) or HTTP (spawned here)."""

    def __init__(self, owner="alice"):
        self.owner = owner
        self.errlog = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        self.pidfile = self.errlog.name + ".pid"
        self.proc = None
        self.url = None
        if MODE == "http":
            env = dict(os.environ, IDEM_MCP_ADDR="127.0.0.1:0")
            self.proc = subprocess.Popen(
                [EXAMPLE], env=env, stdout=subprocess.PIPE, stderr=self.errlog, text=True
            )
            line = self.proc.stdout.readline()
            assert line.startswith("listening on http://"), line
            self.url = line.split()[-1]
            assert self.url.endswith("/mcp"), self.url

    @asynccontextmanager
    async def session(self, token=None):
        token = token or self.owner
        if MODE == "stdio":
            cmd = f'echo $$ > "{self.pidfile}"; exec "{EXAMPLE}"'
            env = dict(os.environ, IDEM_MCP_OWNER=token)
            params = StdioServerParameters(command="/bin/sh", args=["-c", cmd], env=env)
            async with stdio_client(params, errlog=self.errlog) as (r, w):
                async with ClientSession(r, w) as s:
                    await s.initialize()
                    yield s
        else:
            headers = {"Authorization": f"Bearer {token}"}
            async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
                async with streamable_http_client(self.url, http_client=http) as (r, w):
                    async with ClientSession(r, w) as s:
                        await s.initialize()
                        yield s

    def pid(self):
        if self.proc is not None:
            return self.proc.pid
        with open(self.pidfile) as f:
            return int(f.read().strip())

    def kill(self):
        os.kill(self.pid(), signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()

    async def wait_for(self, line, count):
        """Until the server's stderr holds `line` `count` times (20 s at most)."""
        deadline = time.monotonic() + 20
        while self.log().count(line) < count:
            assert time.monotonic() < deadline, self.log()
            await asyncio.sleep(0.02)

    def log(self):
        with open(self.errlog.name) as f:
            return f.read()

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


async def call(s, tool, args, meta=None):
    """The result, or the MCPError."""
    try:
        return await s.call_tool(tool, args, meta=meta)
    except MCPError as e:
        return e


def replayed(r):
    return bool((r.meta or {}).get("idempotentReplayed"))


async def executions(s):
    r = await s.call_tool("stats", {})
    return r.structured_content["executions"]


def code(e):
    assert isinstance(e, MCPError), e
    return e.error.data["code"]


async def answers(server):
    async with server.session() as s:
        cap = s.server_capabilities.experimental["idempotency"]
        assert cap["keyLocations"] == ["_meta.idempotencyKey", "arguments.idempotency_key"], cap
        assert cap["responseTtlMs"] > 0 and cap["keyTtlMs"] > 0, cap
        check("capability")

        k = key()
        first = await call(s, "create_order", order(), {"idempotencyKey": k})
        sc = first.structured_content
        assert sc["id"].startswith("ord_") and sc["amount"] == 5 and sc["currency"] == "EUR", sc
        assert isinstance(sc["created_at_ms"], int) and not replayed(first), first
        again = await call(s, "create_order", order(), {"idempotencyKey": k})
        assert replayed(again) and again.structured_content == sc, again
        assert again.content == first.content and again.is_error == first.is_error
        assert await executions(s) == 1
        check("first call, replay with the marker (key in _meta)")

        ka = key()
        a1 = await call(s, "create_order", order(idempotency_key=ka))
        a2 = await call(s, "create_order", order(idempotency_key=ka))
        assert not replayed(a1) and replayed(a2), (a1, a2)
        assert a1.structured_content == a2.structured_content
        both = await call(s, "create_order", order(idempotency_key=key()), {"idempotencyKey": k})
        assert replayed(both) and both.structured_content == sc, "_meta wins"
        assert await executions(s) == 2
        check("key as argument; _meta wins")

        m = await call(s, "create_order", order(9), {"idempotencyKey": k})
        assert code(m) == "fingerprint_mismatch", m
        assert await executions(s) == 2
        check("mismatch")

        for bad in ["", "x" * 256, "caf\u00e9", 42]:
            e = await call(s, "create_order", order(), {"idempotencyKey": bad})
            assert code(e) == "invalid_key", (bad, e)
        assert await executions(s) == 2
        check("malformed keys")

        kf = key()
        working = server.log().count("slow: working")
        slow = asyncio.create_task(call(s, "create_order", order(note="slow"), {"idempotencyKey": kf}))
        await server.wait_for("slow: working", working + 1)
        busy = await call(s, "create_order", order(note="slow"), {"idempotencyKey": kf})
        assert code(busy) == "in_flight" and busy.error.data["retryAfterMs"] > 0, busy
        done = await slow
        assert not replayed(done), done
        assert await executions(s) == 3
        check("in flight")

        kt = key()
        for _ in range(2):
            t = await call(s, "create_order", order(13), {"idempotencyKey": kt})
            assert t.is_error and not replayed(t), t
            assert t.structured_content == {"error": "provider_unavailable"}, t
            assert "provider_unavailable" in t.content[0].text
        assert await executions(s) == 5
        check("transient release")

        kp = key()
        p1 = await call(s, "create_order", order(7), {"idempotencyKey": kp})
        p2 = await call(s, "create_order", order(7), {"idempotencyKey": kp})
        assert p1.is_error and p1.structured_content == {"error": "insufficient_funds"}, p1
        assert "insufficient_funds" in p1.content[0].text
        assert p2.is_error and replayed(p2) and p2.structured_content == p1.structured_content
        assert await executions(s) == 6
        check("permanent replay")

        n1 = await call(s, "create_order", order())
        n2 = await call(s, "create_order", order())
        assert n1.structured_content["id"] != n2.structured_content["id"]
        assert await executions(s) == 8
        st = await call(s, "stats", {"idempotency_key": k}, {"idempotencyKey": k})
        assert not replayed(st) and st.structured_content == {"executions": 8}, st
        check("no key runs each time; stats is never keyed")
    return k, sc


async def two_owners(server, k, sc):
    if MODE == "http":
        async with server.session(token="bob") as s:
            b = await call(s, "create_order", order(), {"idempotencyKey": k})
            assert not replayed(b) and b.structured_content["id"] != sc["id"], b
            assert await executions(s) == 9
    else:
        bob = Server(owner="bob")
        async with bob.session() as s:
            b = await call(s, "create_order", order(), {"idempotencyKey": k})
            assert not replayed(b) and b.structured_content["id"] != sc["id"], b
            assert await executions(s) == 1
    check("two owners, one key: two executions")


async def unauthorized(server):
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "create_order", "arguments": order()}}
    headers = {"Accept": "application/json, text/event-stream"}
    for auth in [None, "Basic YWxpY2U6eA==", "Bearer", "Token alice"]:
        h = dict(headers)
        if auth is not None:
            h["Authorization"] = auth
        # A connection per request: a server may close one whose request
        # body it answered without reading.
        async with httpx2.AsyncClient(timeout=10) as http:
            r = await http.post(server.url, json=body, headers=h)
        assert r.status_code == 401, (auth, r.status_code, r.text)
    async with server.session() as s:
        assert await executions(s) == 9
    check("401 without a bearer token; nothing ran")


async def killed_between_work_and_answer():
    server = Server()
    kk = key()
    try:
        async with server.session() as s:
            pending = asyncio.create_task(call(s, "create_order", order(note="slow"), {"idempotencyKey": kk}))
            await server.wait_for("slow: outcome stored", 1)
            server.kill()
            try:
                lost = await asyncio.wait_for(pending, 20)
            except BaseException as e:  # the connection died under the call
                lost = e
            assert not hasattr(lost, "structured_content"), f"the answer was lost: {lost!r}"
    except BaseException as e:
        if not isinstance(e, (Exception, BaseExceptionGroup)):
            raise
    server.stop()
    again = Server()
    try:
        async with again.session() as s:
            r = await call(s, "create_order", order(note="slow"), {"idempotencyKey": kk})
            assert replayed(r) and r.structured_content["id"].startswith("ord_"), r
            assert await executions(s) == 0, "nothing ran in the new process"
    finally:
        again.stop()
    check("killed between the work and the answer: the retry replays")


async def store_down(server):
    down, up = os.environ.get("IDEM_TEST_STORE_DOWN"), os.environ.get("IDEM_TEST_STORE_UP")
    if not down:
        return
    async with server.session() as s:
        before = await executions(s)
        subprocess.run(down, shell=True, check=True)
        try:
            e = await call(s, "create_order", order(), {"idempotencyKey": key()})
            assert code(e) == "store_unavailable" and e.error.data["retryAfterMs"] > 0, e
            assert await executions(s) == before
        finally:
            subprocess.run(up, shell=True, check=True)
    check("store down: store_unavailable, nothing ran")


async def main():
    server = Server()
    try:
        k, sc = await answers(server)
        await two_owners(server, k, sc)
        if MODE == "http":
            await unauthorized(server)
        await store_down(server)
    finally:
        server.stop()
    await killed_between_work_and_answer()
    print(f"{len(PASSED)} passed, 0 failed")


asyncio.run(main())
