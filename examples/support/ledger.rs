//! The orders ledger that the queue examples (`nats_orders`,
//! `rabbitmq_orders`) write once per message, whatever the broker
//! redelivers, and the line each prints for a processed message.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idem::consumer::{Disposition, Processed};
use idem::sqlite::sqlx::{self, SqlitePool};
use idem::{Attempt, Failure};
use serde_json::Value;

/// The example's tables, created if missing: `ledger`, one row per order
/// applied, and `dead_letters`, one row per dead-lettered delivery (the
/// same message id can be dead-lettered more than once: a stored permanent
/// failure replayed, a second payload under an id that ran; each is kept).
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
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        message_id TEXT NOT NULL,
        subject TEXT NOT NULL,
        reason TEXT NOT NULL,
        payload BLOB NOT NULL,
        at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP
    )",
];

/// Creates the tables on `pool` (idem's records share its file).
pub(crate) async fn create_tables(pool: &SqlitePool) -> Result<(), sqlx::Error> {
    for ddl in SCHEMA {
        sqlx::query(ddl).execute(pool).await?;
    }
    Ok(())
}

/// Keeps a dead-lettered delivery in `dead_letters`, a row per delivery.
pub(crate) async fn keep_dead_letter(
    pool: &SqlitePool,
    message_id: &str,
    subject: &str,
    reason: &str,
    payload: &[u8],
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO dead_letters (message_id, subject, reason, payload) VALUES (?, ?, ?, ?)",
    )
    .bind(message_id)
    .bind(subject)
    .bind(reason)
    .bind(payload)
    .execute(pool)
    .await?;
    Ok(())
}

/// One message's work, and what it saw: whether it found the ledger row of
/// an attempt that died (and reconciled instead of writing a second one).
#[derive(Clone, Default)]
pub(crate) struct Work {
    reconciled: Arc<AtomicBool>,
}

impl Work {
    /// The order's one effect: a ledger row under the attempt's downstream
    /// key (the same on every attempt of this message). `delivered` is the
    /// broker's delivery count: `test.transient` fails on the first two.
    pub(crate) async fn apply(
        &self,
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
            // An earlier attempt wrote the row and died before idem stored
            // its outcome: this run reconciles (counts the recovery), it does
            // not apply the order a second time.
            sqlx::query("UPDATE ledger SET recoveries = recoveries + 1 WHERE downstream_key = ?")
                .bind(&key)
                .execute(&pool)
                .await
                .map_err(|e| Failure::transient(format!("ledger: {e}")))?;
            self.reconciled.store(true, Ordering::Relaxed);
        }
        if kind == "test.slow" {
            // The window in which a crash leaves the effect without an outcome.
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        Ok(key)
    }

    /// The line for a processed message: `acked <id> attempt <n> <how>`
    /// (`executed`, `replayed` or `recovered`), `retry <id> after <ms>` or
    /// `dead-letter <id> <reason>`.
    pub(crate) fn line(&self, id: &str, p: &Processed<String, String>) -> String {
        match &p.disposition {
            Disposition::Ack => {
                let how = if p.replayed {
                    "replayed"
                } else if self.reconciled.load(Ordering::Relaxed) {
                    "recovered"
                } else {
                    "executed"
                };
                format!("acked {id} attempt {} {how}", p.attempt)
            }
            Disposition::Retry { after } => format!("retry {id} after {}", after.as_millis()),
            Disposition::DeadLetter { reason } => format!("dead-letter {id} {}", reason.as_str()),
            other => format!("{other:?} {id}"),
        }
    }
}

/// SIGTERM or Ctrl-C: the queue examples stop on it.
#[path = "stop.rs"]
mod signal;
pub(crate) use signal::stop;
