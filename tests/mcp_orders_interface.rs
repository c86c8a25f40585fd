//! The fixed interface of `examples/mcp_orders.rs` (issue 33), checked with
//! the official Python MCP SDK (`mcp` from PyPI, pinned) over stdio and
//! over streamable HTTP: `tests/mcp/client.py` asserts every answer (first
//! call, replay with the marker, the key in `_meta` and as an argument,
//! mismatch, in flight, transient release, permanent replay, no key, two
//! owners, 401, store down, a server killed between the work and the
//! answer). This test makes the script's virtual environment (under the
//! target dir, keyed by the requirements, reused when present), runs it per
//! transport and store, and reads its closing line. Then `mcp_order_client`
//! is run against the example through a proxy that drops the first answer.
//!
//! The binaries are the ones `cargo test` builds next to this test, e.g.
//! `cargo test -p idem --features mcp,axum,postgres,redis,mysql` (no `--test`
//! filter: with one, cargo builds no examples, and this test says so).

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;

mod support;

use support::TempSqlite;

/// The example binaries' features, for the message when they are not built.
const FEATURES: &str = "mcp,axum,postgres,mysql,redis";

/// The SDK, pinned: the version the script was written against.
const REQUIREMENTS: &str = "mcp==2.3.0\n";

/// The script's Python, in a virtual environment of its own made once per
/// requirements (`target/mcp-venv-<hash>`); made in a scratch directory and
/// renamed into place, so parallel tests and runs never see half of one.
fn python() -> PathBuf {
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let exe = std::env::current_exe().unwrap();
    let target = exe.ancestors().nth(3).unwrap().to_path_buf();
    let hash = REQUIREMENTS
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
    let venv = target.join(format!("mcp-venv-{hash:016x}"));
    let py = venv.join("bin").join("python");
    if py.is_file() {
        return py;
    }
    let scratch = target.join(format!("mcp-venv-{hash:016x}.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let ok = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&scratch)
        .status()
        .expect("python3 must be installed (this test never skips)");
    assert!(ok.success(), "python3 -m venv failed");
    let req = scratch.join("requirements.txt");
    std::fs::write(&req, REQUIREMENTS).unwrap();
    let ok = Command::new(scratch.join("bin").join("pip"))
        .args(["install", "--quiet", "--disable-pip-version-check", "-r"])
        .arg(&req)
        .status()
        .unwrap();
    assert!(ok.success(), "pip install {REQUIREMENTS} failed");
    if std::fs::rename(&scratch, &venv).is_err() {
        // Another run made it first.
        let _ = std::fs::remove_dir_all(&scratch);
    }
    py
}

/// Runs `tests/mcp/client.py MODE` against `mcp_orders` with this store
/// environment; panics with its output unless it closes with "N passed, 0
/// failed".
fn drive(mode: &str, env: &[(&str, String)]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/client.py");
    let mut cmd = Command::new(python());
    cmd.arg(script)
        .arg(mode)
        .arg(support::example("mcp_orders", FEATURES));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stdout.lines().last().unwrap_or("");
    assert!(
        out.status.success() && last.ends_with(" passed, 0 failed"),
        "client.py {mode}: {}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
    // Every check ran: 11 on stdio; HTTP adds the 401s, a store that can
    // be stopped adds the outage.
    let passed: u32 = last.split(' ').next().unwrap().parse().unwrap();
    let expected = 11
        + u32::from(mode == "http")
        + u32::from(env.iter().any(|(k, _)| *k == "IDEM_TEST_STORE_DOWN"));
    assert_eq!(passed, expected, "{last}");
}

/// A SQLite file of its own, removed after.
fn with_sqlite(f: impl FnOnce(&[(&str, String)])) {
    let db = TempSqlite::new("mcp-orders");
    f(&db.store_env());
}

#[test]
fn python_sdk_over_stdio_on_sqlite() {
    with_sqlite(|env| drive("stdio", env));
}

#[test]
fn python_sdk_over_http_on_sqlite() {
    with_sqlite(|env| drive("http", env));
}

/// A throwaway Redis server: also the store that goes down and comes back.
#[cfg(feature = "redis")]
#[test]
fn python_sdk_over_http_on_redis_with_the_store_down() {
    let redis = idem_test_support::redis_server::Throwaway::start();
    let port = redis.port;
    let dir = std::env::temp_dir();
    let down = format!("redis-cli -p {port} shutdown nosave >/dev/null 2>&1 || true");
    let up = format!(
        "redis-server --port {port} --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
         --dir {} >/dev/null && for i in $(seq 200); do \
         redis-cli -p {port} ping >/dev/null 2>&1 && break; sleep 0.05; done",
        dir.display()
    );
    let env = [
        ("IDEM_STORE", "redis".to_owned()),
        ("IDEM_REDIS_URL", redis.url()),
        ("IDEM_TEST_STORE_DOWN", down),
        ("IDEM_TEST_STORE_UP", up),
    ];
    drive("http", &env);
    redis.stop();
}

#[cfg(feature = "postgres")]
#[test]
fn python_sdk_over_stdio_on_postgres() {
    let db = support::TempDatabase::postgres("mcp_orders");
    drive("stdio", &db.store_env());
}

#[cfg(feature = "mysql")]
#[test]
fn python_sdk_over_http_on_mysql() {
    let db = support::TempDatabase::mysql("mcp_orders");
    drive("http", &db.store_env());
}

/// `mcp_orders` on HTTP with this store, killed when dropped.
struct HttpServer {
    child: std::process::Child,
    url: String,
}

impl HttpServer {
    fn start(env: &[(&str, String)]) -> Self {
        use std::io::BufRead;
        let mut cmd = Command::new(support::example("mcp_orders", FEATURES));
        cmd.env("IDEM_MCP_ADDR", "127.0.0.1:0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap()
            .to_owned();
        Self { child, url }
    }

    fn addr(&self) -> String {
        self.url
            .trim_start_matches("http://")
            .trim_end_matches("/mcp")
            .to_owned()
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP proxy to `upstream` that reads the answer to the first request
/// carrying `tools/call` and closes the connection instead of passing it on.
fn dropping_proxy(upstream: String) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let dropped = Arc::new(AtomicBool::new(false));
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let upstream = upstream.clone();
            let dropped = Arc::clone(&dropped);
            std::thread::spawn(move || relay(client, &upstream, &dropped));
        }
    });
    addr
}

fn relay(mut client: TcpStream, upstream: &str, dropped: &AtomicBool) {
    let Ok(mut server) = TcpStream::connect(upstream) else {
        return;
    };
    let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    let lose = Arc::new(AtomicBool::new(false));
    let lose2 = Arc::clone(&lose);
    // Server to client, unless this connection's answer is the one lost.
    let back = std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        while let Ok(n) = s2.read(&mut buf) {
            if n == 0 {
                break;
            }
            if lose2.load(Ordering::SeqCst) {
                let _ = c2.shutdown(std::net::Shutdown::Both);
                return;
            }
            if c2.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = c2.shutdown(std::net::Shutdown::Write);
    });
    let mut buf = [0u8; 16 * 1024];
    while let Ok(n) = client.read(&mut buf) {
        if n == 0 {
            break;
        }
        if !dropped.load(Ordering::SeqCst)
            && String::from_utf8_lossy(&buf[..n]).contains("tools/call")
            && !dropped.swap(true, Ordering::SeqCst)
        {
            lose.store(true, Ordering::SeqCst);
        }
        if server.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = server.shutdown(std::net::Shutdown::Write);
    let _ = back.join();
}

/// Runs `mcp_order_client`: the parsed JSON line and its exit code.
fn order_client(args: &[&str]) -> (Value, i32) {
    let out = Command::new(support::example("mcp_order_client", FEATURES))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "one line on stdout: {stdout:?}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        serde_json::from_str(lines[0]).unwrap(),
        out.status.code().unwrap(),
    )
}

/// Through a proxy that loses the first `tools/call` answer: one execution,
/// the retry replayed; then the same key directly, a mismatch, and stdio.
#[test]
fn mcp_order_client_through_a_dropped_answer() {
    with_sqlite(|env| {
        let server = HttpServer::start(env);
        let proxy = format!("http://{}/mcp", dropping_proxy(server.addr()));
        let base = [
            "--url",
            proxy.as_str(),
            "--token",
            "carol",
            "--amount",
            "5",
            "--currency",
            "EUR",
        ];
        let (line, code) = order_client(&[&base[..], &["--deadline-ms", "20000"]].concat());
        assert_eq!(code, 0, "{line}");
        assert_eq!(line["outcome"], "replayed", "{line}");
        assert_eq!(line["attempts"], 2, "{line}");
        assert!(line.get("code").is_none_or(Value::is_null), "{line}");
        let key = line["key"].as_str().unwrap().to_owned();
        let id = line["result"]["structuredContent"]["id"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(id.starts_with("ord_"), "{line}");

        let direct = server.url.as_str();
        let keyed = |amount: &str| {
            order_client(&[
                "--url",
                direct,
                "--token",
                "carol",
                "--amount",
                amount,
                "--currency",
                "EUR",
                "--key",
                key.as_str(),
            ])
        };
        let (again, code) = keyed("5");
        assert_eq!(
            (code, again["outcome"].as_str()),
            (0, Some("replayed")),
            "{again}"
        );
        assert_eq!(again["result"]["structuredContent"]["id"], id.as_str());
        let (mismatch, code) = keyed("6");
        assert_eq!(code, 1, "{mismatch}");
        assert_eq!(mismatch["outcome"], "error");
        assert_eq!(mismatch["code"], "fingerprint_mismatch");

        // stdio: a server command, the same store, its own owner.
        let cmd = support::example("mcp_orders", FEATURES)
            .to_string_lossy()
            .into_owned();
        let (fresh, code) = order_client(&[
            "--server-cmd",
            cmd.as_str(),
            "--amount",
            "5",
            "--currency",
            "EUR",
        ]);
        assert_eq!(
            (code, fresh["outcome"].as_str()),
            (0, Some("fresh")),
            "{fresh}"
        );
        assert_eq!(fresh["attempts"], 1);
    });
}

/// An empty bearer token (which the Python SDK's HTTP client refuses to
/// send) is a 401 like no token; nothing runs.
#[test]
fn an_empty_bearer_token_is_401() {
    let server = HttpServer::start(&[("IDEM_STORE", "memory".to_owned())]);
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_order","arguments":{"amount":5,"currency":"EUR"}}}"#;
    for auth in ["Bearer ", "Bearer \t ", "Bearer", "Basic YWxpY2U6eA=="] {
        let mut s = TcpStream::connect(server.addr()).unwrap();
        write!(
            s,
            "POST /mcp HTTP/1.1\r\nHost: {}\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            server.addr(),
            body.len()
        )
        .unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        assert!(resp.starts_with("HTTP/1.1 401"), "{auth:?}: {resp}");
    }
}
