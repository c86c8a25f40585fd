//! [`connect`]: a store named by a URL, as an [`AnyStore`].

use std::time::Duration;

use idem_core::AnyStore;
use idem_core::store::BoxDynError;

/// Why [`connect`] could not give a store.
///
/// The source of [`Invalid`](Self::Invalid), [`Connect`](Self::Connect) and
/// [`Migrate`](Self::Migrate) is the backend's own error (`idem_sqlite::Error`,
/// `idem_postgres::Error`, `idem_mysql::Error`, `idem_redis::Error`), boxed; downcast it for the
/// details. No variant carries the URL, which may hold a password.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL names no store this crate knows. Permanent.
    #[error(
        "unknown store scheme {scheme:?}: use sqlite: (or a file path), postgres://, mysql://, mariadb://, redis:// or redis+cluster://"
    )]
    UnknownScheme {
        /// The scheme, as written.
        scheme: String,
    },
    /// The URL names a backend whose cargo feature is off in this build.
    /// Permanent: enable the feature.
    #[error("{scheme}: URLs need idem's `{feature}` feature, which this build does not enable")]
    FeatureDisabled {
        /// The scheme, as written.
        scheme: String,
        /// The feature to enable (`sqlite`, `postgres`, `mysql` or `redis`).
        feature: &'static str,
    },
    /// The URL, or an option of [`ConnectOptions`], is not valid for its
    /// backend (a malformed URL, a schema name that is not an identifier, a
    /// refused key prefix). Permanent: fix the configuration.
    #[error("invalid {backend} store configuration")]
    Invalid {
        /// `"sqlite"`, `"postgres"`, `"mysql"` or `"redis"`.
        backend: &'static str,
        /// What is wrong.
        #[source]
        source: BoxDynError,
    },
    /// The store could not be reached or opened (no server, refused
    /// credentials, a SQLite file that does not exist). May be temporary.
    #[error("cannot open the {backend} store")]
    Connect {
        /// `"sqlite"`, `"postgres"`, `"mysql"` or `"redis"`.
        backend: &'static str,
        /// The driver's error.
        #[source]
        source: BoxDynError,
    },
    /// The store was reached but its schema could not be created or
    /// brought up to date (for example no `CREATE` privilege).
    #[error("cannot migrate the {backend} store")]
    Migrate {
        /// `"sqlite"`, `"postgres"` or `"mysql"`.
        backend: &'static str,
        /// The driver's error.
        #[source]
        source: BoxDynError,
    },
}

/// How [`ConnectOptions::connect`] opens a store: whether it migrates, where
/// the records live, how long a call may wait on the server.
///
/// An option that a backend does not have is ignored by it (the schema and
/// table are Postgres's, the key prefix Redis's), so one set of options
/// serves every URL a configuration may hold.
///
/// ```no_run
/// # async fn f() -> Result<(), idem::ConnectError> {
/// use std::time::Duration;
///
/// let store = idem::ConnectOptions::new()
///     .migrate(false) // the schema is applied by our own migration tool
///     .schema_name("billing")
///     .timeout(Duration::from_secs(5))
///     .connect("postgres://app@db/app")
///     .await?;
/// # let _ = store; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    migrate: bool,
    schema_name: Option<String>,
    table_name: Option<String>,
    key_prefix: Option<String>,
    inline_body_limit: usize,
    timeout: Option<Duration>,
    require_synchronous_replication: bool,
    replication_check_period: Option<Duration>,
    read_only: bool,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self::new()
    }
}

/// [`ConnectOptions`]' plain setters: each sets its field to what it is
/// given (a name as an owned `Some`) and returns the options.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident($arg:ident: $ty:ty) => $field:ident = $value:expr;)+) => {
        $(
            $(#[$doc])*
            #[must_use]
            pub fn $name(mut self, $arg: $ty) -> Self {
                self.$field = $value;
                self
            }
        )+
    };
}

impl ConnectOptions {
    /// The options [`connect`] uses: migrate, the backends' default names
    /// and timeouts.
    #[must_use]
    pub fn new() -> Self {
        Self {
            migrate: true,
            schema_name: None,
            table_name: None,
            key_prefix: None,
            inline_body_limit: 0,
            timeout: None,
            require_synchronous_replication: false,
            replication_check_period: None,
            read_only: false,
        }
    }

    setters! {
        /// Whether to create the schema or bring it up to date while connecting
        /// (default `true`):
        ///
        /// | backend | `true` | `false` |
        /// |---|---|---|
        /// | SQLite file | creates the file if missing, WAL, `synchronous = NORMAL`, then `SqliteStore::migrate` (as `SqliteStore::open`) | opens the file as it is; a missing file is [`ConnectError::Connect`] |
        /// | SQLite `:memory:` | migrates | migrates too (an empty in-memory database is no store) |
        /// | Postgres | `PgStore::migrate`: the schema, table and indexes, idempotent, under an advisory lock; needs `CREATE` | no DDL: apply `PgStore::migration_sql` with your own tool |
        /// | MySQL / MariaDB | `MySqlStore::migrate`: the table and its index, idempotent, under a named lock; needs `CREATE` | no DDL: apply `MySqlStore::migration_sql` with your own tool |
        /// | Redis | nothing: Redis has no schema | nothing |
        migrate(migrate: bool) => migrate = migrate;

        /// The Postgres schema (default `public`). Ignored by other backends.
        schema_name(schema: &str) => schema_name = Some(schema.to_owned());

        /// The table on the SQL backends (default `idem_records`, validated as an
        /// identifier by each). Ignored by Redis.
        table_name(table: &str) => table_name = Some(table.to_owned());

        /// The Redis key prefix (default `idem:`). Ignored by other backends.
        key_prefix(prefix: &str) => key_prefix = Some(prefix.to_owned());

        /// Keeps a response body of up to `bytes` inside its Redis record, so a
        /// replay is one command (`RedisStore::with_inline_body_limit`; default
        /// 0: every body in a key of its own). Such a body stays in memory until
        /// the key expires, and versions before the option refuse those records:
        /// read that method's memory figures and rolling-upgrade rule first.
        /// Ignored by other backends.
        redis_inline_body_limit(bytes: usize) => inline_body_limit = bytes;

        /// How long one call may wait on the server before it fails: the
        /// pool's acquire timeout on SQL backends, SQLite's busy timeout (the
        /// wait for its write lock), on Postgres `statement_timeout` (set on
        /// every connection of the store's pool) plus the store's
        /// `PgStore::with_call_timeout`, which also bounds a commit waiting for
        /// a synchronous standby (`statement_timeout` does not), and on MySQL
        /// `innodb_lock_wait_timeout` (the wait for a row lock, whole seconds,
        /// at least 1, set on every connection). Redis calls wait on no lock and
        /// do not use it. Default: the backends' own (SQLite 5 s busy, 30 s
        /// acquire, no statement or call timeout).
        timeout(timeout: Duration) => timeout = Some(timeout);

        /// On Postgres, refuse to run unless commits are synchronous to a
        /// standby (`PgStore::require_synchronous_replication`): connecting
        /// fails with `idem_postgres::Error::NotSynchronous` (inside
        /// [`ConnectError::Connect`]) when `synchronous_standby_names` names
        /// none, where without it the store only warns once. Default `false`.
        /// Ignored by the other backends.
        require_synchronous_replication(require: bool) => require_synchronous_replication = require;

        /// On Postgres, with
        /// [`require_synchronous_replication`](Self::require_synchronous_replication):
        /// how often the store checks the server again
        /// (`PgStore::with_replication_check_period`; default 5 s, zero before
        /// every write). A failed check refuses every write (503) until a check
        /// passes. Ignored by the other backends.
        replication_check_period(period: Duration) => replication_check_period = Some(period);
    }

    /// Open the store for reading only (default `false`): no migration,
    /// and on Postgres a standby in recovery (a read replica) is accepted
    /// instead of refused (`PgStore::connect_read_only`). For the operator
    /// API's reads (`idem stats`, `stuck`, `inspect` with `--read-only`);
    /// never run the engine on such a store.
    #[must_use]
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        if read_only {
            self.migrate = false;
        }
        self
    }

    /// Opens the store `url` names, with these options. See [`connect`] for
    /// the URL forms.
    ///
    /// # Errors
    ///
    /// See [`connect`].
    pub async fn connect(&self, url: &str) -> Result<AnyStore, ConnectError> {
        match Scheme::of(url)? {
            #[cfg(feature = "sqlite")]
            Scheme::Sqlite { bare } => self.sqlite(url, bare).await,
            #[cfg(feature = "postgres")]
            Scheme::Postgres => self.postgres(url).await,
            #[cfg(feature = "mysql")]
            Scheme::MySql => self.mysql(url).await,
            #[cfg(feature = "redis")]
            Scheme::Redis => self.redis(url).await,
            #[cfg(feature = "redis")]
            Scheme::RedisCluster { nodes } => self.redis_cluster(nodes).await,
        }
    }
}

/// Opens the store a URL names, as an [`AnyStore`]: one `Idem<AnyStore>`
/// type whatever the configuration says, with the operator API too.
/// Migrates (see [`ConnectOptions::migrate`]); use [`ConnectOptions`] for
/// names, timeouts or no migration.
///
/// | URL | backend | feature |
/// |---|---|---|
/// | `sqlite://PATH`, `sqlite:PATH`, `sqlite::memory:`, or a file path (`idem.db`, `/var/lib/app/idem.db`) | SQLite | `sqlite` |
/// | `postgres://…`, `postgresql://…` | PostgreSQL | `postgres` |
/// | `mysql://…`, `mariadb://…` | MySQL 8 or MariaDB 10.5+ (the server's flavour is asked at connect) | `mysql` |
/// | `redis://HOST:PORT/DB`, `rediss://…` (TLS) | Redis | `redis` |
/// | `redis+cluster://H1:P1,H2:P2`, `rediss+cluster://…` | Redis Cluster, through any of the nodes listed | `redis` |
///
/// A `sqlite:` URL takes sqlx's query parameters (`?mode=ro`, …); a file
/// path is taken as it is (no percent-decoding). A path whose text before
/// a `:` looks like a scheme (`data:1.db`) needs the `sqlite://` form.
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use idem::{AnyStore, Idem};
///
/// let url = std::env::var("IDEM_URL").unwrap_or_else(|_| "idem.db".to_owned());
/// let idem: Idem<AnyStore> = Idem::new(idem::connect(&url).await?);
/// # let _ = idem; Ok(()) }
/// ```
///
/// # Errors
///
/// [`ConnectError::UnknownScheme`] or [`ConnectError::FeatureDisabled`]
/// for a URL this build cannot open; [`ConnectError::Invalid`] for a
/// malformed URL; [`ConnectError::Connect`] when the store cannot be
/// reached or opened; [`ConnectError::Migrate`] when the migration fails.
pub async fn connect(url: &str) -> Result<AnyStore, ConnectError> {
    ConnectOptions::new().connect(url).await
}

/// What a URL names; only the backends compiled in.
#[allow(
    clippy::empty_enums,
    reason = "empty only in a build without any backend"
)]
#[derive(Debug, PartialEq, Eq)]
enum Scheme {
    /// `bare`: a file path rather than a `sqlite:` URL.
    #[cfg(feature = "sqlite")]
    Sqlite { bare: bool },
    #[cfg(feature = "postgres")]
    Postgres,
    #[cfg(feature = "mysql")]
    MySql,
    #[cfg(feature = "redis")]
    Redis,
    #[cfg(feature = "redis")]
    RedisCluster { nodes: Vec<String> },
}

impl Scheme {
    fn of(url: &str) -> Result<Self, ConnectError> {
        let Some(scheme) = scheme_of(url) else {
            if url.is_empty() {
                return Err(ConnectError::UnknownScheme {
                    scheme: String::new(),
                });
            }
            #[cfg(feature = "sqlite")]
            return Ok(Self::Sqlite { bare: true });
            #[cfg(not(feature = "sqlite"))]
            return Err(disabled("a file path", "sqlite"));
        };
        match scheme.to_ascii_lowercase().as_str() {
            #[cfg(feature = "sqlite")]
            "sqlite" => Ok(Self::Sqlite { bare: false }),
            #[cfg(feature = "postgres")]
            "postgres" | "postgresql" => Ok(Self::Postgres),
            #[cfg(feature = "mysql")]
            "mysql" | "mariadb" => Ok(Self::MySql),
            #[cfg(feature = "redis")]
            "redis" | "rediss" => Ok(Self::Redis),
            #[cfg(feature = "redis")]
            s @ ("redis+cluster" | "rediss+cluster") => {
                let node_scheme = s.trim_end_matches("+cluster");
                let nodes = url[scheme.len() + 1..]
                    .trim_start_matches("//")
                    .split(',')
                    .filter(|n| !n.is_empty())
                    .map(|n| format!("{node_scheme}://{n}"))
                    .collect();
                Ok(Self::RedisCluster { nodes })
            }
            #[cfg(not(feature = "sqlite"))]
            "sqlite" => Err(disabled(scheme, "sqlite")),
            #[cfg(not(feature = "postgres"))]
            "postgres" | "postgresql" => Err(disabled(scheme, "postgres")),
            #[cfg(not(feature = "mysql"))]
            "mysql" | "mariadb" => Err(disabled(scheme, "mysql")),
            #[cfg(not(feature = "redis"))]
            "redis" | "rediss" | "redis+cluster" | "rediss+cluster" => {
                Err(disabled(scheme, "redis"))
            }
            _ => Err(ConnectError::UnknownScheme {
                scheme: scheme.to_owned(),
            }),
        }
    }
}

/// The URL's scheme: the text before the first `:` when it is one (a
/// letter, then letters, digits, `+`, `-` or `.`), of two characters at
/// least so that `C:\idem.db` is a path.
fn scheme_of(url: &str) -> Option<&str> {
    let (scheme, _) = url.split_once(':')?;
    let mut chars = scheme.chars();
    let first = chars.next()?;
    let ok = scheme.len() >= 2
        && first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    ok.then_some(scheme)
}

#[cfg(not(all(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "redis"
)))]
fn disabled(scheme: &str, feature: &'static str) -> ConnectError {
    ConnectError::FeatureDisabled {
        scheme: scheme.to_owned(),
        feature,
    }
}

/// The step a backend's error happened at, as the variant that says so.
#[cfg_attr(
    not(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "mysql",
        feature = "redis"
    )),
    allow(dead_code, reason = "no backend in this build")
)]
impl ConnectError {
    fn invalid(backend: &'static str, e: impl Into<BoxDynError>) -> Self {
        Self::Invalid {
            backend,
            source: e.into(),
        }
    }

    fn unreachable(backend: &'static str, e: impl Into<BoxDynError>) -> Self {
        Self::Connect {
            backend,
            source: e.into(),
        }
    }

    #[cfg_attr(
        not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
        allow(dead_code, reason = "no SQL backend in this build")
    )]
    fn migrate(backend: &'static str, e: impl Into<BoxDynError>) -> Self {
        Self::Migrate {
            backend,
            source: e.into(),
        }
    }
}

/// A SQL store as [`ConnectOptions`] finishes it once its pool is open:
/// the table named, then the schema migrated. Each backend names its own
/// methods here once, so a change of their signatures is one line.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
trait SqlStore: idem_core::store::AdminStore + Sized {
    /// The backend's name in [`ConnectError`].
    const BACKEND: &'static str;
    /// The store's `with_table_name`.
    fn with_table(self, table: &str) -> Result<Self, BoxDynError>;
    /// The store's `migrate`.
    fn migrate_schema(&self) -> impl Future<Output = Result<(), BoxDynError>> + Send;
}

/// [`SqlStore`] for `$store`, whose `with_table_name` and `migrate` every
/// SQL backend spells the same, named `$backend`.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
macro_rules! sql_store {
    ($store:ty, $backend:literal) => {
        impl SqlStore for $store {
            const BACKEND: &'static str = $backend;
            fn with_table(self, table: &str) -> Result<Self, BoxDynError> {
                Ok(self.with_table_name(table)?)
            }
            async fn migrate_schema(&self) -> Result<(), BoxDynError> {
                self.migrate().await?;
                Ok(())
            }
        }
    };
}

#[cfg(feature = "sqlite")]
sql_store!(idem_sqlite::SqliteStore, "sqlite");
#[cfg(feature = "postgres")]
sql_store!(idem_postgres::PgStore, "postgres");
#[cfg(feature = "mysql")]
sql_store!(idem_mysql::MySqlStore, "mysql");

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
impl ConnectOptions {
    /// The steps every SQL backend shares after connecting: the table
    /// option, then the migration when `migrate`.
    async fn finish<S: SqlStore>(
        &self,
        mut store: S,
        migrate: bool,
    ) -> Result<AnyStore, ConnectError> {
        if let Some(table) = &self.table_name {
            store = store
                .with_table(table)
                .map_err(|e| ConnectError::invalid(S::BACKEND, e))?;
        }
        if migrate {
            store
                .migrate_schema()
                .await
                .map_err(|e| ConnectError::migrate(S::BACKEND, e))?;
        }
        Ok(AnyStore::new(store))
    }
}

#[cfg(feature = "sqlite")]
impl ConnectOptions {
    async fn sqlite(&self, url: &str, bare: bool) -> Result<AnyStore, ConnectError> {
        use idem_sqlite::sqlx::sqlite::{
            SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
        };
        use idem_sqlite::{Error, SqliteStore};

        const BACKEND: &str = <SqliteStore as SqlStore>::BACKEND;
        let mut options = if bare {
            SqliteConnectOptions::new().filename(url)
        } else {
            url.parse::<SqliteConnectOptions>()
                .map_err(|e| ConnectError::invalid(BACKEND, Error::from(e)))?
        };
        // No ping before a checkout, as `SqliteStore::open`: a handle on a
        // local file has no peer to lose.
        let mut pool = SqlitePoolOptions::new().test_before_acquire(false);
        if let Some(t) = self.timeout {
            options = options.busy_timeout(t);
            pool = pool.acquire_timeout(t);
        }
        let in_memory = !bare && sqlite_in_memory(url);
        if in_memory {
            // An in-memory database lives as long as its one connection.
            pool = pool
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None);
        } else {
            pool = pool.max_connections(idem_sqlite::DEFAULT_MAX_CONNECTIONS);
            if self.migrate {
                options = options
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(SqliteSynchronous::Normal);
            }
        }
        let store = SqliteStore::new(
            pool.connect_with(options)
                .await
                .map_err(|e| ConnectError::unreachable(BACKEND, Error::from(e)))?,
        );
        self.finish(store, self.migrate || in_memory).await
    }
}

/// Whether a `sqlite:` URL names an in-memory database (`sqlite::memory:`,
/// `sqlite://:memory:`, `?mode=memory`).
#[cfg(feature = "sqlite")]
fn sqlite_in_memory(url: &str) -> bool {
    let rest = url
        .trim_start_matches("sqlite://")
        .trim_start_matches("sqlite:");
    let (database, params) = rest.split_once('?').unwrap_or((rest, ""));
    database == ":memory:" || params.split('&').any(|p| p == "mode=memory")
}

#[cfg(feature = "postgres")]
impl ConnectOptions {
    async fn postgres(&self, url: &str) -> Result<AnyStore, ConnectError> {
        use idem_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
        use idem_postgres::{Error, PgStore};

        const BACKEND: &str = <PgStore as SqlStore>::BACKEND;
        let mut options = url
            .parse::<PgConnectOptions>()
            .map_err(|e| ConnectError::invalid(BACKEND, Error::from(e)))?;
        let mut pool = PgPoolOptions::new();
        if let Some(t) = self.timeout {
            let ms = t.as_millis().to_string();
            options = options.options([("statement_timeout", ms.as_str())]);
            pool = pool.acquire_timeout(t);
        }
        let mut store = if self.read_only {
            PgStore::connect_read_only(pool, options).await
        } else {
            PgStore::connect_with(pool, options).await
        }
        .map_err(|e| ConnectError::unreachable(BACKEND, e))?;
        if let Some(t) = self.timeout {
            store = store.with_call_timeout(t);
        }
        if let Some(period) = self.replication_check_period {
            store = store.with_replication_check_period(period);
        }
        if self.require_synchronous_replication {
            store = store
                .require_synchronous_replication()
                .await
                .map_err(|e| ConnectError::unreachable(BACKEND, e))?;
        }
        if let Some(schema) = &self.schema_name {
            store = store
                .with_schema_name(schema)
                .map_err(|e| ConnectError::invalid(BACKEND, e))?;
        }
        self.finish(store, self.migrate).await
    }
}

#[cfg(feature = "mysql")]
impl ConnectOptions {
    async fn mysql(&self, url: &str) -> Result<AnyStore, ConnectError> {
        use idem_mysql::sqlx::Executor;
        use idem_mysql::sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
        use idem_mysql::{Error, MySqlStore};

        const BACKEND: &str = <MySqlStore as SqlStore>::BACKEND;
        let options = url
            .parse::<MySqlConnectOptions>()
            .map_err(|e| ConnectError::invalid(BACKEND, Error::from(e)))?;
        let mut pool = MySqlPoolOptions::new();
        if let Some(t) = self.timeout {
            // Whole seconds: the server has no finer unit.
            let secs = t.as_millis().div_ceil(1000).max(1);
            pool = pool.acquire_timeout(t).after_connect(move |conn, _| {
                Box::pin(async move {
                    conn.execute(idem_mysql::sqlx::AssertSqlSafe(format!(
                        "SET SESSION innodb_lock_wait_timeout = {secs}"
                    )))
                    .await
                    .map(|_| ())
                })
            });
        }
        let store = MySqlStore::connect_with(pool, options)
            .await
            .map_err(|e| ConnectError::unreachable(BACKEND, e))?;
        self.finish(store, self.migrate).await
    }
}

#[cfg(feature = "redis")]
impl ConnectOptions {
    /// The key prefix, checked before connecting (a bad one is a
    /// configuration error, whether or not the server answers).
    fn redis_prefix(&self) -> Result<Option<idem_redis::KeyPrefix>, ConnectError> {
        self.key_prefix
            .as_deref()
            .map(idem_redis::KeyPrefix::new)
            .transpose()
            .map_err(|e| ConnectError::invalid(REDIS, idem_redis::Error::from(e)))
    }

    /// The options every Redis store takes once connected: the prefix
    /// checked by [`Self::redis_prefix`], and the inline body limit.
    fn redis_finish(
        &self,
        mut store: idem_redis::RedisStore,
        prefix: Option<idem_redis::KeyPrefix>,
    ) -> AnyStore {
        if let Some(prefix) = prefix {
            store = store.with_key_prefix(prefix);
        }
        AnyStore::new(store.with_inline_body_limit(self.inline_body_limit))
    }

    async fn redis(&self, url: &str) -> Result<AnyStore, ConnectError> {
        use idem_redis::redis::Client;
        use idem_redis::redis::aio::ConnectionManagerConfig;
        use idem_redis::{Error, RedisStore};

        let client = Client::open(url).map_err(|e| ConnectError::invalid(REDIS, Error::from(e)))?;
        let prefix = self.redis_prefix()?;
        let store = RedisStore::connect_with(ConnectionManagerConfig::new(), client)
            .await
            .map_err(|e| ConnectError::unreachable(REDIS, e))?;
        Ok(self.redis_finish(store, prefix))
    }

    async fn redis_cluster(&self, nodes: Vec<String>) -> Result<AnyStore, ConnectError> {
        use idem_redis::redis::cluster::ClusterClient;
        use idem_redis::{Error, RedisStore};

        if nodes.is_empty() {
            return Err(ConnectError::invalid(
                REDIS,
                "redis+cluster:// names no node",
            ));
        }
        let client =
            ClusterClient::new(nodes).map_err(|e| ConnectError::invalid(REDIS, Error::from(e)))?;
        let prefix = self.redis_prefix()?;
        let conn = client
            .get_async_connection()
            .await
            .map_err(|e| ConnectError::unreachable(REDIS, Error::from(e)))?;
        Ok(self.redis_finish(RedisStore::new_cluster(conn), prefix))
    }
}

/// The Redis backend's name in [`ConnectError`].
#[cfg(feature = "redis")]
const REDIS: &str = "redis";

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "mysql",
        feature = "redis"
    ))]
    use run::*;

    /// What every backend's test does with the store it opened.
    #[cfg(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "mysql",
        feature = "redis"
    ))]
    mod run {
        use super::*;
        pub(super) use idem_core::Idem;
        use idem_core::{Outcome, Reply, Scope};

        /// Runs `key` on `idem` (scope `acct`, `POST /x`), the work answering
        /// `body`.
        pub(super) async fn answer(
            idem: &Idem<AnyStore>,
            key: &str,
            body: String,
        ) -> Reply<String, String> {
            let scope = Scope::new("acct", "POST /x").expect("scope");
            idem.execute(&scope, key, &1, |_| async {
                Outcome::<String, String>::Success(body)
            })
            .await
            .expect("execute")
        }

        /// Key `k1` runs once on a fresh `store` and is stored.
        pub(super) async fn runs(store: AnyStore) -> Reply<String, String> {
            let reply = answer(&Idem::new(store), "k1", "ok".to_owned()).await;
            assert!(reply.is_stored());
            reply
        }

        /// `options` refuse `url` for `backend` ([`ConnectError::Invalid`]).
        pub(super) async fn assert_invalid(options: &ConnectOptions, url: &str, backend: &str) {
            let e = options.connect(url).await.expect_err("refused");
            assert!(
                matches!(&e, ConnectError::Invalid { backend: b, .. } if *b == backend),
                "{e:?}"
            );
        }
    }

    #[test]
    fn schemes_and_paths() {
        assert_eq!(scheme_of("sqlite::memory:"), Some("sqlite"));
        assert_eq!(scheme_of("redis+cluster://a:1"), Some("redis+cluster"));
        assert_eq!(scheme_of("idem.db"), None);
        assert_eq!(scheme_of("/var/lib/idem.db"), None);
        assert_eq!(scheme_of(r"C:\idem.db"), None, "a drive letter is a path");
        assert_eq!(scheme_of("./a:b.db"), None);
        assert!(matches!(
            Scheme::of("ftp://x"),
            Err(ConnectError::UnknownScheme { scheme }) if scheme == "ftp"
        ));
        assert!(matches!(
            Scheme::of(""),
            Err(ConnectError::UnknownScheme { .. })
        ));
    }

    #[cfg(feature = "redis")]
    #[test]
    fn cluster_urls_list_their_nodes() {
        assert_eq!(
            Scheme::of("rediss+cluster://a:1,b:2,").ok(),
            Some(Scheme::RedisCluster {
                nodes: vec!["rediss://a:1".to_owned(), "rediss://b:2".to_owned()]
            })
        );
        assert_eq!(
            Scheme::of("REDIS://a:1").ok(),
            Some(Scheme::Redis),
            "schemes are case-insensitive"
        );
    }

    #[cfg(not(feature = "redis"))]
    #[test]
    fn a_backend_compiled_out_names_its_feature() {
        let e = Scheme::of("redis+cluster://a:1").expect_err("no redis");
        assert!(
            matches!(&e, ConnectError::FeatureDisabled { feature: "redis", scheme } if scheme == "redis+cluster"),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "redis+cluster: URLs need idem's `redis` feature, which this build does not enable"
        );
    }

    #[cfg(feature = "sqlite")]
    mod sqlite {
        use super::*;

        #[tokio::test]
        async fn memory_and_files() {
            runs(connect("sqlite::memory:").await.expect("memory")).await;

            let dir = std::env::temp_dir().join(format!(
                "idem-connect-{}",
                idem_core::IdempotencyKey::random()
            ));
            std::fs::create_dir(&dir).expect("temp dir");
            let path = dir.join("idem.db");
            let path = path.to_str().expect("UTF-8 path");
            // Without migration a missing file is not created.
            let e = ConnectOptions::new()
                .migrate(false)
                .connect(path)
                .await
                .expect_err("no such file");
            assert!(
                matches!(
                    e,
                    ConnectError::Connect {
                        backend: "sqlite",
                        ..
                    }
                ),
                "{e:?}"
            );
            assert!(!std::path::Path::new(path).exists());
            // A bare path, created and migrated; then opened as it is.
            runs(connect(path).await.expect("file")).await;
            let store = ConnectOptions::new()
                .migrate(false)
                .connect(&format!("sqlite://{path}"))
                .await
                .expect("existing file");
            runs(store).await;
            let _ = std::fs::remove_dir_all(&dir);

            assert_invalid(
                &ConnectOptions::new(),
                "sqlite://x.db?colour=blue",
                "sqlite",
            )
            .await;
        }
    }

    #[cfg(any(feature = "postgres", feature = "mysql", feature = "redis"))]
    fn random() -> String {
        idem_core::IdempotencyKey::random().as_str().to_lowercase()
    }

    /// The URL of a server of the tests: `$env`, else `default`.
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "redis"))]
    fn server_url(env: &str, default: &str) -> String {
        std::env::var(env).unwrap_or_else(|_| default.to_owned())
    }

    /// The store `options` open at `url`, or a panic saying to start
    /// `server` or set `env`.
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "redis"))]
    async fn reach(options: &ConnectOptions, url: &str, server: &str, env: &str) -> AnyStore {
        options.connect(url).await.unwrap_or_else(|e| {
            panic!("cannot reach {server} at {url} ({e}): start it or set {env}")
        })
    }

    /// The Postgres the tests use (`IDEM_POSTGRES_URL`).
    #[cfg(feature = "postgres")]
    fn postgres_url() -> String {
        server_url(
            "IDEM_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432/test",
        )
    }

    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn postgres_with_a_schema() {
        let url = postgres_url();
        let schema = format!("idem_connect_{}", random());
        let options = ConnectOptions::new().schema_name(&schema);
        let store = reach(&options, &url, "Postgres", "IDEM_POSTGRES_URL").await;
        runs(store).await;
        let bad = ConnectOptions::new().schema_name("no such schema");
        assert_invalid(&bad, &url, "postgres").await;
        let pg = idem_postgres::PgStore::connect(&url)
            .await
            .expect("connect");
        let drop = format!("DROP SCHEMA \"{schema}\" CASCADE");
        let drop = idem_postgres::sqlx::query(idem_postgres::sqlx::AssertSqlSafe(drop));
        drop.execute(pg.pool()).await.expect("drop schema");
    }

    /// The machine's Postgres has no synchronous standby: a store that
    /// requires one is refused at connect with the typed error (it only
    /// warns without the option, and creates nothing either way).
    #[cfg(feature = "postgres")]
    #[tokio::test]
    async fn postgres_requiring_synchronous_replication_is_refused_without_a_standby() {
        let url = postgres_url();
        let schema = format!("idem_connect_{}", random());
        let e = ConnectOptions::new()
            .schema_name(&schema)
            .require_synchronous_replication(true)
            .connect(&url)
            .await
            .expect_err("no synchronous standby here");
        let ConnectError::Connect { backend, source } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(*backend, "postgres");
        assert!(
            matches!(
                source.downcast_ref::<idem_postgres::Error>(),
                Some(idem_postgres::Error::NotSynchronous { .. })
            ),
            "{source:?}"
        );
    }

    #[cfg(feature = "mysql")]
    #[tokio::test]
    async fn mysql_and_mariadb_urls_with_a_table() {
        let url = server_url("IDEM_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
        let table = format!("idem_connect_{}", random());
        let options = ConnectOptions::new()
            .table_name(&table)
            .timeout(std::time::Duration::from_secs(3));
        for (i, url) in [url.clone(), url.replacen("mysql://", "mariadb://", 1)]
            .iter()
            .enumerate()
        {
            let store = reach(&options, url, "MySQL/MariaDB", "IDEM_MYSQL_URL").await;
            let reply = runs(store).await;
            assert_eq!(reply.is_replay(), i == 1, "both URL forms reach one table");
        }
        let bad = ConnectOptions::new().table_name("no such table");
        assert_invalid(&bad, &url, "mysql").await;
        let my = idem_mysql::MySqlStore::connect(&url)
            .await
            .expect("connect");
        let bound: u64 =
            idem_mysql::sqlx::query_scalar("SELECT @@SESSION.innodb_lock_wait_timeout")
                .fetch_one(my.pool())
                .await
                .expect("bound");
        assert_eq!(bound, 50, "a store of its own keeps the server default");
        let drop = format!("DROP TABLE `{table}`");
        let drop = idem_mysql::sqlx::query(idem_mysql::sqlx::AssertSqlSafe(drop));
        drop.execute(my.pool()).await.expect("drop table");
    }

    /// The Redis the tests use (`IDEM_REDIS_URL`).
    #[cfg(feature = "redis")]
    fn redis_url() -> String {
        server_url("IDEM_REDIS_URL", "redis://127.0.0.1:6379/")
    }

    /// Opens the store `options` name on the tests' Redis, and a connection
    /// of the test's own to look at its keys.
    #[cfg(feature = "redis")]
    async fn open_redis(
        options: ConnectOptions,
    ) -> (AnyStore, idem_redis::redis::aio::MultiplexedConnection) {
        let url = redis_url();
        let store = reach(&options, &url, "Redis", "IDEM_REDIS_URL").await;
        let conn = idem_redis::redis::Client::open(url.as_str())
            .expect("client")
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        (store, conn)
    }

    /// Every key under `prefix`.
    #[cfg(feature = "redis")]
    async fn redis_keys(
        conn: &mut idem_redis::redis::aio::MultiplexedConnection,
        prefix: &str,
    ) -> Vec<String> {
        idem_test_support::redis_admin::scan(conn, prefix).await
    }

    #[cfg(feature = "redis")]
    #[tokio::test]
    async fn redis_with_a_prefix() {
        use idem_redis::redis::AsyncCommands;
        // A bad prefix is found before connecting (nothing listens on port 1).
        let bad = ConnectOptions::new().key_prefix("");
        assert_invalid(&bad, "redis://127.0.0.1:1/", "redis").await;
        let prefix = format!("idem-connect:{}:", random());
        let (store, mut conn) = open_redis(ConnectOptions::new().key_prefix(&prefix)).await;
        runs(store).await;
        let keys = redis_keys(&mut conn, &prefix).await;
        assert_eq!(keys.len(), 2, "the record and its body key: {keys:?}");
        let _: i64 = conn.del(keys).await.expect("DEL");
    }

    #[cfg(feature = "redis")]
    #[tokio::test]
    async fn redis_with_bodies_inside_their_record() {
        use idem_redis::redis::AsyncCommands;
        let prefix = format!("idem-connect-inline:{}:", random());
        let options = ConnectOptions::new()
            .key_prefix(&prefix)
            .redis_inline_body_limit(64);
        let (store, mut conn) = open_redis(options).await;
        let idem = Idem::new(store);
        // A body within the limit stays inside its record: one key, and the
        // replay is the same bytes.
        let small = answer(&idem, "small", "ok".to_owned()).await;
        assert!(small.is_stored());
        let keys = redis_keys(&mut conn, &prefix).await;
        assert_eq!(keys.len(), 1, "the record alone: {keys:?}");
        let replay = answer(&idem, "small", "run again".to_owned()).await;
        assert!(replay.is_replay());
        assert_eq!(replay.into_result(), Ok("ok".to_owned()));
        // One over it goes to a body key of its own.
        let large = answer(&idem, "large", "x".repeat(100)).await;
        assert!(large.is_stored());
        let keys = redis_keys(&mut conn, &prefix).await;
        assert_eq!(keys.len(), 3, "two records and one body key: {keys:?}");
        let _: i64 = conn.del(keys).await.expect("DEL");
    }
}
