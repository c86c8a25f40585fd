//! [`MySqlStore`]: building it and migrating its table. Its calls are
//! [`idem_sql::SqlCore`]'s, on the statements of [`crate::dialect`]:
//! every transition is one SQL statement of [`crate::sql`], except the
//! claim on MySQL (an insert, then a read when the key exists) and a
//! takeover (the claim, then a guarded update).

use idem_sql::Dialect;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use idem_sql::{Conns, SqlCore};
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{Executor, MySql, MySqlConnection, MySqlPool};

use crate::config::{
    DEFAULT_TABLE, DEFAULT_TX_LOCK_TIMEOUT, MAX_TABLE_NAME_LEN, Server, validate_identifier,
};
use crate::dialect::{MySqlDialect, leaves_connection_sound};
use crate::error::Error;
use crate::sql::TableName;

/// The MySQL / MariaDB idempotency store. Cheap to clone (pools and a few
/// `Arc`s; clones share them).
///
/// Build it with [`MySqlStore::new`] (your pool) or [`MySqlStore::connect`],
/// pick the table with [`MySqlStore::with_table_name`], and create it with
/// [`MySqlStore::migrate`]. The server's flavour ([`Server`]), which decides
/// the claim statement, is detected by [`MySqlStore::connect`], or for a
/// store over your pool by [`MySqlStore::migrate`] or its first call.
///
/// # Connections
///
/// A store built by [`MySqlStore::connect`] or [`MySqlStore::connect_with`]
/// runs everything (claim, completion, release, saved resource id, lease
/// extension, fetch, purge, [`MySqlStore::migrate`], the transactional mode
/// and the operator API) on one pool of its own ([`idem_sql::Pool`]) that
/// pings a connection neither before a call nor after it. A connection is
/// re-validated only when a call may have left it unsound (a dropped future:
/// its answer is awaited off the caller's path, then a ping), and replaced
/// when a call failed on the wire or the server ended the session (`KILL`, a
/// shutdown). Up to `max_connections` of the pool options serve them, most
/// recently used first (a transaction holds one for as long as it runs);
/// [`MySqlStore::pool`], a sqlx pool opened lazily with the same options, is
/// for your own queries only: it opens no connection unless you use it.
///
/// A store over your pool ([`MySqlStore::new`]) runs everything on that
/// pool, which pings each connection as it takes it back (sqlx does so
/// unconditionally): one more round trip per call, off the caller's path but
/// holding the connection until it is answered.
#[derive(Clone)]
pub struct MySqlStore {
    core: SqlCore<MySqlDialect>,
}

impl MySqlStore {
    /// A store over an existing pool, using the table `idem_records` of the
    /// pool's database. Nothing is asked here (no connection is used): the
    /// server's flavour, which picks the claim statement ([`Server`]), is
    /// detected (`SELECT VERSION()`, once) by [`MySqlStore::migrate`] or
    /// else by the first call, unless [`MySqlStore::with_server`] names it.
    ///
    /// Every call runs on this pool, as given. If you build it yourself,
    /// consider
    /// [`MySqlPoolOptions::test_before_acquire(false)`](MySqlPoolOptions::test_before_acquire):
    /// otherwise sqlx pings every connection before handing it out, which
    /// doubles the round trips of every call. A dead connection then fails
    /// one call with [`StoreError::Unavailable`](idem_core::store::StoreError)
    /// and is replaced. Even so, sqlx pings each connection as it takes it
    /// back after a call (unconditionally): one more round trip per call,
    /// which the caller does not wait for but which keeps the connection
    /// from the next call until it is answered (a fresh key checks out
    /// twice). A store built by [`MySqlStore::connect`] or
    /// [`MySqlStore::connect_with`] does not pay it (see
    /// [Connections](MySqlStore#connections)).
    ///
    /// Run [`MySqlStore::migrate`] (or apply [`MIGRATION`](crate::MIGRATION)
    /// yourself) before the first call.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), idem_mysql::Error> {
    /// use idem_mysql::{MySqlStore, sqlx::mysql::MySqlPoolOptions};
    ///
    /// let pool = MySqlPoolOptions::new()
    ///     .test_before_acquire(false)
    ///     .connect("mysql://root@127.0.0.1:3306/test")
    ///     .await?;
    /// let store = MySqlStore::new(pool).with_table_name("payments_idem")?;
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn new(pool: MySqlPool) -> Self {
        Self::with_server_of(Conns::yours(pool), Arc::new(OnceLock::new()))
    }

    fn with_server_of(conns: Conns<MySql>, server: Arc<OnceLock<Server>>) -> Self {
        let name = TableName {
            table: DEFAULT_TABLE.to_owned(),
        };
        Self::build(conns, name, server, DEFAULT_TX_LOCK_TIMEOUT)
    }

    /// Connects to `url` (`mysql://` or `mariadb://`) and returns a store
    /// with pools of its own (see [Connections](MySqlStore#connections)),
    /// sqlx's default pool options.
    ///
    /// No ping before or after a call, so a claim or a replay is one round
    /// trip on MariaDB. The price: a connection that died while idle fails
    /// the one call that picks it up (a typed
    /// [`StoreError::Unavailable`](idem_core::store::StoreError), HTTP 503),
    /// and the pool replaces it.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlx`] when the URL is invalid or the server unreachable.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let options: MySqlConnectOptions = url.parse()?;
        Self::connect_with(MySqlPoolOptions::new(), options).await
    }

    /// Like [`MySqlStore::connect`], with your pool and connect options.
    ///
    /// The calls' pool takes from `pool` its `max_connections`, its
    /// `acquire_timeout` (a call that waits longer for a connection fails
    /// with [`StoreError::Unavailable`](idem_core::store::StoreError)), its
    /// `max_lifetime` and its `idle_timeout` (a connection past either is
    /// replaced at its next checkout). [`MySqlStore::pool`] is built from
    /// `pool` with `test_before_acquire(false)` and `min_connections(0)`,
    /// and opened lazily; its hooks apply to it only.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlx`] when the server is unreachable.
    pub async fn connect_with(
        pool: MySqlPoolOptions,
        options: MySqlConnectOptions,
    ) -> Result<Self, Error> {
        let conns = Conns::own(pool, options);
        let server = idem_sql::on_conn!(conns, Error::Sqlx, leaves_connection_sound, |c| {
            crate::dialect::detect(c)
        })?;
        Ok(Self::with_server_of(
            conns,
            Arc::new(OnceLock::from(server)),
        ))
    }

    /// Uses another table name (default `idem_records`), in the pool's
    /// database.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidIdentifier`] unless the name is 1 to 48 ASCII letters,
    /// digits and `_`, not starting with a digit.
    pub fn with_table_name(self, table: &str) -> Result<Self, Error> {
        let table = validate_identifier("table", table, MAX_TABLE_NAME_LEN)?;
        let MySqlDialect {
            server,
            tx_lock_timeout,
            ..
        } = self.core.dialect().clone();
        let conns = self.core.connections().clone();
        Ok(Self::build(
            conns,
            TableName { table },
            server,
            tx_lock_timeout,
        ))
    }

    /// Uses the claim statement of `server` instead of the detected one
    /// (e.g. the portable MySQL statements on a MariaDB server, which runs
    /// them too: the tests do, to run the MySQL path somewhere).
    #[must_use]
    pub fn with_server(mut self, server: Server) -> Self {
        self.core.dialect_mut().server = Arc::new(OnceLock::from(server));
        self
    }

    /// How long the transactional mode waits for a concurrent duplicate's
    /// transaction to finish before answering 409 (default 5 s; rounded up
    /// to whole seconds, at least 1: it sets the session's
    /// `innodb_lock_wait_timeout`, see
    /// [`MySqlIdemExt`](crate::MySqlIdemExt)).
    #[must_use]
    pub fn with_tx_lock_timeout(mut self, timeout: Duration) -> Self {
        self.core.dialect_mut().tx_lock_timeout = timeout;
        self
    }

    fn build(
        conns: Conns<MySql>,
        name: TableName,
        server: Arc<OnceLock<Server>>,
        tx_lock_timeout: Duration,
    ) -> Self {
        let dialect = MySqlDialect::new(name, server, tx_lock_timeout);
        Self {
            core: SqlCore::new(conns, dialect),
        }
    }

    /// The migration for this store's table, placeholder filled in, for
    /// applying with your own tool.
    #[must_use]
    pub fn migration_sql(&self) -> String {
        crate::schema::render(&self.core.dialect().name)
    }

    /// Creates the table and its index if missing. Idempotent: safe to call
    /// at every start, from every instance at once (a named lock,
    /// `GET_LOCK`, serializes them: MySQL's DDL is not transactional). It
    /// never touches sqlx's `_sqlx_migrations` table, so it does not
    /// interfere with your application's own migrations.
    ///
    /// A table that already exists must carry this build's layout mark (its
    /// comment, [`idem_sql::LAYOUT`]); any other is refused and left as it
    /// is, never read or altered.
    ///
    /// # Errors
    ///
    /// [`Error::Layout`] for a table of another layout; [`Error::Sqlx`] when
    /// the server refuses (e.g. no `CREATE` privilege, or the lock not
    /// granted within 60 s).
    pub async fn migrate(&self) -> Result<(), Error> {
        let conns = self.core.connections();
        idem_sql::on_conn!(conns, Error::Sqlx, leaves_connection_sound, |conn| {
            self.migrate_on(conn)
        })
    }

    /// The migration on one connection, under the named lock.
    async fn migrate_on(&self, conn: &mut MySqlConnection) -> Result<(), Error> {
        // Detected now (if not yet), so that the first call does not ask.
        self.core.dialect().server_on(&mut *conn).await?;
        let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 60)")
            .bind(crate::schema::MIGRATE_LOCK)
            .fetch_one(&mut *conn)
            .await?;
        if got != Some(1) {
            return Err(Error::Sqlx(sqlx::Error::Protocol(
                "could not take the migration lock within 60 s".into(),
            )));
        }
        // An existing table must be of this layout: never touched otherwise.
        let table = self.table_name();
        let mark = self.core.dialect().layout_mark(&mut *conn).await?;
        let checked = mark.map_or(Ok(()), |m| idem_sql::check_layout(table, m.as_deref()));
        if let Err(refused) = checked {
            sqlx::query("SELECT RELEASE_LOCK(?)")
                .bind(crate::schema::MIGRATE_LOCK)
                .execute(&mut *conn)
                .await?;
            return Err(refused.into());
        }
        let done = conn
            .execute(sqlx::AssertSqlSafe(self.migration_sql()))
            .await;
        let released = sqlx::query("SELECT RELEASE_LOCK(?)")
            .bind(crate::schema::MIGRATE_LOCK)
            .execute(&mut *conn)
            .await;
        done?;
        released?;
        Ok(())
    }

    /// The table holding the records (default `idem_records`), as validated
    /// by [`MySqlStore::with_table_name`].
    #[must_use]
    pub fn table_name(&self) -> &str {
        &self.core.dialect().name.table
    }

    /// The server flavour whose statements the store runs: named by
    /// [`MySqlStore::with_server`], or detected by [`MySqlStore::connect`],
    /// [`MySqlStore::migrate`] or the first call; `None` before that (a
    /// store over your pool that has not run yet).
    #[must_use]
    pub fn server(&self) -> Option<Server> {
        self.core.dialect().server.get().copied()
    }
}

idem_sql::sql_store!(MySqlStore, MySqlDialect, core, MySqlPool);
