//! The JetStream adapter against the real NATS server (`IDEM_NATS_URL`,
//! default `nats://127.0.0.1:4222`, JetStream on): each test makes its own
//! stream and durable pull consumer and deletes the stream at the end.
//!
//! The broker's own clocks (ack wait, nak delay, duplicate window) are real
//! time: those waits are the broker's, kept short (≤ 1.5 s).

mod support;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer::pull, stream};
use futures_util::StreamExt;
use idem_consumer::nats::{NatsConsumer, REASON_HEADER, publish_dead_letter};
use idem_consumer::{Cause, DeadLetterReason};
use idem_core::{Failure, Idem, IdempotencyKey, MemoryStore};
use idem_sqlite::SqliteStore;
use support::{
    P, Runs, assert_acked, assert_dead_lettered, assert_replays, assert_retry, backing_off,
    builder, dead_lettering,
};

type PullConsumer = jetstream::consumer::Consumer<pull::Config>;

fn url() -> String {
    std::env::var("IDEM_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// One test's stream (`subjects = "{prefix}.>"`), its DLQ stream, and a client.
struct Fixture {
    js: jetstream::Context,
    stream: String,
    prefix: String,
}

impl Fixture {
    async fn new(duplicate_window: Duration) -> Self {
        let client = async_nats::connect(url()).await.unwrap_or_else(|e| {
            panic!(
                "cannot reach NATS at {}: {e}. Start one with `nats-server -js -a 127.0.0.1 -p 4222` \
                 (Debian package nats-server) or point IDEM_NATS_URL at a server with JetStream",
                url()
            )
        });
        let js = jetstream::new(client);
        let id = IdempotencyKey::random();
        let stream = format!("IDEMTEST_{}", id.as_str());
        let prefix = format!("idemtest.{}", id.as_str());
        js.create_stream(stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{prefix}.>")],
            duplicate_window,
            ..Default::default()
        })
        .await
        .expect("create the test stream");
        Self { js, stream, prefix }
    }

    async fn pull(&self, ack_wait: Duration) -> PullConsumer {
        let s = self.js.get_stream(&self.stream).await.expect("stream");
        s.create_consumer(pull::Config {
            durable_name: Some("billing".to_owned()),
            filter_subject: format!("{}.orders.>", self.prefix),
            ack_wait,
            max_deliver: 10,
            ..Default::default()
        })
        .await
        .expect("create the durable pull consumer")
    }

    async fn publish(&self, id: Option<&str>, payload: &'static [u8]) {
        let mut headers = HeaderMap::new();
        if let Some(id) = id {
            headers.insert(async_nats::header::NATS_MESSAGE_ID, id);
        }
        self.js
            .publish_with_headers(
                format!("{}.orders.created", self.prefix),
                headers,
                payload.into(),
            )
            .await
            .expect("publish")
            .await
            .expect("publish ack");
    }

    /// Publishes `payload` (with `Nats-Msg-Id` `id`) and pulls it back.
    async fn delivered(
        &self,
        pull: &PullConsumer,
        id: &str,
        payload: &'static [u8],
    ) -> jetstream::Message {
        self.publish(Some(id), payload).await;
        next(pull, Duration::from_secs(2)).await.expect("delivery")
    }
}

impl support::Fixture for Fixture {
    async fn teardown(&self) {
        self.js
            .delete_stream(&self.stream)
            .await
            .expect("delete the test stream");
    }
}

/// A test's stream and durable pull consumer.
#[derive(Debug, Clone, Copy)]
struct Setup {
    /// The stream's duplicate window.
    duplicate_window: Duration,
    /// The consumer's ack wait (when JetStream redelivers an unacked message).
    ack_wait: Duration,
}

/// No resend within the test is stored again; redelivery after 1 s.
const QUICK_REDELIVERY: Setup = Setup {
    duplicate_window: Duration::from_secs(120),
    ack_wait: Duration::from_secs(1),
};

/// No resend within the test is stored again; redelivery after 5 s, past
/// the test's own waits.
const SLOW_REDELIVERY: Setup = Setup {
    duplicate_window: Duration::from_secs(120),
    ack_wait: Duration::from_secs(5),
};

/// A resend after 200 ms is stored again; redelivery after 5 s.
const SHORT_WINDOW: Setup = Setup {
    duplicate_window: Duration::from_millis(200),
    ack_wait: Duration::from_secs(5),
};

/// Runs `scenario` on a stream and pull consumer made as `setup` says, and
/// deletes the stream even when it fails.
async fn with_nats<F, Fut>(setup: Setup, scenario: F)
where
    F: FnOnce(Arc<Fixture>, PullConsumer) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let fx = Fixture::new(setup.duplicate_window).await;
    support::with_fixture(fx, move |fx| async move {
        let pull = fx.pull(setup.ack_wait).await;
        scenario(fx, pull).await;
    })
    .await;
}

/// The next message, or `None` after `wait`.
async fn next(c: &PullConsumer, wait: Duration) -> Option<jetstream::Message> {
    let mut batch = c
        .fetch()
        .max_messages(1)
        .expires(wait)
        .messages()
        .await
        .expect("fetch");
    batch.next().await.map(|m| m.expect("message"))
}

/// Nothing waits for an ack, nothing is left to deliver.
async fn assert_nothing_pending(pull: &PullConsumer) {
    let info = pull.get_info().await.expect("consumer info");
    assert_eq!((info.num_ack_pending, info.num_pending), (0, 0));
}

/// The adapter on a consumer retrying after 700 ms (up to 5 s), no jitter.
async fn adapter() -> NatsConsumer<SqliteStore> {
    NatsConsumer::new(support::consumer(Duration::from_millis(700)).await)
}

/// A message whose ack was lost (the consumer processed it, then died) is
/// redelivered by JetStream after `ack_wait`: a replay, acked, the work run
/// once, nothing left pending. Also proves async-nats creates consumers and
/// acks on this server version.
#[tokio::test]
async fn redelivered_message_runs_the_work_once() {
    with_nats(QUICK_REDELIVERY, |fx, pull| async move {
        let nats = adapter().await;
        let runs = Runs::default();
        let first = fx
            .delivered(&pull, "evt_redelivered", br#"{"order":"ord_1"}"#)
            .await;
        // Processed, never acked: the consumer "died" before the ack.
        let p: P = nats
            .consumer()
            .process("evt_redelivered", &first.payload, runs.ok("ch_1"))
            .await;
        assert_eq!(p.cause, Cause::Succeeded);
        let again = next(&pull, Duration::from_secs(3))
            .await
            .expect("redelivery after ack_wait");
        assert_eq!(again.info().expect("info").delivered, 2);
        let p: P = nats.handle(&again, runs.ok("ch_2")).await.expect("handle");
        assert_replays(p, "ch_1");
        assert_eq!(runs.count(), 1);
        assert_nothing_pending(&pull).await;
        assert!(next(&pull, Duration::from_millis(1500)).await.is_none());
    })
    .await;
}

/// A transient failure is nak'd with the backoff delay: JetStream
/// redelivers it no earlier than that, and the work runs again, as a
/// recovery, then the message is acked.
#[tokio::test]
async fn transient_failure_is_redelivered_after_the_delay_and_runs_again() {
    with_nats(SLOW_REDELIVERY, |fx, pull| async move {
        let nats = adapter().await;
        let runs = Runs::default();
        let first = fx
            .delivered(&pull, "evt_transient", br#"{"order":"ord_2"}"#)
            .await;
        let p: P = nats
            .handle(&first, runs.transient("psp 503"))
            .await
            .expect("handle");
        let nakked = Instant::now();
        assert_retry(&p, Duration::from_millis(700));
        assert_eq!(p.cause, Cause::TransientFailure);
        let again = next(&pull, Duration::from_secs(3))
            .await
            .expect("redelivery after the nak delay");
        assert!(
            nakked.elapsed() >= Duration::from_millis(650),
            "redelivered after {:?}",
            nakked.elapsed()
        );
        let p: P = nats.handle(&again, runs.ok("ch_ok")).await.expect("handle");
        assert_acked(&p, Cause::Succeeded);
        assert_eq!((runs.count(), runs.recovered()), (2, 1));
        assert_nothing_pending(&pull).await;
    })
    .await;
}

/// A permanent failure under `ConsumerPermanentFailure::DeadLetter` reaches the DLQ
/// subject (with the reason header) and is `Term`ed: it never comes back.
#[tokio::test]
async fn permanent_failure_is_dead_lettered_and_termed() {
    with_nats(QUICK_REDELIVERY, |fx, pull| async move {
        let store = SqliteStore::memory().await.expect("sqlite");
        let js = fx.js.clone();
        let prefix = format!("{}.dlq", fx.prefix);
        let nats = NatsConsumer::new(dead_lettering(Idem::new(store))).dead_letter(move |d| {
            let (js, prefix) = (js.clone(), prefix.clone());
            async move { publish_dead_letter(js, &prefix, d).await }
        });
        let dlq_stream = fx.js.get_stream(&fx.stream).await.expect("stream");
        let dlq = dlq_stream
            .create_consumer(pull::Config {
                durable_name: Some("dlq-reader".to_owned()),
                filter_subject: format!("{}.dlq.>", fx.prefix),
                ..Default::default()
            })
            .await
            .expect("dlq consumer");
        let runs = Runs::default();
        let msg = fx
            .delivered(&pull, "evt_permanent", br#"{"order":"ord_3"}"#)
            .await;
        let p: P = nats
            .handle(&msg, runs.permanent("unknown account"))
            .await
            .expect("handle");
        assert_dead_lettered(&p, DeadLetterReason::PermanentFailure);
        assert!(
            next(&pull, Duration::from_millis(1500)).await.is_none(),
            "a termed message came back"
        );
        let dead = next(&dlq, Duration::from_secs(2))
            .await
            .expect("the DLQ copy");
        assert_eq!(&dead.payload[..], br#"{"order":"ord_3"}"#);
        let headers = dead.headers.clone().expect("headers");
        assert_eq!(
            headers
                .get(async_nats::header::NATS_MESSAGE_ID)
                .map(|v| v.as_str()),
            Some("dlq:evt_permanent")
        );
        assert_eq!(
            headers.get(REASON_HEADER).map(|v| v.as_str()),
            Some("permanent_failure")
        );
        assert_eq!(
            dead.subject.as_str(),
            format!("{}.dlq.{}.orders.created", fx.prefix, fx.prefix)
        );
        dead.double_ack().await.expect("ack the DLQ copy");
        assert_eq!(runs.count(), 1);
    })
    .await;
}

/// A producer that resends a message past the stream's duplicate window
/// (JetStream then stores it again): the second copy is a duplicate, acked
/// without running the work.
#[tokio::test]
async fn duplicate_past_the_publish_window_is_acked_without_running() {
    with_nats(SHORT_WINDOW, |fx, pull| async move {
        let nats = adapter().await;
        let runs = Runs::default();
        fx.publish(Some("evt_dup"), br#"{"order":"ord_4"}"#).await;
        tokio::time::sleep(Duration::from_millis(400)).await; // past the broker's window
        fx.publish(Some("evt_dup"), br#"{"order":"ord_4"}"#).await;
        let mut causes = Vec::new();
        for _ in 0..2 {
            let msg = next(&pull, Duration::from_secs(2))
                .await
                .expect("both copies are in the stream");
            let p: P = nats.handle(&msg, runs.ok("ch")).await.expect("handle");
            assert!(p.disposition.is_ack());
            causes.push(p.cause);
        }
        assert_eq!(causes, [Cause::Succeeded, Cause::Replayed]);
        assert_eq!(runs.count(), 1);
        assert_nothing_pending(&pull).await;
    })
    .await;
}

/// Without `Nats-Msg-Id` the key is `stream:sequence`: a redelivery of the
/// same stream message is a replay; another message with the same payload
/// is new work. A mismatch (same id, other payload) is termed, and a
/// dead-letter hook that fails naks instead, so nothing is lost.
#[tokio::test]
async fn sequence_keys_mismatches_and_a_failing_dead_letter_hook() {
    with_nats(SLOW_REDELIVERY, |fx, pull| async move {
        let core = backing_off(
            Idem::new(MemoryStore::new()),
            Duration::from_millis(300),
            Duration::from_secs(1),
        );
        let failing = NatsConsumer::new(core.clone())
            .dead_letter(|_| async { Err::<(), _>("DLQ unreachable".into()) });
        let nats = NatsConsumer::new(core);
        let runs = Runs::default();
        fx.publish(None, b"same bytes").await;
        fx.publish(None, b"same bytes").await;
        for _ in 0..2 {
            let msg = next(&pull, Duration::from_secs(2)).await.expect("message");
            let (key, _) = idem_consumer::nats::message_key(&msg).expect("key");
            assert!(key.starts_with(&format!("{}:", fx.stream)), "{key}");
            let p: P = nats.handle(&msg, runs.ok("ch")).await.expect("handle");
            assert_eq!(p.cause, Cause::Succeeded);
        }
        assert_eq!(runs.count(), 2);
        // Same Nats-Msg-Id, other payload: a producer bug.
        let msg = fx.delivered(&pull, "evt_mm", b"first").await;
        let _: P = nats.handle(&msg, runs.ok("ch")).await.expect("handle");
        let p: P = nats
            .consumer()
            .process("evt_mm", b"second", runs.ok("ch"))
            .await;
        assert_dead_lettered(&p, DeadLetterReason::FingerprintMismatch);
        // A payload that cannot be fingerprinted, with a DLQ hook that fails:
        // nak'd (with the backoff), redelivered, never lost.
        let msg = fx
            .delivered(&pull, "evt_dup_member", br#"{"a":1,"a":2}"#)
            .await;
        let p: P = failing.handle(&msg, runs.ok("ch")).await.expect("handle");
        assert_retry(&p, Duration::from_millis(300));
        assert_eq!(p.cause, Cause::InvalidMessage);
        let again = next(&pull, Duration::from_secs(2))
            .await
            .expect("redelivered after the failed hook");
        let p: P = nats.handle(&again, runs.ok("ch")).await.expect("handle");
        assert_dead_lettered(&p, DeadLetterReason::InvalidMessage);
        assert!(next(&pull, Duration::from_millis(1000)).await.is_none());
        assert_eq!(runs.count(), 3);
    })
    .await;
}

/// Long work: progress acks keep JetStream from redelivering past
/// `ack_wait`, and the idem lease is extended alongside.
#[tokio::test]
async fn progress_acks_hold_the_message_during_long_work() {
    with_nats(QUICK_REDELIVERY, |fx, pull| async move {
        let nats = adapter().await.progress_every(Duration::from_millis(300));
        let msg = fx
            .delivered(&pull, "evt_slow", br#"{"order":"ord_5"}"#)
            .await;
        // Another instance of the consumer pulls meanwhile: past ack_wait it
        // would get the message, unless the progress acks hold it.
        let other = pull.clone();
        let probe = tokio::spawn(async move { next(&other, Duration::from_millis(2200)).await });
        let p: P = nats
            .handle(&msg, |_| async {
                // Longer than ack_wait: without progress acks it would be redelivered.
                tokio::time::sleep(Duration::from_millis(2500)).await;
                Ok::<_, Failure<String>>("done".to_owned())
            })
            .await
            .expect("handle");
        assert_eq!(p.cause, Cause::Succeeded);
        let stolen = probe.await.expect("probe");
        assert!(
            stolen.is_none(),
            "redelivered to another instance during the work"
        );
        let info = pull.get_info().await.expect("consumer info");
        assert_eq!(info.num_redelivered, 0, "redelivered during the work");
        assert!(next(&pull, Duration::from_millis(1500)).await.is_none());
    })
    .await;
}

/// `run`: bounded concurrency over a pull consumer's message stream; 8
/// orders each published twice (the resends past the duplicate window) run
/// 8 times in all, never more than 3 at once, every message acked; the
/// shutdown waits for the messages in hand.
#[tokio::test]
async fn run_processes_a_stream_with_bounded_concurrency_and_stops_gracefully() {
    with_nats(SHORT_WINDOW, |fx, pull| async move {
        let nats = adapter().await;
        const IDS: [&str; 8] = ["o1", "o2", "o3", "o4", "o5", "o6", "o7", "o8"];
        let published = Instant::now();
        for id in IDS {
            fx.publish(Some(id), br#"{"order":"any"}"#).await;
        }
        let runs = Arc::new(AtomicUsize::new(0));
        let (now, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let messages = pull.messages().await.expect("message stream");
        let (r, n, pk) = (Arc::clone(&runs), Arc::clone(&now), Arc::clone(&peak));
        let runner = tokio::spawn(async move {
            nats.run(
                messages,
                3,
                async move {
                    let _ = stop_rx.await;
                },
                move |_, payload| {
                    let (r, n, pk) = (Arc::clone(&r), Arc::clone(&n), Arc::clone(&pk));
                    async move {
                        assert_eq!(&payload[..], br#"{"order":"any"}"#);
                        r.fetch_add(1, Ordering::SeqCst);
                        let in_flight = n.fetch_add(1, Ordering::SeqCst) + 1;
                        pk.fetch_max(in_flight, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        n.fetch_sub(1, Ordering::SeqCst);
                        Ok::<_, Failure<String>>("done".to_owned())
                    }
                },
            )
            .await
        });
        // The first copies all done, then the producer resends all 8 past the
        // broker's duplicate window (a resend of a message still in work
        // would be in flight: nak'd for the lease left).
        all_acked(&pull, 8).await;
        tokio::time::sleep(Duration::from_millis(400).saturating_sub(published.elapsed())).await;
        for id in IDS {
            fx.publish(Some(id), br#"{"order":"any"}"#).await;
        }
        all_acked(&pull, 16).await;
        stop_tx.send(()).expect("runner waiting");
        let handled = runner.await.expect("runner");
        assert_eq!(handled, 16);
        assert_eq!(runs.load(Ordering::SeqCst), 8);
        let peak = peak.load(Ordering::SeqCst);
        assert!((1..=3).contains(&peak), "peak concurrency {peak}");
    })
    .await;
}

/// Waits (up to 10 s) until the consumer has acked stream sequence `seq`
/// and everything before it.
async fn all_acked(pull: &PullConsumer, seq: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info = pull.get_info().await.expect("consumer info");
        if info.num_pending == 0
            && info.num_ack_pending == 0
            && info.ack_floor.stream_sequence == seq
        {
            return;
        }
        assert!(Instant::now() < deadline, "not all acked: {info:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Two instances of the consumer group and a slow handler: JetStream
/// redelivers the message to the second after `ack_wait`; it is nak'd for
/// about the lease left, and the work runs once.
#[tokio::test]
async fn second_instance_is_nakd_for_the_lease_left_while_the_first_works() {
    with_nats(QUICK_REDELIVERY, |fx, pull| async move {
        let store = SqliteStore::memory().await.expect("sqlite");
        let policy = idem_core::Policy::builder()
            .lease(Duration::from_secs(30))
            .build()
            .expect("policy");
        let core = builder(Idem::new(store).with_policy(policy))
            .build()
            .expect("consumer");
        let (a, b) = (NatsConsumer::new(core.clone()), NatsConsumer::new(core));
        let runs = Runs::default();
        let first = fx
            .delivered(&pull, "evt_slow_dup", br#"{"order":"ord_6"}"#)
            .await;
        let (r, release) = (runs.clone(), Arc::new(tokio::sync::Notify::new()));
        let go = Arc::clone(&release);
        let slow = tokio::spawn(async move {
            let p: P = a
                .handle(&first, move |attempt| async move {
                    r.record(&attempt);
                    go.notified().await;
                    Ok::<_, Failure<String>>("ch_slow".to_owned())
                })
                .await
                .expect("handle");
            p
        });
        let again = next(&pull, Duration::from_secs(3))
            .await
            .expect("redelivery to the second instance");
        let p: P = b.handle(&again, runs.ok("ch_dup")).await.expect("handle");
        assert_eq!(p.cause, Cause::InFlight);
        let after = p.disposition.retry_after().expect("a retry");
        assert!(
            after >= Duration::from_secs(27) && after <= Duration::from_secs(30),
            "nak'd for {after:?}"
        );
        release.notify_one();
        assert_eq!(slow.await.expect("slow").cause, Cause::Succeeded);
        assert_eq!(runs.count(), 1);
    })
    .await;
}

/// The store down at the claim: the message is nak'd with the backoff and
/// redelivered; once the store is back, it runs.
#[tokio::test]
async fn store_down_naks_then_the_redelivery_runs() {
    with_nats(SLOW_REDELIVERY, |fx, pull| async move {
        let failing = idem_core::testkit::FailingStore::new(Arc::new(MemoryStore::new()));
        let nats = NatsConsumer::new(backing_off(
            Idem::new(failing.clone()),
            Duration::from_millis(300),
            Duration::from_secs(1),
        ));
        let runs = Runs::default();
        let msg = fx
            .delivered(&pull, "evt_store_down", br#"{"order":"ord_7"}"#)
            .await;
        failing.fail_all(true);
        let p: P = nats.handle(&msg, runs.ok("ch")).await.expect("handle");
        assert_eq!(p.cause, Cause::StoreUnavailable);
        assert_retry(&p, Duration::from_millis(300));
        failing.fail_all(false);
        let again = next(&pull, Duration::from_secs(2))
            .await
            .expect("redelivery");
        let p: P = nats.handle(&again, runs.ok("ch")).await.expect("handle");
        assert_eq!(p.cause, Cause::Succeeded);
        assert_eq!(runs.count(), 1);
    })
    .await;
}
