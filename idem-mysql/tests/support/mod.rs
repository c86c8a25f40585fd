//! Shared test setup: a real server, one fresh table per test, and the
//! MySQL/MariaDB glue of the SQL suite ([`MySql`]): the one place that knows
//! how the suite's stores are built here.

#![allow(dead_code, unreachable_pub, unused_imports)]

use std::time::Duration;

use idem_core::testkit::Fixture;
use idem_core::{IdempotencyKey, RecordId};
use idem_mysql::sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions, MySqlSslMode};
use idem_mysql::sqlx::pool::PoolConnection;
use idem_mysql::sqlx::{self, Executor, MySqlConnection, MySqlPool, Row, Transaction};
use idem_mysql::{MySqlStore, Server};
use idem_test_support::sql::mariadb::Throwaway;
use idem_test_support::sql::proxy::{Protocol, Proxy};
use idem_test_support::sql::{
    CorruptDialect, Cost, Costs, Dialect, KillDialect, MYSQL, Outage, OutageDialect, SharedServer,
    SqlFixture, Teardown, TxDialect, TxFuture, WireDialect, poll,
};

pub use idem_test_support::sql::{mariadb as server, mariadb_cluster as cluster, proxy};

/// The server URL: `IDEM_MYSQL_URL`, or the local default.
pub fn url() -> String {
    MYSQL.url()
}

/// Connect options for the test server; panics with what to start if the
/// URL is malformed.
pub fn options() -> MySqlConnectOptions {
    MYSQL.options()
}

pub fn unreachable(e: &dyn std::fmt::Display) -> ! {
    MYSQL.unreachable(e)
}

/// The server's socket address (for the proxy).
pub async fn upstream() -> std::net::SocketAddr {
    let o = options();
    MYSQL.addr(o.get_host(), o.get_port()).await
}

/// Connect options that go through `proxy` (without TLS, so it can count).
pub fn via(proxy: &Proxy) -> MySqlConnectOptions {
    options()
        .host("127.0.0.1")
        .port(proxy.addr.port())
        .ssl_mode(MySqlSslMode::Disabled)
}

/// A pool on the test server (fails the test, never skips, if unreachable).
pub async fn pool(max: u32, options: MySqlConnectOptions) -> MySqlPool {
    MYSQL.pool(max, options).await
}

/// A store with pools of its own (`MySqlStore::connect_with`: the calls on
/// idem-sqlx's pool), on the default table (fails the test, never skips, if
/// the server is unreachable).
pub async fn connect(max: u32, options: MySqlConnectOptions) -> MySqlStore {
    let store = MySqlStore::connect_with(SharedServer::pool_options(max), options)
        .await
        .unwrap_or_else(|e| unreachable(&e));
    batched_if_asked(store)
}

/// `store`, sending every call through the batched path if this test
/// binary asked for it ([`MySql::batched`]).
pub fn batched_if_asked(store: MySqlStore) -> MySqlStore {
    match idem_test_support::sql::forced_coalescing() {
        Some(mode) => store.with_coalescing_mode(mode),
        None => store,
    }
}

/// A store over `pool` (`MySqlStore::new`; the server's version is read by
/// `migrate` or the first call): the one place that builds one over a sqlx
/// pool.
pub async fn over(pool: MySqlPool) -> MySqlStore {
    MySqlStore::new(pool)
}

/// A pool whose connections run every transaction at `isolation`
/// (`"REPEATABLE READ"`, InnoDB's default, or `"READ COMMITTED"`).
pub async fn pool_at(max: u32, isolation: &'static str) -> MySqlPool {
    SharedServer::pool_options::<sqlx::MySql>(max)
        .test_before_acquire(false)
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

/// One test's store: its own table, dropped on teardown (on the server
/// `admin` reaches).
#[derive(Debug)]
pub struct MyFixture {
    pub store: MySqlStore,
    pub table: String,
    pub admin: MySqlConnectOptions,
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
        let store = connect(max, options).await;
        let store = match server {
            Some(s) => store.with_server(s),
            None => store,
        };
        Self::migrated(store, self::options()).await
    }

    /// `store` on a new, migrated table, dropped through `admin`.
    pub async fn migrated(store: MySqlStore, admin: MySqlConnectOptions) -> Self {
        let table = unique("idem_test");
        let store = store.with_table_name(&table).expect("valid table name");
        store.migrate().await.expect("migrate");
        Self {
            store,
            table,
            admin,
        }
    }

    /// `` `table` ``.
    pub fn quoted(&self) -> String {
        format!("`{}`", self.table)
    }

    /// Drops the table (and any `extra` tables) and closes the store.
    pub async fn drop_tables(&self, extra: &[&str]) {
        let admin = pool(1, self.admin.clone()).await;
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

impl SqlFixture for MyFixture {
    type Store = MySqlStore;
    fn store(&self) -> &MySqlStore {
        &self.store
    }
}

impl Teardown for MyFixture {
    /// Drops the table and the transactional tests' `orders` table.
    async fn teardown(&self) {
        self.drop_tables(&[&orders_table(self)]).await;
    }
}

/// The rows of `table`.
pub async fn count_rows(fx: &MyFixture, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT COUNT(*) FROM `{table}`"
    )))
    .fetch_one(fx.store.pool())
    .await
    .expect("count")
}

/// The caller's own table of the transactional tests.
pub fn orders_table(fx: &MyFixture) -> String {
    format!("{}_orders", fx.table)
}

/// The MySQL / MariaDB dialect of the SQL suite: the claim path it runs
/// (MariaDB's `INSERT … RETURNING`, or the portable MySQL statements), and
/// the isolation level of the extra stores of the races.
#[derive(Debug, Clone, Copy)]
pub struct MySql {
    pub server: Server,
    pub isolation: &'static str,
}

/// InnoDB's default isolation level, with its gap locks.
pub const RR: &str = "REPEATABLE READ";
/// The other level applications run.
pub const RC: &str = "READ COMMITTED";

impl MySql {
    /// MariaDB's statements (the server here), at InnoDB's default level.
    pub const MARIADB: Self = Self {
        server: Server::MariaDb,
        isolation: RR,
    };
    /// The portable MySQL statements, at InnoDB's default level.
    pub const MYSQL_PATH: Self = Self {
        server: Server::MySql,
        isolation: RR,
    };
    /// `server`'s statements; the races' extra stores at `isolation`.
    pub const fn at(server: Server, isolation: &'static str) -> Self {
        Self { server, isolation }
    }

    /// `self`, with every store this test binary builds on a pool of its
    /// own sending every call through the batched path.
    pub fn batched(self) -> Self {
        idem_test_support::sql::batch_every_call();
        self
    }
}

impl Dialect for MySql {
    type Store = MySqlStore;
    type Fixture = MyFixture;
    async fn open(&self, max: u32) -> MyFixture {
        MyFixture::with_options(max, options(), Some(self.server)).await
    }
    async fn stores_on(&self, fx: &MyFixture, n: usize) -> Vec<MySqlStore> {
        let mut stores = Vec::new();
        for _ in 0..n {
            let store = over(pool_at(8, self.isolation).await)
                .await
                .with_table_name(&fx.table)
                .expect("table")
                .with_server(self.server);
            stores.push(store);
        }
        stores
    }
    fn coalescing(store: MySqlStore, mode: idem_sql::Coalescing) -> MySqlStore {
        store.with_coalescing_mode(mode)
    }
    async fn close(&self, store: &MySqlStore) {
        store.pool().close().await;
    }
    async fn count_records(&self, fx: &MyFixture) -> i64 {
        count_rows(fx, &fx.table).await
    }
    async fn stored_identity(&self, fx: &MyFixture) -> [Vec<u8>; 3] {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT owner, operation, `key` FROM {}",
            fx.quoted()
        )))
        .fetch_one(fx.store.pool())
        .await
        .expect("the table is still there, with one row");
        ["owner", "operation", "key"].map(|c| row.get::<Vec<u8>, _>(c))
    }
    /// The columns are binary, whatever the server's default collation.
    async fn check_identity_columns(&self, fx: &MyFixture) {
        let types: Vec<(String, String)> = sqlx::query_as(
            "SELECT CAST(COLUMN_NAME AS CHAR), CAST(DATA_TYPE AS CHAR) FROM information_schema.COLUMNS
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?
               AND COLUMN_NAME IN ('owner', 'operation', 'key', 'fingerprint', 'response')
             ORDER BY COLUMN_NAME",
        )
        .bind(&fx.table)
        .fetch_all(fx.store.pool())
        .await
        .expect("columns");
        let types: Vec<(&str, &str)> = types
            .iter()
            .map(|(c, t)| (c.as_str(), t.as_str()))
            .collect();
        assert_eq!(
            types,
            [
                ("fingerprint", "varbinary"),
                ("key", "varbinary"),
                ("operation", "varbinary"),
                ("owner", "varbinary"),
                ("response", "longblob"),
            ]
        );
    }
}

impl CorruptDialect for MySql {
    async fn drop_checks(&self, fx: &MyFixture) {
        let checks: Vec<String> = sqlx::query_scalar(
            "SELECT CAST(CONSTRAINT_NAME AS CHAR) FROM information_schema.TABLE_CONSTRAINTS
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND CONSTRAINT_TYPE = 'CHECK'",
        )
        .bind(&fx.table)
        .fetch_all(fx.store.pool())
        .await
        .expect("checks");
        assert_eq!(checks.len(), 3, "{checks:?}");
        for c in checks {
            fx.store
                .pool()
                .execute(sqlx::AssertSqlSafe(format!(
                    "ALTER TABLE {} DROP CONSTRAINT `{c}`",
                    fx.quoted()
                )))
                .await
                .expect("drop check");
        }
    }
    fn corruptions(&self) -> Vec<(&'static str, &'static str)> {
        vec![
            ("state", "state = 'exploded'"),
            ("fingerprint", "fingerprint = X'0102'"),
            ("outcome", "outcome = 'maybe'"),
            ("attempt", "attempt = -1"),
            // Another identity under this record's key: what two identities
            // sharing the first 16 bytes of their digest would look like.
            ("identity", "`key` = 'someone-else'"),
        ]
    }
    async fn corrupt(&self, fx: &MyFixture, set: &str, key: &str) {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {} SET {set} WHERE `key` = ?",
            fx.quoted()
        )))
        .bind(key)
        .execute(fx.store.pool())
        .await
        .expect("corrupt");
    }
}

impl TxDialect for MySql {
    async fn create_orders(&self, fx: &MyFixture) {
        fx.store
            .pool()
            .execute(sqlx::AssertSqlSafe(format!(
                "CREATE TABLE `{}` (id BIGINT AUTO_INCREMENT PRIMARY KEY, note TEXT NOT NULL) ENGINE=InnoDB",
                orders_table(fx)
            )))
            .await
            .expect("create orders");
    }
    fn insert_order_sql(&self, fx: &MyFixture) -> String {
        format!("INSERT INTO `{}` (note) VALUES (?)", orders_table(fx))
    }
    async fn count_orders(&self, fx: &MyFixture) -> i64 {
        count_rows(fx, &orders_table(fx)).await
    }
    fn with_tx_lock_timeout(&self, store: MySqlStore, timeout: Duration) -> MySqlStore {
        store.with_tx_lock_timeout(timeout)
    }
    /// A claim statement on the fixture's table seen running on the server
    /// (so queued on the winner's lock, the winner's transaction being idle).
    ///
    /// `PROCESSLIST`, not `INNODB_TRX`: InnoDB refreshes that table's cache
    /// only after 0.1 s without a reader, so tests polling it in parallel keep
    /// each other's view stale.
    async fn claim_waiting(&self, fx: &MyFixture) -> bool {
        // The table name is a validated identifier: safe to splice.
        let sql = format!(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST
             WHERE COMMAND <> 'Sleep' AND INFO LIKE 'INSERT INTO `{}`%'",
            fx.table
        );
        let pool = pool(1, options()).await;
        let seen = poll(2000, Duration::from_millis(5), || async {
            let waiting: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.clone()))
                .fetch_one(&pool)
                .await
                .expect("processlist");
            (waiting > 0).then_some(())
        })
        .await;
        pool.close().await;
        seen.is_some()
    }
    /// The session keeps the transactional mode's bound (no `SET LOCAL` in
    /// MySQL): documented, and checked here.
    async fn after_tx_lock_timeout(&self, store: &MySqlStore) {
        let bound: u64 = sqlx::query_scalar("SELECT @@SESSION.innodb_lock_wait_timeout")
            .fetch_one(store.pool())
            .await
            .expect("bound");
        assert!(bound == 1 || bound == 50, "{bound}");
    }
}

impl WireDialect for MySql {
    const PROTOCOL: Protocol = Protocol::MySql;
    async fn upstream(&self) -> std::net::SocketAddr {
        upstream().await
    }
    async fn open_via(&self, proxy: &Proxy, own_pool: bool) -> MyFixture {
        let store = if own_pool {
            connect(1, via(proxy)).await
        } else {
            over(pool(1, via(proxy)).await).await
        };
        MyFixture::migrated(store.with_server(self.server), options()).await
    }
    fn pool_idle(store: &MySqlStore) -> bool {
        let pool = store.pool();
        usize::try_from(pool.size()).ok() == Some(pool.num_idle())
    }
    fn expected_costs(&self) -> Costs<Cost> {
        let one = (1, 1, 0);
        match self.server {
            // MariaDB: a claim is one statement and one round trip whether
            // the key is fresh or replayed; a takeover adds one guarded update.
            Server::MariaDb => Costs {
                claim: one,
                save_resource_id: one,
                extend: one,
                release: one,
                takeover: (2, 2, 0),
                complete: one,
                replay: one,
                fetch: one,
                // The purge with nothing due: delete, drop bodies, re-file.
                purge: (3, 3, 0),
                fresh: (2, 2, 0),
                replayed: one,
                // SET SESSION …; BEGIN (one text query), claim, complete, COMMIT.
                tx_fresh: (4, 4, 0),
                // SET SESSION …; BEGIN, claim, ROLLBACK.
                tx_replay: (3, 3, 0),
            },
            // The portable statements (no `RETURNING`): a fresh key is one
            // insert; a key that exists costs the failed insert and a read;
            // a takeover one guarded update more.
            _ => Costs {
                claim: one,
                save_resource_id: one,
                extend: one,
                release: one,
                takeover: (3, 3, 0),
                complete: one,
                replay: (2, 2, 0),
                fetch: one,
                purge: (3, 3, 0),
                fresh: (2, 2, 0),
                replayed: (2, 2, 0),
                tx_fresh: (4, 4, 0),
                tx_replay: (4, 4, 0),
            },
        }
    }
}

/// Kills (`KILL <id>`) the first connection found running a statement on
/// `table`, except `spare`; returns its id.
pub async fn kill_when_running(url: String, table: String, spare: u64) -> u64 {
    let admin = MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .expect("admin");
    let sql = format!(
        "SELECT CAST(ID AS UNSIGNED) FROM information_schema.PROCESSLIST
         WHERE COMMAND <> 'Sleep' AND INFO LIKE '%`{table}`%' AND ID <> CONNECTION_ID() AND ID <> {spare}
         LIMIT 1"
    );
    let id = poll(1000, Duration::from_millis(10), || async {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.clone()))
            .fetch_optional(&admin)
            .await
            .expect("processlist")
    })
    .await
    .unwrap_or_else(|| panic!("no connection ever ran a statement on {table}"));
    sqlx::query(sqlx::AssertSqlSafe(format!("KILL {id}")))
        .execute(&admin)
        .await
        .expect("KILL");
    admin.close().await;
    id
}

/// A connection of a throwaway server's own, and its id.
#[derive(Debug)]
pub struct Blocker(PoolConnection<sqlx::MySql>, u64);

impl KillDialect for MySql {
    type Handle = Throwaway;
    type Blocker = Blocker;
    type Locked = Transaction<'static, sqlx::MySql>;
    async fn open_killable(&self) -> (MyFixture, Throwaway) {
        let db = Throwaway::start().await;
        let admin: MySqlConnectOptions = db.url().parse().expect("url");
        let pool = MySqlPoolOptions::new()
            .max_connections(2)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(2))
            .connect_with(admin.clone())
            .await
            .expect("connect to the throwaway server");
        let store = over(pool).await.with_server(self.server);
        (MyFixture::migrated(store, admin).await, db)
    }
    async fn blocker(&self, _fx: &MyFixture, db: &Throwaway) -> Blocker {
        let mut conn = MySqlPoolOptions::new()
            .max_connections(1)
            .connect(&db.url())
            .await
            .expect("blocker")
            .acquire()
            .await
            .expect("conn");
        let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
            .fetch_one(&mut *conn)
            .await
            .expect("id");
        Blocker(conn, id)
    }
    fn killer(
        &self,
        fx: &MyFixture,
        db: &Throwaway,
        spare: &Blocker,
    ) -> impl Future<Output = ()> + Send + 'static {
        let (url, table, spare) = (db.url(), fx.table.clone(), spare.1);
        async move {
            kill_when_running(url, table, spare).await;
        }
    }
    async fn lock(
        &self,
        fx: &MyFixture,
        blocker: Blocker,
        id: &RecordId,
    ) -> Transaction<'static, sqlx::MySql> {
        let mut lock = Transaction::begin(blocker.0, None).await.expect("begin");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT 1 FROM {} WHERE id = ? FOR UPDATE",
            fx.quoted()
        )))
        .bind(&idem_sql::record_key(id)[..])
        .execute(&mut *lock)
        .await
        .expect("lock");
        lock
    }
    async fn unlock(&self, locked: Transaction<'static, sqlx::MySql>) {
        locked.rollback().await.expect("rollback");
    }
}

/// A throwaway `mariadbd` stopped and restarted (on the same data
/// directory: InnoDB keeps what was committed).
#[derive(Debug)]
pub struct Restart(Throwaway);

impl Outage for Restart {
    async fn down(&mut self) {
        self.0.stop().await;
    }
    async fn up(&mut self) {
        self.0.restart().await;
    }
}

impl OutageDialect for MySql {
    type Outage = Restart;
    async fn outage(&self, own_pool: bool) -> (MyFixture, Restart) {
        let db = Throwaway::start().await;
        let admin: MySqlConnectOptions = db.url().parse().expect("url");
        let options = MySqlPoolOptions::new()
            .max_connections(4)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(2));
        let store = if own_pool {
            batched_if_asked(
                MySqlStore::connect_with(options, admin.clone())
                    .await
                    .expect("connect to the throwaway server"),
            )
        } else {
            over(
                options
                    .connect_with(admin.clone())
                    .await
                    .expect("connect to the throwaway server"),
            )
            .await
        };
        let fx = MyFixture::migrated(store.with_server(self.server), admin).await;
        (fx, Restart(db))
    }
}

impl idem_test_support::sql::PoisonDialect for MySql {
    async fn poison(&self, fx: &MyFixture, key: &'static str) {
        let t = &fx.table;
        fx.store
            .pool()
            .execute(sqlx::AssertSqlSafe(format!(
                "ALTER TABLE `{t}` ADD CONSTRAINT `{t}_poison` CHECK (`key` <> '{key}')"
            )))
            .await
            .expect("poison");
    }
}
