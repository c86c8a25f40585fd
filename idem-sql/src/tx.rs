//! The transactional mode, once for every SQL dialect: the claim, the work's
//! own writes and the stored outcome commit in one transaction.
//!
//! Built on the engine's claim guard: the claim is sent on the transaction
//! ([`EngineExt::ticket`] + [`EngineExt::settle`]), the work runs on the same
//! connection, and the completion ([`ClaimExt::into_pending`]) is written on
//! it before `COMMIT`. What differs between dialects (the statement that
//! begins the transaction and bounds its lock waits, what a lock timeout
//! looks like, whether a lost race rolls the transaction back) is
//! [`Dialect`](crate::Dialect)'s.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use idem_core::adapter::{ClaimExt, ClaimTicket, EngineExt, Prepared};
use idem_core::store::{CLAIM_RACE_TRIES, ClaimOutcome, StoreError};
use idem_core::{Attempt, Begin, Claim, Error, Idem, IntoKey, Outcome, Reply, Scope, Storable};
use serde::Serialize;
use sqlx::{AssertSqlSafe, Connection, Transaction};
use tokio::sync::oneshot;
use tracing::{debug, warn};

use crate::conns::SqlStore;
use crate::pool::ConnectionError;
use crate::store::{DbConnection, Dialect, SqlCore, TxStore};

/// The future a transactional work returns: boxed, because it borrows the
/// transaction's connection (`|attempt, conn| Box::pin(async move { .. })`).
pub type TxFuture<'c, T> = Pin<Box<dyn Future<Output = T> + Send + 'c>>;

/// The connection a transactional work writes on, for store `S`.
pub type TxConnection<S> = DbConnection<<S as TxStore>::Dialect>;

/// The database of store `S`.
type Db<S> = <<S as TxStore>::Dialect as Dialect>::Db;

/// [`Idem`] methods that only a SQL store has: the transactional mode.
pub trait SqlIdemExt<S: TxStore> {
    /// The engine (the trait is [`Idem`]'s).
    #[doc(hidden)]
    fn engine(&self) -> &Idem<S>;

    /// Runs `work` at most once per `(scope, key)` inside one transaction that
    /// also holds the claim and the stored outcome, or replays the stored one.
    ///
    /// * **Exactly once for local effects.** The claim, every write the work
    ///   makes on the connection it is given, and the stored outcome commit
    ///   together. If the work returns [`Outcome::Transient`], the future is
    ///   dropped, the process dies, or the commit fails, the transaction
    ///   rolls back: neither the record nor the work's rows remain, and the
    ///   next retry runs the work again (a record that was `released` or
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
    /// back (the library does). Write it as
    /// `|attempt, conn| Box::pin(async move { .. })`. The transaction runs
    /// on one connection of the store's pool, like its other calls.
    ///
    /// # Concurrent duplicates
    ///
    /// A duplicate in this mode that arrives while another call's
    /// transaction holds the record (uncommitted insert or takeover)
    /// **waits** for the record's lock until that transaction ends, bounded
    /// by the store's `tx_lock_timeout` (default 5 s; each store's
    /// `with_tx_lock_timeout` says how it is set). Then:
    ///
    /// * the first committed → the duplicate gets the replay (or 422 for
    ///   another request);
    /// * the first rolled back → the duplicate claims and runs the work;
    /// * the lock wait expired → [`Error::InFlight`] (409, `Retry-After: 1`).
    ///   The other transaction's record is not visible yet, so this answer
    ///   is given without comparing fingerprints. In this mode the lock wait
    ///   *is* the wait: [`InFlightMode::Wait`](idem_core::InFlightMode::Wait)
    ///   does not poll again after it.
    ///
    /// Plain [`Idem::execute`] calls on the same key wait the same way,
    /// bounded only by the lock timeout of their own connections. Keep
    /// transactional work short.
    ///
    /// Round trips: the begin statement (one), the claim (one), the work's
    /// own, the completion (one), `COMMIT` (one). A replay costs the first
    /// two and a `ROLLBACK`.
    ///
    /// # Errors
    ///
    /// As [`Idem::execute`]; in addition [`Error::Store`] when the
    /// completion or the commit fails (then nothing of this call remains,
    /// unless the commit reached the server before the connection broke: a
    /// retry then gets the replay).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use idem_core::{Idem, Outcome, Scope};
    /// use idem_sql::{SqlIdemExt, TxStore};
    ///
    /// # async fn f<S: TxStore>(idem: Idem<S>) -> Result<(), idem_core::Error> {
    /// let scope = Scope::new("acct_42", "POST /orders")?;
    /// let request = serde_json::json!({"sku": "A-1", "qty": 2});
    /// let reply = idem
    ///     .execute_in_tx(&scope, "order-7", &request, |_attempt, _conn| {
    ///         // Write with `&mut *conn` here.
    ///         Box::pin(async move { Outcome::<u64, String>::Success(7) })
    ///     })
    ///     .await?;
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
        F: for<'c> FnOnce(Attempt, &'c mut TxConnection<S>) -> TxFuture<'c, O> + Send,
    {
        // Validate before touching the server: invalid input costs nothing.
        let prepared = self.engine().prepare(scope, key, request);
        let idem = self.engine();
        async move { idem.execute_prepared_in_tx(prepared?, work).await }
    }

    /// [`execute_in_tx`](SqlIdemExt::execute_in_tx) for a request an adapter
    /// already checked and fingerprinted on its own terms
    /// ([`EngineExt::prepare`], or [`Prepared::new`] with its own
    /// fingerprint): a queue consumer's transactional inbox.
    ///
    /// # Errors
    ///
    /// As [`execute_in_tx`](SqlIdemExt::execute_in_tx), except the input
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
        F: for<'c> FnOnce(Attempt, &'c mut TxConnection<S>) -> TxFuture<'c, O> + Send,
    {
        let idem = self.engine();
        async move {
            let core = idem.store().sql_core();
            <S::Dialect as Dialect>::before_tx(core).await?;
            core.ensure_layout().await?;
            let result = on_checkout(idem, prepared, work).await;
            if let Err(Error::Store(e)) = &result {
                core.dialect().observe(e);
            }
            result
        }
    }
}

impl<S: TxStore> SqlIdemExt<S> for Idem<S> {
    fn engine(&self) -> &Idem<S> {
        self
    }
}

/// The transaction on one checkout of the store's connections. The commit
/// is bounded by [`Dialect::bounded`] from outside the checkout, so that a
/// commit cut short leaves its connection in flight (its answer awaited
/// off the caller's path, see [`Conn`](crate::Conn)) rather than closed
/// under a commit that may be waiting for a standby.
async fn on_checkout<S: TxStore, T: Storable, E: Storable, O, F>(
    idem: &Idem<S>,
    prepared: Prepared,
    work: F,
) -> Result<Reply<T, E>, Error>
where
    O: Into<Outcome<T, E>> + Send,
    F: for<'c> FnOnce(Attempt, &'c mut TxConnection<S>) -> TxFuture<'c, O> + Send,
{
    let core = idem.store().sql_core();
    let (committing, commit_started) = oneshot::channel();
    let commit_bound = async {
        if commit_started.await.is_err() {
            // No commit: the transaction ended before it.
            std::future::pending::<()>().await;
        }
        let never = std::future::pending::<Result<Infallible, StoreError>>();
        match core.dialect().bounded(never).await {
            Err(timed_out) => timed_out,
            Ok(never) => match never {},
        }
    };
    let conns = core.conns();
    let run = async {
        match conns.own_pool() {
            Some(own) => {
                let mut checkout = own.get().await.map_err(checkout_failure::<S>)?;
                let ran = checkout
                    .run(|conn| async move {
                        let (result, sound) = in_tx(idem, conn, prepared, work, committing).await;
                        if sound {
                            Ok(result)
                        } else {
                            Err(Unsound(result))
                        }
                    })
                    .await;
                Ok(ran.unwrap_or_else(|Unsound(result)| result))
            }
            None => {
                let mut checkout = conns
                    .pool()
                    .acquire()
                    .await
                    .map_err(checkout_failure::<S>)?;
                Ok(in_tx(idem, &mut checkout, prepared, work, committing)
                    .await
                    .0)
            }
        }
    };
    tokio::select! {
        ran = run => ran.map_err(Error::Store)?,
        timed_out = commit_bound => Err(Error::Store(timed_out)),
    }
}

/// A transaction's result on a connection it may have left unsound.
struct Unsound<T>(T);

impl<T> ConnectionError for Unsound<T> {
    fn leaves_connection_sound(&self) -> bool {
        false
    }
}

/// The transaction on `conn`: its result, and whether the connection is
/// still sound (every statement answered).
async fn in_tx<S: TxStore, T: Storable, E: Storable, O, F>(
    idem: &Idem<S>,
    conn: &mut TxConnection<S>,
    prepared: Prepared,
    work: F,
    committing: oneshot::Sender<()>,
) -> (Result<Reply<T, E>, Error>, bool)
where
    O: Into<Outcome<T, E>> + Send,
    F: for<'c> FnOnce(Attempt, &'c mut TxConnection<S>) -> TxFuture<'c, O> + Send,
{
    let ticket = idem.ticket(prepared).deferred();
    let core = idem.store().sql_core();
    let (mut tx, answer) = match claim_in_new_tx::<S>(core, conn, &ticket).await {
        Ok(claimed) => claimed,
        Err((e, sound)) => return (Err(e), sound),
    };
    let claim: Claim<S, T, E> = match idem.settle(ticket, answer) {
        Ok(Begin::Run(claim)) => claim,
        Ok(Begin::Replay(reply)) => return (Ok(reply), rollback::<S>(tx).await),
        Err(e) => return (Err(e), rollback::<S>(tx).await),
    };
    let outcome = work(claim.attempt().clone(), &mut *tx).await;
    let pending = claim.into_pending(outcome);
    if pending.is_transient() {
        // Rolling back undoes the claim: that is the release.
        let sound = rollback::<S>(tx).await;
        debug!("transactional transient failure: rolled back");
        return (Ok(pending.not_written()), sound);
    }
    let written = core
        .complete_in_tx(
            &mut *tx,
            pending.record(),
            pending.token(),
            &pending.completion(),
        )
        .await;
    if let Err(e) = written {
        // The transaction is aborted: the work's writes are gone too, so
        // the caller gets the error, not the outcome.
        return (Err(e.into()), rollback::<S>(tx).await);
    }
    // The commit may wait for a synchronous standby: bounded by the
    // store's call timeout (the work is not; see `on_checkout`). A commit
    // that timed out is unknown, not failed: it may still complete, with
    // the work's rows.
    let _ = committing.send(());
    match tx.commit().await {
        Ok(()) => {
            debug!("transactional outcome committed");
            (Ok(pending.written()), true)
        }
        Err(e) => {
            let (e, sound) = driver_failure::<S>(e);
            (Err(e), sound)
        }
    }
}

/// Begins a transaction and runs the claim in it, again when it lost a race
/// (in a new transaction when the race rolled it back), bounded like every
/// backend's (see [`retry_claim_race`](idem_core::store::retry_claim_race)).
/// A lock timeout behind another open transaction is [`Error::InFlight`].
/// An error comes with whether the connection is still sound.
async fn claim_in_new_tx<'c, S: TxStore>(
    core: &SqlCore<S::Dialect>,
    conn: &'c mut TxConnection<S>,
    ticket: &ClaimTicket,
) -> Result<(Transaction<'c, Db<S>>, ClaimOutcome), (Error, bool)> {
    let req = ticket.request();
    let mut tx = conn
        .begin_with(AssertSqlSafe(core.dialect().begin_statement()))
        .await
        .map_err(driver_failure::<S>)?;
    for _ in 1..CLAIM_RACE_TRIES {
        match core.claim_in_tx(&mut *tx, &req).await {
            Ok(Some(answer)) => return Ok((tx, answer)),
            Ok(None) => {
                if let Err(e) = core.dialect().restart_tx(&mut *tx).await {
                    let (e, sound) = driver_failure::<S>(e);
                    return Err((e, rollback::<S>(tx).await && sound));
                }
            }
            Err(e) => return Err(claim_failed::<S>(e, tx).await),
        }
    }
    match core.claim_in_tx(&mut *tx, &req).await {
        Ok(Some(answer)) => Ok((tx, answer)),
        Ok(None) => {
            let e = Error::Store(<S::Dialect as Dialect>::contention(CLAIM_RACE_TRIES));
            Err((e, rollback::<S>(tx).await))
        }
        Err(e) => Err(claim_failed::<S>(e, tx).await),
    }
}

/// A claim that failed: a lock timeout behind a concurrent transaction is
/// [`Error::InFlight`]; the transaction is rolled back either way.
async fn claim_failed<S: TxStore>(
    e: <S::Dialect as Dialect>::Error,
    tx: Transaction<'_, Db<S>>,
) -> (Error, bool) {
    let e = if <S::Dialect as Dialect>::is_lock_timeout(&e) {
        debug!("transactional claim: lock timeout behind a concurrent transaction");
        Error::InFlight {
            retry_after: Duration::from_secs(1),
        }
    } else {
        Error::Store(e.into())
    };
    (e, rollback::<S>(tx).await)
}

/// Rolls `tx` back; whether its connection is still sound.
async fn rollback<S: TxStore>(tx: Transaction<'_, Db<S>>) -> bool {
    match tx.rollback().await {
        Ok(()) => true,
        Err(e) => {
            // The server rolls back anyway when the connection goes.
            warn!(error = %e, "rollback failed");
            driver_failure::<S>(e).1
        }
    }
}

/// A checkout that failed, as store `S` reports it.
fn checkout_failure<S: TxStore>(e: sqlx::Error) -> StoreError {
    <S::Dialect as Dialect>::checkout_error(e).into()
}

/// The driver's error as store `S` reports it, and whether the connection
/// is still sound after it.
fn driver_failure<S: TxStore>(e: sqlx::Error) -> (Error, bool) {
    let e = <S::Dialect as Dialect>::driver_error(e);
    let sound = <S::Dialect as Dialect>::leaves_connection_sound(&e);
    (Error::Store(e.into()), sound)
}
