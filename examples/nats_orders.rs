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
//! acked <id> attempt <n>       the work ran (or had run: a replay) and the message is acknowledged
//! retry <id> after <ms>        nak'd: JetStream delivers it again after <ms>
//! dead-letter <id> <reason>    terminated, and kept in the `dead_letters` table
//! ```
//!
//! `<id>` is the message's `Nats-Msg-Id` header, else `STREAM:sequence`.
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

use std::error::Error;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull};
use futures_util::StreamExt;
use idem::consumer::nats::{DeadLetter, NatsConsumer, message_key};
use idem::consumer::{Consumer, ConsumerPermanentFailure, Disposition, Processed};
use idem::sqlite::SqliteStore;
use idem::sqlite::sqlx::{self, SqlitePool};
use idem::{Attempt, Failure, Idem, Policy};
use serde_json::Value;

type BoxError = Box<dyn Error + Send + Sync>;

/// The durable consumer's name, and idem's owner (the consumer group).
const GROUP: &str = "nats-orders";

/// At most this many messages are worked on at once.
const CONCURRENCY: usize = 8;

const SCHEMA: [&str; 2] = [
    "CREATE TABLE IF NOT EXISTS ledger (
        downstream_key TEXT PRIMARY KEY,
        message_id TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        payload BLOB NOT NULL,
        recoveries INTEGER NOT NULL DEFAULT 0,
        applied_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP
    )",
    "CREATE TABLE IF NOT EXISTS dead_letters (
        message_id TEXT PRIMARY KEY,
        subject TEXT NOT NULL,
        reason TEXT NOT NULL,
        payload BLOB NOT NULL,
        at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP
    )",
];

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
    for ddl in SCHEMA {
        sqlx::query(ddl).execute(&pool).await?;
    }
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
    let result: Result<Processed<String, String>, _> = nats
        .handle(msg, move |attempt| {
            apply(pool, attempt, key, payload.to_vec(), delivered)
        })
        .await;
    match result {
        Ok(p) => match p.disposition {
            Disposition::Ack => println!("acked {id} attempt {}", p.attempt),
            Disposition::Retry { after } => println!("retry {id} after {}", after.as_millis()),
            Disposition::DeadLetter { reason } => println!("dead-letter {id} {}", reason.as_str()),
            other => println!("{other:?} {id}"),
        },
        // Processed, but the acknowledgement failed: JetStream redelivers
        // after ack_wait, and the redelivery is a replay.
        Err(e) => eprintln!("{id}: {e}"),
    }
}

/// The work: the order's one effect, a ledger row under the attempt's
/// downstream key (the same on every attempt of this message).
async fn apply(
    pool: SqlitePool,
    attempt: Attempt,
    id: String,
    payload: Vec<u8>,
    delivered: u32,
) -> Result<String, Failure<String>> {
    let order: Value = serde_json::from_slice(&payload)
        .map_err(|e| Failure::permanent(format!("not JSON: {e}")))?;
    let kind = order.get("type").and_then(Value::as_str).unwrap_or("");
    match kind {
        "test.permanent" => return Err(Failure::permanent("test.permanent".to_owned())),
        "test.transient" if delivered <= 2 => {
            return Err(Failure::transient(format!(
                "test.transient, delivery {delivered}"
            )));
        }
        _ => {}
    }
    let key = attempt.downstream_key("ledger", 1);
    let inserted = sqlx::query(
        "INSERT INTO ledger (downstream_key, message_id, attempt, payload) VALUES (?, ?, ?, ?)
         ON CONFLICT (downstream_key) DO NOTHING",
    )
    .bind(&key)
    .bind(&id)
    .bind(attempt.number())
    .bind(&payload)
    .execute(&pool)
    .await
    .map_err(|e| Failure::transient(format!("ledger: {e}")))?
    .rows_affected()
        == 1;
    if !inserted {
        // An earlier attempt wrote the row and died before idem stored its
        // outcome: this run reconciles (counts the recovery), it does not
        // apply the order a second time.
        sqlx::query("UPDATE ledger SET recoveries = recoveries + 1 WHERE downstream_key = ?")
            .bind(&key)
            .execute(&pool)
            .await
            .map_err(|e| Failure::transient(format!("ledger: {e}")))?;
    }
    if kind == "test.slow" {
        // The window in which a crash leaves the effect without an outcome.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    Ok(key)
}

/// The dead-letter hook: keeps the message in the `dead_letters` table (a
/// failure here naks the message instead, so it is never lost).
async fn keep_dead_letter(pool: SqlitePool, d: DeadLetter) -> Result<(), BoxError> {
    sqlx::query(
        "INSERT INTO dead_letters (message_id, subject, reason, payload) VALUES (?, ?, ?, ?)
         ON CONFLICT (message_id) DO NOTHING",
    )
    .bind(&d.message_id)
    .bind(&d.subject)
    .bind(d.reason.as_str())
    .bind(d.payload.to_vec())
    .execute(&pool)
    .await?;
    Ok(())
}

/// SIGTERM or Ctrl-C.
async fn stop() {
    #[cfg(unix)]
    {
        let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        else {
            let _ = tokio::signal::ctrl_c().await;
            return;
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
