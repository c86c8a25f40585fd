//! The fixed interface of `examples/order_client.rs` (issue 20), checked
//! from the outside: the built `order_client` binary against the built
//! `http_orders` binary, on a SQLite file, a throwaway Postgres database and
//! a throwaway Redis server, through `IDEM_STORE`. Each check reads the one
//! JSON line and the exit status.
//!
//! The binaries are the ones `cargo test` builds next to this test (under
//! `target/<profile>/examples/`), e.g.
//! `cargo test -p idem --features client,axum,postgres,redis` (no `--test`
//! filter: with one, cargo builds no examples, and this test says so).

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    process::{Child, Command},
    time::{Duration, Instant},
};

use serde_json::Value;
use support::{TempSqlite, example, free_addr, random_id};

/// The example binaries' features, for the message when they are not built.
const FEATURES: &str = "client,axum,postgres,redis";

/// `http_orders` with this environment, killed when dropped.
struct OrdersServer {
    child: Child,
    addr: SocketAddr,
}

impl OrdersServer {
    /// Starts it on `addr` and waits (bounded) for its "listening" line.
    fn start(addr: SocketAddr, env: &[(&str, String)]) -> Self {
        let mut child = support::spawn("http_orders", FEATURES, env, |cmd| {
            cmd.env("IDEM_HTTP_ADDR", addr.to_string());
        });
        support::await_line(&mut child, "http_orders", |line| {
            line.starts_with("listening on")
        });
        Self { child, addr }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// `GET /stats` → executions in this process.
    fn executions(&self) -> u64 {
        let mut s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "GET /stats HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.addr
        )
        .unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        let body = resp.split("\r\n\r\n").nth(1).unwrap();
        let v: Value = serde_json::from_str(body).unwrap();
        v["executions"].as_u64().unwrap()
    }

    /// A hard stop (SIGKILL): nothing is flushed on the way out.
    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// A hard stop, then everything it wrote on stderr.
    fn kill_and_read_stderr(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        err
    }
}

impl Drop for OrdersServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `order_client`: the parsed JSON line and whether it exited 0.
fn order_client(args: &[&str]) -> (Value, i32) {
    let t0 = Instant::now();
    let out = Command::new(example("order_client", FEATURES))
        .args(args)
        .output()
        .expect("run order_client");
    assert!(t0.elapsed() < Duration::from_secs(30));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one line on stdout: {stdout:?}");
    let v: Value = serde_json::from_str(lines[0]).unwrap();
    (v, out.status.code().unwrap())
}

/// Fresh, replayed (same `--key`), a mismatch not retried, a 503 retried to
/// the deadline; then the server is killed and started again on the same
/// store: the key still replays, and nothing ran in the new process.
fn the_interface_on(env: &[(&str, String)]) {
    let addr = free_addr();
    let server = OrdersServer::start(addr, env);
    let url = server.url("/orders");
    let account = format!("acct_{}", random_id());
    let body = r#"{"item":"book","qty":1}"#;
    let base = ["--url", url.as_str(), "--account", account.as_str()];

    let (fresh, code) = order_client(&[&base[..], &["--body", body]].concat());
    assert_eq!(code, 0, "{fresh}");
    assert_eq!(fresh["outcome"], "fresh", "{fresh}");
    assert_eq!(
        (fresh["status"].as_u64(), fresh["attempts"].as_u64()),
        (Some(201), Some(1))
    );
    assert_eq!(fresh["body"]["item"], "book");
    assert!(fresh.get("code").is_none(), "{fresh}");
    let key = fresh["key"].as_str().unwrap().to_owned();
    assert_eq!(key.len(), 32, "a minted key: {key}");

    let with_key =
        |extra: &[&str]| order_client(&[&base[..], &["--key", key.as_str()], extra].concat());
    let (replayed, code) = with_key(&["--body", body]);
    assert_eq!(code, 0, "{replayed}");
    assert_eq!(replayed["outcome"], "replayed", "{replayed}");
    assert_eq!(
        (replayed["status"].as_u64(), replayed["attempts"].as_u64()),
        (Some(201), Some(1))
    );
    assert_eq!(replayed["key"], key.as_str());
    assert_eq!(replayed["body"], fresh["body"]);
    assert_eq!(server.executions(), 1);

    let (mismatch, code) = with_key(&["--body", r#"{"item":"pen","qty":2}"#]);
    assert_eq!(code, 1, "{mismatch}");
    assert_eq!(mismatch["outcome"], "error");
    assert_eq!(mismatch["code"], "fingerprint_mismatch");
    assert_eq!(
        (mismatch["status"].as_u64(), mismatch["attempts"].as_u64()),
        (Some(422), Some(1))
    );
    assert_eq!(server.executions(), 1);

    let failing = server.url("/orders?status=503");
    let (busy, code) = order_client(&[
        "--url",
        failing.as_str(),
        "--account",
        account.as_str(),
        "--body",
        body,
        "--deadline-ms",
        "1500",
    ]);
    assert_eq!(code, 1, "{busy}");
    assert_eq!(busy["outcome"], "error");
    assert_eq!(busy["code"], "exhausted");
    assert_eq!(busy["status"], 503);
    let attempts = busy["attempts"].as_u64().unwrap();
    assert!(attempts >= 2, "retried: {busy}");
    // One run per released 503 attempt, never more.
    assert_eq!(server.executions(), 1 + attempts);

    // `--deadline-ms` does not cut an attempt already running: a POST that
    // takes longer than the deadline still gets its answer, and the line says
    // it came after the deadline. Without the flag there is no such field.
    assert!(fresh.get("after_deadline").is_none(), "{fresh}");
    let slow = server.url("/orders?delay_ms=1200");
    let slow_args = [
        "--url",
        slow.as_str(),
        "--account",
        account.as_str(),
        "--body",
        body,
    ];
    let (late, code) = order_client(&[&slow_args[..], &["--deadline-ms", "300"]].concat());
    assert_eq!(code, 0, "{late}");
    assert_eq!(late["outcome"], "fresh", "{late}");
    assert_eq!(
        (late["status"].as_u64(), late["attempts"].as_u64()),
        (Some(201), Some(1))
    );
    assert_eq!(late["after_deadline"], true, "{late}");
    let (timely, code) = order_client(&[&slow_args[..], &["--deadline-ms", "20000"]].concat());
    assert_eq!(code, 0, "{timely}");
    assert_eq!(timely["after_deadline"], false, "{timely}");
    assert_eq!(server.executions(), 3 + attempts);

    server.kill();
    // Nobody listening: retried (connection refused) until the deadline, and
    // the error still names the key, with the attempts made.
    let (down, code) = with_key(&["--body", body, "--deadline-ms", "1500"]);
    assert_eq!(code, 1, "{down}");
    assert_eq!(down["outcome"], "error");
    assert_eq!(down["status"], 0);
    assert_eq!(down["key"], key.as_str());
    assert!(down["attempts"].as_u64().unwrap() >= 2, "retried: {down}");
    assert!(
        ["deadline", "transport", "max_attempts"].contains(&down["code"].as_str().unwrap()),
        "{down}"
    );
    let server = OrdersServer::start(addr, env);
    let (again, code) = with_key(&["--body", body]);
    assert_eq!(code, 0, "{again}");
    assert_eq!(again["outcome"], "replayed", "after a restart: {again}");
    assert_eq!(again["body"], fresh["body"]);
    assert_eq!(server.executions(), 0, "nothing ran in the new process");
}

#[test]
fn order_client_against_http_orders_on_sqlite() {
    let db = TempSqlite::new("order-client");
    let env = db.store_env();
    the_interface_on(&env);
}

/// A database of its own (`http_orders` uses the fixed schema
/// `idem_http_orders`), dropped after.
#[cfg(feature = "postgres")]
#[test]
fn order_client_against_http_orders_on_postgres() {
    let db = support::TempDatabase::postgres("order_client");
    let env = db.store_env();
    the_interface_on(&env);
}

/// MariaDB (or MySQL) through `IDEM_STORE=mysql`, on a table of its own
/// named by `IDEM_MYSQL_TABLE` in the shared database, dropped after.
#[cfg(feature = "mysql")]
#[test]
fn order_client_against_http_orders_on_mysql() {
    let table = support::TempMysqlTable::new("orders");
    the_interface_on(&table.env());
}

/// A throwaway Redis server of its own (`http_orders` uses the fixed prefix
/// `idem-http-orders:`), shut down after.
#[cfg(feature = "redis")]
#[test]
fn order_client_against_http_orders_on_redis() {
    let redis = idem_test_support::redis_server::Throwaway::start();
    let env = support::redis_env(redis.url());
    the_interface_on(&env);
}

/// `http_orders` on Postgres without a synchronous standby (this machine's):
/// by default it starts and says so on stderr (the library's warning, which
/// the example prints); with `IDEM_REQUIRE_SYNC_REPLICATION=1` it refuses
/// to start, and says why.
#[cfg(feature = "postgres")]
#[test]
fn http_orders_warns_or_refuses_without_a_synchronous_standby() {
    let db = support::TempDatabase::postgres("orders_sync");
    let base = [
        ("IDEM_STORE", "postgres".to_owned()),
        ("IDEM_POSTGRES_URL", db.url.clone()),
        ("IDEM_CALL_TIMEOUT_MS", "2000".to_owned()),
    ];
    let addr = free_addr();
    let server = OrdersServer::start(addr, &base);
    let stderr = server.kill_and_read_stderr();
    assert!(
        stderr.contains("WARN") && stderr.contains("synchronous"),
        "the start warning on stderr: {stderr}"
    );

    let refused = [
        &base[..],
        &[("IDEM_REQUIRE_SYNC_REPLICATION", "1".to_owned())],
    ]
    .concat();
    let mut child = support::spawn("http_orders", FEATURES, &refused, |cmd| {
        cmd.env("IDEM_HTTP_ADDR", free_addr().to_string());
    });
    let status = child.wait().expect("wait");
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read stderr");
    assert!(!status.success(), "refused to start: {err}");
    assert!(err.contains("synchronous"), "says why: {err}");
}

/// `IDEM_POSTGRES_SCHEMA` and `IDEM_REDIS_PREFIX` put `http_orders`' records
/// where the run says, on the shared servers (two runs can share one
/// server): the whole interface runs there, the records are found under that
/// schema and that prefix, and both are removed after.
#[cfg(all(feature = "postgres", feature = "redis"))]
#[test]
fn http_orders_on_a_schema_and_a_prefix_of_its_own() {
    use idem::postgres::sqlx::{self, Connection, Executor};
    use idem::redis::redis as r;
    let pg = std::env::var("IDEM_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let schema = format!("idem_orders_{}", random_id());
    let result = std::panic::catch_unwind(|| {
        the_interface_on(&[
            ("IDEM_STORE", "postgres".to_owned()),
            ("IDEM_POSTGRES_URL", pg.clone()),
            ("IDEM_POSTGRES_SCHEMA", schema.clone()),
        ]);
    });
    let redis =
        std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned());
    let prefix = format!("idem-orders-{}:", random_id());
    let result = result.and_then(|()| {
        std::panic::catch_unwind(|| {
            the_interface_on(&[
                ("IDEM_STORE", "redis".to_owned()),
                ("IDEM_REDIS_URL", redis.clone()),
                ("IDEM_REDIS_PREFIX", prefix.clone()),
            ]);
        })
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (records, keys) = rt.block_on(async {
        let mut c = sqlx::PgConnection::connect(&pg).await.unwrap();
        let records: Option<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM \"{schema}\".idem_records"
        )))
        .fetch_one(&mut c)
        .await
        .ok();
        c.execute(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
        )))
        .await
        .unwrap();
        c.close().await.unwrap();
        let client = r::Client::open(redis.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let keys = idem_test_support::redis_admin::scan(&mut conn, &prefix).await;
        idem_test_support::redis_admin::unlink_all(&mut conn, &prefix).await;
        (records, keys.len())
    });
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
    assert!(
        records.unwrap_or(0) >= 2,
        "records under {schema}: {records:?}"
    );
    assert!(keys >= 2, "keys under {prefix}: {keys}");
}
