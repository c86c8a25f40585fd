//! Shared test setup: a real server, one fresh table per test, and the
//! MySQL/MariaDB glue of the SQL suite ([`MySql`]): the one place that knows
//! how the suite's stores are built here.

#![allow(dead_code, unreachable_pub, unused_imports)]

use std::time::Duration;

use idem_core::{IdempotencyKey, RecordId};
use idem_mysql::sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions, MySqlSslMode};
use idem_mysql::sqlx::pool::PoolConnection;
use idem_mysql::sqlx::{self, Executor, MySqlPool, Transaction};
use idem_mysql::{MySqlStore, Server};
pub use idem_test_support::sql::MYSQL;
use idem_test_support::sql::mariadb::Throwaway;
use idem_test_support::sql::proxy::{Protocol, Proxy};
use idem_test_support::sql::{
    Cost, Costs, Isolated, KillDialect, ServerDialect, SharedServer, lock_row, poll,
};

pub use idem_test_support::sql::{
    Dialect, Teardown, count_rows, mariadb as server, mariadb_cluster as cluster, proxy,
};

/// One test's store on a table of its own, dropped on teardown (with the
/// transactional scenarios' `orders` table).
pub type MyFixture = Isolated<MySql>;

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
        .connect_with(MySql::options())
        .await
        .unwrap_or_else(|e| MYSQL.unreachable(&e))
}

/// A fresh name with `prefix`.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", IdempotencyKey::random().as_str())
}

/// The MySQL / MariaDB dialect of the SQL suite: the claim path it runs
/// (MariaDB's `INSERT … RETURNING`, the portable MySQL statements, or the
/// server's own as the store detects it), and the isolation level of the
/// extra stores of the races.
#[derive(Debug, Clone, Copy)]
pub struct MySql {
    pub server: Option<Server>,
    pub isolation: &'static str,
}

/// InnoDB's default isolation level, with its gap locks.
pub const RR: &str = "REPEATABLE READ";
/// The other level applications run.
pub const RC: &str = "READ COMMITTED";

impl MySql {
    /// MariaDB's statements (the server here), at InnoDB's default level.
    pub const MARIADB: Self = Self::at(Server::MariaDb, RR);
    /// The portable MySQL statements, at InnoDB's default level.
    pub const MYSQL_PATH: Self = Self::at(Server::MySql, RR);
    /// The statements of the server the store detects.
    pub const DETECTED: Self = Self {
        server: None,
        isolation: RR,
    };
    /// `server`'s statements; the races' extra stores at `isolation`.
    pub const fn at(server: Server, isolation: &'static str) -> Self {
        Self {
            server: Some(server),
            isolation,
        }
    }

    /// `self`, with every store this test binary builds on a pool of its
    /// own sending every call through the batched path.
    pub fn batched(self) -> Self {
        idem_test_support::work::batch_every_call();
        self
    }

    /// `store` running this dialect's statements.
    fn server(&self, store: MySqlStore) -> MySqlStore {
        match self.server {
            Some(s) => store.with_server(s),
            None => store,
        }
    }
}

impl ServerDialect for MySql {
    type Db = sqlx::MySql;
    type Store = MySqlStore;
    type Outage = Throwaway;
    const SERVER: SharedServer = MYSQL;
    const PROTOCOL: Protocol = Protocol::MySql;
    const QUOTE: char = '`';
    const FIRST: &'static str = "?";
    const ORDERS: &'static str =
        "(id BIGINT AUTO_INCREMENT PRIMARY KEY, note TEXT NOT NULL) ENGINE=InnoDB";
    const IDENTITY: &'static str = "owner, operation, `key`";

    async fn connect_with(
        pool: MySqlPoolOptions,
        options: MySqlConnectOptions,
    ) -> Result<MySqlStore, String> {
        MySqlStore::connect_with(pool, options)
            .await
            .map_err(|e| e.to_string())
    }
    /// The server's version is read by `migrate` or the first call.
    fn over(&self, pool: MySqlPool) -> MySqlStore {
        MySqlStore::new(pool)
    }
    fn through(options: MySqlConnectOptions, proxy: &Proxy) -> MySqlConnectOptions {
        options
            .host("127.0.0.1")
            .port(proxy.addr.port())
            .ssl_mode(MySqlSslMode::Disabled)
    }
    fn with_coalescing(store: MySqlStore, mode: idem_sql::Coalescing) -> MySqlStore {
        store.with_coalescing_mode(mode)
    }
    /// The table `name`, and the `orders` table beside it.
    fn named(&self, store: MySqlStore, name: &str) -> (MySqlStore, String, Vec<String>) {
        let store = store.with_table_name(name).expect("valid table name");
        let drops = [name.to_owned(), format!("{name}_orders")]
            .map(|t| format!("DROP TABLE IF EXISTS `{t}`"))
            .into();
        (self.server(store), format!("`{name}`"), drops)
    }
    async fn migrate(store: &MySqlStore) {
        store.migrate().await.expect("migrate");
    }
    fn qualify(_fx: &MyFixture, table: &str) -> String {
        format!("`{table}`")
    }
    /// Over a pool at the dialect's isolation level.
    async fn store_on(&self, fx: &MyFixture) -> MySqlStore {
        let store = MySqlStore::new(pool_at(8, self.isolation).await);
        self.server(store.with_table_name(&fx.name).expect("table"))
    }
    async fn check_constraints(&self, fx: &MyFixture) -> Vec<String> {
        let checks: Vec<String> = sqlx::query_scalar(
            "SELECT CAST(CONSTRAINT_NAME AS CHAR) FROM information_schema.TABLE_CONSTRAINTS
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND CONSTRAINT_TYPE = 'CHECK'",
        )
        .bind(&fx.name)
        .fetch_all(fx.store.pool())
        .await
        .expect("checks");
        assert_eq!(checks.len(), 3, "{checks:?}");
        checks
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
    fn with_tx_lock_timeout(&self, store: MySqlStore, timeout: Duration) -> MySqlStore {
        store.with_tx_lock_timeout(timeout)
    }
    /// A claim statement on the fixture's table seen running on the server
    /// (so queued on the winner's lock, the winner's transaction being idle).
    ///
    /// `PROCESSLIST`, not `INNODB_TRX`: InnoDB refreshes that table's cache
    /// only after 0.1 s without a reader, so tests polling it in parallel keep
    /// each other's view stale.
    fn waiting_sql(&self, fx: &MyFixture) -> String {
        // The table name is a validated identifier: safe to splice.
        format!(
            "SELECT 1 FROM information_schema.PROCESSLIST
             WHERE COMMAND <> 'Sleep' AND INFO LIKE 'INSERT INTO `{}`%' LIMIT 1",
            fx.name
        )
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
    /// The columns are binary, whatever the server's default collation.
    async fn identity_columns(&self, fx: &MyFixture) {
        let types: Vec<(String, String)> = sqlx::query_as(
            "SELECT CAST(COLUMN_NAME AS CHAR), CAST(DATA_TYPE AS CHAR) FROM information_schema.COLUMNS
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?
               AND COLUMN_NAME IN ('owner', 'operation', 'key', 'fingerprint', 'response')
             ORDER BY COLUMN_NAME",
        )
        .bind(&fx.name)
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
    fn expected_costs(&self) -> Costs<Cost> {
        let one = (1, 1, 0);
        let costs = Costs {
            takeover: (2, 2, 0),
            // The purge with nothing due: delete, drop bodies, re-file.
            purge: (3, 3, 0),
            fresh: (2, 2, 0),
            // SET SESSION …; BEGIN (one text query), claim, complete, COMMIT.
            tx_fresh: (4, 4, 0),
            // SET SESSION …; BEGIN, claim, ROLLBACK.
            tx_replay: (3, 3, 0),
            ..Costs::each(one)
        };
        match self.server {
            // MariaDB: a claim is one statement and one round trip whether
            // the key is fresh or replayed; a takeover adds one guarded update.
            Some(Server::MariaDb) | None => costs,
            // The portable statements (no `RETURNING`): a fresh key is one
            // insert; a key that exists costs the failed insert and a read;
            // a takeover one guarded update more.
            _ => Costs {
                takeover: (3, 3, 0),
                replay: (2, 2, 0),
                replayed: (2, 2, 0),
                tx_replay: (4, 4, 0),
                ..costs
            },
        }
    }
    /// A throwaway `mariadbd` of the test's own.
    async fn outage_server(&self) -> (Throwaway, MySqlConnectOptions, MySqlConnectOptions) {
        let db = Throwaway::start().await;
        let options: MySqlConnectOptions = db.url().parse().expect("url");
        (db, options.clone(), options)
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
        let fx = self.isolate(self.over(pool), admin, true).await;
        (fx, db)
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
        let (url, table, spare) = (db.url(), fx.name.clone(), spare.1);
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
        lock_row(fx, blocker.0, id).await
    }
    async fn unlock(&self, locked: Transaction<'static, sqlx::MySql>) {
        locked.rollback().await.expect("rollback");
    }
}
