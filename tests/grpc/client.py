"""A gRPC client of examples/grpc_orders.rs that is not tonic (grpcio).

Usage: client.py ADDR PROTO_DIR

It compiles PROTO_DIR/orders.proto with grpcio-tools, connects to ADDR, then
reads one JSON command per line on stdin and answers each with one JSON line
on stdout:

  {"op": "call", "account": ..., "keys": [...], "amount": N, "note": ...,
   "currency": ..., "timeout_ms": N}                 -> the call's result
  {"op": "start", "tag": T, ...same fields...}       -> {"started": T}
  {"op": "join", "tag": T}                           -> the started call's result
  {"op": "stats"}                                    -> the result of GetStats
  {"op": "stats", "keys": [...]}                     -> the same, with key metadata

A result: {"code": "OK" | the status code's name, "details": message,
"reason"/"domain": the google.rpc.ErrorInfo sent in grpc-status-details-bin,
"retry_delay_ms": its RetryInfo, "replayed": "initial" | "trailing" | null
(where idempotent-replayed: true came), "resource_id": the
idempotency-resource-id metadata, "order"/"stats": the message}.
"""

import json
import os
import sys
import tempfile

import grpc
from google.protobuf import json_format
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from grpc_tools import protoc


def compile_proto(proto_dir):
    out = tempfile.mkdtemp(prefix="idem-grpc-py-")
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    rc = protoc.main([
        "protoc",
        f"-I{proto_dir}",
        f"-I{include}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        "orders.proto",
    ])
    if rc != 0:
        raise SystemExit(f"protoc failed: {rc}")
    sys.path.insert(0, out)
    import orders_pb2
    import orders_pb2_grpc
    return orders_pb2, orders_pb2_grpc


def metadata_of(cmd):
    md = []
    if cmd.get("account") is not None:
        md.append(("x-account-id", cmd["account"]))
    for k in cmd.get("keys", []):
        md.append(("idempotency-key", k))
    return md


def marker(md):
    return any(k == "idempotent-replayed" and v == "true" for k, v in (md or ()))


def result_of(fut, kind):
    out = {"code": "OK", "details": None, "reason": None, "domain": None,
           "retry_delay_ms": None, "replayed": None, "resource_id": None,
           kind: None}
    try:
        msg = fut.result()
        out[kind] = json_format.MessageToDict(
            msg, preserving_proto_field_name=True,
            always_print_fields_with_no_presence=True)
        if kind == "order":
            # int64 as JSON numbers, as the proto numbers them.
            for f in ("amount", "created_at_ms"):
                out[kind][f] = int(out[kind][f])
        else:
            out[kind]["executions"] = int(out[kind]["executions"])
    except grpc.RpcError:
        out["code"] = fut.code().name
        out["details"] = fut.details()
        status = rpc_status.from_call(fut)
        if status is not None:
            for d in status.details:
                if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    d.Unpack(info)
                    out["reason"], out["domain"] = info.reason, info.domain
                elif d.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                    retry = error_details_pb2.RetryInfo()
                    d.Unpack(retry)
                    out["retry_delay_ms"] = retry.retry_delay.ToMilliseconds()
    initial = fut.initial_metadata()
    trailing = fut.trailing_metadata()
    if marker(initial):
        out["replayed"] = "initial"
    elif marker(trailing):
        out["replayed"] = "trailing"
    for k, v in list(initial or ()) + list(trailing or ()):
        if k == "idempotency-resource-id":
            out["resource_id"] = v
    return out


def main():
    addr, proto_dir = sys.argv[1], sys.argv[2]
    pb, pb_grpc = compile_proto(proto_dir)
    channel = grpc.insecure_channel(addr)
    stub = pb_grpc.OrdersStub(channel)
    started = {}

    def start(cmd):
        req = pb.CreateOrderRequest(
            account=cmd.get("account") or "",
            amount=cmd.get("amount", 0),
            currency=cmd.get("currency", "EUR"),
            note=cmd.get("note", ""),
        )
        timeout = cmd.get("timeout_ms")
        return stub.CreateOrder.future(
            req, metadata=metadata_of(cmd),
            timeout=None if timeout is None else timeout / 1000)

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "call":
            out = result_of(start(cmd), "order")
        elif op == "start":
            started[cmd["tag"]] = start(cmd)
            out = {"started": cmd["tag"]}
        elif op == "join":
            out = result_of(started.pop(cmd["tag"]), "order")
        elif op == "stats":
            fut = stub.GetStats.future(pb.GetStatsRequest(), metadata=metadata_of(cmd))
            out = result_of(fut, "stats")
        else:
            out = {"error": f"unknown op {op}"}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
