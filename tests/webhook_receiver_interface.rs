//! The fixed interface of `examples/webhook_receiver.rs` (issue 19, point 3),
//! checked from the outside: the built `webhook_receiver` binary on a free
//! loopback port, on a SQLite file, a throwaway Postgres database and a
//! throwaway Redis server (through `IDEM_STORE`), with deliveries signed here
//! as each provider signs them (Standard Webhooks, Stripe, GitHub). Each check
//! reads the answer's status and headers and `GET /stats`.
//!
//! The binary is the one `cargo test` builds next to this test (under
//! `target/<profile>/examples/`), e.g.
//! `cargo test -p idem --features axum,webhook,postgres,redis` (no `--test`
//! filter: with one, cargo builds no examples, and this test says so).

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    io::{BufRead, BufReader, Read},
    net::SocketAddr,
    process::{Child, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::Value;
use sha2::Sha256;
use support::{TempSqlite, free_addr, random_id};

const STANDARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const STRIPE_SECRET: &str = "whsec_stripe_interface_test";
const GITHUB_SECRET: &str = "github interface test secret";

/// The example binary's features, for the message when it is not built.
const FEATURES: &str = "axum,webhook,postgres,mysql,redis";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).unwrap();
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The variables that choose the example's store: none is inherited, so a
/// test's store is the one it sets.
const STORE_VARS: [&str; 9] = [
    "IDEM_STORE",
    "IDEM_SQLITE_PATH",
    "IDEM_POSTGRES_URL",
    "IDEM_POSTGRES_SCHEMA",
    "IDEM_MYSQL_URL",
    "IDEM_MYSQL_TABLE",
    "IDEM_REDIS_URL",
    "IDEM_REDIS_PREFIX",
    "IDEM_REDIS_INLINE_BODY_LIMIT",
];

/// `webhook_receiver` with the three secrets and this store, killed when
/// dropped.
struct Receiver {
    child: Child,
    addr: SocketAddr,
    stdout: Arc<Mutex<Vec<String>>>,
}

impl Receiver {
    /// Starts it on `addr` and waits (bounded) for its `listening on
    /// http://ADDR` line.
    fn start(addr: SocketAddr, env: &[(&str, String)]) -> Self {
        Self::start_in(addr, env, None)
    }

    /// Like [`Receiver::start`], in working directory `cwd` when given, and
    /// with no store variable inherited from the test's own environment.
    fn start_in(addr: SocketAddr, env: &[(&str, String)], cwd: Option<&std::path::Path>) -> Self {
        let mut child = support::spawn("webhook_receiver", FEATURES, env, |cmd| {
            for var in STORE_VARS {
                cmd.env_remove(var);
            }
            if let Some(dir) = cwd {
                cmd.current_dir(dir);
            }
            cmd.env("IDEM_HTTP_ADDR", addr.to_string())
                .env("STANDARD_WEBHOOK_SECRET", STANDARD_SECRET)
                .env("STRIPE_WEBHOOK_SECRET", STRIPE_SECRET)
                .env("GITHUB_WEBHOOK_SECRET", GITHUB_SECRET)
                .stdin(Stdio::null());
        });
        let out = child.stdout.take().unwrap();
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let lines = Arc::clone(&stdout);
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                if let Some(rest) = line.strip_prefix("listening on ") {
                    let _ = tx.send(rest.to_owned());
                }
                lines.lock().unwrap().push(line);
            }
        });
        // Drained so that the child never blocks on a full pipe; read when
        // it failed to start.
        let mut err = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        let mut receiver = Self {
            child,
            addr,
            stdout,
        };
        let Ok(listening) = rx.recv_timeout(Duration::from_secs(30)) else {
            receiver.stop();
            // Killed: its stderr is closed, so this ends.
            let stderr = stderr.join().unwrap_or_default();
            panic!(
                "webhook_receiver did not print `listening on`: stdout {:?}, stderr {stderr}",
                receiver.stdout.lock().unwrap(),
            );
        };
        assert_eq!(listening, format!("http://{addr}"));
        let printed = receiver.stdout.lock().unwrap().clone();
        for route in ["standard", "stripe", "github"] {
            let mounted = format!("POST /webhooks/{route} mounted");
            assert!(
                printed.iter().any(|l| l.starts_with(&mounted)),
                "{mounted}: {printed:?}"
            );
        }
        receiver
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// A hard stop (SIGKILL): nothing is flushed on the way out.
    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One answer: status, `Retry-After`, `Idempotent-Replayed`, body.
#[derive(Debug)]
struct Answer {
    status: u16,
    retry_after: Option<String>,
    replayed: bool,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }
}

struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    fn new(receiver: &Receiver) -> Self {
        Self {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
            base: receiver.url(""),
        }
    }

    async fn post(&self, route: &str, headers: &[(&str, String)], body: &str) -> Answer {
        let mut req = self
            .http
            .post(format!("{}/webhooks/{route}", self.base))
            .header("content-type", "application/json")
            .body(body.to_owned());
        for (k, v) in headers {
            req = req.header(*k, v);
        }
        let resp = req.send().await.unwrap();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        let (retry_after, replayed) = (
            header("retry-after"),
            header("idempotent-replayed").as_deref() == Some("true"),
        );
        let status = resp.status().as_u16();
        let body = resp.text().await.unwrap();
        Answer {
            status,
            retry_after,
            replayed,
            body,
        }
    }

    /// `GET /stats` → runs of the handler in this process.
    async fn executions(&self) -> u64 {
        let resp = self
            .http
            .get(format!("{}/stats", self.base))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let v: Value = serde_json::from_str(&resp.text().await.unwrap()).unwrap();
        v["executions"].as_u64().unwrap()
    }

    /// A Standard Webhooks delivery: `webhook-signature: v1,<base64>` over
    /// `{id}.{timestamp}.{body}` with the base64 key after `whsec_`.
    async fn standard(&self, id: &str, ts: u64, body: &str, secret: &str) -> Answer {
        let key = base64::engine::general_purpose::STANDARD
            .decode(secret.strip_prefix("whsec_").unwrap())
            .unwrap();
        let ts = ts.to_string();
        let sig = hmac_sha256(
            &key,
            &[id.as_bytes(), b".", ts.as_bytes(), b".", body.as_bytes()],
        );
        let sig = base64::engine::general_purpose::STANDARD.encode(sig);
        let headers = [
            ("webhook-id", id.to_owned()),
            ("webhook-timestamp", ts),
            ("webhook-signature", format!("v1,{sig}")),
        ];
        self.post("standard", &headers, body).await
    }

    /// A Stripe delivery: `Stripe-Signature: t=<ts>,v1=<hex>` over
    /// `{t}.{body}` with the `whsec_…` string itself as the key.
    async fn stripe(&self, ts: u64, body: &str, secret: &str) -> Answer {
        let ts = ts.to_string();
        let sig = hmac_sha256(secret.as_bytes(), &[ts.as_bytes(), b".", body.as_bytes()]);
        let headers = [("stripe-signature", format!("t={ts},v1={}", hex(&sig)))];
        self.post("stripe", &headers, body).await
    }

    /// A GitHub delivery: `X-Hub-Signature-256: sha256=<hex>` over the body,
    /// the id in `X-GitHub-Delivery`.
    async fn github(&self, delivery: &str, body: &str, secret: &str) -> Answer {
        let sig = hmac_sha256(secret.as_bytes(), &[body.as_bytes()]);
        let headers = [
            ("x-github-delivery", delivery.to_owned()),
            ("x-github-event", "push".to_owned()),
            ("x-hub-signature-256", format!("sha256={}", hex(&sig))),
        ];
        self.post("github", &headers, body).await
    }
}

fn assert_fresh(a: &Answer, id: &str) {
    assert_eq!(a.status, 200, "{a:?}");
    assert!(!a.replayed, "{a:?}");
    assert_eq!(a.json()["received"], id, "{a:?}");
}

fn assert_duplicate(a: &Answer) {
    assert!((200..300).contains(&a.status), "a duplicate is 2xx: {a:?}");
    assert!(a.replayed, "a duplicate is marked: {a:?}");
}

/// Every row the interface states, on one store; then the receiver is
/// killed and started again on the same store, and a first delivery is still
/// a duplicate there.
async fn the_interface_on(env: &[(&str, String)]) {
    let addr = free_addr();
    let mut receiver = Receiver::start(addr, env);
    let c = Client::new(&receiver);
    let n = random_id();
    assert_eq!(c.executions().await, 0);

    // A signed delivery runs once; the same delivery again (re-signed with
    // a later timestamp, as senders do) is a 2xx duplicate and does not run.
    let paid_id = format!("msg_{n}_paid");
    let paid = r#"{"type":"invoice.paid","data":{"amount":100}}"#;
    assert_fresh(
        &c.standard(&paid_id, now(), paid, STANDARD_SECRET).await,
        &paid_id,
    );
    assert_eq!(c.executions().await, 1);
    assert_duplicate(&c.standard(&paid_id, now(), paid, STANDARD_SECRET).await);
    assert_eq!(c.executions().await, 1);

    // A wrong signature is 401 and claims nothing: the same id signed right
    // runs afterwards.
    let forged_id = format!("msg_{n}_forged");
    let wrong = "whsec_".to_owned() + &base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
    let a = c.standard(&forged_id, now(), paid, &wrong).await;
    assert_eq!(a.status, 401, "{a:?}");
    assert!(a.body.contains("invalid_signature"), "{a:?}");
    assert_eq!(c.executions().await, 1);
    // A body other than the one signed is as wrong.
    let sig_of_other = {
        let key = base64::engine::general_purpose::STANDARD
            .decode(STANDARD_SECRET.strip_prefix("whsec_").unwrap())
            .unwrap();
        let ts = now().to_string();
        let sig = hmac_sha256(
            &key,
            &[forged_id.as_bytes(), b".", ts.as_bytes(), b".", b"{}"],
        );
        [
            ("webhook-id", forged_id.clone()),
            ("webhook-timestamp", ts),
            (
                "webhook-signature",
                format!(
                    "v1,{}",
                    base64::engine::general_purpose::STANDARD.encode(sig)
                ),
            ),
        ]
    };
    let a = c.post("standard", &sig_of_other, paid).await;
    assert_eq!(a.status, 401, "{a:?}");
    assert_eq!(c.executions().await, 1);

    // A stale timestamp (10 minutes old or ahead, signed right) is refused.
    for ts in [now() - 600, now() + 600] {
        let a = c.standard(&forged_id, ts, paid, STANDARD_SECRET).await;
        assert_eq!(a.status, 401, "{a:?}");
        assert!(a.body.contains("stale_webhook"), "{a:?}");
    }
    assert_eq!(c.executions().await, 1);
    assert_fresh(
        &c.standard(&forged_id, now(), paid, STANDARD_SECRET).await,
        &forged_id,
    );
    assert_eq!(c.executions().await, 2);

    // A transient failure answers 5xx and releases the key: the next
    // delivery runs again.
    let transient_id = format!("msg_{n}_transient");
    let transient = r#"{"type":"test.transient"}"#;
    for run in 1..=2 {
        let a = c
            .standard(&transient_id, now(), transient, STANDARD_SECRET)
            .await;
        assert!((500..600).contains(&a.status), "{a:?}");
        assert!(!a.replayed, "{a:?}");
        assert_eq!(c.executions().await, 2 + run);
    }

    // A permanent failure is stored and acknowledged (2xx, so the provider
    // stops); its redelivery does not run.
    let permanent_id = format!("msg_{n}_permanent");
    let permanent = r#"{"type":"test.permanent"}"#;
    let a = c
        .standard(&permanent_id, now(), permanent, STANDARD_SECRET)
        .await;
    assert_eq!(a.status, 200, "acknowledged: {a:?}");
    assert!(!a.replayed, "{a:?}");
    assert_eq!(c.executions().await, 5);
    let a = c
        .standard(&permanent_id, now(), permanent, STANDARD_SECRET)
        .await;
    assert!((200..300).contains(&a.status), "{a:?}");
    assert!(a.replayed, "{a:?}");
    assert_eq!(c.executions().await, 5);

    // A slow delivery with a duplicate while it runs: the duplicate is told
    // to come back later (503 + Retry-After) and does not run.
    let slow_id = format!("msg_{n}_slow");
    let slow = r#"{"type":"test.slow"}"#;
    let first = c.standard(&slow_id, now(), slow, STANDARD_SECRET);
    let duplicate = async {
        // The handler counts its run when it starts: from then on the
        // delivery is in flight (2 s).
        let deadline = Instant::now() + Duration::from_secs(10);
        while c.executions().await < 6 {
            assert!(Instant::now() < deadline, "the slow delivery never started");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        c.standard(&slow_id, now(), slow, STANDARD_SECRET).await
    };
    let (first, duplicate) = tokio::join!(first, duplicate);
    assert_fresh(&first, &slow_id);
    assert_eq!(duplicate.status, 503, "{duplicate:?}");
    let retry_after: u64 = duplicate
        .retry_after
        .as_deref()
        .unwrap_or_else(|| panic!("Retry-After: {duplicate:?}"))
        .parse()
        .unwrap();
    assert!(retry_after >= 1, "{duplicate:?}");
    assert_eq!(c.executions().await, 6);
    assert_duplicate(&c.standard(&slow_id, now(), slow, STANDARD_SECRET).await);
    assert_eq!(c.executions().await, 6);

    // Stripe: the event id is the body's `id`.
    let evt = format!("evt_{n}");
    let event = format!(r#"{{"id":"{evt}","object":"event","type":"invoice.paid"}}"#);
    assert_fresh(&c.stripe(now(), &event, STRIPE_SECRET).await, &evt);
    assert_eq!(c.executions().await, 7);
    assert_duplicate(&c.stripe(now(), &event, STRIPE_SECRET).await);
    let a = c.stripe(now(), &event, "whsec_not_the_secret").await;
    assert_eq!(a.status, 401, "{a:?}");
    let a = c.stripe(now() - 600, &event, STRIPE_SECRET).await;
    assert_eq!(a.status, 401, "{a:?}");
    assert!(a.body.contains("stale_webhook"), "{a:?}");
    assert_eq!(c.executions().await, 7);

    // GitHub: the id is `X-GitHub-Delivery`, no timestamp.
    let delivery = format!("{n}-github");
    let push = r#"{"ref":"refs/heads/main","commits":[]}"#;
    assert_fresh(&c.github(&delivery, push, GITHUB_SECRET).await, &delivery);
    assert_eq!(c.executions().await, 8);
    assert_duplicate(&c.github(&delivery, push, GITHUB_SECRET).await);
    let a = c.github(&delivery, push, "not the secret").await;
    assert_eq!(a.status, 401, "{a:?}");
    assert_eq!(c.executions().await, 8);
    // The endpoint owns the records: the Standard Webhooks id sent to the
    // GitHub route is another event.
    assert_fresh(&c.github(&paid_id, push, GITHUB_SECRET).await, &paid_id);
    assert_eq!(c.executions().await, 9);

    // Killed and started again on the same store: the records are there, so
    // a redelivery is a duplicate and nothing runs in the new process; the
    // transient one, released, runs again.
    receiver.stop();
    let receiver = Receiver::start(addr, env);
    let c = Client::new(&receiver);
    assert_duplicate(&c.standard(&paid_id, now(), paid, STANDARD_SECRET).await);
    assert_duplicate(&c.stripe(now(), &event, STRIPE_SECRET).await);
    assert_duplicate(&c.github(&delivery, push, GITHUB_SECRET).await);
    assert_eq!(c.executions().await, 0, "nothing ran in the new process");
    let a = c
        .standard(&transient_id, now(), transient, STANDARD_SECRET)
        .await;
    assert!((500..600).contains(&a.status), "{a:?}");
    assert_eq!(c.executions().await, 1);
    drop(receiver);
}

#[tokio::test]
async fn webhook_receiver_on_sqlite() {
    let db = TempSqlite::new("webhook-receiver");
    let env = db.store_env();
    the_interface_on(&env).await;
}

/// A database of its own (`webhook_receiver` uses the fixed schema
/// `idem_webhook_receiver`), dropped after.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn webhook_receiver_on_postgres() {
    let db = support::TempDatabase::postgres("webhook_receiver");
    let env = db.store_env();
    the_interface_on(&env).await;
}

/// A throwaway Redis server of its own (`webhook_receiver` uses the fixed
/// prefix `idem-webhook-receiver:`), shut down after.
#[cfg(feature = "redis")]
#[tokio::test]
async fn webhook_receiver_on_redis() {
    let redis = idem_test_support::redis_server::Throwaway::start();
    let env = support::redis_env(redis.url());
    the_interface_on(&env).await;
}

/// With no store variable at all, the default store is a file in the working
/// directory that outlives the process, named on the first line: restarted,
/// the same event is a duplicate and its handler does not run again (before,
/// the default was a new file per process, and a restart forgot every event).
#[tokio::test]
async fn webhook_receiver_default_store_survives_a_restart() {
    let dir = std::env::temp_dir().join(format!("idem-webhook-default-{}", random_id()));
    std::fs::create_dir_all(&dir).unwrap();
    let result = tokio::spawn({
        let dir = dir.clone();
        async move {
            let addr = free_addr();
            let file = std::path::absolute(dir.join("idem-webhook-receiver.db")).unwrap();
            let first_line = format!("store: sqlite {}", file.display());
            let id = format!("msg_{}_default", random_id());
            let body = r#"{"type":"invoice.paid"}"#;
            let mut receiver = Receiver::start_in(addr, &[], Some(&dir));
            assert_eq!(
                receiver.stdout.lock().unwrap().first(),
                Some(&first_line),
                "the first line names the store"
            );
            let c = Client::new(&receiver);
            assert_fresh(&c.standard(&id, now(), body, STANDARD_SECRET).await, &id);
            assert_eq!(c.executions().await, 1);
            receiver.stop();
            assert!(file.is_file(), "{} kept", file.display());

            let receiver = Receiver::start_in(addr, &[], Some(&dir));
            assert_eq!(receiver.stdout.lock().unwrap().first(), Some(&first_line));
            let c = Client::new(&receiver);
            assert_duplicate(&c.standard(&id, now(), body, STANDARD_SECRET).await);
            assert_eq!(c.executions().await, 0, "nothing ran after the restart");
        }
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = result {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// MariaDB (or MySQL) through `IDEM_STORE=mysql`, on a table of its own
/// (`IDEM_MYSQL_TABLE`), dropped after.
#[cfg(feature = "mysql")]
#[tokio::test]
async fn webhook_receiver_on_mysql() {
    let table = support::TempMysqlTable::new("webhook");
    the_interface_on(&table.env()).await;
}
