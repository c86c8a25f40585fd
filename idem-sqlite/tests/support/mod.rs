//! Fixtures: a fresh database file (or memory database) per test, and the
//! SQLite glue of the SQL suite ([`Sqlite`]).

#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;

use idem_core::IdempotencyKey;
use idem_core::testkit::Fixture;
use idem_sqlite::SqliteStore;
use idem_sqlite::sqlx::{self, Executor, Row};
use idem_test_support::sql::{Dialect, SqlFixture, Teardown};

/// A database file in the temp dir, deleted (with its WAL files) on teardown.
pub struct FileDb {
    pub store: SqliteStore,
    pub path: PathBuf,
}

impl FileDb {
    pub async fn new() -> Self {
        let path = temp_path();
        let store = SqliteStore::open(&path).await.expect("open sqlite file");
        Self { store, path }
    }

    /// A fresh file whose records live in `table`, reached through a URL
    /// (`connect`, then `with_table_name` and `migrate`).
    pub async fn with_table(table: &str) -> Self {
        let path = temp_path();
        let url = format!("sqlite://{}?mode=rwc", path.display());
        let store = SqliteStore::connect(&url)
            .await
            .expect("connect to a sqlite file")
            .with_table_name(table)
            .expect("a valid table name");
        store.migrate().await.expect("migrate");
        Self { store, path }
    }
}

/// A database file name in the temp dir that no other test uses.
pub fn temp_path() -> PathBuf {
    std::env::temp_dir().join(format!("idem-test-{}.db", IdempotencyKey::random()))
}

pub use idem_test_support::remove_sqlite as remove;

/// A private in-memory database.
pub struct MemoryDb(pub SqliteStore);

impl Fixture for MemoryDb {
    type Store = SqliteStore;
    fn store(&self) -> SqliteStore {
        self.0.clone()
    }
    async fn teardown(self) {
        self.0.close().await;
    }
}

pub async fn memory() -> MemoryDb {
    MemoryDb(SqliteStore::memory().await.expect("memory sqlite"))
}

impl SqlFixture for FileDb {
    type Store = SqliteStore;
    fn store(&self) -> &SqliteStore {
        &self.store
    }
}

impl Teardown for FileDb {
    async fn teardown(&self) {
        self.store.close().await;
        remove(&self.path);
    }
}

/// The SQLite dialect of the SQL suite: a database file of its own per
/// test; "several processes" are several stores opened on that file.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sqlite;

impl Dialect for Sqlite {
    type Store = SqliteStore;
    type Fixture = FileDb;
    async fn open(&self, _max: u32) -> FileDb {
        FileDb::new().await
    }
    async fn stores_on(&self, fx: &FileDb, n: usize) -> Vec<SqliteStore> {
        let mut stores = Vec::new();
        for _ in 0..n {
            stores.push(
                SqliteStore::open(&fx.path)
                    .await
                    .expect("open the file again"),
            );
        }
        stores
    }
    fn coalescing(store: SqliteStore, mode: idem_sql::Coalescing) -> SqliteStore {
        store.with_coalescing_mode(mode)
    }
    async fn close(&self, store: &SqliteStore) {
        store.close().await;
    }
    async fn count_records(&self, fx: &FileDb) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM \"{}\"",
            fx.store.table_name()
        )))
        .fetch_one(fx.store.pool())
        .await
        .expect("count")
    }
    async fn stored_identity(&self, fx: &FileDb) -> [Vec<u8>; 3] {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT owner, operation, key FROM \"{}\"",
            fx.store.table_name()
        )))
        .fetch_one(fx.store.pool())
        .await
        .expect("the table is still there, with one row");
        ["owner", "operation", "key"].map(|c| row.get::<String, _>(c).into_bytes())
    }
}

impl idem_test_support::sql::PoisonDialect for Sqlite {
    async fn poison(&self, fx: &FileDb, key: &'static str) {
        let t = fx.store.table_name();
        fx.store
            .pool()
            .execute(sqlx::AssertSqlSafe(format!(
                "CREATE TRIGGER idem_poison BEFORE INSERT ON \"{t}\" WHEN NEW.\"key\" = '{key}' \
                 BEGIN SELECT RAISE(ABORT, 'poison'); END"
            )))
            .await
            .expect("poison");
    }
}
