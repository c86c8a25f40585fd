//! Opening a database with the settings an embedded store wants.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use crate::Error;
use crate::SqliteStore;

/// How long a writer waits for SQLite's write lock before giving up
/// (then the call fails with a retryable store error).
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections in the pool of a file database (readers run in parallel under
/// WAL; writers queue on SQLite's single write lock).
pub const DEFAULT_MAX_CONNECTIONS: u32 = 8;

impl SqliteStore {
    /// Opens (creating if needed) a database file with WAL,
    /// `synchronous = NORMAL`, a 5 s busy timeout and a pool of 8
    /// connections, and runs the migration.
    ///
    /// `synchronous = NORMAL` under WAL is the usual embedded setting: a
    /// committed record survives a crash of the process; a power loss can
    /// lose the last transactions. Use [`SqliteStore::open_with`] with
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
        Self::open_with(options, DEFAULT_MAX_CONNECTIONS).await
    }

    /// Opens a private in-memory database (gone when the store is dropped).
    /// For tests and examples; it is not shared between processes.
    ///
    /// # Errors
    ///
    /// The database cannot be created.
    pub async fn memory() -> Result<Self, Error> {
        // One connection, kept forever: an in-memory database lives exactly
        // as long as its connection.
        let options = SqliteConnectOptions::from_str("sqlite::memory:")?;
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .test_before_acquire(false)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(options)
            .await?;
        let store = Self::new(pool);
        store.migrate().await?;
        Ok(store)
    }

    /// Opens a database with your own options and pool size, then migrates.
    ///
    /// # Errors
    ///
    /// The database cannot be opened or migrated.
    pub async fn open_with(
        options: SqliteConnectOptions,
        max_connections: u32,
    ) -> Result<Self, Error> {
        // No ping before a checkout: a SQLite connection is a handle on a
        // local file, with no peer to lose; the ping would be one more trip
        // to the connection's worker thread on every call.
        let pool = SqlitePoolOptions::new()
            .max_connections(max_connections.max(1))
            .test_before_acquire(false)
            .connect_with(options)
            .await?;
        let store = Self::new(pool);
        store.migrate().await?;
        Ok(store)
    }
}
