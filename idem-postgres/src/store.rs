//! [`PgStore`]: building it and migrating its table. Its calls are
//! [`idem_sql::SqlCore`]'s, on the statements of [`crate::dialect`]: every
//! transition is one SQL statement of [`crate::sql`].

use idem_sql::Dialect;
use std::sync::Arc;
use std::time::Duration;

use idem_sql::{Conns, SqlCore};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgPool, Postgres};

use crate::config::{
    DEFAULT_SCHEMA, DEFAULT_TABLE, DEFAULT_TX_LOCK_TIMEOUT, MAX_SCHEMA_NAME_LEN,
    MAX_TABLE_NAME_LEN, validate_identifier,
};
use crate::dialect::{self, PgDialect};
use crate::error::Error;
use crate::replication::{self, Guard, Replication};
use crate::sql::TableName;

/// The PostgreSQL idempotency store. Cheap to clone (two pools and a few
/// `Arc`s; clones share them).
///
/// Build it with [`PgStore::new`] (your pool) or [`PgStore::connect`], pick
/// the table with [`PgStore::with_table_name`] /
/// [`PgStore::with_schema_name`], and create it with [`PgStore::migrate`].
///
/// It checks where its commits go (see the crate docs' durability table):
/// [`PgStore::connect`], [`PgStore::connect_with`], [`PgStore::migrate`] and
/// [`PgStore::check_replication`] refuse a standby in recovery with
/// [`Error::Standby`] and warn once when commits are not synchronous to any
/// standby; [`PgStore::require_synchronous_replication`] makes that an error.
/// The check runs again before the next call after a call lost its
/// connection (the server may have changed: a failover), and before the
/// first call of a store that never checked; [`PgStore::with_call_timeout`]
/// bounds a write (a commit waiting for a standby that does not answer).
///
/// # Connections
///
/// A store built by [`PgStore::connect`] or [`PgStore::connect_with`] runs
/// everything (claim, completion, release, saved resource id, lease
/// extension, fetch, purge, the replication check, [`PgStore::migrate`], the
/// [transactional mode](crate::PgIdemExt::execute_in_tx) and the operator
/// API) on one pool of its own ([`idem_sql::Pool`]) that neither pings a
/// connection before a call nor after it: a claim, a completion or a replay
/// is one round trip. A connection is re-validated only when a call may
/// have left it unsound (a call cut short by [`PgStore::with_call_timeout`]
/// or a dropped future: its answer is awaited, off the caller's path, then
/// a ping), and replaced when a call failed on the wire. Up to
/// `max_connections` of the pool options serve them, most recently used
/// first (a transaction holds one for as long as it runs).
/// [`PgStore::pool`], a sqlx pool opened lazily with the same options, is
/// for your own queries only: it opens no connection unless you use it.
///
/// A store over your pool ([`PgStore::new`]) runs everything on that pool,
/// which pings each connection as it takes it back (sqlx does so
/// unconditionally): one round trip more per call, off the caller's path
/// but holding the connection until it is answered.
#[derive(Clone)]
pub struct PgStore {
    core: SqlCore<PgDialect>,
}

impl PgStore {
    /// A store over an existing pool, using `public.idem_records`.
    ///
    /// Every call runs on this pool, as given. If you build it yourself,
    /// consider
    /// [`PgPoolOptions::test_before_acquire(false)`](PgPoolOptions::test_before_acquire):
    /// otherwise sqlx pings every connection before handing it out, which
    /// doubles the round trips of every call. A dead connection then fails
    /// one call with [`StoreError::Unavailable`](idem_core::store::StoreError) and
    /// is replaced. Even so, sqlx pings each connection as it takes it back
    /// after a call (unconditionally): one more round trip per call, which
    /// the caller does not wait for but which keeps the connection from the
    /// next call until it is answered (a fresh key checks out twice). A store
    /// built by [`PgStore::connect`] or [`PgStore::connect_with`] does not pay
    /// it (see [Connections](PgStore#connections)).
    ///
    /// Run [`PgStore::migrate`] (or apply [`MIGRATION`](crate::MIGRATION)
    /// yourself) before the first call. Nothing is checked here (no
    /// connection is used): [`PgStore::migrate`] or
    /// [`PgStore::check_replication`] checks the server at start; otherwise
    /// the first call does.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), idem_postgres::Error> {
    /// use idem_postgres::{PgStore, sqlx::postgres::PgPoolOptions};
    ///
    /// let pool = PgPoolOptions::new()
    ///     .test_before_acquire(false)
    ///     .connect("postgres://postgres@127.0.0.1:5432/test")
    ///     .await?;
    /// let store = PgStore::new(pool).with_table_name("payments_idem")?;
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn new(pool: PgPool) -> Self {
        Self::build(Conns::yours(pool), Arc::new(Guard::new(false)))
    }

    /// Connects to `url` and returns a store with pools of its own (see
    /// [Connections](PgStore#connections)), sqlx's default pool options.
    ///
    /// No ping before or after a call, so a claim, a completion or a replay
    /// is one round trip. The price: a connection that died while idle fails
    /// the one call that picks it up (a typed
    /// [`StoreError::Unavailable`](idem_core::store::StoreError), HTTP 503),
    /// and the pool replaces it.
    ///
    /// Then it checks the server ([`PgStore::check_replication`]): a standby
    /// is refused; commits not synchronous to any standby are logged once as
    /// a warning.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlx`] when the URL is invalid or the server unreachable;
    /// [`Error::Standby`] when the server is a standby in recovery.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let options: PgConnectOptions = url.parse()?;
        Self::connect_with(PgPoolOptions::new(), options).await
    }

    /// Like [`PgStore::connect`], with your pool and connect options, and
    /// the server checked the same way.
    ///
    /// The calls' pool takes from `pool` its `max_connections`, its
    /// `acquire_timeout` (a call that waits longer for a connection fails
    /// with [`StoreError::Unavailable`](idem_core::store::StoreError)), its
    /// `max_lifetime` and its `idle_timeout` (a connection past either is
    /// replaced at its next checkout). [`PgStore::pool`] is built from
    /// `pool` with `test_before_acquire(false)` and `min_connections(0)`,
    /// and opened lazily; its hooks (`after_connect`, ...) apply to it only.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlx`] when the server is unreachable; [`Error::Standby`]
    /// when it is a standby in recovery.
    pub async fn connect_with(
        pool: PgPoolOptions,
        options: PgConnectOptions,
    ) -> Result<Self, Error> {
        let guard = Arc::new(Guard::new(false));
        let check = replication::connect_check(&guard);
        Self::build(Conns::own_checked(pool, options, Some(check)), guard)
            .checked_at_start()
            .await
    }

    /// Like [`PgStore::connect_with`], for reading only: a standby in
    /// recovery (a read replica) is accepted instead of refused with
    /// [`Error::Standby`], and no replication warning is logged. For the
    /// operator API's reads (listing stuck records, counts, inspect) on a
    /// replica; the server itself refuses writes on a standby (a read-only
    /// transaction: [`StoreError::Backend`](idem_core::store::StoreError)),
    /// so never run the engine on such a store.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlx`] when the URL is invalid or the server unreachable.
    pub async fn connect_read_only(
        pool: PgPoolOptions,
        options: PgConnectOptions,
    ) -> Result<Self, Error> {
        Self::build(Conns::own(pool, options), Arc::new(Guard::for_reads()))
            .checked_at_start()
            .await
    }

    /// The store once [`PgStore::check_replication`] accepted its server;
    /// closed otherwise.
    async fn checked_at_start(self) -> Result<Self, Error> {
        if let Err(e) = self.check_replication().await {
            self.close().await;
            return Err(e);
        }
        Ok(self)
    }

    /// Refuses to run unless commits are synchronous to at least one
    /// standby, so that a deployment that lost its synchronous standby
    /// refuses writes with
    /// [`StoreError::Unavailable`](idem_core::store::StoreError) (503) rather
    /// than acknowledging records a failover would lose. The server is
    /// checked:
    ///
    /// * now;
    /// * on every new connection of the store's own pool (built by
    ///   [`PgStore::connect`] or [`PgStore::connect_with`]), before it serves
    ///   a call: a connection replaced silently (past its idle timeout or
    ///   lifetime) reaches whatever server its address names after a
    ///   failover;
    /// * before the next write after a call lost its connection;
    /// * every [check period](PgStore::with_replication_check_period)
    ///   (default 5 s), by one write: a setting changed on the live primary
    ///   (`synchronous_standby_names` emptied) is refused within a period.
    ///
    /// A failed check latches: every write checks first, and is refused,
    /// until a check passes. A store over your own pool ([`PgStore::new`])
    /// cannot reach into your pool: install
    /// [`refuse_without_synchronous_standby`](crate::refuse_without_synchronous_standby)
    /// as its `after_connect` hook for the same check of every new
    /// connection (without it, the period bounds how long the store may
    /// write to a server it has not judged).
    ///
    /// "Synchronous" is [`Replication::is_synchronous`]:
    /// `synchronous_standby_names` names a standby and `synchronous_commit`
    /// is `on`, `remote_write` or `remote_apply`, as read on one of the
    /// store's connections. It says that commits wait for a standby, not
    /// that one is connected now: while none is, commits wait (see the
    /// durability table in the crate docs).
    ///
    /// The requirement belongs to the store's connections: `self`, the
    /// store returned and every clone share it once it is met (a refused
    /// requirement leaves them as they were).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), idem_postgres::Error> {
    /// use idem_postgres::PgStore;
    ///
    /// let store = PgStore::connect("postgres://app@db.internal/app")
    ///     .await?
    ///     .require_synchronous_replication()
    ///     .await?; // Error::NotSynchronous here, at start, if not
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NotSynchronous`] when commits are not synchronous to any
    /// standby; [`Error::Standby`] on a standby; [`Error::Sqlx`] when the
    /// server cannot be reached.
    pub async fn require_synchronous_replication(self) -> Result<Self, Error> {
        let required_before = self.guard().requires();
        self.guard().require();
        if let Err(e) = self.check_replication().await {
            if !required_before {
                // Refused: the store (and its clones) stay as they were.
                self.guard().relax();
            }
            return Err(e);
        }
        Ok(self)
    }

    /// Whether this store was built with
    /// [`PgStore::require_synchronous_replication`].
    #[must_use]
    pub fn requires_synchronous_replication(&self) -> bool {
        self.guard().requires()
    }

    /// Reads where the server's commits go, on one of the store's
    /// connections, and judges it: a standby is refused, commits not
    /// synchronous to any standby are an error if
    /// [required](PgStore::require_synchronous_replication) and otherwise
    /// logged once per store as a warning. [`PgStore::connect`] and
    /// [`PgStore::migrate`] call it; call it at start when you build the
    /// store with [`PgStore::new`] and do not migrate.
    ///
    /// # Errors
    ///
    /// [`Error::Standby`], [`Error::NotSynchronous`] (only if required), or
    /// [`Error::Sqlx`] when the server cannot be reached.
    pub async fn check_replication(&self) -> Result<Replication, Error> {
        dialect::check_replication(&self.core).await
    }

    /// How often a store that
    /// [requires synchronous replication](PgStore::require_synchronous_replication)
    /// checks the server again (default 5 s): the first write after the
    /// period runs the check (one round trip) before its statement. Zero
    /// checks before every write. Shared, like the requirement, by the
    /// store's clones.
    #[must_use]
    pub fn with_replication_check_period(self, period: Duration) -> Self {
        self.guard().set_period(period);
        self
    }

    /// Uses another table name (default `idem_records`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidIdentifier`] unless the name is 1 to 40 ASCII letters,
    /// digits and `_`, not starting with a digit or `pg_`.
    pub fn with_table_name(self, table: &str) -> Result<Self, Error> {
        let table = validate_identifier("table", table, MAX_TABLE_NAME_LEN)?;
        Ok(self.renamed(|name| name.table = table))
    }

    /// Uses another schema (default `public`); [`PgStore::migrate`] creates
    /// it if missing.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidIdentifier`] unless the name is 1 to 63 ASCII letters,
    /// digits and `_`, not starting with a digit or `pg_`.
    pub fn with_schema_name(self, schema: &str) -> Result<Self, Error> {
        let schema = validate_identifier("schema", schema, MAX_SCHEMA_NAME_LEN)?;
        Ok(self.renamed(|name| name.schema = schema))
    }

    /// How long the transactional mode waits for a concurrent duplicate's
    /// transaction to finish before answering 409 (default 5 s; it sets
    /// `lock_timeout` for its own transaction only).
    #[must_use]
    pub fn with_tx_lock_timeout(mut self, timeout: Duration) -> Self {
        self.core.dialect_mut().tx_lock_timeout = timeout;
        self
    }

    /// Bounds every write of the store (claim, completion, release, saved
    /// resource id, lease extension, purge), from the checkout to the
    /// commit's answer, and the `COMMIT` of the
    /// [transactional mode](crate::PgIdemExt::execute_in_tx) (not its work);
    /// a call still waiting then fails with
    /// [`Error::Timeout`], which the engine sees as
    /// [`StoreError::Unavailable`](idem_core::store::StoreError) (503,
    /// retryable). Default: unbounded.
    ///
    /// Set it when commits wait for a synchronous standby: while no standby
    /// confirms, a commit waits, and neither `statement_timeout` nor
    /// `lock_timeout` bounds that wait (PostgreSQL disarms them before the
    /// commit). A call that timed out was never reported stored; its commit
    /// may still complete on the primary once a standby confirms it (a claim
    /// then holds its key until the lease ends, and the next attempt is a
    /// recovery). The connection is not cancelled (a cancelled wait would
    /// make the unconfirmed commit visible): it returns to the pool once the
    /// server answers, so a pool full of waiting commits answers
    /// `PoolTimedOut` (also 503) until the standby is back.
    #[must_use]
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.core.dialect_mut().call_timeout = Some(timeout);
        self
    }

    /// A store on `public.idem_records`.
    fn build(conns: Conns<Postgres>, guard: Arc<Guard>) -> Self {
        let name = TableName {
            schema: DEFAULT_SCHEMA.to_owned(),
            table: DEFAULT_TABLE.to_owned(),
        };
        let dialect = PgDialect::new(name, DEFAULT_TX_LOCK_TIMEOUT, guard);
        Self {
            core: SqlCore::new(conns, dialect),
        }
    }

    /// The same store on another table.
    /// The same store on the table `rename` makes of its table's name.
    fn renamed(mut self, rename: impl FnOnce(&mut TableName)) -> Self {
        let mut name = (*self.core.dialect().name).clone();
        rename(&mut name);
        *self.core.dialect_mut() = self.core.dialect().renamed(name);
        self
    }

    fn guard(&self) -> &Guard {
        &self.core.dialect().guard
    }

    /// The migration for this store's schema and table, placeholders filled
    /// in, for applying with your own tool.
    #[must_use]
    pub fn migration_sql(&self) -> String {
        crate::schema::render(&self.core.dialect().name)
    }

    /// Creates the schema (if missing), the table and its indexes, in one
    /// transaction. Idempotent: safe to call at every start, from every
    /// instance at once (an advisory lock serializes them). It never touches
    /// sqlx's `_sqlx_migrations` table, so it does not interfere with your
    /// application's own migrations.
    ///
    /// First it checks the server ([`PgStore::check_replication`]) and
    /// returns, and logs at `info`, what it found: whether commits wait for
    /// a standby, and the settings that say so.
    ///
    /// A table that already exists must carry this build's layout mark (its
    /// comment, [`idem_sql::LAYOUT`]); any other is refused and left as it
    /// is, never read or altered.
    ///
    /// # Errors
    ///
    /// [`Error::Standby`] on a standby, [`Error::NotSynchronous`] if
    /// [required](PgStore::require_synchronous_replication), [`Error::Layout`]
    /// for a table of another layout, [`Error::Sqlx`] when the server refuses
    /// (e.g. no `CREATE` privilege).
    pub async fn migrate(&self) -> Result<Replication, Error> {
        let found = self.check_replication().await?;
        replication::report(&found);
        let migrated: Result<(), Error> = idem_sql::on_conn!(&self.core, |conn| async {
            let mut tx = conn.begin().await?;
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(crate::schema::MIGRATE_LOCK)
                .execute(&mut *tx)
                .await?;
            // An existing table must be of this layout: never touched otherwise.
            let dialect = self.core.dialect();
            if let Some(mark) = dialect.layout_mark(&mut tx).await? {
                idem_sql::check_layout(&dialect.table(), mark.as_deref())?;
            }
            // Several statements in one simple-protocol query; the text is
            // the shipped file with validated identifiers spliced in.
            sqlx::raw_sql(sqlx::AssertSqlSafe(self.migration_sql()))
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(())
        });
        migrated?;
        Ok(found)
    }

    /// The schema holding the table (default `public`), as validated by
    /// [`PgStore::with_schema_name`].
    #[must_use]
    pub fn schema_name(&self) -> &str {
        &self.core.dialect().name.schema
    }

    /// The table holding the records (default `idem_records`), as validated
    /// by [`PgStore::with_table_name`].
    #[must_use]
    pub fn table_name(&self) -> &str {
        &self.core.dialect().name.table
    }
}

idem_sql::sql_store!(PgStore, PgDialect, core, PgPool);
