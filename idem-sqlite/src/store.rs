//! [`SqliteStore`]: building it (from a pool, a URL, a file or memory) and
//! migrating its table. Its calls are [`idem_sql::SqlCore`]'s, on the
//! statements of [`crate::dialect`].

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use idem_sql::{Conns, SqlCore};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Sqlite, SqlitePool};

use crate::config::{
    DEFAULT_BUSY_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_TABLE, validate_table_name,
};
use crate::dialect::{SqliteDialect, sqlx_leaves_connection_sound};
use crate::error::Error;

/// What a connection is after the migration failed with this error (see
/// [`idem_sql::Conn`]).
fn leaves_connection_sound(e: &Error) -> bool {
    match e {
        Error::Sqlx(e) => sqlx_leaves_connection_sound(e),
        _ => true,
    }
}

/// An idempotency store in one SQLite table (`idem_records` unless
/// [`SqliteStore::with_table_name`] says otherwise).
///
/// Every transition is one statement, except the claim: it first reads the
/// record (a replay or a conflict ends there, one read that takes no lock
/// under WAL); a key that is absent or claimable then runs an
/// `INSERT … ON CONFLICT DO UPDATE … WHERE … RETURNING` that SQLite runs under
/// its write lock, so two racing claims can never both win. A completion
/// writes the table alone (the table has no index but its primary key; see
/// `migrations/0001_idem.sql`). A claim that loses
/// reads the standing record again; if that read finds the record claimable
/// after all (it changed in between), the claim runs again.
///
/// # Building one
///
/// The same words as the other backends: [`SqliteStore::new`] over your
/// pool, [`SqliteStore::connect`] from a URL, [`SqliteStore::connect_with`]
/// with your pool and connect options; none of them touches the schema, so
/// call [`SqliteStore::migrate`] once they are built. Two shortcuts for an
/// embedded database also migrate: [`SqliteStore::open`] (a file) and
/// [`SqliteStore::memory`] (a private in-memory database).
///
/// Cheap to clone (pools and `Arc`s); clones share them.
///
/// # Connections
///
/// A file store built by [`SqliteStore::open`], [`SqliteStore::connect`] or
/// [`SqliteStore::connect_with`] runs its calls on a pool of its own
/// ([`idem_sql::Pool`]) that sends no ping to a connection's worker thread
/// before or after a call: a fresh key is its three statements and a replay
/// its one read, with no other hop. A connection is re-validated only when a
/// call may have left it unsound (a dropped future: its statement is waited
/// for, then a ping), and replaced when its worker failed. The most recently
/// used connection is handed out first, so the completion of a short work
/// usually runs on the connection (and the page cache) its claim used.
/// The same pool serves [`SqliteStore::migrate`] and the operator API;
/// [`SqliteStore::pool`], a sqlx pool on the same file opened lazily, is for
/// your own queries only.
///
/// An in-memory database ([`SqliteStore::memory`], or an in-memory URL given
/// to [`SqliteStore::connect`]) lives exactly as long as its one connection,
/// which every call, the migration and [`SqliteStore::pool`] share: it stays
/// on sqlx's pool, whose ping after each checkout is one more hop to the
/// connection's worker thread. So does a store over your pool
/// ([`SqliteStore::new`]).
#[derive(Clone)]
pub struct SqliteStore {
    /// On a pool of its own for a file database built here; on the user's
    /// pool, or the one connection of a memory database, otherwise.
    core: SqlCore<SqliteDialect>,
}

impl SqliteStore {
    /// A store over your pool, on the table `idem_records`. The pool is used
    /// as given, for every call: sqlx pings each connection as it takes it
    /// back (one more hop to its worker thread per call, see
    /// [Connections](SqliteStore#connections)). Run [`SqliteStore::migrate`]
    /// (or apply [`SqliteStore::migration_sql`] yourself) before the first
    /// call.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), idem_sqlite::Error> {
    /// use idem_sqlite::{SqliteStore, sqlx::SqlitePool};
    ///
    /// let pool = SqlitePool::connect("sqlite://app.db?mode=rwc").await?;
    /// let store = SqliteStore::new(pool).with_table_name("payments_idem")?;
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn new(pool: SqlitePool) -> Self {
        Self::build(Conns::yours(pool), Arc::from(DEFAULT_TABLE))
    }

    /// Connects a pool to the database `url` names (`sqlite://path`,
    /// `sqlite:path`, with sqlx's query parameters such as `?mode=rwc` to
    /// create a missing file, or `sqlite::memory:`) and returns a store over
    /// it. It does not migrate: call [`SqliteStore::migrate`].
    ///
    /// A file gets what [`SqliteStore::open`] sets up (WAL,
    /// `synchronous = NORMAL`, a 5 s busy timeout, a pool of 8 connections
    /// for the calls, with no ping before or after one), except creating the
    /// file, which the URL decides. An in-memory URL gets the one
    /// connection, kept for the store's life, that [`SqliteStore::memory`]
    /// uses: an in-memory database lives as long as its connection.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlx`] when the URL is invalid or the database cannot be
    /// opened.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), idem_sqlite::Error> {
    /// let store = idem_sqlite::SqliteStore::connect("sqlite://idem.db?mode=rwc").await?;
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let options = SqliteConnectOptions::from_str(url)?;
        if is_in_memory(url) {
            return Self::over_memory(options).await;
        }
        let options = options
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(DEFAULT_BUSY_TIMEOUT);
        let pool = SqlitePoolOptions::new().max_connections(DEFAULT_MAX_CONNECTIONS);
        Self::connect_with(pool, options).await
    }

    /// Returns a store over the database of your connect options, with
    /// pools built from your pool options (see
    /// [Connections](SqliteStore#connections)): the calls' own pool takes
    /// `max_connections`, `acquire_timeout`, `max_lifetime` and
    /// `idle_timeout`; [`SqliteStore::pool`] is opened lazily with
    /// `test_before_acquire(false)` and `min_connections(0)` (a SQLite
    /// connection is a handle on a local file, with no peer to lose: a ping
    /// before each checkout would be one more trip to the connection's
    /// worker thread). It does not migrate: call [`SqliteStore::migrate`].
    ///
    /// For a file database. An in-memory database lives only as long as
    /// one of its connections and is shared between connections only through
    /// SQLite's shared cache (table locks): use [`SqliteStore::memory`] or an
    /// in-memory URL with [`SqliteStore::connect`], which keep it on one
    /// connection.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlx`] when the database cannot be opened.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), idem_sqlite::Error> {
    /// use idem_sqlite::SqliteStore;
    /// use idem_sqlite::sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions, SqliteSynchronous};
    ///
    /// let options = SqliteConnectOptions::new()
    ///     .filename("idem.db")
    ///     .create_if_missing(true)
    ///     .synchronous(SqliteSynchronous::Full);
    /// let store =
    ///     SqliteStore::connect_with(SqlitePoolOptions::new().max_connections(4), options).await?;
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_with(
        pool: SqlitePoolOptions,
        options: SqliteConnectOptions,
    ) -> Result<Self, Error> {
        let conns = Conns::own(pool, options);
        if let Some(own) = conns.own_pool() {
            // Opened now, so that a file that cannot be opened fails here.
            drop(own.get().await?);
        }
        Ok(Self::build(conns, Arc::from(DEFAULT_TABLE)))
    }

    /// A store on one in-memory connection, shared by everything.
    async fn over_memory(options: SqliteConnectOptions) -> Result<Self, Error> {
        let pool = memory_pool()
            .test_before_acquire(false)
            .connect_with(options)
            .await?;
        Ok(Self::new(pool))
    }

    /// Opens (creating if needed) a database file with WAL,
    /// `synchronous = NORMAL`, a 5 s busy timeout and a pool of 8
    /// connections, and migrates the default table: the embedded shortcut for
    /// [`SqliteStore::connect_with`] followed by [`SqliteStore::migrate`].
    ///
    /// `synchronous = NORMAL` under WAL is the usual embedded setting: a
    /// committed record survives a crash of the process; a power loss can
    /// lose the last transactions. Use [`SqliteStore::connect_with`] with
    /// `SqliteSynchronous::Full` if that matters.
    ///
    /// # Errors
    ///
    /// The database cannot be opened or migrated.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), idem_sqlite::Error> {
    /// let store = idem_sqlite::SqliteStore::open("idem.db").await?;
    /// # Ok(()) }
    /// ```
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(DEFAULT_BUSY_TIMEOUT);
        let pool = SqlitePoolOptions::new().max_connections(DEFAULT_MAX_CONNECTIONS);
        let store = Self::connect_with(pool, options).await?;
        store.migrate().await?;
        Ok(store)
    }

    /// Opens a private in-memory database on one connection kept for the
    /// store's life, and migrates the default table. For tests, examples and
    /// a single process that may forget its records when it stops: the
    /// database is not shared with another process or another `memory()`
    /// store, and it is gone when the last clone of this store is dropped, so
    /// a restart forgets every record and a retry after it runs the work
    /// again.
    ///
    /// # Errors
    ///
    /// The database cannot be created.
    pub async fn memory() -> Result<Self, Error> {
        let options = SqliteConnectOptions::from_str("sqlite::memory:")?;
        let store = Self::over_memory(options).await?;
        store.migrate().await?;
        Ok(store)
    }

    /// Uses another table (default `idem_records`), so that several stores
    /// can share one database file without seeing each other's records. Call
    /// [`SqliteStore::migrate`] afterwards: [`SqliteStore::open`] and
    /// [`SqliteStore::memory`] migrated the default table only.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidIdentifier`] unless the name is 1 to 64 ASCII
    /// letters, digits and `_`, not starting with a digit or `sqlite_`.
    /// SQLite ignores ASCII case in names: `Idem` and `idem` are one table.
    pub fn with_table_name(self, table: &str) -> Result<Self, Error> {
        let table = validate_table_name(table)?;
        let mut renamed = Self::build(self.core.connections().clone(), Arc::from(table));
        renamed.core.set_coalescing(self.core.coalescing());
        Ok(renamed)
    }

    fn build(conns: Conns<Sqlite>, table: Arc<str>) -> Self {
        Self {
            core: SqlCore::new(conns, SqliteDialect::new(table)),
        }
    }

    /// The table holding the records (default `idem_records`), as validated
    /// by [`SqliteStore::with_table_name`].
    #[must_use]
    pub fn table_name(&self) -> &str {
        &self.core.dialect().table
    }

    /// The migration for this store's table ([`MIGRATION`](crate::MIGRATION)
    /// with its placeholders filled in), for applying with your own tool,
    /// once, on a new database.
    #[must_use]
    pub fn migration_sql(&self) -> String {
        crate::schema::render(&self.core.dialect().table)
    }

    /// Creates the table when it does not exist: the
    /// shipped `migrations/0001_idem.sql`, in one `BEGIN IMMEDIATE`
    /// transaction. A table that exists must carry this build's layout mark
    /// ([`idem_sql::LAYOUT`], in the text that created it); any other is
    /// refused and left as it is, never read or altered. On a table of this
    /// layout it is one read and takes no write lock (so it waits for no
    /// writer, and a read-only file opens). Safe to call at every start,
    /// from several processes.
    ///
    /// # Errors
    ///
    /// [`Error::Layout`] for a table of another layout; [`Error::Sqlx`] when
    /// the DDL fails (e.g. a read-only file without the table).
    pub async fn migrate(&self) -> Result<(), Error> {
        let conns = self.core.connections();
        idem_sql::on_conn!(conns, Error::Sqlx, leaves_connection_sound, |conn| {
            self.migrate_on(conn)
        })
    }

    /// The migration on one connection.
    async fn migrate_on(&self, conn: &mut SqliteConnection) -> Result<(), Error> {
        if let Some(created) = self.core.dialect().created(&mut *conn).await? {
            return Ok(idem_sql::check_layout(self.table_name(), Some(&created))?);
        }
        let mut tx = sqlx::Connection::begin_with(conn, "BEGIN IMMEDIATE").await?;
        // Asked again under the write lock: another process may have
        // migrated in between.
        match self.core.dialect().created(&mut tx).await? {
            Some(created) => idem_sql::check_layout(self.table_name(), Some(&created))?,
            None => {
                tracing::info!(table = %self.table_name(), "creating the idem table");
                // Several statements in one call; the text is the shipped
                // file with a validated table name spliced in.
                sqlx::raw_sql(sqlx::AssertSqlSafe(self.migration_sql()))
                    .execute(&mut *tx)
                    .await?;
            }
        }
        Ok(tx.commit().await?)
    }
}

idem_sql::sql_store!(SqliteStore, SqliteDialect, core, SqlitePool);

/// The pool of an in-memory database: one connection, never closed (the
/// database lives exactly as long as its connection).
fn memory_pool() -> SqlitePoolOptions {
    SqlitePoolOptions::new()
        .max_connections(1)
        .min_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
}

/// Whether `url` names an in-memory database, by the two rules sqlx's
/// parser follows (`sqlx_sqlite::options::parse`): the database `:memory:`,
/// or the parameter `mode=memory`. (sqlx keeps the flag private, and its
/// `to_url_lossy` panics on the name it gives such a database.)
fn is_in_memory(url: &str) -> bool {
    let rest = url
        .trim_start_matches("sqlite://")
        .trim_start_matches("sqlite:");
    let (database, params) = rest.split_once('?').unwrap_or((rest, ""));
    database == ":memory:" || params.split('&').any(|p| p == "mode=memory")
}

#[cfg(test)]
mod tests {
    use super::is_in_memory;

    #[test]
    fn in_memory_urls_are_recognised() {
        for url in [
            "sqlite::memory:",
            "sqlite://:memory:",
            "sqlite://?mode=memory",
            "sqlite://x.db?cache=private&mode=memory",
        ] {
            assert!(is_in_memory(url), "{url}");
        }
        for url in [
            "sqlite://x.db",
            "sqlite:x.db?mode=rwc",
            "sqlite://memory.db",
        ] {
            assert!(!is_in_memory(url), "{url}");
        }
    }
}
