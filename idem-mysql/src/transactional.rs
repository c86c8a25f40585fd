//! Transactional mode: the claim, the work's own writes and the stored
//! response commit in one InnoDB transaction.
//!
//! Built on the engine's claim guard: the claim is sent on the transaction
//! ([`Idem::ticket`] + [`Idem::settle`]), the work runs on the same
//! connection, and the completion ([`Claim::into_pending`]) is written on it
//! before `COMMIT`.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use idem_core::adapter::{ClaimExt, ClaimTicket, EngineExt, Prepared};
use idem_core::store::{CLAIM_RACE_TRIES, ClaimOutcome};
use idem_core::{Attempt, Begin, Claim, Error, Idem, IntoKey, Outcome, Reply, Scope, Storable};
use serde::Serialize;
use sqlx::{AssertSqlSafe, MySql, MySqlConnection, Transaction};
use tracing::{debug, warn};

use crate::error::{self, code, number};
use crate::store::MySqlStore;

/// The future a transactional work returns: boxed, because it borrows the
/// transaction's connection (`|attempt, conn| Box::pin(async move { .. })`).
pub type TxFuture<'c, T> = Pin<Box<dyn Future<Output = T> + Send + 'c>>;

/// [`Idem`] methods that only a MySQL / MariaDB store has: transactional
/// mode.
pub trait MySqlIdemExt {
    /// Runs `work` at most once per `(scope, key)` inside one transaction that
    /// also holds the claim and the stored outcome, or replays the stored one.
    ///
    /// * **Exactly once for local effects.** The claim, every write the work
    ///   makes on the connection it is given, and the stored outcome commit
    ///   together. If the work returns [`Outcome::Transient`], the future is
    ///   dropped, the process dies, or the commit fails, the transaction rolls
    ///   back: neither the record nor the work's rows remain, and the next
    ///   retry runs the work again (a record that was `released` or
    ///   lease-expired before stays as it was).
    /// * `Success` and `Failure` both commit (a permanent failure is stored
    ///   and replayed, with whatever the work wrote).
    /// * [`Attempt::save_resource_id`] is kept in memory and written with the
    ///   outcome (a crash rolls everything back, so there is nothing to
    ///   recover from); [`Attempt::extend_lease`] is a no-op: the
    ///   transaction's row lock, not the lease, keeps duplicates out until it
    ///   ends.
    ///
    /// The work gets the attempt and the connection of the transaction that
    /// holds the claim: write with `&mut *conn` (e.g.
    /// `sqlx::query(..).execute(&mut *conn)`), and neither commit nor roll
    /// back (the library does). Only InnoDB tables take part in the
    /// transaction. Write it as
    /// `|attempt, conn| Box::pin(async move { .. })`.
    ///
    /// # Concurrent duplicates
    ///
    /// A duplicate in this mode that arrives while another call's transaction
    /// holds the record (uncommitted insert or takeover) **waits** on the
    /// record's lock until that transaction ends, bounded by the store's
    /// [`tx_lock_timeout`](MySqlStore::with_tx_lock_timeout) (default 5 s).
    /// Then:
    ///
    /// * the first committed → the duplicate gets the replay (or 422 for
    ///   another request);
    /// * the first rolled back → the duplicate claims and runs the work;
    /// * the lock wait expired → [`Error::InFlight`] (409, `Retry-After: 1`).
    ///   The other transaction's record is not visible yet, so this answer is
    ///   given without comparing fingerprints.
    ///
    /// MySQL has no `SET LOCAL`: the bound is set with `SET SESSION
    /// innodb_lock_wait_timeout` in the same round trip as `BEGIN`, and
    /// stays on that pooled connection afterwards, where it also bounds the
    /// plain claims that connection runs. Plain [`Idem::execute`] calls on
    /// the same key wait the same way, bounded by their connection's
    /// `innodb_lock_wait_timeout` (server default 50 s). Keep transactional
    /// work short.
    ///
    /// InnoDB rolls a deadlock's victim back whole; the claim is the
    /// transaction's first statement, so a deadlock (or a record changed
    /// between two statements of the claim) starts the transaction again,
    /// at most 8 times, before the work ever ran.
    ///
    /// Round trips: `SET SESSION …; BEGIN` (one), the claim (one on MariaDB,
    /// one or two on MySQL), the work's own, the completion (one), `COMMIT`
    /// (one). A replay costs the first two and a `ROLLBACK`.
    ///
    /// # Errors
    ///
    /// As [`Idem::execute`]; in addition [`Error::Store`] when the completion
    /// or the commit fails (then nothing of this call remains, unless the
    /// commit reached the server before the connection broke: a retry then
    /// gets the replay).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use idem_core::{Idem, Outcome, Scope};
    /// use idem_mysql::{MySqlIdemExt, MySqlStore, sqlx};
    ///
    /// # async fn f(idem: Idem<MySqlStore>) -> Result<(), idem_core::Error> {
    /// let scope = Scope::new("acct_42", "POST /orders")?;
    /// let request = serde_json::json!({"sku": "A-1", "qty": 2});
    /// let reply = idem.execute_in_tx(&scope, "order-7", &request, |_attempt, conn| {
    ///     Box::pin(async move {
    ///         let inserted = sqlx::query("INSERT INTO orders (sku, qty) VALUES (?, ?)")
    ///             .bind("A-1")
    ///             .bind(2_i32)
    ///             .execute(&mut *conn)
    ///             .await;
    ///         match inserted {
    ///             Ok(done) => Outcome::Success(done.last_insert_id()),
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
        F: for<'c> FnOnce(Attempt, &'c mut MySqlConnection) -> TxFuture<'c, O> + Send;

    /// [`execute_in_tx`](MySqlIdemExt::execute_in_tx) for a request an
    /// adapter already checked and fingerprinted on its own terms
    /// ([`EngineExt::prepare`], or [`Prepared::new`] with its own
    /// fingerprint): a queue consumer's transactional inbox.
    ///
    /// # Errors
    ///
    /// As [`execute_in_tx`](MySqlIdemExt::execute_in_tx), except the input
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
        F: for<'c> FnOnce(Attempt, &'c mut MySqlConnection) -> TxFuture<'c, O> + Send;
}

impl MySqlIdemExt for Idem<MySqlStore> {
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
        F: for<'c> FnOnce(Attempt, &'c mut MySqlConnection) -> TxFuture<'c, O> + Send,
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
        F: for<'c> FnOnce(Attempt, &'c mut MySqlConnection) -> TxFuture<'c, O> + Send,
    {
        let ticket = self.ticket(prepared).deferred();
        let store = self.store();
        let (mut tx, answer) = claim_in_new_tx(store, &ticket).await?;
        let claim: Claim<MySqlStore, T, E> = match self.settle(ticket, answer) {
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
            // The transaction is aborted: the work's writes go too, so the
            // caller gets the error, not the outcome.
            rollback(tx).await;
            return Err(e.into());
        }
        tx.commit()
            .await
            .map_err(|e| Error::Store(error::store_error(e)))?;
        debug!("transactional outcome committed");
        Ok(pending.written())
    }
}

/// Begins a transaction and runs the claim as its first statement; when the
/// claim lost a race (a deadlock rolled the transaction back, or the record
/// changed between two statements), rolls back and begins again, bounded
/// like every backend's (see
/// [`retry_claim_race`](idem_core::store::retry_claim_race)). A lock wait
/// timeout behind another open transaction is [`Error::InFlight`].
async fn claim_in_new_tx(
    store: &MySqlStore,
    ticket: &ClaimTicket,
) -> Result<(Transaction<'static, MySql>, ClaimOutcome), Error> {
    let req = ticket.request();
    for _ in 0..CLAIM_RACE_TRIES {
        let mut tx = store
            .pool()
            .begin_with(begin_statement(store))
            .await
            .map_err(error::store_error)?;
        match store.claim_once(&mut tx, &req).await {
            Ok(Some(answer)) => return Ok((tx, answer)),
            Ok(None) => rollback(tx).await,
            Err(crate::Error::Sqlx(e)) if number(&e) == Some(code::LOCK_WAIT_TIMEOUT) => {
                debug!("transactional claim: lock wait timeout behind a concurrent transaction");
                rollback(tx).await;
                return Err(Error::InFlight {
                    retry_after: Duration::from_secs(1),
                });
            }
            Err(e) => {
                rollback(tx).await;
                return Err(Error::Store(e.into()));
            }
        }
    }
    Err(Error::Store(
        crate::Error::ClaimContention {
            tries: CLAIM_RACE_TRIES,
        }
        .into(),
    ))
}

async fn rollback(tx: Transaction<'static, MySql>) {
    if let Err(e) = tx.rollback().await {
        // The connection is discarded; the server rolls back anyway.
        warn!(error = %e, "rollback failed");
    }
}

fn begin_statement(store: &MySqlStore) -> AssertSqlSafe<String> {
    // An integer from a `Duration`: nothing to escape.
    let secs = store.tx_lock_timeout().as_millis().div_ceil(1000).max(1);
    AssertSqlSafe(format!(
        "SET SESSION innodb_lock_wait_timeout = {secs}; BEGIN"
    ))
}
