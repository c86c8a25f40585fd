//! The fixed interface of `examples/nats_orders.rs` (issue 19, point 3),
//! checked from the outside: the built `nats_orders` binary consuming a
//! JetStream stream, its printed lines (`acked <id> attempt <n>`, `retry <id>
//! after <ms>`, `dead-letter <id> <reason>`, `stopped`), its exit status, and
//! the `ledger` and `dead_letters` tables it keeps in its SQLite file.
//!
//! `nats_orders_on_its_own_stream` runs against the machine's NATS
//! (`IDEM_NATS_URL`, default `nats://127.0.0.1:4222`) on a stream of its own:
//! the example binds the fixed subject `orders.>` when it creates a stream,
//! and two streams cannot share a subject, so the test creates
//! `IDEMEX_<id>` on `idemex.<id>.orders.>` first (the example uses a stream
//! that exists as it is) and deletes it at the end. Its duplicate window is
//! short, so that a message republished under the same `Nats-Msg-Id` reaches
//! the consumer instead of being dropped by JetStream. The creation itself
//! (the default stream `ORDERS` on `orders.>`, the durable consumer) is
//! checked by `nats_orders_creates_its_stream` on a throwaway `nats-server`
//! of its own, where `orders.>` is free.
//!
//! The binary is the one `cargo test` builds next to this test (under
//! `target/<profile>/examples/`), e.g. `cargo test -p idem --features
//! nats,sqlite` (no `--test` filter: with one, cargo builds no examples, and
//! this test says so).

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    io::{BufRead, BufReader, Read},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use async_nats::jetstream::{self, stream};
use idem::sqlite::sqlx::{self, Row, SqlitePool, sqlite::SqliteConnectOptions};
use support::{TempSqlite, random_id};
use tokio::sync::mpsc;

/// The example's lease (and the durable consumer's `ack_wait`): short, so a
/// killed run's message comes back within seconds, and long enough that the
/// restarted process sees the dead run still in flight (its last lease
/// renewal is at most a third of it before the kill). Work longer than the
/// lease (the 2 s of `test.slow`) is kept alive by progress acks. 8 s leaves
/// a restart and its first pull more than 5 s, even on a loaded CI machine.
const LEASE_MS: u64 = 8000;

/// How long any one printed line may take.
const LINE: Duration = Duration::from_secs(30);

/// The example binary's features, for the message when it is not built.
const FEATURES: &str = "nats,sqlite";

fn nats_url() -> String {
    std::env::var("IDEM_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// A running `nats_orders`: its stdout line by line; SIGKILLed when dropped.
struct Orders {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
    seen: Vec<String>,
    stderr: Arc<Mutex<String>>,
}

impl Orders {
    /// Starts it and waits (bounded) for its `consuming stream` line.
    fn start(env: &[(&str, String)]) -> Self {
        let mut child = support::spawn("nats_orders", FEATURES, env, |cmd| {
            cmd.stdin(Stdio::null());
        });
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut err = child.stderr.take().unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    return;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Self {
            child,
            lines,
            seen: Vec::new(),
            stderr,
        }
    }

    /// The next line `pred` accepts, within [`LINE`]; the lines before it are
    /// kept in `seen`.
    async fn wait_for(&mut self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + LINE;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) => {
                    self.seen.push(line.clone());
                    if pred(&line) {
                        return line;
                    }
                }
                Ok(None) => panic!(
                    "nats_orders exited before {what}: stdout {:?}, stderr {}",
                    self.seen,
                    self.stderr.lock().unwrap()
                ),
                Err(_) => panic!(
                    "no {what} within {LINE:?}: stdout {:?}, stderr {}",
                    self.seen,
                    self.stderr.lock().unwrap()
                ),
            }
        }
    }

    /// Waits for exactly this line.
    async fn expect(&mut self, line: &str) {
        self.wait_for(&format!("`{line}`"), |l| l == line).await;
    }

    /// The next line about message `id` (any line naming it), which must be
    /// `expected`; lines about other messages are skipped.
    async fn next_about(&mut self, id: &str) -> String {
        self.wait_for(&format!("a line about {id}"), |l| {
            l.split(' ').nth(1) == Some(id)
        })
        .await
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits (bounded) for the process to exit.
    async fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "nats_orders still running after {within:?}: stdout {:?}, stderr {}",
                self.seen,
                self.stderr.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERM.
    fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM {}: {status}", self.pid());
    }

    /// A hard stop (SIGKILL): nothing is flushed, nothing acknowledged.
    /// Returns every line it printed.
    async fn kill(mut self) -> Vec<String> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The pipe is closed now: the reader ends, and so does the channel.
        let deadline = tokio::time::Instant::now() + LINE;
        while let Some(line) = tokio::time::timeout_at(deadline, self.lines.recv())
            .await
            .expect("stdout closes after the kill")
        {
            self.seen.push(line);
        }
        std::mem::take(&mut self.seen)
    }
}

impl Drop for Orders {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The SQLite file the example writes, read here; removed (with its WAL)
/// when dropped.
struct Db(TempSqlite);

impl Db {
    fn new() -> Self {
        Self(TempSqlite::new("nats-orders"))
    }

    fn env(&self) -> String {
        self.0.env()
    }

    async fn pool(&self) -> SqlitePool {
        let options = SqliteConnectOptions::new().filename(&self.0.0);
        SqlitePool::connect_with(options).await.unwrap()
    }

    /// `(attempt, recoveries)` of each ledger row of message `id`.
    async fn ledger(&self, id: &str) -> Vec<(i64, i64)> {
        let pool = self.pool().await;
        let rows = sqlx::query("SELECT attempt, recoveries FROM ledger WHERE message_id = ?")
            .bind(id)
            .fetch_all(&pool)
            .await
            .unwrap();
        pool.close().await;
        rows.iter()
            .map(|r| (r.get::<i64, _>(0), r.get::<i64, _>(1)))
            .collect()
    }

    /// The `dead_letters` reason for message `id`.
    async fn dead_letter(&self, id: &str) -> Option<String> {
        let pool = self.pool().await;
        let reason = sqlx::query_scalar("SELECT reason FROM dead_letters WHERE message_id = ?")
            .bind(id)
            .fetch_optional(&pool)
            .await
            .unwrap();
        pool.close().await;
        reason
    }

    /// Waits (bounded) until message `id` has a ledger row: its effect is
    /// written, its outcome not necessarily stored.
    async fn wait_for_ledger_row(&self, id: &str) {
        let deadline = Instant::now() + LINE;
        while self.ledger(id).await.is_empty() {
            assert!(Instant::now() < deadline, "no ledger row for {id}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Publishes and returns the stream sequence. With an id, a publish that
/// JetStream drops as a duplicate (inside the stream's duplicate window) is
/// made again until the stream takes it: the consumer is to see it.
async fn publish(js: &jetstream::Context, subject: &str, id: Option<&str>, payload: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ack = match id {
            Some(id) => {
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(async_nats::header::NATS_MESSAGE_ID, id);
                js.publish_with_headers(subject.to_owned(), headers, payload.to_owned().into())
                    .await
            }
            None => {
                js.publish(subject.to_owned(), payload.to_owned().into())
                    .await
            }
        }
        .unwrap()
        .await
        .unwrap();
        if !ack.duplicate {
            return ack.sequence;
        }
        assert!(Instant::now() < deadline, "{id:?} stays a duplicate");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `<ms>` of a `retry <id> after <ms>` line.
fn retry_ms(line: &str, id: &str) -> u64 {
    let prefix = format!("retry {id} after ");
    line.strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("not a retry of {id}: {line}"))
        .parse()
        .unwrap()
}

/// The test's own stream, deleted (with the durable consumer on it) at the
/// end, whatever happened.
async fn with_own_stream<F, Fut>(body: F)
where
    F: FnOnce(jetstream::Context, String, String) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let url = nats_url();
    let client = async_nats::connect(&url).await.unwrap_or_else(|e| {
        panic!("cannot reach NATS at {url}: {e}; start `nats-server -js` (this test never skips)")
    });
    let js = jetstream::new(client);
    let id = random_id();
    let name = format!("IDEMEX_{}", id.to_ascii_uppercase());
    let prefix = format!("idemex.{id}.orders");
    js.create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![format!("{prefix}.>")],
        duplicate_window: Duration::from_millis(100),
        ..Default::default()
    })
    .await
    .unwrap();
    let result = tokio::spawn(body(js.clone(), name.clone(), prefix)).await;
    js.delete_stream(&name).await.unwrap();
    if let Err(e) = result {
        std::panic::resume_unwind(e.into_panic());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_orders_on_its_own_stream() {
    with_own_stream(|js, stream, prefix| async move {
        let db = Db::new();
        let env = [
            ("IDEM_NATS_URL", nats_url()),
            ("IDEM_NATS_STREAM", stream.clone()),
            ("IDEM_SQLITE_PATH", db.env()),
            ("IDEM_LEASE_MS", LEASE_MS.to_string()),
        ];
        let mut orders = Orders::start(&env);
        let consuming = orders
            .wait_for("`consuming stream`", |l| l.starts_with("consuming stream"))
            .await;
        assert!(
            consuming.starts_with(&format!("consuming stream {stream} ")),
            "{consuming}"
        );
        assert!(consuming.contains(" as nats-orders from "), "{consuming}");
        let subject = format!("{prefix}.new");
        let n = random_id();
        let order = r#"{"type":"order","item":"book","qty":1}"#;

        // A fresh message: one effect, acked on attempt 1.
        let fresh = format!("o-{n}");
        publish(&js, &subject, Some(&fresh), order).await;
        orders.expect(&format!("acked {fresh} attempt 1")).await;
        assert_eq!(db.ledger(&fresh).await, [(1, 0)]);

        // Republished under the same id: a replay, acked (attempt 1, the one
        // that ran), and no second effect.
        publish(&js, &subject, Some(&fresh), order).await;
        orders.expect(&format!("acked {fresh} attempt 1")).await;
        assert_eq!(db.ledger(&fresh).await, [(1, 0)]);

        // The same id with another payload: dead-lettered, kept, no effect.
        let other = r#"{"type":"order","item":"pen","qty":2}"#;
        publish(&js, &subject, Some(&fresh), other).await;
        orders
            .expect(&format!("dead-letter {fresh} fingerprint_mismatch"))
            .await;
        assert_eq!(db.ledger(&fresh).await, [(1, 0)]);
        assert_eq!(
            db.dead_letter(&fresh).await.as_deref(),
            Some("fingerprint_mismatch")
        );

        // No `Nats-Msg-Id`: the id is `STREAM:sequence`.
        let seq = publish(&js, &subject, None, order).await;
        let anonymous = format!("{stream}:{seq}");
        orders.expect(&format!("acked {anonymous} attempt 1")).await;
        assert_eq!(db.ledger(&anonymous).await, [(1, 0)]);

        // test.transient: fails on its first two deliveries, each nak'd with
        // the backoff (≤ 1 s, then ≤ 2 s), then runs on attempt 3.
        let transient = format!("t-{n}");
        publish(
            &js,
            &subject,
            Some(&transient),
            r#"{"type":"test.transient"}"#,
        )
        .await;
        for ceiling in [1000, 2000] {
            let line = orders.next_about(&transient).await;
            let ms = retry_ms(&line, &transient);
            assert!((1..=ceiling).contains(&ms), "{line}");
        }
        assert_eq!(
            orders.next_about(&transient).await,
            format!("acked {transient} attempt 3")
        );
        assert_eq!(db.ledger(&transient).await, [(3, 0)]);

        // test.permanent: dead-lettered and kept, no effect; republished,
        // the stored failure is dead-lettered again, and still nothing runs.
        let permanent = format!("p-{n}");
        for _ in 0..2 {
            publish(
                &js,
                &subject,
                Some(&permanent),
                r#"{"type":"test.permanent"}"#,
            )
            .await;
            assert_eq!(
                orders.next_about(&permanent).await,
                format!("dead-letter {permanent} permanent_failure")
            );
        }
        assert!(db.ledger(&permanent).await.is_empty());
        assert_eq!(
            db.dead_letter(&permanent).await.as_deref(),
            Some("permanent_failure")
        );

        // Not JSON fails permanently; a duplicate member is invalid.
        let garbage = format!("g-{n}");
        publish(&js, &subject, Some(&garbage), "not json").await;
        assert_eq!(
            orders.next_about(&garbage).await,
            format!("dead-letter {garbage} permanent_failure")
        );
        let twice = format!("d-{n}");
        publish(
            &js,
            &subject,
            Some(&twice),
            r#"{"type":"order","type":"order"}"#,
        )
        .await;
        assert_eq!(
            orders.next_about(&twice).await,
            format!("dead-letter {twice} invalid_message")
        );
        assert!(db.ledger(&garbage).await.is_empty());
        assert!(db.ledger(&twice).await.is_empty());

        // SIGKILL during test.slow, after its ledger row and before idem
        // stored the outcome. Restarted, a copy of the message published
        // again finds it in flight (the dead run's lease has not ended):
        // `retry` after what is left of the lease. After the lease, one
        // delivery runs it again as a recovery (attempt 2) that finds the
        // row, the other replays that outcome; the ledger holds one effect.
        let slow = format!("s-{n}");
        let slow_order = r#"{"type":"test.slow"}"#;
        publish(&js, &subject, Some(&slow), slow_order).await;
        db.wait_for_ledger_row(&slow).await;
        let printed = orders.kill().await;
        assert!(
            !printed.iter().any(|l| l.contains(&slow)),
            "killed before its line: {printed:?}"
        );
        assert_eq!(db.ledger(&slow).await, [(1, 0)]);
        let mut orders = Orders::start(&env);
        orders
            .wait_for("`consuming stream`", |l| l.starts_with("consuming stream"))
            .await;
        publish(&js, &subject, Some(&slow), slow_order).await;
        let line = orders.next_about(&slow).await;
        let ms = retry_ms(&line, &slow);
        assert!((1..=LEASE_MS).contains(&ms), "{line}");
        // Both deliveries (the one JetStream redelivers after ack_wait and
        // the copy) end acked on attempt 2, with `retry` lines meanwhile.
        let acked = format!("acked {slow} attempt 2");
        let mut acks = 0;
        while acks < 2 {
            let line = orders.next_about(&slow).await;
            if line == acked {
                acks += 1;
            } else {
                let ms = retry_ms(&line, &slow);
                assert!((1..=LEASE_MS).contains(&ms), "{line}");
            }
        }
        assert_eq!(db.ledger(&slow).await, [(1, 1)], "one effect, one recovery");
        // Nothing that finished ran again in the new process.
        assert!(
            !orders.seen.iter().any(|l| l.contains(&fresh)),
            "{:?}",
            orders.seen
        );

        // SIGTERM while a slow message is in hand: it finishes and is acked,
        // then the process says `stopped` and exits 0.
        let last = format!("l-{n}");
        publish(&js, &subject, Some(&last), r#"{"type":"test.slow"}"#).await;
        db.wait_for_ledger_row(&last).await;
        orders.terminate();
        orders.expect(&format!("acked {last} attempt 1")).await;
        orders.expect("stopped").await;
        let status = orders.wait_exit(Duration::from_secs(30)).await;
        assert_eq!(status.code(), Some(0), "{status}");
        assert_eq!(db.ledger(&last).await, [(1, 0)]);

        // Acked for good: a new process gets nothing back.
        let info = js
            .get_stream(&stream)
            .await
            .unwrap()
            .consumer_info("nats-orders")
            .await
            .unwrap()
            .clone();
        assert_eq!(info.num_ack_pending, 0, "{info:?}");
        assert_eq!(info.num_pending, 0, "{info:?}");
    })
    .await;
}

/// A throwaway `nats-server -js` on a free loopback port, with its store in
/// a scratch directory; killed (by its pid) and removed when dropped.
struct ThrowawayNats {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl ThrowawayNats {
    async fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(format!("idem-nats-orders-js-{}", random_id()));
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run nats-server (Debian's package `nats-server`): {e}")
            });
        let server = Self { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(15);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(Instant::now() < deadline, "nats-server did not come up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        server
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for ThrowawayNats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(self.dir());
    }
}

/// The stream is created when missing: the default `ORDERS` on `orders.>`,
/// with the durable pull consumer `nats-orders` (`ack_wait` the lease, at
/// most 10 deliveries). On a server of its own, where `orders.>` is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_orders_creates_its_stream() {
    let server = ThrowawayNats::start().await;
    let db = Db::new();
    let env = [
        ("IDEM_NATS_URL", server.url()),
        ("IDEM_SQLITE_PATH", db.env()),
        ("IDEM_LEASE_MS", LEASE_MS.to_string()),
    ];
    let mut orders = Orders::start(&env);
    orders
        .expect(&format!(
            "consuming stream ORDERS (orders.>) as nats-orders from {}",
            server.url()
        ))
        .await;
    let js = jetstream::new(async_nats::connect(server.url()).await.unwrap());
    let mut stream = js.get_stream("ORDERS").await.unwrap();
    assert_eq!(stream.info().await.unwrap().config.subjects, ["orders.>"]);
    let consumer = stream.consumer_info("nats-orders").await.unwrap().clone();
    assert_eq!(consumer.config.durable_name.as_deref(), Some("nats-orders"));
    assert_eq!(consumer.config.ack_wait, Duration::from_millis(LEASE_MS));
    assert_eq!(consumer.config.max_deliver, 10);

    let id = format!("o-{}", random_id());
    publish(&js, "orders.eu.new", Some(&id), r#"{"type":"order"}"#).await;
    orders.expect(&format!("acked {id} attempt 1")).await;
    assert_eq!(db.ledger(&id).await, [(1, 0)]);

    orders.terminate();
    orders.expect("stopped").await;
    let status = orders.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(0), "{status}");
    drop(server);
}
