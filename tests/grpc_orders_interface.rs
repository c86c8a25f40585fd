//! The fixed interface of `examples/grpc_orders.rs` (issue 32), checked
//! from the outside with a gRPC client that is not tonic: Google's `grpcio`
//! for Python (`tests/grpc/client.py`, its pinned packages from
//! `tests/grpc/requirements.txt` installed by this test into a virtual
//! environment of its own under the target dir, reused while the
//! requirements are unchanged). The built `grpc_orders` binary runs on a
//! SQLite file, a throwaway Postgres database, a throwaway MariaDB database
//! and a throwaway Redis server, through `IDEM_STORE`: every row of the
//! README's table, and a server killed between the work and the answer whose
//! retry is replayed, not run again.
//!
//! The binary is the one `cargo test` builds next to this test, e.g.
//! `cargo test -p idem --features grpc,postgres,mysql,redis` (no `--test`
//! filter: with one, cargo builds no examples, and this test says so).

#![allow(clippy::unwrap_used)]
#![allow(
    clippy::disallowed_methods,
    reason = "no async runtime here: the test drives two processes and waits on their wall clock"
)]

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

mod support;

use support::{TempSqlite, free_addr, random_id};

/// The example binaries' features, for the message when they are not built.
const FEATURES: &str = "grpc,client,postgres,mysql,redis";

const RESPONSE_TTL_MS: u64 = 2500;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Python of a virtual environment with `tests/grpc/requirements.txt`
/// installed: `<target>/grpc-client-venv-<hash of the requirements>`, made
/// once (in a scratch directory renamed into place when complete).
fn python() -> PathBuf {
    static VENV: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut venv = VENV.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(p) = &*venv {
        return p.clone();
    }
    let reqs = root().join("tests/grpc/requirements.txt");
    let text = std::fs::read(&reqs).unwrap();
    let hash: String = Sha256::digest(&text)[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<this test> → target
    let target = exe.ancestors().nth(3).unwrap().to_path_buf();
    let dir = target.join(format!("grpc-client-venv-{hash}"));
    let bin = dir.join("bin/python");
    if !bin.is_file() {
        let scratch = target.join(format!("grpc-client-venv-{hash}.tmp{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&scratch);
        run(Command::new("python3").args(["-m", "venv"]).arg(&scratch));
        run(Command::new(scratch.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check", "-r"])
            .arg(&reqs));
        // Its `bin/python` finds the packages relative to itself, so the
        // renamed venv works (only pip's own scripts name the old path).
        if std::fs::rename(&scratch, &dir).is_err() {
            let _ = std::fs::remove_dir_all(&scratch);
        }
    }
    assert!(bin.is_file(), "no Python in {}", dir.display());
    *venv = Some(bin.clone());
    bin
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("{cmd:?}: {e} (python3 with venv is needed; this test never skips)")
    });
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `grpc_orders` with this environment, killed when dropped.
struct Server {
    child: Child,
}

impl Server {
    fn start(addr: SocketAddr, env: &[(&str, String)]) -> Self {
        let mut child = support::spawn("grpc_orders", FEATURES, env, |cmd| {
            cmd.env("IDEM_GRPC_ADDR", addr.to_string())
                .env("IDEM_RESPONSE_TTL_MS", RESPONSE_TTL_MS.to_string());
        });
        let expected = format!("listening on {addr}");
        support::await_line(&mut child, "grpc_orders", move |line| line == expected);
        Self { child }
    }

    /// A hard stop (SIGKILL): nothing is flushed on the way out.
    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `tests/grpc/client.py` connected to a server: one JSON command in, one
/// JSON line out.
struct Client {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Client {
    fn connect(addr: SocketAddr) -> Self {
        let mut child = Command::new(python())
            .arg(root().join("tests/grpc/client.py"))
            .arg(addr.to_string())
            .arg(root().join("examples/proto"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn client.py");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut c = Self {
            child,
            stdin,
            stdout,
        };
        assert_eq!(c.read()["ready"], true);
        c
    }

    fn read(&mut self) -> Value {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    }

    fn send(&mut self, cmd: &Value) -> Value {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        self.read()
    }

    /// `CreateOrder` as `account` with these key entries.
    fn create(&mut self, account: Option<&str>, keys: &[&str], amount: i64, note: &str) -> Value {
        self.send(&json!({
            "op": "call", "account": account, "keys": keys,
            "amount": amount, "currency": "EUR", "note": note,
        }))
    }

    fn executions(&mut self) -> i64 {
        let s = self.send(&json!({"op": "stats"}));
        assert_eq!(s["code"], "OK", "{s}");
        s["stats"]["executions"].as_i64().unwrap()
    }

    /// Polls `GetStats` until `n` executions began (bounded).
    fn wait_executions(&mut self, n: i64) {
        let t0 = Instant::now();
        while self.executions() < n {
            assert!(t0.elapsed() < Duration::from_secs(10), "no execution {n}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A rejection of the layer: its status, `ErrorInfo` (domain `idem`) and
/// the handler not run.
#[track_caller]
fn assert_rejected(v: &Value, code: &str, reason: &str) {
    assert_eq!(v["code"], code, "{v}");
    assert_eq!(v["reason"], reason, "{v}");
    assert_eq!(v["domain"], "idem", "{v}");
    assert_eq!(v["replayed"], Value::Null, "{v}");
}

/// Runs `grpc_order_client`: the parsed JSON line (checked to hold the
/// fields in the documented order) and its exit code.
/// Asserts `order_client`'s exit code and its line's `outcome` and
/// `status`.
#[track_caller]
fn assert_line(line: &Value, code: i32, exit: i32, outcome: &str, status: &str) {
    assert_eq!(code, exit, "{line}");
    assert_eq!(
        (line["outcome"].as_str(), line["status"].as_str()),
        (Some(outcome), Some(status)),
        "{line}"
    );
}

fn order_client(args: &[&str]) -> (Value, i32) {
    let out = Command::new(support::example("grpc_order_client", FEATURES))
        .args(args)
        .output()
        .expect("run grpc_order_client");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one line on stdout: {stdout:?}");
    let order = [
        "\"outcome\":",
        "\"status\":",
        "\"attempts\":",
        "\"key\":",
        "\"reason\":",
        "\"order\":",
    ];
    let at: Vec<usize> = order.iter().map(|f| lines[0].find(f).unwrap()).collect();
    assert!(
        at.windows(2).all(|w| w[0] < w[1]),
        "field order: {}",
        lines[0]
    );
    (
        serde_json::from_str(lines[0]).unwrap(),
        out.status.code().unwrap(),
    )
}

/// A TCP proxy to `upstream` that cuts its first connection `cut` after
/// accepting it, whatever is in flight: the first answer is lost.
fn lossy_proxy(upstream: SocketAddr, cut: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for (i, conn) in listener.incoming().enumerate() {
            let Ok(down) = conn else { return };
            let Ok(up) = std::net::TcpStream::connect(upstream) else {
                return;
            };
            let pipe = |mut from: std::net::TcpStream, mut to: std::net::TcpStream| {
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from, &mut to);
                    let _ = to.shutdown(std::net::Shutdown::Both);
                });
            };
            pipe(down.try_clone().unwrap(), up.try_clone().unwrap());
            pipe(up.try_clone().unwrap(), down.try_clone().unwrap());
            if i == 0 {
                std::thread::spawn(move || {
                    std::thread::sleep(cut);
                    let _ = down.shutdown(std::net::Shutdown::Both);
                    let _ = up.shutdown(std::net::Shutdown::Both);
                });
            }
        }
    });
    addr
}

/// `grpc_order_client`'s fixed interface against the server, then through
/// a proxy that drops the first answer: one execution, the retry replayed.
fn the_client_on(env: &[(&str, String)]) {
    let addr = free_addr();
    let _server = Server::start(addr, env);
    let mut c = Client::connect(addr);
    let url = format!("http://{addr}");
    let acct = format!("acct_{}", random_id());
    let base = [
        "--url",
        url.as_str(),
        "--account",
        acct.as_str(),
        "--currency",
        "EUR",
    ];

    let (fresh, code) = order_client(&[&base[..], &["--amount", "250"]].concat());
    assert_eq!(code, 0, "{fresh}");
    assert_eq!(
        (fresh["outcome"].as_str(), fresh["status"].as_str()),
        (Some("fresh"), Some("OK")),
        "{fresh}"
    );
    assert_eq!(
        (fresh["attempts"].as_u64(), fresh["reason"].as_str()),
        (Some(1), None)
    );
    let key = fresh["key"].as_str().unwrap().to_owned();
    assert_eq!(key.len(), 32, "a minted key: {key}");
    assert_eq!(fresh["order"]["account"], acct.as_str());
    assert_eq!(fresh["order"]["amount"], 250);
    let with_key = |amount: &str| {
        order_client(&[&base[..], &["--key", key.as_str(), "--amount", amount]].concat())
    };
    let (replayed, code) = with_key("250");
    assert_eq!(code, 0, "{replayed}");
    assert_eq!(replayed["outcome"], "replayed");
    assert_eq!(replayed["order"], fresh["order"]);
    assert_eq!(replayed["key"], key.as_str());
    let (mismatch, code) = with_key("251");
    assert_line(&mismatch, code, 1, "error", "FAILED_PRECONDITION");
    assert_eq!(
        (mismatch["reason"].as_str(), mismatch["attempts"].as_u64()),
        (Some("FINGERPRINT_MISMATCH"), Some(1))
    );
    // The handler's own permanent status: its answer, exit 0, never retried.
    let (declined, code) = order_client(&[&base[..], &["--amount", "7"]].concat());
    assert_line(&declined, code, 0, "fresh", "FAILED_PRECONDITION");
    assert_eq!(
        (declined["attempts"].as_u64(), declined["order"].is_null()),
        (Some(1), true)
    );
    assert_eq!(c.executions(), 2);
    // Transient: retried under one key until the deadline, then exit 1.
    let (busy, code) =
        order_client(&[&base[..], &["--amount", "13", "--deadline-ms", "1200"]].concat());
    assert_line(&busy, code, 1, "error", "UNAVAILABLE");
    let attempts = busy["attempts"].as_i64().unwrap();
    assert!(attempts > 1, "{busy}");
    assert_eq!(c.executions(), 2 + attempts);

    // The first answer lost on the way: the retry is replayed, one execution.
    let before = c.executions();
    let proxy = lossy_proxy(addr, Duration::from_millis(1500));
    let via = format!("http://{proxy}");
    let (lost, code) = order_client(&[
        "--url",
        via.as_str(),
        "--account",
        acct.as_str(),
        "--currency",
        "EUR",
        "--amount",
        "99",
        "--note",
        "slow",
    ]);
    assert_eq!(code, 0, "{lost}");
    assert_eq!(
        (lost["outcome"].as_str(), lost["status"].as_str()),
        (Some("replayed"), Some("OK")),
        "{lost}"
    );
    assert!(lost["attempts"].as_u64().unwrap() >= 2, "{lost}");
    assert_eq!(lost["order"]["amount"], 99);
    assert_eq!(c.executions(), before + 1, "the work ran once");
}

/// Every row of the table, then the kill between the work and the answer.
fn the_interface_on(env: &[(&str, String)], store_down: Option<&dyn Fn(bool)>) {
    the_client_on(env);
    let addr = free_addr();
    let server = Server::start(addr, env);
    let mut c = Client::connect(addr);
    let acct = format!("acct_{}", random_id());
    let a = Some(acct.as_str());
    let k = |n: &str| format!("{n}-{}", random_id());

    // GetStats: no owner, no key, a malformed key ignored.
    let s = c.send(&json!({"op": "stats", "keys": ["a, b"]}));
    assert_eq!(
        (s["code"].as_str(), s["stats"]["executions"].as_i64()),
        (Some("OK"), Some(0))
    );

    // First call, then its replay: the same order, the marker in the
    // initial metadata; the first carries none.
    let k1 = k("k1");
    let fresh = c.create(a, &[&k1], 250, "");
    assert_eq!(fresh["code"], "OK", "{fresh}");
    assert_eq!(fresh["replayed"], Value::Null);
    let order = &fresh["order"];
    assert!(order["id"].as_str().unwrap().starts_with("ord_"), "{order}");
    assert_eq!(
        (
            order["account"].as_str(),
            order["amount"].as_i64(),
            order["currency"].as_str()
        ),
        (a, Some(250), Some("EUR"))
    );
    assert!(order["created_at_ms"].as_i64().unwrap() > 1_600_000_000_000);
    let again = c.create(a, &[&format!("\"{k1}\"")], 250, "");
    assert_eq!(
        (again["code"].as_str(), again["replayed"].as_str()),
        (Some("OK"), Some("initial"))
    );
    assert_eq!(again["order"], fresh["order"]);
    assert_eq!(c.executions(), 1);

    // Same key, other request.
    let other = c.create(a, &[&k1], 251, "");
    assert_rejected(&other, "FAILED_PRECONDITION", "FINGERPRINT_MISMATCH");
    assert_eq!(other["retry_delay_ms"], Value::Null);

    // Malformed keys (grpcio itself refuses a TAB or obs-text in metadata;
    // the layer's own suite sends those), and two entries.
    let long = "k".repeat(256);
    for keys in [
        vec![""],
        vec![long.as_str()],
        vec!["a, b"],
        vec![r#""a\qb""#],
        vec!["\"open"],
        vec!["k1", "k1"],
    ] {
        let v = c.create(a, &keys, 250, "");
        assert_rejected(&v, "INVALID_ARGUMENT", "INVALID_KEY");
    }
    // No key on CreateOrder; no owner (checked before the key).
    assert_rejected(
        &c.create(a, &[], 250, ""),
        "INVALID_ARGUMENT",
        "MISSING_KEY",
    );
    assert_rejected(
        &c.create(None, &["a, b"], 250, ""),
        "UNAUTHENTICATED",
        "OWNER_UNAVAILABLE",
    );
    assert_eq!(c.executions(), 1);

    // In flight: ABORTED, IN_FLIGHT, RetryInfo = the lease remaining.
    let k2 = k("k2");
    c.send(
        &json!({"op": "start", "tag": "slow", "account": acct, "keys": [k2],
                   "amount": 300, "currency": "EUR", "note": "slow"}),
    );
    c.wait_executions(2);
    let busy = c.create(a, &[&k2], 300, "slow");
    assert_rejected(&busy, "ABORTED", "IN_FLIGHT");
    let delay = busy["retry_delay_ms"].as_i64().unwrap();
    assert!((1..=60_000).contains(&delay), "{busy}");
    let first = c.send(&json!({"op": "join", "tag": "slow"}));
    assert_eq!(first["code"], "OK", "{first}");
    let slow_again = c.create(a, &[&k2], 300, "slow");
    assert_eq!(slow_again["replayed"], "initial", "{slow_again}");
    assert_eq!(slow_again["order"], first["order"]);
    assert_eq!(c.executions(), 2);

    // amount 13: UNAVAILABLE, transient: the key is released, a retry runs.
    let k3 = k("k3");
    for n in [3, 4] {
        let v = c.create(a, &[&k3], 13, "");
        assert_eq!(
            (v["code"].as_str(), v["details"].as_str()),
            (Some("UNAVAILABLE"), Some("provider_unavailable")),
            "{v}"
        );
        assert_eq!(v["replayed"], Value::Null);
        assert_eq!(c.executions(), n);
    }

    // amount 7: FAILED_PRECONDITION, permanent: stored and replayed, the
    // marker in the trailers.
    let k4 = k("k4");
    let v = c.create(a, &[&k4], 7, "");
    assert_eq!(
        (v["code"].as_str(), v["details"].as_str()),
        (Some("FAILED_PRECONDITION"), Some("insufficient_funds")),
        "{v}"
    );
    assert_eq!(v["replayed"], Value::Null);
    let v = c.create(a, &[&k4], 7, "");
    assert_eq!(
        (v["code"].as_str(), v["details"].as_str()),
        (Some("FAILED_PRECONDITION"), Some("insufficient_funds")),
        "{v}"
    );
    assert_eq!(v["replayed"], "trailing", "{v}");
    assert_eq!(v["reason"], Value::Null, "the handler's own status");
    assert_eq!(c.executions(), 5);

    // Completed, body no longer kept: RESPONSE_EXPIRED, the resource id.
    std::thread::sleep(Duration::from_millis(RESPONSE_TTL_MS + 300));
    let expired = c.create(a, &[&k1], 250, "");
    assert_rejected(&expired, "FAILED_PRECONDITION", "RESPONSE_EXPIRED");
    assert_eq!(expired["resource_id"], fresh["order"]["id"], "{expired}");

    // Store unreachable: UNAVAILABLE, STORE_UNAVAILABLE, a RetryInfo.
    if let Some(toggle) = store_down {
        toggle(true);
        let down = c.create(a, &[&k("k5")], 250, "");
        assert_rejected(&down, "UNAVAILABLE", "STORE_UNAVAILABLE");
        assert!(down["retry_delay_ms"].as_i64().unwrap() > 0, "{down}");
        toggle(false);
    }
    let before = c.executions();

    // Killed between the work and the answer (`slow`: the work's second,
    // its outcome stored, then the answer held a second outside the layer):
    // the retry on a new process is replayed, not run again.
    let k6 = k("k6");
    c.send(
        &json!({"op": "start", "tag": "killed", "account": acct, "keys": [k6],
                   "amount": 600, "currency": "EUR", "note": "slow"}),
    );
    c.wait_executions(before + 1);
    std::thread::sleep(Duration::from_millis(1500));
    server.kill();
    let lost = c.send(&json!({"op": "join", "tag": "killed"}));
    assert_eq!(lost["code"], "UNAVAILABLE", "the answer never came: {lost}");
    drop(c);
    let _server = Server::start(addr, env);
    let mut c = Client::connect(addr);
    let retry = c.create(a, &[&k6], 600, "slow");
    assert_eq!(
        (retry["code"].as_str(), retry["replayed"].as_str()),
        (Some("OK"), Some("initial")),
        "{retry}"
    );
    assert!(retry["order"]["id"].as_str().unwrap().starts_with("ord_"));
    assert_eq!(c.executions(), 0, "nothing ran in the new process");
    // Ids stay unique across the restart.
    let next = c.create(a, &[&k("k7")], 1, "");
    assert_ne!(next["order"]["id"], retry["order"]["id"]);
    assert_ne!(next["order"]["id"], fresh["order"]["id"]);
}

#[test]
fn grpc_orders_on_sqlite() {
    let db = TempSqlite::new("grpc-orders");
    the_interface_on(&db.store_env(), None);
}

/// A database of its own (`grpc_orders` uses a fixed schema), dropped after.
#[cfg(feature = "postgres")]
#[test]
fn grpc_orders_on_postgres() {
    let db = support::TempDatabase::postgres("grpc_orders");
    let env = db.store_env();
    the_interface_on(&env, None);
}

/// A database of its own on the server of `IDEM_MYSQL_URL` (`grpc_orders`
/// uses a fixed table name), dropped after.
#[cfg(feature = "mysql")]
#[test]
fn grpc_orders_on_mariadb() {
    let db = support::TempDatabase::mysql("grpc_orders");
    the_interface_on(&db.store_env(), None);
}

/// A throwaway Redis server of its own, stopped mid-test for the
/// store-down row.
#[cfg(feature = "redis")]
#[test]
fn grpc_orders_on_redis() {
    let redis = idem_test_support::redis_server::Throwaway::start();
    let env = support::redis_env(redis.url());
    let toggle = |down: bool| {
        if down {
            redis.stop();
        } else {
            redis.start_again();
        }
    };
    the_interface_on(&env, Some(&toggle));
}
