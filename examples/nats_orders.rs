//! A NATS JetStream consumer that writes each order to a ledger once,
//! whatever JetStream redelivers, and survives a crash mid-work.
//!
//! Run with: `cargo run --example nats_orders --features nats,sqlite`
//!
//! Environment:
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `IDEM_NATS_URL` | `nats://127.0.0.1:4222` | the NATS server (JetStream enabled) |
//! | `IDEM_NATS_STREAM` | `ORDERS` | the stream, subject `orders.>`, created if missing (an existing stream is used as it is, with its own subjects) |
//! | `IDEM_SQLITE_PATH` | `idem-nats-orders.db` in the temp dir | idem's records, the `ledger` and the `dead_letters` tables |
//! | `IDEM_LEASE_MS` | 60 s | idem's lease, also the durable consumer's `ack_wait` when it is created |
//!
//! The durable pull consumer is `nats-orders` (at most 10 deliveries per
//! message); idem's scope is owner `nats-orders`, operation `ledger`. Each
//! message prints one line:
//!
//! ```text
//! acked <id> attempt <n> <how>  acknowledged; <how> says what this delivery did:
//!                               `executed` (the work ran), `replayed` (it had run:
//!                               the stored outcome, nothing ran) or `recovered` (it
//!                               ran again after an attempt that died, and found that
//!                               attempt's ledger row instead of writing a second one)
//! retry <id> after <ms>         nak'd: JetStream delivers it again after <ms>
//! dead-letter <id> <reason>     terminated, and kept in the `dead_letters` table (a row per
//!                               dead-lettered delivery: none is overwritten)
//! ```
//!
//! `<n>` is the attempt whose outcome is acknowledged (on a replay, the one
//! that ran).
//!
//! `<id>` is the message's `Nats-Msg-Id` header, else `STREAM:sequence`.
//!
//! What JetStream does before idem sees a message, and what to do about it:
//!
//! - **A duplicate `Nats-Msg-Id` inside the stream's duplicate window (2
//!   minutes unless the stream sets `duplicate_window`) is dropped at
//!   publish**: the publisher's ack says `duplicate`, and no delivery
//!   reaches this consumer. So idem's replay and `fingerprint_mismatch` only
//!   show for a copy published after that window, or when the stream's window
//!   is shorter (this example's tests create their stream with a short one).
//!   JetStream's window is what stops a publisher's retry; idem is what
//!   stops a redelivery, a late copy and a second payload under one id.
//! - **`IDEM_LEASE_MS` sets `ack_wait` only when the durable consumer is
//!   first created.** An existing `nats-orders` consumer keeps its own
//!   `ack_wait`: after changing the lease, delete the consumer (`nats
//!   consumer rm <stream> nats-orders`) so that the next start creates it
//!   again, or update it to match (an `ack_wait` shorter than the lease
//!   makes JetStream redeliver messages that idem then answers `retry`).
//! - **Another `IDEM_NATS_STREAM` over the same subjects fails to start with
//!   "subjects overlap"**: a subject belongs to one stream. Use the stream
//!   that already has `orders.>` (it is used as it is), or delete it first.
//!
//! SIGTERM (or Ctrl-C) stops the consumer: the messages in hand finish and
//! are acknowledged first.
//!
//! The work reads the payload as JSON and, by its `type`:
//! `test.transient` fails transiently on its first two deliveries (two
//! `retry` lines, then `acked … attempt 3`); `test.permanent` fails
//! permanently (`dead-letter <id> permanent_failure`); anything else is an
//! order: one row is inserted in `ledger`, keyed by the attempt's
//! downstream key, and `test.slow` then takes 2 s more. A payload that is not
//! JSON fails permanently; one that names a JSON member twice is
//! `dead-letter <id> invalid_message`; the same id with another payload is
//! `dead-letter <id> fingerprint_mismatch`.
//!
//! The downstream key is the same on every attempt of a message. So when the
//! process dies after the ledger row is written but before idem stores the
//! outcome (kill it during a `test.slow`), the redelivery after the lease
//! runs as a recovery: the insert finds the row, `recoveries` goes to 1, and
//! the ledger still holds one effect:
//!
//! ```text
//! sqlite3 "$IDEM_SQLITE_PATH" 'SELECT message_id, attempt, recoveries FROM ledger'
//! ```

#[path = "support/ledger.rs"]
mod ledger;

use std::error::Error;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull};
use futures_util::StreamExt;
use idem::consumer::nats::{DeadLetter, NatsConsumer, message_key};
use idem::consumer::{Consumer, ConsumerPermanentFailure, Processed};
use idem::sqlite::SqliteStore;
use idem::sqlite::sqlx::SqlitePool;
use idem::{Idem, Policy};
use ledger::{Work, create_tables, stop};

type BoxError = Box<dyn Error + Send + Sync>;

/// The durable consumer's name, and idem's owner (the consumer group).
const GROUP: &str = "nats-orders";

/// At most this many messages are worked on at once.
const CONCURRENCY: usize = 8;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = std::env::var("IDEM_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
    let stream_name = std::env::var("IDEM_NATS_STREAM").unwrap_or_else(|_| "ORDERS".to_owned());
    let path = match std::env::var("IDEM_SQLITE_PATH") {
        Ok(p) => PathBuf::from(p),
        // A fixed name, not one per process: a restart must find the records
        // and the ledger of the run that crashed.
        Err(_) => std::env::temp_dir().join("idem-nats-orders.db"),
    };
    let mut policy = Policy::builder();
    if let Ok(ms) = std::env::var("IDEM_LEASE_MS") {
        let ms: u64 = ms.parse().map_err(|e| format!("IDEM_LEASE_MS: {e}"))?;
        policy = policy.lease(Duration::from_millis(ms));
    }
    let policy = policy.build()?;
    let lease = policy.lease();

    // idem's records and the ledger share one SQLite file (and one pool).
    let store = SqliteStore::open(&path).await?;
    let pool = store.pool().clone();
    create_tables(&pool).await?;
    println!("store: sqlite {}", path.display());

    let client = async_nats::connect(&url)
        .await
        .map_err(|e| format!("IDEM_NATS_URL={url}: {e} (is nats-server -js running?)"))?;
    let js = jetstream::new(client);
    let stream = js
        .get_or_create_stream(jetstream::stream::Config {
            name: stream_name.clone(),
            subjects: vec!["orders.>".to_owned()],
            ..Default::default()
        })
        .await
        .map_err(|e| format!("stream {stream_name}: {e}"))?;
    let pull = stream
        .get_or_create_consumer(
            GROUP,
            pull::Config {
                durable_name: Some(GROUP.to_owned()),
                // JetStream redelivers an unacknowledged message after the
                // lease, when idem lets another delivery take it over.
                ack_wait: lease,
                max_deliver: 10,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| format!("consumer {GROUP} on {stream_name}: {e}"))?;

    let consumer = Consumer::builder(Idem::new(store).with_policy(policy))
        .owner(GROUP)
        .operation("ledger")
        // An order the work refuses goes to `dead_letters`, not just acked.
        .permanent_failure(ConsumerPermanentFailure::DeadLetter)
        .build()?;
    let dlq = pool.clone();
    let nats = NatsConsumer::new(consumer)
        // Long work keeps both JetStream's ack_wait and idem's lease alive.
        .progress_every(lease / 3)
        .dead_letter(move |d| keep_dead_letter(dlq.clone(), d));

    let mut messages = pull.messages().await?;
    // The subjects the stream really has: `orders.>` when this created it,
    // its own when it existed already (it is used as it is).
    let subjects = stream.cached_info().config.subjects.join(", ");
    println!("consuming stream {stream_name} ({subjects}) as {GROUP} from {url}");

    let slots = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    let mut tasks = tokio::task::JoinSet::new();
    let shutdown = stop();
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            () = &mut shutdown => break,
            permit = Arc::clone(&slots).acquire_owned() => permit?,
        };
        let next = tokio::select! {
            () = &mut shutdown => break,
            next = messages.next() => next,
        };
        let msg = match next {
            None => break,
            Some(Err(e)) => {
                eprintln!("message stream: {e}");
                continue;
            }
            Some(Ok(msg)) => msg,
        };
        let (nats, pool) = (nats.clone(), pool.clone());
        tasks.spawn(async move {
            let _slot = permit;
            handle(&nats, &pool, &msg).await;
        });
        while tasks.try_join_next().is_some() {}
    }
    // A graceful stop: the messages in hand finish and are acknowledged.
    while tasks.join_next().await.is_some() {}
    println!("stopped");
    Ok(())
}

/// Processes one message and prints its line.
async fn handle(nats: &NatsConsumer<SqliteStore>, pool: &SqlitePool, msg: &jetstream::Message) {
    let (id, delivered) = match message_key(msg) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("skipped: {e}");
            return;
        }
    };
    let (pool, payload, key) = (pool.clone(), msg.payload.clone(), id.clone());
    let work = Work::default();
    let run = work.clone();
    let result: Result<Processed<String, String>, _> = nats
        .handle(msg, move |attempt| async move {
            run.apply(pool, attempt, key, payload.to_vec(), delivered)
                .await
        })
        .await;
    match result {
        Ok(p) => println!("{}", work.line(&id, &p)),
        // Processed, but the acknowledgement failed: JetStream redelivers
        // after ack_wait, and the redelivery is a replay.
        Err(e) => eprintln!("{id}: {e}"),
    }
}

/// The dead-letter hook: keeps the delivery in the `dead_letters` table, a
/// row per dead-lettered delivery (a failure here naks the message instead,
/// so it is never lost).
async fn keep_dead_letter(pool: SqlitePool, d: DeadLetter) -> Result<(), BoxError> {
    let reason = d.reason.as_str();
    ledger::keep_dead_letter(&pool, &d.message_id, &d.subject, reason, &d.payload).await?;
    Ok(())
}
