//! The fixed interface of `examples/nats_orders.rs` (issue 19, point 3),
//! checked from the outside: the built `nats_orders` binary consuming a
//! JetStream stream, its printed lines (`acked <id> attempt <n> <how>`, `retry <id>
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
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use async_nats::jetstream::{self, stream};
use support::queue_example::{self, Db, retry_ms};
use support::random_id;

/// The example's lease (and the durable consumer's `ack_wait`): short, so a
/// killed run's message comes back within seconds, and long enough that the
/// restarted process sees the dead run still in flight (its last lease
/// renewal is at most a third of it before the kill). Work longer than the
/// lease (the 2 s of `test.slow`) is kept alive by progress acks. 8 s leaves
/// a restart and its first pull more than 5 s, even on a loaded CI machine.
const LEASE_MS: u64 = 8000;

/// The example as a process.
struct Orders;

impl Orders {
    fn start(env: &[(&str, String)]) -> queue_example::Orders {
        queue_example::Orders::start("nats_orders", "nats,sqlite", env)
    }
}

fn nats_url() -> String {
    std::env::var("IDEM_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
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
        let db = Db::new("nats-orders");
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
        orders
            .expect(&format!("acked {fresh} attempt 1 executed"))
            .await;
        assert_eq!(db.ledger(&fresh).await, [(1, 0)]);

        // Republished under the same id: a replay, acked (attempt 1, the one
        // that ran), and no second effect.
        publish(&js, &subject, Some(&fresh), order).await;
        orders
            .expect(&format!("acked {fresh} attempt 1 replayed"))
            .await;
        assert_eq!(db.ledger(&fresh).await, [(1, 0)]);

        // The same id with another payload: dead-lettered, kept, no effect.
        let other = r#"{"type":"order","item":"pen","qty":2}"#;
        publish(&js, &subject, Some(&fresh), other).await;
        orders
            .expect(&format!("dead-letter {fresh} fingerprint_mismatch"))
            .await;
        assert_eq!(db.ledger(&fresh).await, [(1, 0)]);
        assert_eq!(
            db.dead_letters(&fresh).await,
            [("fingerprint_mismatch".to_owned(), other.to_owned())]
        );
        // A second payload under the same id is dead-lettered again, and
        // kept beside the first: no dead letter is overwritten.
        let third = r#"{"type":"order","item":"cup","qty":3}"#;
        publish(&js, &subject, Some(&fresh), third).await;
        orders
            .expect(&format!("dead-letter {fresh} fingerprint_mismatch"))
            .await;
        assert_eq!(
            db.dead_letters(&fresh).await,
            [
                ("fingerprint_mismatch".to_owned(), other.to_owned()),
                ("fingerprint_mismatch".to_owned(), third.to_owned())
            ]
        );

        // No `Nats-Msg-Id`: the id is `STREAM:sequence`.
        let seq = publish(&js, &subject, None, order).await;
        let anonymous = format!("{stream}:{seq}");
        orders
            .expect(&format!("acked {anonymous} attempt 1 executed"))
            .await;
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
            format!("acked {transient} attempt 3 executed")
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
        // Both dead-lettered deliveries are kept.
        let kept = (
            "permanent_failure".to_owned(),
            r#"{"type":"test.permanent"}"#.to_owned(),
        );
        assert_eq!(db.dead_letters(&permanent).await, [kept.clone(), kept]);

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
        // the copy) end acked on attempt 2, with `retry` lines meanwhile:
        // one ran it as a recovery (it found the dead run's ledger row), the
        // other replayed that outcome.
        let mut acks = Vec::new();
        while acks.len() < 2 {
            let line = orders.next_about(&slow).await;
            if let Some(how) = line.strip_prefix(&format!("acked {slow} attempt 2 ")) {
                acks.push(how.to_owned());
            } else {
                let ms = retry_ms(&line, &slow);
                assert!((1..=LEASE_MS).contains(&ms), "{line}");
            }
        }
        acks.sort();
        assert_eq!(acks, ["recovered", "replayed"]);
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
        let status = orders.terminate_with_in_hand(&db, &last).await;
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
    let db = Db::new("nats-orders");
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
    orders
        .expect(&format!("acked {id} attempt 1 executed"))
        .await;
    assert_eq!(db.ledger(&id).await, [(1, 0)]);

    orders.terminate();
    orders.expect("stopped").await;
    let status = orders.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(status.code(), Some(0), "{status}");
    drop(server);
}
