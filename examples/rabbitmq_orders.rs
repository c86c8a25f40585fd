//! A RabbitMQ consumer that writes each order to a ledger once, whatever
//! RabbitMQ redelivers, and survives a crash mid-work: `nats_orders` for
//! RabbitMQ, with the same lines and the same ledger.
//!
//! Run with: `cargo run --example rabbitmq_orders --features rabbitmq,sqlite`
//!
//! Environment:
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `IDEM_AMQP_URL` | `amqp://guest:guest@127.0.0.1:5672/%2f` | the broker |
//! | `IDEM_RABBITMQ_QUEUE` | `orders` | the queue consumed, declared (durable) if missing |
//! | `IDEM_SQLITE_PATH` | `idem-rabbitmq-orders.db` in the working directory | idem's records, the `ledger` and the `dead_letters` tables |
//! | `IDEM_LEASE_MS` | 60 s | idem's lease |
//!
//! It declares what it needs, so that nothing is set up by hand: the
//! queue `<queue>` with `x-dead-letter-exchange = <queue>.dlx`, the fanout
//! exchange `<queue>.dlx`, and the queue `<queue>.dead` bound to it, where
//! every dead-lettered message ends (RabbitMQ keeps it there; the
//! `dead_letters` table keeps a row per dead-lettered delivery too). An
//! existing queue must have been declared with the same arguments
//! (RabbitMQ refuses a redeclaration that differs: `PRECONDITION_FAILED`);
//! delete it or choose another `IDEM_RABBITMQ_QUEUE`.
//!
//! The message's key is its `message_id` property (publish with one: a
//! message without it cannot be deduplicated and is dead-lettered as
//! `invalid_message`); idem's scope is owner `rabbitmq-orders`, operation
//! `ledger`. Each message prints one line:
//!
//! ```text
//! acked <id> attempt <n> <how>  acknowledged; <how> says what this delivery did:
//!                               `executed` (the work ran), `replayed` (it had run:
//!                               the stored outcome, nothing ran) or `recovered` (it
//!                               ran again after an attempt that died, and found that
//!                               attempt's ledger row instead of writing a second one)
//! retry <id> after <ms>         nack'd with requeue after <ms> (held until then)
//! dead-letter <id> <reason>     rejected to <queue>.dlx, kept in <queue>.dead and in
//!                               the `dead_letters` table
//! ```
//!
//! SIGTERM (or Ctrl-C) stops the consumer: the messages in hand finish and
//! are acknowledged first, then it prints `stopped`.
//!
//! The work is `nats_orders`'s: by the payload's JSON `type`,
//! `test.transient` fails transiently on its first two attempts,
//! `test.permanent` fails permanently, `test.slow` takes 2 s after writing
//! its ledger row, anything else is an order (one `ledger` row under the
//! attempt's downstream key). Unlike JetStream, RabbitMQ does not drop a
//! message published twice under one `message_id`: the second is a
//! delivery, which idem answers (`acked … replayed`, or `dead-letter …
//! fingerprint_mismatch` for another payload).

#[path = "support/ledger.rs"]
mod ledger;

use std::error::Error;
use std::path::PathBuf;
use std::time::Duration;

use futures_util::StreamExt;
use idem::consumer::rabbitmq::RabbitConsumer;
use idem::consumer::rabbitmq::lapin::message::Delivery;
use idem::consumer::rabbitmq::lapin::options::{
    BasicConsumeOptions, BasicQosOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use idem::consumer::rabbitmq::lapin::types::{AMQPValue, FieldTable};
use idem::consumer::rabbitmq::lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use idem::consumer::{Consumer, ConsumerPermanentFailure, Disposition, Processed};
use idem::sqlite::SqliteStore;
use idem::sqlite::sqlx::SqlitePool;
use idem::{Idem, Policy};
use ledger::{Work, create_tables, stop};

type BoxError = Box<dyn Error + Send + Sync>;

/// idem's owner (the consumer group) and the consumer tag's prefix.
const GROUP: &str = "rabbitmq-orders";

/// At most this many messages are worked on at once (the channel's prefetch).
const CONCURRENCY: u16 = 8;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("IDEM_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let queue = std::env::var("IDEM_RABBITMQ_QUEUE").unwrap_or_else(|_| "orders".to_owned());
    let path = PathBuf::from(
        std::env::var("IDEM_SQLITE_PATH").unwrap_or_else(|_| "idem-rabbitmq-orders.db".to_owned()),
    );
    let mut policy = Policy::builder();
    if let Ok(ms) = std::env::var("IDEM_LEASE_MS") {
        let ms: u64 = ms.parse().map_err(|e| format!("IDEM_LEASE_MS: {e}"))?;
        policy = policy.lease(Duration::from_millis(ms));
    }
    let policy = policy.build()?;

    // idem's records and the ledger share one SQLite file (and one pool).
    let store = SqliteStore::open(&path).await?;
    let pool = store.pool().clone();
    create_tables(&pool).await?;
    let shown = std::path::absolute(&path).unwrap_or(path);
    println!("store: sqlite {}", shown.display());

    let conn = Connection::connect(&url, ConnectionProperties::default())
        .await
        .map_err(|e| format!("IDEM_AMQP_URL={url}: {e} (is rabbitmq-server running?)"))?;
    let channel = conn.create_channel().await?;
    let dead = declare(&channel, &queue).await?;
    channel
        .basic_qos(CONCURRENCY, BasicQosOptions::default())
        .await?;
    let mut deliveries = channel
        .basic_consume(
            queue.as_str().into(),
            format!("{GROUP}-{}", std::process::id()).into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;

    let consumer = Consumer::builder(Idem::new(store).with_policy(policy))
        .owner(GROUP)
        .operation("ledger")
        // An order the work refuses is dead-lettered, not just acked.
        .permanent_failure(ConsumerPermanentFailure::DeadLetter)
        .build()?;
    let rabbit = RabbitConsumer::new(consumer);
    println!("consuming queue {queue} (dead letters: {dead}) as {GROUP} from {url}");

    let mut tasks = tokio::task::JoinSet::new();
    let shutdown = stop();
    tokio::pin!(shutdown);
    loop {
        let next = tokio::select! {
            () = &mut shutdown => break,
            next = deliveries.next() => next,
        };
        let delivery = match next {
            None => break,
            Some(Err(e)) => {
                eprintln!("deliveries: {e}");
                break;
            }
            Some(Ok(delivery)) => delivery,
        };
        let (rabbit, pool) = (rabbit.clone(), pool.clone());
        tasks.spawn(async move { handle(&rabbit, &pool, &delivery).await });
        while tasks.try_join_next().is_some() {}
    }
    // A graceful stop: the messages in hand finish and are acknowledged.
    while tasks.join_next().await.is_some() {}
    println!("stopped");
    Ok(())
}

/// Declares the dead-letter exchange and queue, and the queue itself with
/// its dead-letter exchange; returns the dead-letter queue's name.
async fn declare(channel: &Channel, queue: &str) -> Result<String, BoxError> {
    let (dlx, dead) = (format!("{queue}.dlx"), format!("{queue}.dead"));
    let durable = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .exchange_declare(
            dlx.as_str().into(),
            ExchangeKind::Fanout,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(|e| format!("exchange {dlx}: {e}"))?;
    channel
        .queue_declare(dead.as_str().into(), durable, FieldTable::default())
        .await
        .map_err(|e| format!("queue {dead}: {e}"))?;
    channel
        .queue_bind(
            dead.as_str().into(),
            dlx.as_str().into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| format!("binding {dead} to {dlx}: {e}"))?;
    let mut args = FieldTable::default();
    args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString(dlx.as_str().into()),
    );
    channel
        .queue_declare(queue.into(), durable, args)
        .await
        .map_err(|e| format!("queue {queue}: {e} (declared before with other arguments?)"))?;
    Ok(dead)
}

/// Processes one delivery and prints its line.
async fn handle(rabbit: &RabbitConsumer<SqliteStore>, pool: &SqlitePool, delivery: &Delivery) {
    let id = rabbit
        .message_key(delivery)
        .unwrap_or_else(|| format!("{}:{}", delivery.routing_key, delivery.delivery_tag));
    let (run_pool, payload, key) = (pool.clone(), delivery.data.clone(), id.clone());
    let work = Work::default();
    let run = work.clone();
    let result: Result<Processed<String, String>, _> = rabbit
        .handle(delivery, move |attempt| async move {
            // RabbitMQ's redelivery count is not reliable on classic queues;
            // the attempt number counts the runs idem allowed.
            let delivered = attempt.number();
            run.apply(run_pool, attempt, key, payload, delivered).await
        })
        .await;
    match result {
        Ok(p) => {
            if let Disposition::DeadLetter { reason } = &p.disposition {
                let subject = delivery.routing_key.as_str();
                let kept =
                    ledger::keep_dead_letter(pool, &id, subject, reason.as_str(), &delivery.data);
                if let Err(e) = kept.await {
                    // It is in the dead-letter queue all the same.
                    eprintln!("{id}: dead_letters: {e}");
                }
            }
            println!("{}", work.line(&id, &p));
        }
        // Processed, but the ack or reject failed: RabbitMQ redelivers when
        // the channel closes, and the redelivery is a replay.
        Err(e) => eprintln!("{id}: {e}"),
    }
}
