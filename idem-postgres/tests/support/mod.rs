//! Shared test setup: a real server, one fresh schema per test.

#![allow(dead_code, unreachable_pub)]

pub mod cluster;
pub mod proxy;
pub mod scenario;

use idem_core::IdempotencyKey;
use idem_core::testkit::Fixture;
use idem_postgres::PgStore;
use idem_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use idem_postgres::sqlx::{self, Executor, PgPool};

/// The server URL: `IDEM_POSTGRES_URL`, or the local default.
pub fn url() -> String {
    std::env::var("IDEM_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// Connect options for the test server; panics with what to start if the
/// URL is malformed.
pub fn options() -> PgConnectOptions {
    url()
        .parse()
        .expect("IDEM_POSTGRES_URL is not a valid postgres:// URL")
}

fn unreachable(e: &dyn std::fmt::Display) -> ! {
    panic!(
        "cannot reach PostgreSQL at {}: {e}\n\
         Start the local server with:\n    pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start\n\
         or point IDEM_POSTGRES_URL at a server (these tests never skip).",
        url()
    )
}

/// The server's socket address (for the proxy).
pub async fn upstream() -> std::net::SocketAddr {
    let o = options();
    tokio::net::lookup_host((o.get_host(), o.get_port()))
        .await
        .unwrap_or_else(|e| unreachable(&e))
        .next()
        .unwrap_or_else(|| unreachable(&"the host name resolves to no address"))
}

/// Connect options that go through `proxy` (without TLS, so it can count).
pub fn via(proxy: &proxy::Proxy) -> PgConnectOptions {
    options()
        .host("127.0.0.1")
        .port(proxy.addr.port())
        .ssl_mode(sqlx::postgres::PgSslMode::Disable)
}

/// A pool on the test server (fails the test, never skips, if unreachable).
pub async fn pool(max: u32, options: PgConnectOptions) -> PgPool {
    PgPoolOptions::new()
        .max_connections(max)
        .test_before_acquire(false)
        .acquire_timeout(std::time::Duration::from_secs(10))
        .connect_with(options)
        .await
        .unwrap_or_else(|e| unreachable(&e))
}

/// Pool options of the tests: `max` connections, a 10 s acquire timeout.
pub fn pool_options(max: u32) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(std::time::Duration::from_secs(10))
}

/// A store with pools of its own (`PgStore::connect_with`: the calls on
/// idem-sqlx's pool), on the default table (fails the test, never skips, if
/// the server is unreachable).
pub async fn connect(max: u32, options: PgConnectOptions) -> PgStore {
    PgStore::connect_with(pool_options(max), options)
        .await
        .unwrap_or_else(|e| unreachable(&e))
}

/// A fresh schema name.
pub fn schema_name() -> String {
    format!(
        "idem_test_{}",
        IdempotencyKey::random()
            .as_str()
            .to_ascii_lowercase()
            .replace('-', "_")
    )
}

/// One test's store: its own schema, dropped on teardown.
#[derive(Debug)]
pub struct PgFixture {
    pub store: PgStore,
    pub schema: String,
}

impl PgFixture {
    /// A store of `max` connections for its calls (`PgStore::connect_with`)
    /// over a new, migrated schema.
    pub async fn new(max: u32) -> Self {
        Self::with_options(max, options()).await
    }

    /// Same, with connect options (e.g. through a proxy).
    pub async fn with_options(max: u32, options: PgConnectOptions) -> Self {
        Self::migrated(connect(max, options).await).await
    }

    /// A store over a pool of `max` connections built here (`PgStore::new`:
    /// the calls on sqlx's pool), over a new, migrated schema.
    pub async fn over_pool(max: u32) -> Self {
        Self::migrated(PgStore::new(pool(max, options()).await)).await
    }

    async fn migrated(store: PgStore) -> Self {
        let schema = schema_name();
        let store = store.with_schema_name(&schema).expect("valid schema name");
        store.migrate().await.expect("migrate");
        Self { store, schema }
    }

    /// `"schema"."idem_records"`.
    pub fn table(&self) -> String {
        format!("\"{}\".\"{}\"", self.schema, self.store.table_name())
    }

    /// Drops the schema and closes the store.
    pub async fn drop_schema(&self) {
        let admin = pool(1, options()).await;
        admin
            .execute(sqlx::AssertSqlSafe(format!(
                "DROP SCHEMA IF EXISTS \"{}\" CASCADE",
                self.schema
            )))
            .await
            .expect("drop schema");
        admin.close().await;
        self.store.close().await;
    }
}

impl Fixture for PgFixture {
    type Store = PgStore;
    fn store(&self) -> PgStore {
        self.store.clone()
    }
    async fn teardown(self) {
        self.drop_schema().await;
    }
}
