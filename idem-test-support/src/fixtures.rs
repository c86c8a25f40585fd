//! Isolated stores for the shared conformance suites (idem-http's and
//! idem-consumer's): one per test, with its own SQLite file, Postgres schema,
//! MySQL table or Redis key prefix, removed by [`Fixture::teardown`]. Feature
//! `fixtures`.

use idem_core::testkit::Fixture;
use idem_core::{IdempotencyKey, MemoryStore};
use idem_postgres::PgStore;
use idem_postgres::sqlx::postgres::PgPoolOptions;
use idem_postgres::sqlx::{self, Executor};
use idem_redis::RedisStore;
use idem_redis::redis;
use idem_sqlite::SqliteStore;

use crate::servers::{MYSQL, POSTGRES};

/// [`Fixture`] for a wrapper whose first field is its store: `store` is a
/// clone of it, `teardown` runs the block on the wrapper.
macro_rules! fixture {
    ($name:ident($store:ty), |$fixture:ident| $teardown:block) => {
        impl Fixture for $name {
            type Store = $store;
            fn store(&self) -> $store {
                self.0.clone()
            }
            async fn teardown(self) {
                let $fixture = self;
                $teardown
            }
        }
    };
}

/// A fresh [`MemoryStore`].
#[derive(Debug)]
pub struct Memory(MemoryStore);
fixture!(Memory(MemoryStore), |_fixture| {});
/// A fresh [`MemoryStore`].
pub async fn memory() -> Memory {
    Memory(MemoryStore::new())
}

/// An in-memory SQLite store, closed at teardown.
#[derive(Debug)]
pub struct SqliteMemory(SqliteStore);
fixture!(SqliteMemory(SqliteStore), |fixture| {
    fixture.0.close().await;
});
/// An in-memory SQLite store.
pub async fn sqlite_memory() -> SqliteMemory {
    SqliteMemory(SqliteStore::memory().await.expect("in-memory SQLite"))
}

/// A SQLite file store in the temp dir; the file (and its WAL) removed at teardown.
#[derive(Debug)]
pub struct SqliteFile(SqliteStore, std::path::PathBuf);
fixture!(SqliteFile(SqliteStore), |fixture| {
    fixture.0.close().await;
    crate::remove_sqlite(&fixture.1);
});
/// A SQLite file store of its own.
pub async fn sqlite_file() -> SqliteFile {
    let path = std::env::temp_dir().join(format!(
        "idem-fixture-{}.db",
        IdempotencyKey::random().as_str()
    ));
    SqliteFile(SqliteStore::open(&path).await.expect("SQLite file"), path)
}

fn pg_url() -> String {
    POSTGRES.url()
}

fn pg_down(e: &dyn std::fmt::Display) -> ! {
    POSTGRES.unreachable(e)
}

/// A Postgres store in a schema of its own, dropped at teardown.
#[derive(Debug)]
pub struct Pg(PgStore, String);
fixture!(Pg(PgStore), |fixture| {
    let drop = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", fixture.1);
    fixture
        .0
        .pool()
        .execute(sqlx::AssertSqlSafe(drop))
        .await
        .expect("drop schema");
    fixture.0.close().await;
});
/// A migrated Postgres store in a fresh schema (`IDEM_POSTGRES_URL`, default the machine's server).
///
/// # Panics
///
/// When the server cannot be reached: these tests never skip.
pub async fn postgres() -> Pg {
    let schema = format!(
        "idem_fixture_{}",
        IdempotencyKey::random().as_str().to_ascii_lowercase()
    );
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .test_before_acquire(false)
        .acquire_timeout(std::time::Duration::from_secs(10))
        .connect(&pg_url())
        .await
        .unwrap_or_else(|e| pg_down(&e));
    let store = PgStore::new(pool)
        .with_schema_name(&schema)
        .expect("schema name");
    store.migrate().await.expect("migrate");
    Pg(store, schema)
}

fn mysql_url() -> String {
    MYSQL.url()
}

fn mysql_down(e: &dyn std::fmt::Display) -> ! {
    MYSQL.unreachable(e)
}

/// A MySQL / MariaDB store in a table of its own, dropped at teardown.
#[derive(Debug)]
pub struct MySql(idem_mysql::MySqlStore);
fixture!(MySql(idem_mysql::MySqlStore), |fixture| {
    let drop = format!("DROP TABLE IF EXISTS `{}`", fixture.0.table_name());
    fixture
        .0
        .pool()
        .execute(idem_mysql::sqlx::AssertSqlSafe(drop))
        .await
        .expect("drop table");
    fixture.0.close().await;
});
/// A migrated MySQL / MariaDB store in a fresh table (`IDEM_MYSQL_URL`,
/// default the machine's server), with the statements of the server found.
///
/// # Panics
///
/// When the server cannot be reached: these tests never skip.
pub async fn mysql() -> MySql {
    use idem_mysql::sqlx::mysql::MySqlPoolOptions;
    let table = format!("idem_fixture_{}", IdempotencyKey::random().as_str());
    let pool = MySqlPoolOptions::new()
        .max_connections(8)
        .test_before_acquire(false)
        .acquire_timeout(std::time::Duration::from_secs(10))
        .connect(&mysql_url())
        .await
        .unwrap_or_else(|e| mysql_down(&e));
    let store = idem_mysql::MySqlStore::new(pool)
        .with_table_name(&table)
        .expect("table name");
    store.migrate().await.expect("migrate");
    MySql(store)
}

fn redis_url() -> String {
    std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned())
}

/// A Redis store under a key prefix of its own, whose keys are deleted at teardown.
#[derive(Debug)]
pub struct Redis(RedisStore);
fixture!(Redis(RedisStore), |fixture| {
    let client = redis::Client::open(redis_url()).expect("redis url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection");
    crate::redis_admin::unlink_each(&mut conn, fixture.0.prefix().as_str()).await;
});
/// A Redis store under a fresh prefix (`IDEM_REDIS_URL`, default the machine's server).
///
/// # Panics
///
/// When the server cannot be reached: these tests never skip.
pub async fn redis() -> Redis {
    let url = redis_url();
    let store = RedisStore::connect(&url).await.unwrap_or_else(|e| {
        panic!(
            "cannot reach Redis at {url}: {e}. Start it with `redis-server --daemonize yes --bind 127.0.0.1 \
             --port 6379 --save \"\" --appendonly no` or point IDEM_REDIS_URL at a server"
        )
    });
    let prefix = format!("idemfixture:{}:", IdempotencyKey::random().as_str());
    Redis(store.with_prefix(&prefix).expect("prefix"))
}

/// A key prefix of its own on the throwaway three-primary cluster.
#[derive(Debug)]
pub struct RedisCluster(RedisStore, Vec<String>);
fixture!(RedisCluster(RedisStore), |fixture| {
    for url in &fixture.1 {
        let client = redis::Client::open(url.as_str()).expect("node url");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("node connection");
        crate::redis_admin::unlink_each(&mut conn, fixture.0.prefix().as_str()).await;
    }
});
/// A store on this binary's throwaway Redis Cluster, under a fresh prefix.
///
/// # Panics
///
/// When the cluster does not form.
pub async fn redis_cluster() -> RedisCluster {
    let nodes = tokio::task::spawn_blocking(|| crate::redis_cluster::get().node_urls())
        .await
        .expect("start the cluster");
    let store = RedisStore::connect_cluster(&nodes)
        .await
        .expect("connect to the cluster");
    let prefix = format!("idemfixture:{}:", IdempotencyKey::random().as_str());
    RedisCluster(store.with_prefix(&prefix).expect("prefix"), nodes)
}
