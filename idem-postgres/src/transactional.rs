//! Transactional mode: the claim, the work's own writes and the stored
//! response commit in one PostgreSQL transaction.
//!
//! It reuses the engine unchanged: a private [`Store`] (`TxStore`) runs the
//! claim and the completion on one transaction, and the work gets that
//! transaction's connection. After the engine returns, the transaction is
//! committed only if the outcome was stored in it.

use std::sync::{Arc, Mutex, PoisonError};

use idem_core::store::{
    Capabilities, ClaimOutcome, ClaimRequest, Completion, PurgeReport, RecordState, StoredRecord,
    Token,
};
use idem_core::{
    Attempt, BoxFuture, Clock, Error, Idem, IntoKey, Outcome, RecordId, Reply, Scope, Storable,
    Store, StoreError, Timestamp,
};
use serde::Serialize;
use sqlx::{AssertSqlSafe, PgConnection, Postgres, Transaction};
use tracing::{debug, warn};

use crate::error::{self, is_lock_timeout};
use crate::store::PgStore;

/// Runs `work` at most once per `(scope, key)` inside one transaction that
/// also holds the claim and the stored outcome, or replays the stored one.
///
/// * **Exactly once for local effects.** The claim, every write the work
///   makes on the connection it is given, and the stored outcome commit
///   together. If the work returns [`Outcome::Transient`], the future is
///   dropped, the process dies, or the commit fails, the transaction rolls
///   back: neither the record nor the work's rows remain, and the next retry
///   runs the work again (a record that was `released` or lease-expired
///   before stays as it was).
/// * `Success` and `Failure` both commit (a permanent failure is stored and
///   replayed, with whatever the work wrote).
/// * [`Attempt::checkpoint`] is kept in memory and written with the outcome
///   (a crash rolls everything back, so there is nothing to recover from);
///   [`Attempt::extend_lease`] is a no-op: the transaction's row lock, not
///   the lease, keeps duplicates out until it ends.
///
/// The work gets the attempt and the connection of the transaction that
/// holds the claim: write with `&mut *conn` (e.g.
/// `sqlx::query(..).execute(&mut *conn)`), and neither commit nor roll back
/// (the library does). Write it as `|attempt, conn| Box::pin(async move { .. })`.
///
/// # Concurrent duplicates
///
/// A duplicate in this mode that arrives while another call's transaction
/// holds the record (uncommitted insert or takeover) **waits** on the
/// record's unique index or row lock until that transaction ends, bounded by
/// the store's [`tx_lock_timeout`](PgStore::with_tx_lock_timeout) (default
/// 5 s, set with `SET LOCAL lock_timeout` for its own transaction only).
/// Then:
///
/// * the first committed → the duplicate gets the replay (or 422 for another
///   request);
/// * the first rolled back → the duplicate claims and runs the work;
/// * the lock timeout expired → [`Error::InFlight`] (409, `Retry-After: 1`).
///   The other transaction's record is not visible yet, so this answer is
///   given without comparing fingerprints.
///
/// Plain [`Idem::execute`] calls on the same key wait the same way, bounded
/// only by the `lock_timeout` of their own connections (e.g.
/// `PgConnectOptions::options([("lock_timeout", "5s")])` with
/// [`PgStore::connect_with`]); without one they wait for the transaction to
/// end. Keep transactional work short.
///
/// Round trips: `BEGIN` + `SET LOCAL lock_timeout` (one), the claim (one),
/// the work's own, the completion (one), `COMMIT` (one). A replay costs the
/// first two and a `ROLLBACK`.
///
/// # Errors
///
/// As [`Idem::execute`]; in addition [`Error::Store`] when the completion or
/// the commit fails (then nothing of this call remains, unless the commit
/// reached the server before the connection broke: a retry then gets the
/// replay).
///
/// # Examples
///
/// ```no_run
/// use idem_core::{Idem, Outcome, Scope};
/// use idem_postgres::{PgStore, execute_in_tx, sqlx};
///
/// # async fn f(idem: Idem<PgStore>) -> Result<(), idem_core::Error> {
/// let scope = Scope::new("acct_42", "POST /orders")?;
/// let request = serde_json::json!({"sku": "A-1", "qty": 2});
/// let reply = execute_in_tx(&idem, &scope, "order-7", &request, |_attempt, conn| {
///     Box::pin(async move {
///         let inserted = sqlx::query("INSERT INTO orders (sku, qty) VALUES ($1, $2) RETURNING id")
///             .bind("A-1")
///             .bind(2_i32)
///             .fetch_one(&mut *conn)
///             .await;
///         match inserted {
///             Ok(row) => Outcome::Success(sqlx::Row::get::<i64, _>(&row, "id")),
///             Err(e) => Outcome::Transient(e.to_string()),
///         }
///     })
/// })
/// .await?;
/// println!("order {:?}, replayed: {}", reply.outcome(), reply.is_replay());
/// # Ok(()) }
/// ```
pub async fn execute_in_tx<K, R, T, E, F>(
    idem: &Idem<PgStore>,
    scope: &Scope,
    key: K,
    request: &R,
    work: F,
) -> Result<Reply<T, E>, Error>
where
    K: IntoKey + Send,
    R: Serialize + Sync + ?Sized,
    T: Storable,
    E: Storable,
    F: for<'c> FnOnce(Attempt, &'c mut PgConnection) -> BoxFuture<'c, Outcome<T, E>> + Send,
{
    // Validate before touching the server: invalid input costs nothing.
    let prepared = idem.prepare(scope, key, request)?;
    let store = idem.store();
    let tx = store
        .pool()
        .begin_with(begin_statement(store))
        .await
        .map_err(error::store_error)?;
    let tx_store = Arc::new(TxStore {
        store: store.clone(),
        tx: tokio::sync::Mutex::new(Some(tx)),
        progress: Mutex::new(Progress::default()),
    });
    let engine = Idem::from_arc(Arc::clone(&tx_store))
        .with_policy(idem.policy().clone())
        .with_clock(SharedClock(Arc::clone(idem.clock())));
    let slot = Arc::clone(&tx_store);
    let result = engine
        .execute(
            scope,
            prepared.id.key(),
            request,
            move |attempt| async move {
                let mut guard = slot.tx.lock().await;
                let Some(tx) = guard.as_mut() else {
                    unreachable!("the transaction is taken out only after the engine returns");
                };
                work(attempt, tx).await
            },
        )
        .await;
    let tx = tx_store.tx.lock().await.take();
    let progress = std::mem::take(
        &mut *tx_store
            .progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner),
    );
    let Some(tx) = tx else {
        return result;
    };
    match result {
        Ok(reply) if progress.completed && !reply.is_replay() => {
            tx.commit()
                .await
                .map_err(|e| Error::Store(error::store_error(e)))?;
            debug!("transactional outcome committed");
            Ok(reply)
        }
        other => {
            if let Err(e) = tx.rollback().await {
                // The connection is discarded; the server rolls back anyway.
                warn!(error = %e, "rollback failed");
            }
            match progress.failure {
                Some(failure) => Err(Error::Store(failure)),
                None => other,
            }
        }
    }
}

fn begin_statement(store: &PgStore) -> AssertSqlSafe<String> {
    // An integer from a `Duration`: nothing to escape.
    let ms = store.tx_lock_timeout().as_millis().max(1);
    AssertSqlSafe(format!("BEGIN; SET LOCAL lock_timeout = {ms}"))
}

#[derive(Debug)]
struct SharedClock(Arc<dyn Clock>);

impl Clock for SharedClock {
    fn now(&self) -> Timestamp {
        self.0.now()
    }
}

/// What happened inside the transaction, read once the engine returns.
#[derive(Debug, Default)]
struct Progress {
    /// The outcome was written in the transaction.
    completed: bool,
    /// The completion failed (the transaction is aborted): the caller gets
    /// this error, not the work's outcome, since the work's writes are gone.
    failure: Option<StoreError>,
    /// The checkpoint, written with the outcome.
    checkpoint: Option<String>,
}

/// The engine's store for one transactional call.
struct TxStore {
    store: PgStore,
    tx: tokio::sync::Mutex<Option<Transaction<'static, Postgres>>>,
    progress: Mutex<Progress>,
}

impl std::fmt::Debug for TxStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxStore")
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl TxStore {
    fn progress(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// After a lock timeout the transaction is aborted: start a fresh one so
    /// the engine may claim again (wait mode).
    async fn restart(
        &self,
        tx: &mut Option<Transaction<'static, Postgres>>,
    ) -> Result<(), StoreError> {
        let fresh = self
            .store
            .pool()
            .begin_with(begin_statement(&self.store))
            .await
            .map_err(error::store_error)?;
        if let Some(old) = tx.replace(fresh) {
            let _ = old.rollback().await;
        }
        Ok(())
    }
}

fn missing() -> StoreError {
    StoreError::Backend {
        backend: error::BACKEND,
        source: "the transactional call's transaction is gone".into(),
    }
}

impl Store for TxStore {
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let mut guard = self.tx.lock().await;
        for _ in 0..crate::store::CLAIM_TRIES {
            let tx = guard.as_mut().ok_or_else(missing)?;
            match self.store.claim_once(&mut **tx, req).await {
                Ok(Some(outcome)) => return Ok(outcome),
                Ok(None) => {}
                Err(crate::Error::Sqlx(e)) if is_lock_timeout(&e) => {
                    debug!("transactional claim: lock timeout behind a concurrent transaction");
                    self.restart(&mut guard).await?;
                    // The other transaction's record is not visible yet: answer
                    // "in flight" for about a second.
                    return Ok(ClaimOutcome::Existing(StoredRecord {
                        fingerprint: req.fingerprint,
                        state: RecordState::InFlight,
                        attempt: 1,
                        lease_until: req.now.plus(std::time::Duration::from_secs(1)),
                        resource_id: None,
                        outcome: None,
                        response: None,
                        response_expires_at: None,
                        key_expires_at: req.key_expires_at,
                    }));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(crate::Error::ClaimContention {
            tries: crate::store::CLAIM_TRIES,
        }
        .into())
    }

    async fn complete(
        &self,
        id: &RecordId,
        token: Token,
        c: &Completion<'_>,
    ) -> Result<(), StoreError> {
        if self.progress().failure.is_some() {
            return Err(StoreError::LeaseLost);
        }
        let checkpoint = self.progress().checkpoint.take();
        let completion = Completion {
            resource_id: c.resource_id.or(checkpoint.as_deref()),
            ..*c
        };
        let mut guard = self.tx.lock().await;
        let tx = guard.as_mut().ok_or_else(missing)?;
        match self
            .store
            .complete_on(&mut **tx, id, token, &completion)
            .await
        {
            Ok(()) => {
                self.progress().completed = true;
                Ok(())
            }
            Err(e) => {
                // The transaction is aborted: no retry can succeed. Keep the
                // real error for the caller and stop the engine's retries.
                self.progress().failure = Some(e);
                Err(StoreError::LeaseLost)
            }
        }
    }

    async fn release(
        &self,
        _id: &RecordId,
        _token: Token,
        _now: Timestamp,
    ) -> Result<(), StoreError> {
        // A transient failure rolls the whole transaction back, which undoes
        // the claim: that is the release.
        Ok(())
    }

    async fn checkpoint(
        &self,
        _id: &RecordId,
        _token: Token,
        resource_id: &str,
    ) -> Result<(), StoreError> {
        self.progress().checkpoint = Some(resource_id.to_owned());
        Ok(())
    }

    async fn extend_lease(
        &self,
        _id: &RecordId,
        _token: Token,
        _until: Timestamp,
    ) -> Result<(), StoreError> {
        Ok(())
    }

    async fn fetch(
        &self,
        id: &RecordId,
        now: Timestamp,
    ) -> Result<Option<StoredRecord>, StoreError> {
        self.store.fetch(id, now).await
    }

    async fn purge_expired(&self, now: Timestamp, limit: u32) -> Result<PurgeReport, StoreError> {
        self.store.purge_expired(now, limit).await
    }

    fn capabilities(&self) -> Capabilities {
        self.store.capabilities()
    }
}
