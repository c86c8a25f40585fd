//! The RabbitMQ adapter against the real broker (`IDEM_AMQP_URL`, default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`): each test declares its own
//! queue, dead-letter exchange and dead-letter queue, and deletes them at the
//! end. Redelivery delays are the broker's real time (≤ 1 s).

mod support;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use idem_consumer::rabbitmq::RabbitConsumer;
use idem_consumer::{Cause, DeadLetterReason, Disposition};
use idem_core::{Idem, IdempotencyKey, MemoryStore};
use lapin::message::Delivery;
use lapin::options::{
    BasicConsumeOptions, BasicGetOptions, BasicPublishOptions, BasicQosOptions,
    ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use support::{
    P, Runs, assert_acked, assert_dead_lettered, assert_replays, assert_retry, dead_lettering,
};

fn url() -> String {
    std::env::var("IDEM_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// One test's queue `q`, its dead-letter exchange `dlx` and queue `dlq`.
struct Fixture {
    conn: Connection,
    channel: Channel,
    q: String,
    dlx: String,
    dlq: String,
}

impl Fixture {
    async fn new() -> Self {
        let conn = Connection::connect(&url(), ConnectionProperties::default())
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "cannot reach RabbitMQ at {}: {e}. Start it (Debian package rabbitmq-server) \
                     or point IDEM_AMQP_URL at a broker",
                    url()
                )
            });
        let channel = conn.create_channel().await.expect("channel");
        let id = IdempotencyKey::random();
        let q = format!("idemtest.{}", id.as_str());
        let (dlx, dlq) = (format!("{q}.dlx"), format!("{q}.dlq"));
        channel
            .exchange_declare(
                dlx.as_str().into(),
                ExchangeKind::Fanout,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("declare the dead-letter exchange");
        channel
            .queue_declare(
                dlq.as_str().into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("declare the dead-letter queue");
        channel
            .queue_bind(
                dlq.as_str().into(),
                dlx.as_str().into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("bind the dead-letter queue");
        let mut args = FieldTable::default();
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(dlx.as_str().into()),
        );
        channel
            .queue_declare(q.as_str().into(), QueueDeclareOptions::default(), args)
            .await
            .expect("declare the queue");
        Self {
            conn,
            channel,
            q,
            dlx,
            dlq,
        }
    }

    async fn publish(&self, message_id: Option<&str>, headers: FieldTable, payload: &[u8]) {
        let mut props = BasicProperties::default().with_headers(headers);
        if let Some(id) = message_id {
            props = props.with_message_id(id.into());
        }
        self.channel
            .basic_publish(
                "".into(),
                self.q.as_str().into(),
                BasicPublishOptions::default(),
                payload,
                props,
            )
            .await
            .expect("publish")
            .await
            .expect("publish confirm");
    }

    /// A consumer on its own channel (prefetch 10), manual acks.
    async fn subscribe(&self) -> (Channel, lapin::Consumer) {
        let ch = self.conn.create_channel().await.expect("channel");
        ch.basic_qos(10, BasicQosOptions::default())
            .await
            .expect("qos");
        let consumer = ch
            .basic_consume(
                self.q.as_str().into(),
                ShortString::from(format!("c-{}", IdempotencyKey::random().as_str())),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("consume");
        (ch, consumer)
    }

    /// Messages left in a queue.
    async fn count(&self, queue: &str) -> u32 {
        self.channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("passive declare")
            .message_count()
    }

    /// Publishes `payload` with `message_id` `id`.
    async fn publish_id(&self, id: &str, payload: &[u8]) {
        self.publish(Some(id), FieldTable::default(), payload).await;
    }
}

impl support::Fixture for Fixture {
    async fn teardown(&self) {
        for q in [&self.q, &self.dlq] {
            self.channel
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await
                .expect("delete queue");
        }
        self.channel
            .exchange_delete(self.dlx.as_str().into(), ExchangeDeleteOptions::default())
            .await
            .expect("delete the dead-letter exchange");
        let _ = self.conn.close(200, "bye".into()).await;
    }
}

/// Runs `scenario` and deletes the queues even when it fails.
async fn with_rabbit<F, Fut>(scenario: F)
where
    F: FnOnce(Arc<Fixture>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    support::with_fixture(Fixture::new().await, scenario).await;
}

async fn next(c: &mut lapin::Consumer, wait: Duration) -> Option<Delivery> {
    tokio::time::timeout(wait, c.next())
        .await
        .ok()
        .flatten()
        .map(|d| d.expect("delivery"))
}

/// The next delivery on `c`, which must come within 2 s (`what` it is).
async fn delivery(c: &mut lapin::Consumer, what: &str) -> Delivery {
    next(c, Duration::from_secs(2)).await.expect(what)
}

/// The adapter on a consumer retrying after 600 ms (up to 5 s), no jitter.
async fn adapter() -> RabbitConsumer<idem_sqlite::SqliteStore> {
    RabbitConsumer::new(support::consumer(Duration::from_millis(600)).await)
}

/// A consumer that processed a message and died before acking it (its
/// channel closed): RabbitMQ redelivers it to another consumer, whose
/// handle is a replay, acked; the work ran once and the queue is empty.
#[tokio::test]
async fn redelivered_message_runs_the_work_once() {
    with_rabbit(|fx| async move {
        let rabbit = adapter().await;
        let runs = Runs::default();
        fx.publish_id("evt_redelivered", br#"{"order":"ord_1"}"#)
            .await;
        let (dying, mut first) = fx.subscribe().await;
        let d = delivery(&mut first, "delivery").await;
        let p: P = rabbit
            .consumer()
            .process("evt_redelivered", &d.data, runs.ok("ch_1"))
            .await;
        assert_eq!(p.cause, Cause::Succeeded);
        dying
            .close(200, "died before the ack".into())
            .await
            .expect("close");
        let (_ch, mut second) = fx.subscribe().await;
        let again = delivery(&mut second, "redelivery").await;
        assert!(again.redelivered);
        let p: P = rabbit
            .handle(&again, runs.ok("ch_2"))
            .await
            .expect("handle");
        assert_replays(p, "ch_1");
        assert_eq!(runs.count(), 1);
        assert!(
            next(&mut second, Duration::from_millis(500))
                .await
                .is_none()
        );
        assert_eq!(fx.count(&fx.q).await, 0);
    })
    .await;
}

/// A transient failure is nack'd with requeue after the backoff: the
/// redelivery comes no earlier, and the work runs again as a recovery.
#[tokio::test]
async fn transient_failure_is_requeued_after_the_delay_and_runs_again() {
    with_rabbit(|fx| async move {
        let rabbit = adapter().await;
        let runs = Runs::default();
        fx.publish_id("evt_transient", br#"{"order":"ord_2"}"#)
            .await;
        let (_ch, mut sub) = fx.subscribe().await;
        let d = delivery(&mut sub, "delivery").await;
        let handled = Instant::now();
        let p: P = rabbit
            .handle(&d, runs.transient("psp 503"))
            .await
            .expect("handle");
        assert_retry(&p, Duration::from_millis(600));
        let again = next(&mut sub, Duration::from_secs(3))
            .await
            .expect("requeued");
        assert!(
            handled.elapsed() >= Duration::from_millis(550),
            "after {:?}",
            handled.elapsed()
        );
        assert!(again.redelivered);
        let p: P = rabbit
            .handle(&again, runs.ok("ch_ok"))
            .await
            .expect("handle");
        assert_acked(&p, Cause::Succeeded);
        assert_eq!((runs.count(), runs.recovered()), (2, 1));
    })
    .await;
}

/// A permanent failure under `ConsumerPermanentFailure::DeadLetter` is rejected
/// without requeue: the dead-letter exchange routes it to the DLQ, and it
/// never comes back. A message without any key goes there too.
#[tokio::test]
async fn permanent_failure_and_keyless_messages_reach_the_dead_letter_queue() {
    with_rabbit(|fx| async move {
        let rabbit = RabbitConsumer::new(dead_lettering(Idem::new(MemoryStore::new())));
        let runs = Runs::default();
        fx.publish_id("evt_permanent", br#"{"order":"ord_3"}"#)
            .await;
        fx.publish(None, FieldTable::default(), b"no id at all")
            .await;
        let (_ch, mut sub) = fx.subscribe().await;
        let d = delivery(&mut sub, "delivery").await;
        let p: P = rabbit
            .handle(&d, runs.permanent("unknown account"))
            .await
            .expect("handle");
        assert_dead_lettered(&p, DeadLetterReason::PermanentFailure);
        let d = delivery(&mut sub, "keyless delivery").await;
        let p: P = rabbit.handle(&d, runs.ok("x")).await.expect("handle");
        assert_eq!(
            (p.disposition, p.cause),
            (
                Disposition::DeadLetter {
                    reason: DeadLetterReason::InvalidMessage
                },
                Cause::InvalidMessage
            )
        );
        assert!(next(&mut sub, Duration::from_millis(700)).await.is_none());
        let mut dead = Vec::new();
        for _ in 0..20 {
            match fx
                .channel
                .basic_get(fx.dlq.as_str().into(), BasicGetOptions { no_ack: true })
                .await
                .expect("basic.get")
            {
                Some(m) => dead.push(m.delivery.data.clone()),
                None if dead.len() == 2 => break,
                None => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        assert_eq!(
            dead,
            vec![br#"{"order":"ord_3"}"#.to_vec(), b"no id at all".to_vec()]
        );
        assert_eq!(runs.count(), 1);
    })
    .await;
}

/// The same message published twice (a producer's retry) is processed
/// once: the copy is acked as a replay. A key header stands in for a
/// missing `message_id`.
#[tokio::test]
async fn duplicates_are_acked_without_running() {
    with_rabbit(|fx| async move {
        let rabbit = adapter().await.key_header("event-id");
        let runs = Runs::default();
        let mut headers = FieldTable::default();
        headers.insert(
            "event-id".into(),
            AMQPValue::LongString(LongString::from("evt_by_header")),
        );
        for _ in 0..2 {
            fx.publish_id("evt_dup", br#"{"order":"ord_4"}"#).await;
            fx.publish(None, headers.clone(), br#"{"order":"ord_5"}"#)
                .await;
        }
        let (_ch, mut sub) = fx.subscribe().await;
        let mut causes = Vec::new();
        for _ in 0..4 {
            let d = delivery(&mut sub, "delivery").await;
            let p: P = rabbit.handle(&d, runs.ok("ch")).await.expect("handle");
            assert!(p.disposition.is_ack());
            causes.push(p.cause);
        }
        assert_eq!(
            causes,
            [
                Cause::Succeeded,
                Cause::Succeeded,
                Cause::Replayed,
                Cause::Replayed
            ]
        );
        assert_eq!(runs.count(), 2);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(fx.count(&fx.q).await, 0);
    })
    .await;
}
