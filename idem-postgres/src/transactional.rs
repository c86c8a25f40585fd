//! Transactional mode: the claim, the work's own writes and the stored
//! response commit in one PostgreSQL transaction.
//!
//! Built on the engine's claim guard: the claim is sent on the transaction
//! ([`Idem::ticket`] + [`Idem::settle`]), the work runs on the same
//! connection, and the completion ([`Claim::into_pending`]) is written on it
//! before `COMMIT`.

use std::future::Future;
use std::pin::Pin;

use idem_core::adapter::{ClaimExt, ClaimTicket, EngineExt, Prepared};
use idem_core::store::{CLAIM_RACE_TRIES, ClaimOutcome};
use idem_core::{Attempt, Begin, Claim, Error, Idem, IntoKey, Outcome, Reply, Scope, Storable};
use serde::Serialize;
use sqlx::{AssertSqlSafe, PgConnection, Postgres, Transaction};
use tracing::{debug, warn};

use crate::error::{self, is_lock_timeout};
use crate::store::PgStore;

/// The future a transactional work returns: boxed, because it borrows the
/// transaction's connection (`|attempt, conn| Box::pin(async move { .. })`).
pub type TxFuture<'c, T> = Pin<Box<dyn Future<Output = T> + Send + 'c>>;

/// [`Idem`] methods that only a Postgres store has: transactional mode.
pub trait PgIdemExt {
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
    /// * [`Attempt::save_resource_id`] is kept in memory and written with the
    ///   outcome (a crash rolls everything back, so there is nothing to recover
    ///   from); [`Attempt::extend_lease`] is a no-op: the transaction's row lock,
    ///   not the lease, keeps duplicates out until it ends.
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
    ///   given without comparing fingerprints. In this mode the lock wait *is*
    ///   the wait: [`InFlightMode::Wait`](idem_core::InFlightMode::Wait) does not
    ///   poll again after it.
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
    /// use idem_postgres::{PgIdemExt, PgStore, sqlx};
    ///
    /// # async fn f(idem: Idem<PgStore>) -> Result<(), idem_core::Error> {
    /// let scope = Scope::new("acct_42", "POST /orders")?;
    /// let request = serde_json::json!({"sku": "A-1", "qty": 2});
    /// let reply = idem.execute_in_tx(&scope, "order-7", &request, |_attempt, conn| {
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
    fn execute_in_tx<K, R, T, E, O, F>(
        &self,
        scope: &Scope,
        key: K,
        request: &R,
        work: F,
    ) -> impl Future<Output = Result<Reply<T, E>, Error>> + Send
    where
        K: IntoKey + Send,
        R: Serialize + Sync + ?Sized,
        T: Storable,
        E: Storable,
        O: Into<Outcome<T, E>> + Send,
        F: for<'c> FnOnce(Attempt, &'c mut PgConnection) -> TxFuture<'c, O> + Send;

    /// [`execute_in_tx`](PgIdemExt::execute_in_tx) for a request an adapter
    /// already checked and fingerprinted on its own terms
    /// ([`EngineExt::prepare`], or [`Prepared::new`] with its own
    /// fingerprint): a queue consumer's transactional inbox.
    ///
    /// # Errors
    ///
    /// As [`execute_in_tx`](PgIdemExt::execute_in_tx), except the input
    /// checks.
    fn execute_prepared_in_tx<T, E, O, F>(
        &self,
        prepared: Prepared,
        work: F,
    ) -> impl Future<Output = Result<Reply<T, E>, Error>> + Send
    where
        T: Storable,
        E: Storable,
        O: Into<Outcome<T, E>> + Send,
        F: for<'c> FnOnce(Attempt, &'c mut PgConnection) -> TxFuture<'c, O> + Send;
}

impl PgIdemExt for Idem<PgStore> {
    async fn execute_in_tx<K, R, T, E, O, F>(
        &self,
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
        O: Into<Outcome<T, E>> + Send,
        F: for<'c> FnOnce(Attempt, &'c mut PgConnection) -> TxFuture<'c, O> + Send,
    {
        // Validate before touching the server: invalid input costs nothing.
        let prepared = self.prepare(scope, key, request)?;
        self.execute_prepared_in_tx(prepared, work).await
    }

    async fn execute_prepared_in_tx<T, E, O, F>(
        &self,
        prepared: Prepared,
        work: F,
    ) -> Result<Reply<T, E>, Error>
    where
        T: Storable,
        E: Storable,
        O: Into<Outcome<T, E>> + Send,
        F: for<'c> FnOnce(Attempt, &'c mut PgConnection) -> TxFuture<'c, O> + Send,
    {
        // The replication check (after a lost connection, or for a store
        // that never checked), and a server made suspect by what happens
        // here, as for the store's own calls.
        let store = self.store();
        store.ensure_checked().await?;
        let result = in_tx(self, prepared, work).await;
        if let Err(Error::Store(e)) = &result {
            store.observe(e);
        }
        result
    }
}

async fn in_tx<T, E, O, F>(
    idem: &Idem<PgStore>,
    prepared: Prepared,
    work: F,
) -> Result<Reply<T, E>, Error>
where
    T: Storable,
    E: Storable,
    O: Into<Outcome<T, E>> + Send,
    F: for<'c> FnOnce(Attempt, &'c mut PgConnection) -> TxFuture<'c, O> + Send,
{
    let ticket = idem.ticket(prepared).deferred();
    let store = idem.store();
    let mut tx = store
        .pool()
        .begin_with(begin_statement(store))
        .await
        .map_err(error::store_error)?;
    let answer = match claim_on(store, &mut tx, &ticket).await {
        Ok(answer) => answer,
        Err(e) => {
            rollback(tx).await;
            return Err(e);
        }
    };
    let claim: Claim<PgStore, T, E> = match idem.settle(ticket, answer) {
        Ok(Begin::Run(claim)) => claim,
        Ok(Begin::Replay(reply)) => {
            rollback(tx).await;
            return Ok(reply);
        }
        Err(e) => {
            rollback(tx).await;
            return Err(e);
        }
    };
    let outcome = work(claim.attempt().clone(), &mut tx).await;
    let pending = claim.into_pending(outcome);
    if pending.is_transient() {
        // Rolling back undoes the claim: that is the release.
        rollback(tx).await;
        debug!("transactional transient failure: rolled back");
        return Ok(pending.not_written());
    }
    let written = store
        .complete_on(
            &mut *tx,
            pending.record(),
            pending.token(),
            &pending.completion(),
        )
        .await;
    if let Err(e) = written {
        // The transaction is aborted: the work's writes are gone too, so
        // the caller gets the error, not the outcome.
        rollback(tx).await;
        return Err(e.into());
    }
    // The commit may wait for a synchronous standby: bounded by the
    // store's call timeout (the work is not). A commit that timed out is
    // unknown, not failed: it may still complete, with the work's rows.
    store
        .bounded(async { tx.commit().await.map_err(error::store_error) })
        .await?;
    debug!("transactional outcome committed");
    Ok(pending.written())
}

/// The claim on the transaction, run again when it lost a race (bounded
/// like every backend's, see [`retry_claim_race`](idem_core::store::retry_claim_race)). A lock timeout behind
/// another open transaction is [`Error::InFlight`].
async fn claim_on(
    store: &PgStore,
    tx: &mut Transaction<'static, Postgres>,
    ticket: &ClaimTicket,
) -> Result<ClaimOutcome, Error> {
    let req = ticket.request();
    for _ in 0..CLAIM_RACE_TRIES {
        match store.claim_once(tx, &req).await {
            Ok(Some(answer)) => return Ok(answer),
            Ok(None) => {}
            Err(crate::Error::Sqlx(e)) if is_lock_timeout(&e) => {
                debug!("transactional claim: lock timeout behind a concurrent transaction");
                return Err(Error::InFlight {
                    retry_after: std::time::Duration::from_secs(1),
                });
            }
            Err(e) => return Err(Error::Store(e.into())),
        }
    }
    Err(Error::Store(
        crate::Error::ClaimContention {
            tries: CLAIM_RACE_TRIES,
        }
        .into(),
    ))
}

async fn rollback(tx: Transaction<'static, Postgres>) {
    if let Err(e) = tx.rollback().await {
        // The connection is discarded; the server rolls back anyway.
        warn!(error = %e, "rollback failed");
    }
}

fn begin_statement(store: &PgStore) -> AssertSqlSafe<String> {
    // An integer from a `Duration`: nothing to escape.
    let ms = store.tx_lock_timeout().as_millis().max(1);
    AssertSqlSafe(format!("BEGIN; SET LOCAL lock_timeout = {ms}"))
}
