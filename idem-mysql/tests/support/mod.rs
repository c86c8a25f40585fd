//! Shared test setup: a real server, one fresh table per test.

#![allow(dead_code, unreachable_pub)]

pub mod proxy;
pub mod scenario;
pub mod server;

use idem_core::IdempotencyKey;
use idem_core::testkit::Fixture;
use idem_mysql::sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions, MySqlSslMode};
use idem_mysql::sqlx::{self, Executor, MySqlPool};
use idem_mysql::{MySqlStore, Server};

/// The server URL: `IDEM_MYSQL_URL`, or the local default.
pub fn url() -> String {
    std::env::var("IDEM_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// Connect options for the test server; panics with what to start if the
/// URL is malformed.
pub fn options() -> MySqlConnectOptions {
    url()
        .parse()
        .expect("IDEM_MYSQL_URL is not a valid mysql:// URL")
}

pub fn unreachable(e: &dyn std::fmt::Display) -> ! {
    panic!(
        "cannot reach MySQL/MariaDB at {}: {e}\n\
         Start the local server with:\n    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql\n\
         or point IDEM_MYSQL_URL at a server (these tests never skip).",
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
pub fn via(proxy: &proxy::Proxy) -> MySqlConnectOptions {
    options()
        .host("127.0.0.1")
        .port(proxy.addr.port())
        .ssl_mode(MySqlSslMode::Disabled)
}

/// A pool on the test server (fails the test, never skips, if unreachable).
pub async fn pool(max: u32, options: MySqlConnectOptions) -> MySqlPool {
    MySqlPoolOptions::new()
        .max_connections(max)
        .test_before_acquire(false)
        .acquire_timeout(std::time::Duration::from_secs(10))
        .connect_with(options)
        .await
        .unwrap_or_else(|e| unreachable(&e))
}

/// A store with pools of its own (`MySqlStore::connect_with`: the calls on
/// idem-sqlx's pool), on the default table (fails the test, never skips, if
/// the server is unreachable).
pub async fn connect(max: u32, options: MySqlConnectOptions) -> MySqlStore {
    let pool = MySqlPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(std::time::Duration::from_secs(10));
    MySqlStore::connect_with(pool, options)
        .await
        .unwrap_or_else(|e| unreachable(&e))
}

/// A pool whose connections run every transaction at `isolation`
/// (`"REPEATABLE READ"`, InnoDB's default, or `"READ COMMITTED"`).
pub async fn pool_at(max: u32, isolation: &'static str) -> MySqlPool {
    MySqlPoolOptions::new()
        .max_connections(max)
        .test_before_acquire(false)
        .acquire_timeout(std::time::Duration::from_secs(10))
        .after_connect(move |conn, _| {
            Box::pin(async move {
                conn.execute(sqlx::AssertSqlSafe(format!(
                    "SET SESSION TRANSACTION ISOLATION LEVEL {isolation}"
                )))
                .await?;
                Ok(())
            })
        })
        .connect_with(options())
        .await
        .unwrap_or_else(|e| unreachable(&e))
}

/// A fresh name with `prefix`.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", IdempotencyKey::random().as_str())
}

/// One test's store: its own table, dropped on teardown.
#[derive(Debug)]
pub struct MyFixture {
    pub store: MySqlStore,
    pub table: String,
}

impl MyFixture {
    /// A store of `max` connections over a new, migrated table, with the
    /// statements of the detected server.
    pub async fn new(max: u32) -> Self {
        Self::with_options(max, options(), None).await
    }

    /// Same, running the portable MySQL statements whatever the server.
    pub async fn mysql_path(max: u32) -> Self {
        Self::with_options(max, options(), Some(Server::MySql)).await
    }

    /// Same, with connect options (e.g. through a proxy) and a flavour.
    pub async fn with_options(
        max: u32,
        options: MySqlConnectOptions,
        server: Option<Server>,
    ) -> Self {
        let table = unique("idem_test");
        let store = connect(max, options)
            .await
            .with_table_name(&table)
            .expect("valid table name");
        let store = match server {
            Some(s) => store.with_server(s),
            None => store,
        };
        store.migrate().await.expect("migrate");
        Self { store, table }
    }

    /// `` `table` ``.
    pub fn quoted(&self) -> String {
        format!("`{}`", self.table)
    }

    /// Drops the table (and any `extra` tables) and closes the store.
    pub async fn drop_tables(&self, extra: &[&str]) {
        let admin = pool(1, options()).await;
        for t in std::iter::once(self.table.as_str()).chain(extra.iter().copied()) {
            admin
                .execute(sqlx::AssertSqlSafe(format!("DROP TABLE IF EXISTS `{t}`")))
                .await
                .expect("drop table");
        }
        admin.close().await;
        self.store.close().await;
    }
}

impl Fixture for MyFixture {
    type Store = MySqlStore;
    fn store(&self) -> MySqlStore {
        self.store.clone()
    }
    async fn teardown(self) {
        self.drop_tables(&[]).await;
    }
}
