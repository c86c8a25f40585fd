//! Issue 19: the inbound adapters with a real process death. A child
//! (`crash-consumer` on a real NATS JetStream, or `crash-webhook` serving a
//! `WebhookLayer`) says on stdout that it is at a named point of its work,
//! the parent SIGKILLs it there, and a fresh child gets the broker's (or the
//! provider's) redelivery. Every run of the work is counted (the children's
//! `run` lines), and so is the side effect: rows of an `effects` table
//! (the transactional inbox), or calls to a loopback "provider" stub with
//! the downstream key (store-backed work, the webhook handler).
//!
//! | test | killed | the redelivery | work runs | effect |
//! |---|---|---|---|---|
//! | `inbox_killed_before_commit_*` | after `INSERT INTO effects`, before `COMMIT` | fresh (rolled back), acked | 2 | 1 row |
//! | `store_killed_after_the_call_*` (SQLite file, Postgres, Redis) | after the stub call | C5 until the lease ends, then C6 (a recovery), acked | 2 | 2 calls, 1 downstream key |
//! | `inbox_killed_after_commit_*` | after `COMMIT`, before the ack | C4 (a replay), acked | 1 | 1 row |
//! | `inbox_writing_outside_the_transaction_is_caught` | as the first row, the row written outside the transaction (broken on purpose) | fresh, acked | 2 | **2 rows**: the check can fail |
//! | `store_work_ignoring_the_downstream_key_is_caught` (SQLite file) | as the second row, the key made per process (broken on purpose) | as the second row | 2 | **2 distinct keys**: the check can fail |
//! | `webhook_killed_in_the_handler_*` (SQLite file, Postgres) | in the handler, after the stub call | W12 (503 + `Retry-After`) until the lease ends, then a recovery; then W10 | 2 | 2 calls, 1 downstream key |
//!
//! Services: NATS with JetStream (`IDEM_NATS_URL`, default
//! `nats://127.0.0.1:4222`; each test its own stream, deleted at the end),
//! PostgreSQL (`IDEM_POSTGRES_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`; each test its own schema,
//! dropped), Redis (`IDEM_REDIS_URL`, default `redis://127.0.0.1:6379/`;
//! each test its own key prefix, deleted). The leases are real time, short
//! (2-3 s): these are real processes. A few seconds per test.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, stream};
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use idem_core::IdempotencyKey;
use idem_crashtest::inbound::Stub;
use idem_postgres::PgStore;
use idem_postgres::sqlx::{self, Row};
use sha2::Sha256;

/// The store-backed consumer's and the webhook layer's lease.
const LEASE_MS: u64 = 3000;
const WEBHOOK_LEASE_MS: u64 = 2000;
/// JetStream's ack wait: a dead consumer's message comes back after it.
const ACK_WAIT: Duration = Duration::from_secs(1);
/// How long a child may take to reach a line it should print.
const PATIENCE: Duration = Duration::from_secs(30);
const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn unique() -> String {
    IdempotencyKey::random().as_str().to_ascii_lowercase()
}

fn postgres_url() -> String {
    std::env::var("IDEM_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

fn nats_url() -> String {
    std::env::var("IDEM_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

fn redis_url() -> String {
    std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned())
}

/// A child process whose stdout lines are read by a thread of their own;
/// SIGKILLed and reaped on drop.
struct Kid {
    name: &'static str,
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Kid {
    fn spawn(name: &'static str, bin: &str, env: &[(&str, String)]) -> Self {
        let mut cmd = Command::new(bin);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {bin}: {e}"));
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            name,
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Reads lines until one starts with `prefix`; returns it.
    fn wait_for(&mut self, prefix: &str) -> String {
        let until = Instant::now() + PATIENCE;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.starts_with(prefix) {
                        return line;
                    }
                }
                Err(e) => panic!(
                    "{}: no line {prefix:?} ({e}); it printed {:#?}",
                    self.name, self.seen
                ),
            }
        }
    }

    /// Every line printed so far.
    fn drain(&mut self) -> &[String] {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
        &self.seen
    }

    /// SIGKILL (`Child::kill` sends it) and reap.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One `run <id> <attempt> <recovery> <downstream key>` line.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Run {
    attempt: u32,
    recovery: bool,
    downstream_key: String,
}

fn runs(lines: &[String]) -> Vec<Run> {
    lines
        .iter()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            match f.as_slice() {
                ["run", _, attempt, recovery, dk] => Some(Run {
                    attempt: attempt.parse().expect("attempt"),
                    recovery: *recovery == "1",
                    downstream_key: (*dk).to_owned(),
                }),
                _ => None,
            }
        })
        .collect()
}

/// A `settled <id> <cause> <action> <attempt> <recovery> <after ms>` line,
/// as `(cause, action)`.
fn settled(line: &str) -> (String, String) {
    let f: Vec<&str> = line.split(' ').collect();
    assert_eq!(f.len(), 7, "{line}");
    (f[2].to_owned(), f[3].to_owned())
}

/// The test's own JetStream stream and durable pull consumer, deleted on
/// drop.
struct Jet {
    rt: tokio::runtime::Runtime,
    js: jetstream::Context,
    stream: String,
    subject: String,
}

const DURABLE: &str = "crash";

impl Jet {
    fn new() -> Self {
        let rt = runtime();
        let id = unique();
        let stream = format!("IDEMCRASH_{id}");
        let subject = format!("idemcrash.{id}.effects");
        let js = rt.block_on(async {
            let client = async_nats::connect(nats_url()).await.unwrap_or_else(|e| {
                panic!(
                    "cannot reach NATS at {}: {e}. Start `nats-server -js -a 127.0.0.1 -p 4222` \
                     (Debian package nats-server) or set IDEM_NATS_URL",
                    nats_url()
                )
            });
            let js = jetstream::new(client);
            let s = js
                .create_stream(stream::Config {
                    name: stream.clone(),
                    subjects: vec![format!("idemcrash.{id}.>")],
                    ..Default::default()
                })
                .await
                .expect("create the test stream");
            s.create_consumer(pull::Config {
                durable_name: Some(DURABLE.to_owned()),
                ack_wait: ACK_WAIT,
                max_deliver: 10,
                ..Default::default()
            })
            .await
            .expect("create the durable consumer");
            js
        });
        Self {
            rt,
            js,
            stream,
            subject,
        }
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("IDEM_NATS_URL", nats_url()),
            ("IDEM_CRASH_STREAM", self.stream.clone()),
            ("IDEM_CRASH_DURABLE", DURABLE.to_owned()),
        ]
    }

    /// Publishes one message with `Nats-Msg-Id: id`.
    fn publish(&self, id: &str) {
        self.rt.block_on(async {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(async_nats::header::NATS_MESSAGE_ID, id);
            self.js
                .publish_with_headers(
                    self.subject.clone(),
                    headers,
                    format!(r#"{{"order":"{id}"}}"#).into(),
                )
                .await
                .expect("publish")
                .await
                .expect("publish ack");
        });
    }

    /// The consumer's `(num_ack_pending, num_pending, ack floor's stream
    /// sequence)`.
    fn state(&self) -> (usize, u64, u64) {
        self.rt.block_on(async {
            let mut c: jetstream::consumer::Consumer<pull::Config> = self
                .js
                .get_stream(&self.stream)
                .await
                .expect("stream")
                .get_consumer(DURABLE)
                .await
                .expect("consumer");
            let info = c.info().await.expect("consumer info");
            (
                info.num_ack_pending,
                info.num_pending,
                info.ack_floor.stream_sequence,
            )
        })
    }
}

impl Drop for Jet {
    fn drop(&mut self) {
        let _ = self.rt.block_on(self.js.delete_stream(&self.stream));
    }
}

/// The test's own Postgres schema (the idem table migrated, and an
/// `effects` table), dropped on drop.
struct Schema {
    rt: tokio::runtime::Runtime,
    store: PgStore,
    name: String,
}

impl Schema {
    fn new() -> Self {
        let rt = runtime();
        let name = format!("idem_inbound_{}", unique());
        let store = rt.block_on(async {
            let store = PgStore::connect(&postgres_url())
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "cannot reach Postgres at {}: {e}. Start one or set IDEM_POSTGRES_URL",
                        postgres_url()
                    )
                })
                .with_schema_name(&name)
                .expect("schema name");
            store.migrate().await.expect("migrate");
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "CREATE TABLE \"{name}\".effects (message TEXT NOT NULL, attempt INT NOT NULL)"
            )))
            .execute(store.pool())
            .await
            .expect("create effects");
            store
        });
        Self { rt, store, name }
    }

    fn url(&self) -> String {
        format!("{}#{}", postgres_url(), self.name)
    }

    /// The backend argument of this schema.
    fn backend(&self) -> String {
        format!("postgres:{}", self.url())
    }

    fn effects(&self) -> i64 {
        self.rt.block_on(async {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "SELECT count(*) AS n FROM \"{}\".effects",
                self.name
            )))
            .fetch_one(self.store.pool())
            .await
            .expect("count effects")
            .get::<i64, _>("n")
        })
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let _ = self.rt.block_on(
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP SCHEMA IF EXISTS \"{}\" CASCADE",
                self.name
            )))
            .execute(self.store.pool()),
        );
    }
}

/// Waits `d` on this (test) thread.
fn pause(d: Duration) {
    let until = Instant::now() + d;
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        std::thread::park_timeout(left);
    }
}

/// The stub's calls, checked to be two with one downstream key: the work
/// ran again after the crash, and the effect was made once.
fn called_twice_with_one_key(stub: &Stub) -> BTreeMap<String, usize> {
    let calls = stub.calls();
    assert_eq!(calls.values().sum::<usize>(), 2, "{calls:?}");
    assert_eq!(calls.len(), 1, "two distinct effects: {calls:?}");
    calls
}

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("idem-inbound-{}", unique()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }

    /// The backend argument of a SQLite file in this directory.
    fn sqlite_backend(&self) -> String {
        format!("sqlite:{}", self.0.join("idem.db").display())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The test's own Redis key prefix; its keys deleted on drop.
struct RedisPrefix(String);

impl Drop for RedisPrefix {
    fn drop(&mut self) {
        use idem_redis::redis::AsyncCommands as _;
        let rt = runtime();
        let _ = rt.block_on(async {
            let client = idem_redis::redis::Client::open(redis_url())?;
            let mut conn = client.get_multiplexed_async_connection().await?;
            let keys: Vec<String> = conn.keys(format!("{}*", self.0)).await?;
            if !keys.is_empty() {
                let () = conn.del(keys).await?;
            }
            Ok::<_, idem_redis::redis::RedisError>(())
        });
    }
}

/// The consumer scenarios: spawn a child that stops at `stop_at`, publish,
/// wait for it to stop, start a fresh child, SIGKILL the first; the fresh
/// one settles the redelivery with an ack. Returns both children (for their
/// lines) after checking the message is acked on the server.
fn consumer_crash(
    jet: &Jet,
    backend: &str,
    stop_at: &str,
    stub: &Stub,
    broken: bool,
) -> (Kid, Kid) {
    let mut env = jet.env();
    env.push((
        "IDEM_CRASH_BROKEN",
        if broken { "1" } else { "0" }.to_owned(),
    ));
    env.push(("IDEM_CRASH_BACKEND", backend.to_owned()));
    env.push(("IDEM_CRASH_LEASE_MS", LEASE_MS.to_string()));
    env.push(("IDEM_CRASH_STUB", stub.addr()));
    let bin = env!("CARGO_BIN_EXE_crash-consumer");
    let mut stopped = {
        let mut env = env.clone();
        env.push(("IDEM_CRASH_STOP_AT", stop_at.to_owned()));
        Kid::spawn("the first consumer", bin, &env)
    };
    stopped.wait_for("ready");
    let id = format!("evt_{}", unique());
    jet.publish(&id);
    stopped.wait_for(&format!("stop {stop_at}"));
    // The fresh child is up before the kill, so the lease is not spent on
    // its start-up.
    let mut fresh = Kid::spawn("the fresh consumer", bin, &env);
    fresh.wait_for("ready");
    let killed_at = Instant::now();
    stopped.kill();
    loop {
        let line = fresh.wait_for(&format!("settled {id} "));
        if settled(&line).1 == "ack" {
            break;
        }
    }
    eprintln!(
        "{backend} {stop_at}: acked {:?} after the kill\n  killed: {:?}\n  fresh: {:?}",
        killed_at.elapsed(),
        stopped.drain(),
        fresh.drain()
    );
    // Acked: nothing pending, nothing awaiting an ack, the floor past it.
    assert_eq!(jet.state(), (0, 0, 1), "the message is not acked");
    (stopped, fresh)
}

/// 1a: the inbox, killed after `INSERT INTO effects` and before `COMMIT`:
/// the transaction (claim included) rolls back, the redelivery runs the
/// work afresh and commits; `effects` has one row.
#[test]
fn inbox_killed_before_commit_applies_the_effect_once() {
    let (jet, schema, stub) = (Jet::new(), Schema::new(), Stub::start());
    let (mut first, mut fresh) = consumer_crash(
        &jet,
        &format!("inbox:{}", schema.url()),
        "before-commit",
        &stub,
        false,
    );
    let before = runs(first.drain());
    let after = runs(fresh.drain());
    assert_eq!(before.len(), 1, "{before:?}");
    // Rolled back with the claim: the redelivery is a fresh attempt 1.
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!((after[0].attempt, after[0].recovery), (1, false));
    let settled_lines: Vec<_> = fresh
        .drain()
        .iter()
        .filter(|l| l.starts_with("settled"))
        .map(|l| settled(l))
        .collect();
    assert_eq!(
        settled_lines,
        vec![("succeeded".to_owned(), "ack".to_owned())]
    );
    assert_eq!(schema.effects(), 1, "the effect is applied once");
}

/// The check above can fail: a consumer that writes its row outside the
/// transaction leaves it behind when killed, and the redelivery writes a
/// second one.
#[test]
fn inbox_writing_outside_the_transaction_is_caught() {
    let (jet, schema, stub) = (Jet::new(), Schema::new(), Stub::start());
    let _ = consumer_crash(
        &jet,
        &format!("inbox:{}", schema.url()),
        "before-commit",
        &stub,
        true,
    );
    assert_eq!(schema.effects(), 2, "the broken inbox went unnoticed");
}

/// 1c: the inbox, killed after the commit and before the ack: the
/// redelivery is a replay (C4), acked; the work ran once, one row.
#[test]
fn inbox_killed_after_commit_replays() {
    let (jet, schema, stub) = (Jet::new(), Schema::new(), Stub::start());
    let (mut first, mut fresh) = consumer_crash(
        &jet,
        &format!("inbox:{}", schema.url()),
        "after-commit",
        &stub,
        false,
    );
    assert_eq!(runs(first.drain()).len(), 1);
    assert_eq!(runs(fresh.drain()), vec![], "the replay ran the work");
    let last = fresh
        .drain()
        .iter()
        .rev()
        .find(|l| l.starts_with("settled"))
        .cloned()
        .expect("settled");
    assert_eq!(settled(&last), ("replayed".to_owned(), "ack".to_owned()));
    assert_eq!(schema.effects(), 1);
}

/// 1b: store-backed, killed after the side effect (the stub call with the
/// downstream key): the redelivery during the lease is C5 (retry later,
/// nak'd with the lease left), the one after it C6 (a recovery with the
/// same downstream key); the stub saw two calls and one effect.
fn store_killed_after_the_call(backend: &str) {
    let (jet, stub) = (Jet::new(), Stub::start());
    let (mut first, mut fresh) = consumer_crash(&jet, backend, "after-call", &stub, false);
    let mut all = runs(first.drain());
    assert_eq!(all.len(), 1, "{all:?}");
    let lines = fresh.drain().to_vec();
    let after = runs(&lines);
    assert_eq!(after.len(), 1, "{lines:#?}");
    assert_eq!(
        (after[0].attempt, after[0].recovery),
        (2, true),
        "not a recovery"
    );
    let settled_lines: Vec<_> = lines
        .iter()
        .filter(|l| l.starts_with("settled"))
        .map(|l| settled(l))
        .collect();
    let in_flight = ("in_flight".to_owned(), "retry".to_owned());
    assert!(
        !settled_lines.is_empty() && settled_lines[0] == in_flight,
        "the redelivery during the lease was not C5: {lines:#?}"
    );
    assert_eq!(
        settled_lines.last(),
        Some(&("succeeded".to_owned(), "ack".to_owned()))
    );
    assert!(
        settled_lines[..settled_lines.len() - 1]
            .iter()
            .all(|s| *s == in_flight),
        "{lines:#?}"
    );
    all.extend(after);
    let calls = called_twice_with_one_key(&stub);
    assert!(all.iter().all(|r| calls.contains_key(&r.downstream_key)));
}

#[test]
fn store_killed_after_the_call_sqlite_file() {
    let dir = TempDir::new();
    store_killed_after_the_call(&dir.sqlite_backend());
}

/// The check above can fail: work that does not call with the downstream
/// key (here: one that adds its process id) makes two distinct effects,
/// and the stub shows them.
#[test]
fn store_work_ignoring_the_downstream_key_is_caught() {
    let dir = TempDir::new();
    let (jet, stub) = (Jet::new(), Stub::start());
    let backend = dir.sqlite_backend();
    let (_first, mut fresh) = consumer_crash(&jet, &backend, "after-call", &stub, true);
    let recovered = runs(fresh.drain());
    assert_eq!(recovered.len(), 1, "{recovered:?}");
    assert!(recovered[0].recovery);
    let calls = stub.calls();
    assert_eq!(
        (calls.values().sum::<usize>(), calls.len()),
        (2, 2),
        "the broken work went unnoticed: {calls:?}"
    );
}

#[test]
fn store_killed_after_the_call_postgres() {
    let schema = Schema::new();
    store_killed_after_the_call(&schema.backend());
}

#[test]
fn store_killed_after_the_call_redis() {
    let prefix = RedisPrefix(format!("idemcrash:{}:", unique()));
    store_killed_after_the_call(&format!("redis:{}#{}", redis_url(), prefix.0));
}

/// One HTTP answer: status, headers (lower-case names), body.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A Standard Webhooks delivery of event `id`, signed now, posted to
/// `addr`; `None` when the connection is lost before an answer.
fn deliver(addr: &str, id: &str) -> Option<Answer> {
    let body = format!(r#"{{"id":"{id}","type":"order.paid"}}"#);
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        .to_string();
    let key = base64::engine::general_purpose::STANDARD
        .decode(SECRET.trim_start_matches("whsec_"))
        .expect("secret");
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&key).expect("key");
    mac.update(format!("{id}.{ts}.{body}").as_bytes());
    let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    let request = format!(
        "POST /hook HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         webhook-id: {id}\r\nwebhook-timestamp: {ts}\r\nwebhook-signature: v1,{sig}\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut conn = TcpStream::connect(addr).expect("connect to the receiver");
    conn.write_all(request.as_bytes()).expect("send");
    let mut raw = String::new();
    if conn.read_to_string(&mut raw).is_err() || raw.is_empty() {
        return None;
    }
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Some(Answer {
        status,
        headers,
        body: body.to_owned(),
    })
}

/// W9 with a real process death: the receiver is SIGKILLed in its handler
/// after the side effect. The provider's delivery loses its connection; a
/// redelivery (to a fresh receiver) inside the lease gets 503 with
/// `Retry-After` (W12); once the provider has waited that long, the next one
/// runs as a recovery with the same downstream key; one more is W10. The
/// stub saw two calls and one effect.
fn webhook_killed_in_the_handler(backend: &str) {
    let stub = Stub::start();
    let env = vec![
        ("IDEM_CRASH_BACKEND", backend.to_owned()),
        ("IDEM_CRASH_LEASE_MS", WEBHOOK_LEASE_MS.to_string()),
        ("IDEM_CRASH_STUB", stub.addr()),
        ("IDEM_CRASH_SECRET", SECRET.to_owned()),
        ("IDEM_CRASH_ENDPOINT", format!("crash/{}", unique())),
    ];
    let bin = env!("CARGO_BIN_EXE_crash-webhook");
    let mut stopped = {
        let mut env = env.clone();
        env.push(("IDEM_CRASH_STOP_AT", "after-call".to_owned()));
        Kid::spawn("the first receiver", bin, &env)
    };
    let addr = stopped.wait_for("listening ")["listening ".len()..].to_owned();
    let id = format!("msg_{}", unique());
    let first = {
        let (addr, id) = (addr.clone(), id.clone());
        std::thread::spawn(move || deliver(&addr, &id))
    };
    stopped.wait_for("stop after-call");
    let mut fresh = Kid::spawn("the fresh receiver", bin, &env);
    let fresh_addr = fresh.wait_for("listening ")["listening ".len()..].to_owned();
    stopped.kill();
    let lost = first.join().expect("the first delivery");
    assert!(lost.is_none(), "the killed receiver answered: {lost:?}");

    // Inside the lease: retry later.
    let waited = Instant::now();
    let busy = deliver(&fresh_addr, &id).expect("an answer");
    assert_eq!(busy.status, 503, "{busy:?}");
    assert!(busy.body.contains("in_flight"), "{busy:?}");
    let mut retry_after: u64 = busy
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert!(
        (1..=WEBHOOK_LEASE_MS.div_ceil(1000)).contains(&retry_after),
        "{busy:?}"
    );
    // The provider honours Retry-After until the lease ends.
    let done = loop {
        pause(Duration::from_secs(retry_after));
        let got = deliver(&fresh_addr, &id).expect("an answer");
        if got.status != 503 {
            break got;
        }
        retry_after = got
            .header("retry-after")
            .and_then(|v| v.parse().ok())
            .expect("Retry-After");
    };
    assert_eq!(done.status, 200, "{done:?}");
    assert_eq!(done.header("idempotent-replayed"), None, "{done:?}");
    let again = deliver(&fresh_addr, &id).expect("an answer");
    assert_eq!(
        (again.status, again.header("idempotent-replayed")),
        (200, Some("true")),
        "{again:?}"
    );

    eprintln!(
        "{backend}: killed: {:?}\n  fresh: {:?}\n  answers: 503 then 200 after {:?}",
        stopped.drain(),
        fresh.drain(),
        waited.elapsed()
    );
    let before = runs(stopped.drain());
    let after = runs(fresh.drain());
    assert_eq!(before.len(), 1, "{before:?}");
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!((after[0].attempt, after[0].recovery), (2, true));
    let calls = called_twice_with_one_key(&stub);
    assert!(calls.contains_key(&after[0].downstream_key));
}

#[test]
fn webhook_killed_in_the_handler_sqlite_file() {
    let dir = TempDir::new();
    webhook_killed_in_the_handler(&dir.sqlite_backend());
}

#[test]
fn webhook_killed_in_the_handler_postgres() {
    let schema = Schema::new();
    webhook_killed_in_the_handler(&schema.backend());
}
