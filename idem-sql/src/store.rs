//! The one SQL store: [`SqlCore`], generic over a [`Dialect`] that supplies
//! its statements. Every call's shape (which checkout it runs on, when it
//! runs again, how a fenced update reads, how the purge loops, how the
//! operator listing pages) is here, once; a dialect says only how each
//! statement is bound and read on one connection.

use std::future::Future;
use std::sync::Arc;

use idem_core::clock::Timestamp;
use idem_core::store::{
    AdminStore, Capabilities, ClaimOutcome, ClaimRequest, Completion, Cursor, InFlightQuery,
    KeysetPosition, Page, PurgeReport, RecordSummary, StateCounts, Store, StoreError, StoredRecord,
    Token, retry_claim_race,
};
use idem_core::{IdempotencyKey, RecordId, Scope};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, Connection, Database, Encode, Type};
use tracing::debug;

use crate::batch::{BatchCompletion, Queues};
use crate::conns::{Conns, SqlStore};
use crate::error::fenced;
use crate::layout::{LayoutError, check_layout};
use crate::statement::{Driver, SharedStatements, Statement, Values};
use idem_core::store::Coalescing;

/// [`on_conn!`](crate::on_conn) on a [`SqlCore`], its error as a
/// [`StoreError`].
macro_rules! call {
    ($core:expr, |$conn:ident| $call:expr) => {
        async {
            $core.ensure_layout().await?;
            async { crate::on_conn!($core, |$conn| $call) }
                .await
                .map_err(Into::<StoreError>::into)
        }
        .await
    };
}

/// [`on_conn!`](crate::on_conn) on a [`SqlCore`], without the layout
/// check (the check's own statement).
macro_rules! call_unchecked {
    ($core:expr, |$conn:ident| $call:expr) => {
        async { crate::on_conn!($core, |$conn| $call) }
            .await
            .map_err(Into::<StoreError>::into)
    };
}

/// The connection a dialect's statements run on.
pub type DbConnection<D> = <<D as Dialect>::Db as Database>::Connection;

/// A row a dialect's statements return.
pub type DbRow<D> = <<D as Dialect>::Db as Database>::Row;

/// Runs one of the shared statements with `values`; its row, if any.
fn fetch_optional<'a, D: Dialect>(
    conn: &'a mut DbConnection<D>,
    statement: &Statement,
    values: Values<'_>,
) -> impl Future<Output = Result<Option<DbRow<D>>, D::Error>> + Send + 'a {
    let query = statement.bind::<D::Db>(&values);
    async move {
        <D::Db as Driver>::fetch_optional(query, conn)
            .await
            .map_err(D::driver_error)
    }
}

/// Runs one of the shared statements with `values`; the rows it matched.
fn execute<'a, D: Dialect>(
    conn: &'a mut DbConnection<D>,
    statement: &Statement,
    values: Values<'_>,
) -> impl Future<Output = Result<u64, D::Error>> + Send + 'a {
    let query = statement.bind::<D::Db>(&values);
    async move {
        <D::Db as Driver>::execute(query, conn)
            .await
            .map_err(D::driver_error)
    }
}

/// An update guarded by the fencing token: it changes the record only while
/// the token is the record's and the record is in flight.
#[derive(Debug, Clone, Copy)]
pub enum Fenced<'a> {
    /// The holder gives the key back (the record becomes `released` at
    /// `now`).
    Release {
        /// The engine's time.
        now: Timestamp,
    },
    /// The holder saves the id of the resource its work created.
    SaveResourceId(&'a str),
    /// The holder extends its lease to `until`.
    ExtendLease {
        /// The new lease end.
        until: Timestamp,
    },
}

/// What a SQL dialect supplies to [`SqlCore`]: its statements, each bound
/// and read on one connection, its error, and what only it has (hooks with
/// defaults that do nothing).
///
/// A statement method runs exactly its statement(s) on `conn`; the checkout,
/// the runs again after a lost race, the fencing verdict and the paging are
/// [`SqlCore`]'s. The dialect value itself holds the statements (rendered
/// for the store's table) and the dialect's settings; [`SqlCore`] clones it
/// with the store.
pub trait Dialect: Clone + Send + Sync + 'static {
    /// The database (any of sqlx's: every one is a [`Driver`]).
    type Db: Driver;
    /// The error its statements return: the driver's, plus what only this
    /// dialect reports.
    type Error: Into<StoreError> + std::fmt::Debug + Send + 'static;

    /// The backend's name in [`StoreError`]s.
    const BACKEND: &'static str;

    /// Whether a store of this dialect coalesces its calls unless told
    /// otherwise: [`Coalescing::WhenBusy`] where the benches show it pays,
    /// [`Coalescing::Off`] by default.
    const COALESCING: Coalescing = Coalescing::Off;

    /// The driver's error, as this dialect's.
    fn driver_error(e: sqlx::Error) -> Self::Error;

    /// The store's table, as the store names it (in errors).
    fn table(&self) -> String;

    /// The layout mark on the store's table (its comment, or the text that
    /// created it): `None` when there is no such table, `Some(None)` when
    /// it carries no mark. Read by `migrate` before it touches a table, and
    /// by a store's first call ([`check_layout`](crate::check_layout)).
    fn layout_mark(
        &self,
        conn: &mut DbConnection<Self>,
    ) -> impl Future<Output = Result<Option<Option<String>>, Self::Error>> + Send;

    /// A checkout that failed (by default the driver's error).
    fn checkout_error(e: sqlx::Error) -> Self::Error {
        Self::driver_error(e)
    }

    /// Whether the connection is still sound after a statement failed with
    /// `e` (see [`ConnectionError`](crate::ConnectionError)).
    fn leaves_connection_sound(e: &Self::Error) -> bool;

    /// Runs the claim once. `None`: it lost a race to a concurrent writer
    /// of the same record and must run again (at most
    /// [`CLAIM_RACE_TRIES`](idem_core::store::CLAIM_RACE_TRIES) times).
    fn claim_once(
        &self,
        conn: &mut DbConnection<Self>,
        req: &ClaimRequest<'_>,
    ) -> impl Future<Output = Result<Option<ClaimOutcome>, Self::Error>> + Send;

    /// The statements every dialect has: their text and bind order, run by
    /// the provided methods below.
    fn shared(&self) -> &SharedStatements;

    /// The text of the dialect's own statement `name` (one not among
    /// [`Dialect::shared`]), for the hidden `idem_sql::statement` (benches and tests).
    fn statement(&self, name: &str) -> Option<&str>;

    /// A record from a row of the `fetch` statement, refusing anything a
    /// record cannot hold and another identity sharing `id`'s key.
    fn decode_record(row: &DbRow<Self>, id: &RecordId) -> Result<StoredRecord, Self::Error>;

    /// A summary from a row of the operator listing.
    fn decode_summary(row: &DbRow<Self>) -> Result<RecordSummary, Self::Error>;

    /// The completion, fenced by `token`; the rows it matched.
    fn complete(
        &self,
        conn: &mut DbConnection<Self>,
        id: &RecordId,
        token: Token,
        completion: &Completion<'_>,
    ) -> impl Future<Output = Result<u64, Self::Error>> + Send {
        let values = Values {
            token: Some(token),
            completion: Some(completion),
            ..Values::of(id)
        };
        execute::<Self>(conn, &self.shared().complete, values)
    }

    /// The completion, and when it matched no row, whether this completion
    /// was already applied under `token` (`true`: not an error) or the
    /// lease is lost (`false`).
    fn complete_applied(
        &self,
        conn: &mut DbConnection<Self>,
        id: &RecordId,
        token: Token,
        completion: &Completion<'_>,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        async move {
            if self.complete(&mut *conn, id, token, completion).await? == 1 {
                return Ok(true);
            }
            self.completed_under(conn, id, token).await
        }
    }

    /// How many of `waiting` queued calls (at least one) one batch takes:
    /// all of them by default. A dialect whose batch statement's text
    /// depends on its size takes fewer (a power of two, say), so that each
    /// connection prepares few texts; the others wait for the next batch.
    fn batch_len(&self, waiting: usize) -> usize {
        waiting
    }

    /// Above how many claims and completions under way a store on a pool
    /// of `connections` is busy (every call queues, see
    /// [`batch_lanes`](Dialect::batch_lanes)): its connections, by default.
    fn busy_above(&self, connections: usize) -> usize {
        connections
    }

    /// How many batches of a busy store run at once on a pool of
    /// `connections`: a quarter of them, at least one, by default. A
    /// dialect whose writers take one lock in turn (SQLite's file) runs one.
    fn batch_lanes(&self, connections: usize) -> usize {
        (connections / 4).max(1)
    }

    /// The claims of a batch (distinct records, sorted by key), one answer
    /// per claim, in order, each as [`Dialect::claim_once`] would give it
    /// alone: `None` for a claim that lost a race (it runs again alone).
    ///
    /// By default [`claim_batch_in_tx`]: one transaction over the single
    /// claims.
    fn claim_batch(
        &self,
        conn: &mut DbConnection<Self>,
        reqs: &[ClaimRequest<'_>],
    ) -> impl Future<Output = Result<Vec<Option<ClaimOutcome>>, Self::Error>> + Send {
        claim_batch_in_tx(self, conn, reqs)
    }

    /// The completions of a batch (distinct records, sorted by key):
    /// whether each is applied, as [`Dialect::complete_applied`] would say
    /// alone.
    ///
    /// By default one transaction ([`Dialect::begin_statement`]) that runs
    /// every completion and commits once; an error rolls it back.
    fn complete_batch(
        &self,
        conn: &mut DbConnection<Self>,
        items: &[BatchCompletion<'_>],
    ) -> impl Future<Output = Result<Vec<bool>, Self::Error>> + Send {
        async move {
            let begin = AssertSqlSafe(self.begin_statement());
            let mut tx = conn.begin_with(begin).await.map_err(Self::driver_error)?;
            let mut applied = Vec::with_capacity(items.len());
            for item in items {
                let done = self
                    .complete_applied(&mut tx, item.id, item.token, &item.completion)
                    .await;
                match done {
                    Ok(done) => applied.push(done),
                    Err(e) => {
                        drop(tx.rollback().await);
                        return Err(e);
                    }
                }
            }
            tx.commit().await.map_err(Self::driver_error)?;
            Ok(applied)
        }
    }

    /// Whether the record is completed under `token` (a completion that
    /// matched no row was already applied: a retry after a lost reply).
    fn completed_under(
        &self,
        conn: &mut DbConnection<Self>,
        id: &RecordId,
        token: Token,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        let values = Values {
            token: Some(token),
            ..Values::of(id)
        };
        let row = fetch_optional::<Self>(conn, &self.shared().completed_under, values);
        async move { Ok(row.await?.is_some()) }
    }

    /// A [`Fenced`] update; the rows it matched.
    fn fenced(
        &self,
        conn: &mut DbConnection<Self>,
        id: &RecordId,
        token: Token,
        change: Fenced<'_>,
    ) -> impl Future<Output = Result<u64, Self::Error>> + Send {
        let on = Values {
            token: Some(token),
            ..Values::of(id)
        };
        let shared = self.shared();
        let (statement, values) = match change {
            Fenced::Release { now } => (
                &shared.release,
                Values {
                    now: Some(now),
                    ..on
                },
            ),
            Fenced::SaveResourceId(resource_id) => (
                &shared.save_resource_id,
                Values {
                    resource_id: Some(resource_id),
                    ..on
                },
            ),
            Fenced::ExtendLease { until } => (
                &shared.extend_lease,
                Values {
                    lease_until: Some(until),
                    ..on
                },
            ),
        };
        execute::<Self>(conn, statement, values)
    }

    /// Reads the live record.
    fn fetch(
        &self,
        conn: &mut DbConnection<Self>,
        id: &RecordId,
        now: Timestamp,
    ) -> impl Future<Output = Result<Option<StoredRecord>, Self::Error>> + Send {
        let values = Values {
            now: Some(now),
            ..Values::of(id)
        };
        let row = fetch_optional::<Self>(conn, &self.shared().fetch, values);
        async move {
            row.await?
                .as_ref()
                .map(|row| Self::decode_record(row, id))
                .transpose()
        }
    }

    /// One purge round of at most `limit` rows per statement: what it
    /// removed, and how many records it passed without removing them
    /// (re-filed to their next due time, or found and changed since): 0 when
    /// the purge has nothing more to walk (a round that removed something
    /// may report 0).
    fn purge_round(
        &self,
        conn: &mut DbConnection<Self>,
        now: Timestamp,
        limit: u32,
    ) -> impl Future<Output = Result<(PurgeReport, u64), Self::Error>> + Send;

    /// The operator listing: at most `fetch` in-flight records of `query`,
    /// in keyset order (lease end, then the record's key), after `after`.
    fn list_in_flight(
        &self,
        conn: &mut DbConnection<Self>,
        query: &InFlightQuery<'_>,
        after: Option<KeysetAfter>,
        fetch: u32,
    ) -> impl Future<Output = Result<Vec<RecordSummary>, Self::Error>> + Send {
        let shared = self.shared();
        let statement = match after {
            None => &shared.list_in_flight,
            Some(_) => &shared.list_in_flight_after,
        };
        let values = Values {
            now: Some(query.now),
            lease_before: Some(query.lease_before),
            limit: Some(fetch),
            after: after.as_ref(),
            ..Values::default()
        };
        // Planned at every run: the listing is rare, and a plan kept from
        // when the table was small (Postgres keeps one after five runs)
        // reads and sorts the whole table for every page at any size after.
        let query = statement.bind::<Self::Db>(&values).persistent(false);
        async move {
            let rows = <Self::Db as Driver>::fetch_all(query, conn).await;
            let rows = rows.map_err(Self::driver_error)?;
            rows.iter().map(Self::decode_summary).collect()
        }
    }

    /// The operator's release (of `attempt` only, if given); the rows it
    /// matched.
    fn release_in_flight(
        &self,
        conn: &mut DbConnection<Self>,
        id: &RecordId,
        attempt: Option<u32>,
        now: Timestamp,
    ) -> impl Future<Output = Result<u64, Self::Error>> + Send {
        let values = Values {
            now: Some(now),
            attempt,
            ..Values::of(id)
        };
        execute::<Self>(conn, &self.shared().release_in_flight, values)
    }

    /// The operator's delete of a completed record; the rows it matched.
    fn delete_completed(
        &self,
        conn: &mut DbConnection<Self>,
        id: &RecordId,
        now: Timestamp,
    ) -> impl Future<Output = Result<u64, Self::Error>> + Send {
        let values = Values {
            now: Some(now),
            ..Values::of(id)
        };
        execute::<Self>(conn, &self.shared().delete_completed, values)
    }

    /// The records in each state.
    fn count_states(
        &self,
        conn: &mut DbConnection<Self>,
        now: Timestamp,
    ) -> impl Future<Output = Result<StateCounts, Self::Error>> + Send {
        let values = Values {
            now: Some(now),
            ..Values::default()
        };
        let row = fetch_optional::<Self>(conn, &self.shared().count_states, values);
        async move {
            // One row, always (an aggregate): none is the driver's
            // `RowNotFound`, as `fetch_one` reported it.
            let row = row.await?.ok_or(sqlx::Error::RowNotFound);
            row.and_then(|row| <Self::Db as Driver>::decode_counts(&row))
                .map_err(Self::driver_error)
        }
    }

    /// The statement that begins a transaction of the transactional mode
    /// and bounds how long it waits for a concurrent duplicate's lock.
    fn begin_statement(&self) -> String;

    /// After a claim in a transaction that lost a race, before it runs
    /// again: a dialect whose server rolled the transaction back (InnoDB
    /// rolls a deadlock's victim back whole) ends it and begins the next
    /// one on `conn` and says `true`; by default nothing is sent (`false`)
    /// and the claim runs again in the same transaction.
    fn restart_tx(
        &self,
        conn: &mut DbConnection<Self>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send {
        let _ = conn;
        async { Ok(false) }
    }

    /// Whether the claim in a transaction waited for a concurrent
    /// transaction's lock longer than the transaction allows (by default
    /// never: the begin statement took every lock).
    fn is_lock_timeout(e: &Self::Error) -> bool {
        let _ = e;
        false
    }

    /// The error when the claim lost
    /// [`CLAIM_RACE_TRIES`](idem_core::store::CLAIM_RACE_TRIES) races in a
    /// row.
    fn contention(tries: u32) -> StoreError {
        StoreError::Unavailable {
            backend: Self::BACKEND,
            source: format!("the claim lost {tries} races in a row").into(),
        }
    }

    /// Runs a write of the store (claim, completion, fenced update, purge),
    /// e.g. within a check of the server and a time bound; by default as
    /// it is.
    fn write<T: Send>(
        core: &SqlCore<Self>,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> impl Future<Output = Result<T, StoreError>> + Send {
        let _ = core;
        call
    }

    /// Runs before a transaction of the transactional mode (e.g. a check of
    /// the server).
    fn before_tx(core: &SqlCore<Self>) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = core;
        async { Ok(()) }
    }

    /// Sees the error a transactional call ended with.
    fn observe(&self, e: &StoreError) {
        let _ = e;
    }

    /// `fut` within the store's bound on a call, if it has one (the commit
    /// of a transaction is bounded by it; its work is not).
    fn bounded<T: Send>(
        &self,
        fut: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> impl Future<Output = Result<T, StoreError>> + Send {
        fut
    }
}

/// [`Dialect::claim_batch`]'s default, for a dialect that overrides it for
/// some servers only: one transaction ([`Dialect::begin_statement`]) that
/// runs every claim ([`Dialect::claim_once`]) and commits once. An error
/// rolls it back, and so does a race lost inside it (a dialect may roll the
/// whole transaction back on it), every claim then answered `None`.
///
/// # Errors
///
/// The first claim's error, or the driver's on `BEGIN` or `COMMIT`.
pub async fn claim_batch_in_tx<D: Dialect>(
    dialect: &D,
    conn: &mut DbConnection<D>,
    reqs: &[ClaimRequest<'_>],
) -> Result<Vec<Option<ClaimOutcome>>, D::Error> {
    let begin = AssertSqlSafe(dialect.begin_statement());
    let mut tx = conn.begin_with(begin).await.map_err(D::driver_error)?;
    let mut answers = Vec::with_capacity(reqs.len());
    for req in reqs {
        match dialect.claim_once(&mut tx, req).await {
            Ok(Some(answer)) => answers.push(Some(answer)),
            Ok(None) => {
                tx.rollback().await.map_err(D::driver_error)?;
                return Ok(vec![None; reqs.len()]);
            }
            Err(e) => {
                // The claim's error says what went wrong; a rollback that
                // fails too leaves the connection to be judged by it.
                drop(tx.rollback().await);
                return Err(e);
            }
        }
    }
    tx.commit().await.map_err(D::driver_error)?;
    Ok(answers)
}

/// The one SQL store: a [`Dialect`] on a store's [`Conns`]. It implements
/// [`Store`] and [`AdminStore`]; a dialect crate's store type holds one and
/// hands every call to it ([`sql_store!`](crate::sql_store)).
pub struct SqlCore<D: Dialect> {
    conns: Conns<D::Db>,
    dialect: D,
    pub(crate) coalescing: Coalescing,
    pub(crate) queues: Arc<Queues>,
    /// The verdict on the table's layout mark, once a call found the table
    /// (one check at a time: concurrent first calls wait for it).
    layout: Arc<tokio::sync::OnceCell<Result<(), LayoutError>>>,
}

impl<D: Dialect> Clone for SqlCore<D> {
    fn clone(&self) -> Self {
        Self {
            conns: self.conns.clone(),
            dialect: self.dialect.clone(),
            coalescing: self.coalescing,
            queues: Arc::clone(&self.queues),
            layout: Arc::clone(&self.layout),
        }
    }
}

impl<D: Dialect> std::fmt::Debug for SqlCore<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlCore")
            .field("backend", &D::BACKEND)
            .field("conns", &self.conns)
            .field("coalescing", &self.coalescing)
            .field("layout", &self.layout.get())
            .finish_non_exhaustive()
    }
}

impl<D: Dialect> SqlCore<D> {
    /// `dialect` on `conns`.
    #[must_use]
    pub fn new(conns: Conns<D::Db>, dialect: D) -> Self {
        Self {
            conns,
            dialect,
            coalescing: D::COALESCING,
            queues: Arc::default(),
            layout: Arc::default(),
        }
    }

    /// Refuses to run a call on a table of another layout: the first call
    /// that finds the table reads its mark and keeps the verdict (a store
    /// migrated by a tool of the user's own, or never migrated, is checked
    /// this way; `migrate` checks before it touches a table). No table yet:
    /// nothing to check (the call fails on its own, and the next call
    /// looks again).
    ///
    /// # Errors
    ///
    /// [`StoreError::Backend`] with the [`LayoutError`] for a table of
    /// another layout, on every call of the store; the driver's error when
    /// the mark cannot be read.
    pub(crate) async fn ensure_layout(&self) -> Result<(), StoreError> {
        let refused = |e: LayoutError| StoreError::Backend {
            backend: D::BACKEND,
            source: Box::new(e),
        };
        if let Some(verdict) = self.layout.get() {
            return verdict.clone().map_err(refused);
        }
        let checked = self
            .layout
            .get_or_try_init(|| async {
                match call_unchecked!(self, |conn| self.dialect.layout_mark(conn))? {
                    Some(mark) => Ok(check_layout(&self.dialect.table(), mark.as_deref())),
                    // Nothing to keep: the next call looks again.
                    None => Err(None),
                }
            })
            .await;
        match checked {
            Ok(verdict) => verdict.clone().map_err(refused),
            Err(None) => Ok(()),
            Err(Some(e)) => Err(e),
        }
    }

    /// Whether the store coalesces its claims and completions (see
    /// [`Coalescing`]).
    #[must_use]
    pub fn coalescing(&self) -> Coalescing {
        self.coalescing
    }

    /// Sets whether the store coalesces its claims and completions.
    pub fn set_coalescing(&mut self, coalescing: Coalescing) {
        self.coalescing = coalescing;
    }

    /// The dialect.
    #[must_use]
    pub fn dialect(&self) -> &D {
        &self.dialect
    }

    /// The dialect, to change its settings. The store stops sharing its
    /// waiting calls with its clones: a batch runs on one dialect (one
    /// table), so a store whose statements may change waits alone.
    pub fn dialect_mut(&mut self) -> &mut D {
        self.queues = Arc::default();
        self.layout = Arc::default();
        &mut self.dialect
    }

    /// The store's connections.
    #[must_use]
    pub fn connections(&self) -> &Conns<D::Db> {
        &self.conns
    }

    /// A fenced update as a store call: `Ok` when it matched the record,
    /// [`StoreError::LeaseLost`] otherwise.
    async fn fenced_call(
        &self,
        id: &RecordId,
        token: Token,
        change: Fenced<'_>,
    ) -> Result<(), StoreError> {
        D::write(self, async {
            fenced(call!(self, |conn| self
                .dialect
                .fenced(conn, id, token, change))?)
        })
        .await
    }

    /// The completion, and when it matched no row, whether this completion
    /// was already applied (not an error) or the lease is lost.
    pub(crate) async fn complete_on(
        &self,
        conn: &mut DbConnection<D>,
        id: &RecordId,
        token: Token,
        completion: &Completion<'_>,
    ) -> Result<bool, D::Error> {
        self.dialect
            .complete_applied(conn, id, token, completion)
            .await
    }

    /// Purge rounds on one connection until one removes something or passes
    /// nothing more. Each round moves every record it re-files past `now`,
    /// or walks on towards the table's end, so this ends.
    async fn purge_on(
        &self,
        conn: &mut DbConnection<D>,
        now: Timestamp,
        limit: u32,
    ) -> Result<PurgeReport, D::Error> {
        loop {
            let (report, refiled) = self.dialect.purge_round(&mut *conn, now, limit).await?;
            if report != PurgeReport::default() || refiled == 0 {
                return Ok(report);
            }
        }
    }

    /// The claim on a transaction's connection (see [`TxStore`]).
    pub(crate) async fn claim_in_tx(
        &self,
        conn: &mut DbConnection<D>,
        req: &ClaimRequest<'_>,
    ) -> Result<Option<ClaimOutcome>, D::Error> {
        self.dialect.claim_once(conn, req).await
    }

    /// The completion on a transaction's connection: `Ok` when it applied,
    /// [`StoreError::LeaseLost`] when no row matched.
    pub(crate) async fn complete_in_tx(
        &self,
        conn: &mut DbConnection<D>,
        id: &RecordId,
        token: Token,
        completion: &Completion<'_>,
    ) -> Result<(), StoreError> {
        let rows = self.dialect.complete(conn, id, token, completion).await;
        fenced(rows.map_err(Into::into)?)
    }
}

impl<D: Dialect> SqlStore for SqlCore<D> {
    type Db = D::Db;
    type CallError = D::Error;

    fn conns(&self) -> &Conns<D::Db> {
        &self.conns
    }

    fn checkout_error(e: sqlx::Error) -> D::Error {
        D::checkout_error(e)
    }

    fn call_leaves_connection_sound(e: &D::Error) -> bool {
        D::leaves_connection_sound(e)
    }
}

/// Every call on one checkout; the writes through [`Dialect::write`].
#[deny(clippy::missing_trait_methods)]
impl<D: Dialect> Store for SqlCore<D> {
    /// The dialect's claim on one checkout, run again (at most 8 times in
    /// all) only when it lost a race to a concurrent writer on the same
    /// record, which the next run sees committed.
    ///
    /// Coalesced (see [`Coalescing`]) on the store's own pool: a claim that
    /// finds every connection busy waits and goes with the others waiting,
    /// in one batch ([`Dialect::claim_batch`]).
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        D::write(self, async {
            self.ensure_layout().await?;
            if let Some(answer) = self.claim_coalesced(req).await {
                return answer;
            }
            retry_claim_race(D::BACKEND, || async {
                let outcome = call!(self, |conn| self.dialect.claim_once(conn, req))?;
                if outcome.is_none() {
                    debug!("claim lost a race; running it again");
                }
                Ok(outcome)
            })
            .await
        })
        .await
    }

    /// One statement; when it matched no row, a read on the same checkout
    /// tells a lost lease from this completion already applied (a retry
    /// after a lost reply, which is not an error).
    async fn complete(
        &self,
        id: &RecordId,
        token: Token,
        completion: &Completion<'_>,
    ) -> Result<(), StoreError> {
        D::write(self, async {
            self.ensure_layout().await?;
            if let Some(answer) = self.complete_coalesced(id, token, completion).await {
                return answer;
            }
            if call!(self, |conn| self.complete_on(conn, id, token, completion))? {
                Ok(())
            } else {
                Err(StoreError::LeaseLost)
            }
        })
        .await
    }

    async fn release(&self, id: &RecordId, token: Token, now: Timestamp) -> Result<(), StoreError> {
        self.fenced_call(id, token, Fenced::Release { now }).await
    }

    async fn save_resource_id(
        &self,
        id: &RecordId,
        token: Token,
        resource_id: &str,
    ) -> Result<(), StoreError> {
        self.fenced_call(id, token, Fenced::SaveResourceId(resource_id))
            .await
    }

    async fn extend_lease(
        &self,
        id: &RecordId,
        token: Token,
        lease_until: Timestamp,
    ) -> Result<(), StoreError> {
        let until = Fenced::ExtendLease { until: lease_until };
        self.fenced_call(id, token, until).await
    }

    async fn fetch(
        &self,
        id: &RecordId,
        now: Timestamp,
    ) -> Result<Option<StoredRecord>, StoreError> {
        call!(self, |conn| self.dialect.fetch(conn, id, now))
    }

    /// Rounds of the dialect's purge on one checkout. A round that only
    /// re-filed records (moved them to their next due time) removed
    /// nothing, and an empty report tells the caller the purge is done; so
    /// rounds run until one removes something or finds nothing due.
    async fn purge_expired(&self, now: Timestamp, limit: u32) -> Result<PurgeReport, StoreError> {
        D::write(self, async {
            call!(self, |conn| self.purge_on(conn, now, limit))
        })
        .await
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::none()
    }
}

/// Listing with keyset pagination (lease end, then key: the sweep index's
/// order where the dialect has one); release, delete and counts are one
/// statement each. Counting scans the table.
#[deny(clippy::missing_trait_methods)]
impl<D: Dialect> AdminStore for SqlCore<D> {
    async fn list_in_flight(&self, query: &InFlightQuery<'_>) -> Result<Page, StoreError> {
        let limit = query.limit.max(1);
        let after = query.cursor.map(Cursor::keyset_position).transpose()?;
        let after = after.as_ref().map(KeysetAfter::of).transpose()?;
        let fetch = limit.saturating_add(1);
        let records = call!(self, |conn| {
            self.dialect.list_in_flight(conn, query, after, fetch)
        })?;
        Ok(Page::keyset(records, limit))
    }

    async fn release_in_flight(
        &self,
        id: &RecordId,
        attempt: Option<u32>,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let rows = call!(self, |conn| {
            self.dialect.release_in_flight(conn, id, attempt, now)
        })?;
        Ok(rows == 1)
    }

    async fn delete_completed(&self, id: &RecordId, now: Timestamp) -> Result<bool, StoreError> {
        let rows = call!(self, |conn| self.dialect.delete_completed(conn, id, now))?;
        Ok(rows == 1)
    }

    async fn count_states(&self, now: Timestamp) -> Result<StateCounts, StoreError> {
        call!(self, |conn| self.dialect.count_states(conn, now))
    }
}

/// A store type that runs on a [`SqlCore`]: what the transactional mode
/// ([`SqlIdemExt`](crate::SqlIdemExt)) and the consumer's transactional
/// inbox need of it. [`sql_store!`](crate::sql_store) implements it with
/// [`Store`] and [`AdminStore`].
pub trait TxStore: Store + Sized {
    /// The store's dialect.
    type Dialect: Dialect;

    /// The store's core.
    fn sql_core(&self) -> &SqlCore<Self::Dialect>;
}

impl<D: Dialect> TxStore for SqlCore<D> {
    type Dialect = D;

    fn sql_core(&self) -> &Self {
        self
    }
}

/// Implements [`TxStore`], [`Store`], [`AdminStore`] and `Debug` (its
/// dialect and connections) for a dialect crate's store type by handing
/// every call to its [`SqlCore`], and writes its inherent `pool` (typed as
/// the driver's pool alias, for its docs), `close` and `with_coalescing`:
/// `sql_store!(PgStore, Pg, core, PgPool)` for `struct PgStore { core:
/// SqlCore<Pg>, .. }`.
#[macro_export]
macro_rules! sql_store {
    // One async method of `$trait` handed to the store's core.
    (@forward $trait:ident, $field:ident;
        $(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty;)*
    ) => {
        $(
            async fn $name(&self, $($arg: $ty),*) -> $crate::__private::Result<$ret> {
                $crate::__private::$trait::$name(&self.$field, $($arg),*).await
            }
        )*
    };
    ($store:ty, $dialect:ty, $field:ident, $pool:ty) => {
        impl $store {
            /// Whether claims and completions that find every connection
            /// of the store's own pool busy are coalesced: sent together,
            /// as one batch on the next connection free, each answered as
            /// it would be alone. A call that finds a connection free goes
            /// at once, alone, unless more claims and completions are under
            /// way than the pool has connections: then they all queue, and a
            /// quarter of the connections run their batches, which grow with
            /// the load. A store built on your sqlx pool (`new(pool)`) never
            /// coalesces. The batch sizes are the
            /// `idem_store_batch_size` metric.
            ///
            /// On by default: on PostgreSQL and MySQL/MariaDB a batch is one
            /// statement of each kind; on SQLite one read of the claims'
            /// records, one write transaction for the claims that write and
            /// one update for the completions, and a store is busy above two
            /// calls under way and runs one batch at a time, so that its
            /// writers queue instead of meeting the file's write lock.
            #[must_use]
            pub fn with_coalescing(mut self, on: bool) -> Self {
                self.$field.set_coalescing(if on {
                    $crate::Coalescing::WhenBusy
                } else {
                    $crate::Coalescing::Off
                });
                self
            }

            /// The sqlx pool of the store, for your own queries on the same
            /// database, for its size and idle connections. A store over
            /// your pool (`new(pool)`) runs everything on it; a store built
            /// by `connect` runs on a pool of its own and opens this one
            /// lazily, for you only (see [Connections](Self#connections)).
            /// To close the store, call [`close`](Self::close).
            #[must_use]
            pub fn pool(&self) -> &$pool {
                self.$field.connections().pool()
            }

            /// Closes the store's connections: its own pool (its idle
            /// connections now, the others as their calls end) and
            /// [`pool`](Self::pool), which for a store over your pool is
            /// yours. Every call after it fails with
            /// [`StoreError::Unavailable`](idem_core::store::StoreError), on
            /// every clone.
            pub async fn close(&self) {
                self.$field.connections().close().await;
            }

            /// [`with_coalescing`](Self::with_coalescing) with any
            /// [`Coalescing`](idem_sql::Coalescing), for tests.
            #[doc(hidden)]
            #[must_use]
            pub fn with_coalescing_mode(mut self, mode: $crate::Coalescing) -> Self {
                self.$field.set_coalescing(mode);
                self
            }
        }

        impl ::std::fmt::Debug for $store {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct(stringify!($store))
                    .field("dialect", self.$field.dialect())
                    .field("conns", self.$field.connections())
                    .finish_non_exhaustive()
            }
        }

        impl $crate::TxStore for $store {
            type Dialect = $dialect;

            fn sql_core(&self) -> &$crate::SqlCore<$dialect> {
                &self.$field
            }
        }

        /// Every call is [`SqlCore`](idem_sql::SqlCore)'s: see the crate
        /// docs for its statements.
        impl $crate::__private::Store for $store {
            $crate::sql_store!(@forward Store, $field;
                fn claim(req: &$crate::__private::ClaimRequest<'_>)
                    -> $crate::__private::ClaimOutcome;
                fn complete(
                    id: &$crate::__private::RecordId,
                    token: $crate::__private::Token,
                    completion: &$crate::__private::Completion<'_>
                ) -> ();
                fn release(
                    id: &$crate::__private::RecordId,
                    token: $crate::__private::Token,
                    now: $crate::__private::Timestamp
                ) -> ();
                fn save_resource_id(
                    id: &$crate::__private::RecordId,
                    token: $crate::__private::Token,
                    resource_id: &str
                ) -> ();
                fn extend_lease(
                    id: &$crate::__private::RecordId,
                    token: $crate::__private::Token,
                    lease_until: $crate::__private::Timestamp
                ) -> ();
                fn fetch(id: &$crate::__private::RecordId, now: $crate::__private::Timestamp)
                    -> ::std::option::Option<$crate::__private::StoredRecord>;
                fn purge_expired(now: $crate::__private::Timestamp, limit: u32)
                    -> $crate::__private::PurgeReport;
            );
            fn capabilities(&self) -> $crate::__private::Capabilities {
                $crate::__private::Store::capabilities(&self.$field)
            }
        }

        /// The operator API is [`SqlCore`](idem_sql::SqlCore)'s: indexed
        /// listing with keyset pagination; release, delete and counts are
        /// one statement each. Counting scans the table.
        impl $crate::__private::AdminStore for $store {
            $crate::sql_store!(@forward AdminStore, $field;
                fn list_in_flight(query: &$crate::__private::InFlightQuery<'_>)
                    -> $crate::__private::Page;
                fn release_in_flight(
                    id: &$crate::__private::RecordId,
                    attempt: ::std::option::Option<u32>,
                    now: $crate::__private::Timestamp
                ) -> bool;
                fn delete_completed(
                    id: &$crate::__private::RecordId,
                    now: $crate::__private::Timestamp
                ) -> bool;
                fn count_states(now: $crate::__private::Timestamp)
                    -> $crate::__private::StateCounts;
            );
        }
    };
}

/// The primary key of a record's row: the first 16 bytes of the SHA-256 of
/// its identity ([`RecordId::digest`]). The owner, operation and key are
/// stored beside it and checked on every read ([`check_identity`](crate::check_identity)),
/// so that two identities sharing a key are a typed error, never a wrong
/// replay.
#[must_use]
pub fn record_key(id: &RecordId) -> [u8; 16] {
    let digest = id.digest();
    let mut key = [0; 16];
    key.copy_from_slice(&digest[..16]);
    key
}

/// `sql` with its numbered parameters (`$N` with `sigil` `'$'`, `?N` with
/// `'?'`) renumbered for a statement that names the record by its one key
/// parameter ([`record_key`], number 1) rather than by owner, operation and
/// key (numbers 1 to 3): 4 becomes 2, and so on. A dialect writes its
/// statements in the identity's numbering and keys them with this.
#[must_use]
pub fn keyed(sql: &str, sigil: char) -> std::sync::Arc<str> {
    let mut out = String::with_capacity(sql.len());
    let mut rest = sql;
    while let Some(at) = rest.find(sigil) {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let digits = after
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(after.len());
        match after[..digits].parse::<u32>() {
            Ok(n) if n >= 4 => out.push_str(&format!("{sigil}{}", n - 2)),
            _ => out.push_str(&rest[at..at + 1 + digits]),
        }
        rest = &after[digits..];
    }
    out.push_str(rest);
    out.into()
}

/// Where a listing's previous page stopped, in the keyset order of every
/// dialect's listing: lease end, then the record's key (Postgres and MySQL
/// read it from their `(sweep_at, id)` index, where an in-flight record's
/// `sweep_at` is its lease end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeysetAfter {
    /// The last record's lease end.
    pub lease_until: Timestamp,
    /// The last record's primary key ([`record_key`]).
    pub key: [u8; 16],
}

impl KeysetAfter {
    /// The position a cursor names.
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidCursor`] when it names no record identity (a
    /// cursor this store did not write).
    fn of(position: &KeysetPosition) -> Result<Self, StoreError> {
        let scope = Scope::new(position.owner.as_str(), position.operation.as_str())
            .map_err(|_| StoreError::InvalidCursor)?;
        let key =
            IdempotencyKey::parse_exact(&position.key).map_err(|_| StoreError::InvalidCursor)?;
        Ok(Self {
            lease_until: position.lease_until,
            key: record_key(&RecordId::new(scope, key)),
        })
    }
}

/// The binds every dialect's statements share, in the order its statement
/// names them.
pub trait BindRecord: Sized {
    /// Binds the record's primary key ([`record_key`]) as the statement's
    /// next parameter.
    #[must_use]
    fn bind_id(self, id: &RecordId) -> Self;

    /// [`BindRecord::bind_id`], then the fencing `token`.
    #[must_use]
    fn bind_fenced(self, id: &RecordId, token: Token) -> Self;

    /// Binds the record's owner, operation and key, as the statement's next
    /// three parameters (the columns an insert stores beside the key).
    #[must_use]
    fn bind_identity(self, id: &RecordId) -> Self;
}

impl<'q, DB> BindRecord for Query<'q, DB, <DB as Database>::Arguments>
where
    DB: Database,
    for<'t> &'t str: Encode<'t, DB> + Type<DB>,
    for<'t> &'t [u8]: Encode<'t, DB> + Type<DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
{
    fn bind_id(self, id: &RecordId) -> Self {
        self.bind(&record_key(id)[..])
    }

    fn bind_fenced(self, id: &RecordId, token: Token) -> Self {
        self.bind_id(id).bind(token.as_i64())
    }

    fn bind_identity(self, id: &RecordId) -> Self {
        self.bind(id.owner())
            .bind(id.operation())
            .bind(id.key().as_str())
    }
}

/// What [`sql_store!`](crate::sql_store) and [`sql_error!`](crate::sql_error)
/// name, from wherever they expand.
#[doc(hidden)]
pub mod __private {
    pub use idem_core::Error as CoreError;
    pub use idem_core::RecordId;
    pub use idem_core::clock::Timestamp;
    pub use idem_core::store::{
        AdminStore, Capabilities, ClaimOutcome, ClaimRequest, Completion, InFlightQuery, Page,
        PurgeReport, StateCounts, Store, StoreError, StoredRecord, Token,
    };
    pub use sqlx;

    /// A store call's result.
    pub type Result<T> = std::result::Result<T, idem_core::store::StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_renumbers_the_parameters_after_the_identity() {
        assert_eq!(
            &*keyed("id = $1 AND t = $4 AND v = $5 OR w = $12 AND x = $3", '$'),
            "id = $1 AND t = $2 AND v = $3 OR w = $10 AND x = $3"
        );
        assert_eq!(
            &*keyed("id = ?1 AND t = ?4 AND ?", '?'),
            "id = ?1 AND t = ?2 AND ?"
        );
    }
}
