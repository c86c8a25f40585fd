//! Shared test setup: a real server, one fresh schema per test, and the
//! Postgres glue of the SQL suite ([`Pg`]): the one place that knows how the
//! suite's stores are built here.

#![allow(dead_code, unreachable_pub, unused_imports)]

use std::time::Duration;

use idem_core::testkit::Fixture;
use idem_core::{Error, IdempotencyKey, RecordId};
use idem_postgres::PgStore;
use idem_postgres::sqlx::pool::PoolConnection;
use idem_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use idem_postgres::sqlx::{self, Executor, PgConnection, PgPool, Postgres, Row, Transaction};
use idem_test_support::sql::proxy::{Protocol, Proxy};
use idem_test_support::sql::{
    CorruptDialect, Cost, Costs, Dialect, KillDialect, Outage, OutageDialect, POSTGRES,
    SharedServer, SqlFixture, Teardown, TxDialect, TxFuture, WireDialect, poll,
};

pub use idem_test_support::sql::{pg_cluster as cluster, proxy};

/// The server URL: `IDEM_POSTGRES_URL`, or the local default.
pub fn url() -> String {
    POSTGRES.url()
}

/// Connect options for the test server; panics with what to start if the
/// URL is malformed.
pub fn options() -> PgConnectOptions {
    POSTGRES.options()
}

fn unreachable(e: &dyn std::fmt::Display) -> ! {
    POSTGRES.unreachable(e)
}

/// The server's socket address (for the proxy).
pub async fn upstream() -> std::net::SocketAddr {
    let o = options();
    POSTGRES.addr(o.get_host(), o.get_port()).await
}

/// Connect options that go through `proxy` (without TLS, so it can count).
pub fn via(proxy: &Proxy) -> PgConnectOptions {
    options()
        .host("127.0.0.1")
        .port(proxy.addr.port())
        .ssl_mode(sqlx::postgres::PgSslMode::Disable)
}

/// A pool on the test server (fails the test, never skips, if unreachable).
pub async fn pool(max: u32, options: PgConnectOptions) -> PgPool {
    POSTGRES.pool(max, options).await
}

/// Pool options of the tests: `max` connections, a 10 s acquire timeout.
pub fn pool_options(max: u32) -> PgPoolOptions {
    SharedServer::pool_options(max)
}

/// A store with pools of its own (`PgStore::connect_with`: the calls on
/// idem-sqlx's pool), on the default table (fails the test, never skips, if
/// the server is unreachable).
pub async fn connect(max: u32, options: PgConnectOptions) -> PgStore {
    let store = PgStore::connect_with(pool_options(max), options)
        .await
        .unwrap_or_else(|e| unreachable(&e));
    batched_if_asked(store)
}

/// `store`, sending every call through the batched path if this test
/// binary asked for it ([`Pg::batched`]).
pub fn batched_if_asked(store: PgStore) -> PgStore {
    match idem_test_support::sql::forced_coalescing() {
        Some(mode) => store.with_coalescing_mode(mode),
        None => store,
    }
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

    /// A store over a pool of `max` connections built here (`PgStore::new`),
    /// on a new schema it has not migrated (nor created).
    pub async fn unmigrated(max: u32) -> Self {
        let schema = schema_name();
        let store = PgStore::new(pool(max, options()).await)
            .with_schema_name(&schema)
            .expect("valid schema name");
        Self { store, schema }
    }

    /// `store` over a new, migrated schema.
    pub async fn migrated(store: PgStore) -> Self {
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

impl SqlFixture for PgFixture {
    type Store = PgStore;
    fn store(&self) -> &PgStore {
        &self.store
    }
}

impl Teardown for PgFixture {
    async fn teardown(&self) {
        self.drop_schema().await;
    }
}

/// The rows of `table` in the fixture's schema.
pub async fn count_rows(fx: &PgFixture, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{}\".\"{table}\"",
        fx.schema
    )))
    .fetch_one(fx.store.pool())
    .await
    .expect("count")
}

/// The Postgres dialect of the SQL suite.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pg;

impl Pg {
    /// The dialect, with every store this test binary builds on a pool of
    /// its own sending every call through the batched path.
    pub fn batched() -> Self {
        idem_test_support::sql::batch_every_call();
        Self
    }
}

impl Dialect for Pg {
    type Store = PgStore;
    type Fixture = PgFixture;
    async fn open(&self, max: u32) -> PgFixture {
        PgFixture::new(max).await
    }
    /// Each with two connections: the shared server allows 100 in all, and
    /// the 64 racers of `races.rs` over eight pools of eight run next to
    /// these.
    async fn stores_on(&self, fx: &PgFixture, n: usize) -> Vec<PgStore> {
        let mut stores = Vec::new();
        for _ in 0..n {
            stores.push(
                connect(2, options())
                    .await
                    .with_schema_name(&fx.schema)
                    .expect("schema"),
            );
        }
        stores
    }
    fn coalescing(store: PgStore, mode: idem_sql::Coalescing) -> PgStore {
        store.with_coalescing_mode(mode)
    }
    async fn close(&self, store: &PgStore) {
        store.close().await;
    }
    async fn count_records(&self, fx: &PgFixture) -> i64 {
        count_rows(fx, fx.store.table_name()).await
    }
    async fn stored_identity(&self, fx: &PgFixture) -> [Vec<u8>; 3] {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT owner, operation, key FROM {}",
            fx.table()
        )))
        .fetch_one(fx.store.pool())
        .await
        .expect("the table is still there, with one row");
        ["owner", "operation", "key"].map(|c| row.get::<String, _>(c).into_bytes())
    }
}

impl CorruptDialect for Pg {
    async fn drop_checks(&self, fx: &PgFixture) {
        let (t, p) = (fx.table(), fx.store.table_name());
        for c in ["state_check", "fingerprint_check", "outcome_check"] {
            fx.store
                .pool()
                .execute(sqlx::AssertSqlSafe(format!(
                    "ALTER TABLE {t} DROP CONSTRAINT \"{p}_{c}\""
                )))
                .await
                .expect("drop check");
        }
    }
    fn corruptions(&self) -> Vec<(&'static str, &'static str)> {
        vec![
            ("state", "state = 'exploded'"),
            ("fingerprint", "fingerprint = '\\x0102'::bytea"),
            ("outcome", "outcome = 'maybe'"),
            // Another identity under this record's key: what two identities
            // sharing the first 16 bytes of their digest would look like.
            ("identity", "key = 'someone-else'"),
        ]
    }
    async fn corrupt(&self, fx: &PgFixture, set: &str, key: &str) {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {} SET {set} WHERE key = $1",
            fx.table()
        )))
        .bind(key)
        .execute(fx.store.pool())
        .await
        .expect("corrupt");
    }
}

impl TxDialect for Pg {
    async fn create_orders(&self, fx: &PgFixture) {
        fx.store
            .pool()
            .execute(sqlx::AssertSqlSafe(format!(
                "CREATE TABLE \"{}\".orders (id bigserial PRIMARY KEY, note text NOT NULL)",
                fx.schema
            )))
            .await
            .expect("create orders");
    }
    fn insert_order_sql(&self, fx: &PgFixture) -> String {
        format!("INSERT INTO \"{}\".orders (note) VALUES ($1)", fx.schema)
    }
    async fn count_orders(&self, fx: &PgFixture) -> i64 {
        count_rows(fx, "orders").await
    }
    fn with_tx_lock_timeout(&self, store: PgStore, timeout: Duration) -> PgStore {
        store.with_tx_lock_timeout(timeout)
    }
    /// A backend whose statement names the fixture's schema, waiting on a
    /// lock (`pg_stat_activity`).
    async fn claim_waiting(&self, fx: &PgFixture) -> bool {
        let admin = pool(1, options()).await;
        let schema = format!("\"{}\".", fx.schema);
        let seen = poll(2000, Duration::from_millis(5), || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0",
            )
            .bind(&schema)
            .fetch_one(&admin)
            .await
            .expect("pg_stat_activity");
            (waiting > 0).then_some(())
        })
        .await;
        admin.close().await;
        seen.is_some()
    }
}

impl WireDialect for Pg {
    const PROTOCOL: Protocol = Protocol::Postgres;
    async fn upstream(&self) -> std::net::SocketAddr {
        upstream().await
    }
    async fn open_via(&self, proxy: &Proxy, own_pool: bool) -> PgFixture {
        if own_pool {
            PgFixture::with_options(1, via(proxy)).await
        } else {
            PgFixture::migrated(PgStore::new(pool(1, via(proxy)).await)).await
        }
    }
    fn pool_idle(store: &PgStore) -> bool {
        let pool = store.pool();
        usize::try_from(pool.size()).ok() == Some(pool.num_idle())
    }
    fn expected_costs(&self) -> Costs<Cost> {
        let one = (1, 1, 0);
        Costs {
            claim: one,
            save_resource_id: one,
            extend: one,
            release: one,
            // The rare path: the claim reads the released record, then
            // takes it over (on the same checkout).
            takeover: (2, 2, 0),
            complete: one,
            replay: one,
            fetch: one,
            purge: one,
            fresh: (2, 2, 0),
            replayed: one,
            // BEGIN+SET LOCAL (one simple query), claim, complete, COMMIT.
            tx_fresh: (4, 4, 0),
            // BEGIN+SET LOCAL, claim, ROLLBACK.
            tx_replay: (3, 3, 0),
        }
    }
}

/// A name of its own for a store's connections (`application_name`).
pub fn app_name() -> String {
    format!("idem-test-{}", &IdempotencyKey::random().as_str()[..12])
}

/// Terminates (`pg_terminate_backend`) the first backend of `app` seen
/// waiting on a lock; its pid.
pub async fn terminate_when_waiting(app: String) -> i32 {
    let admin = pool(1, options()).await;
    let pid = poll(200, Duration::from_millis(10), || async {
        sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock' LIMIT 1",
        )
        .bind(&app)
        .fetch_optional(&admin)
        .await
        .expect("pg_stat_activity")
    })
    .await
    .unwrap_or_else(|| panic!("no backend of {app} ever waited on a lock"));
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&admin)
        .await
        .expect("kill");
    assert!(killed);
    admin.close().await;
    pid
}

impl KillDialect for Pg {
    /// The store's connections' `application_name`.
    type Handle = String;
    type Blocker = PoolConnection<Postgres>;
    type Locked = Transaction<'static, Postgres>;
    async fn open_killable(&self) -> (PgFixture, String) {
        let app = app_name();
        let fx = PgFixture::with_options(2, options().application_name(&app)).await;
        (fx, app)
    }
    async fn blocker(&self, _fx: &PgFixture, _app: &String) -> PoolConnection<Postgres> {
        pool(1, options()).await.acquire().await.expect("blocker")
    }
    fn killer(
        &self,
        _fx: &PgFixture,
        app: &String,
        _spare: &PoolConnection<Postgres>,
    ) -> impl Future<Output = ()> + Send + 'static {
        let app = app.clone();
        async move {
            terminate_when_waiting(app).await;
        }
    }
    async fn lock(
        &self,
        fx: &PgFixture,
        blocker: PoolConnection<Postgres>,
        id: &RecordId,
    ) -> Transaction<'static, Postgres> {
        let mut lock = Transaction::begin(blocker, None).await.expect("begin");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT 1 FROM {} WHERE id = $1 FOR UPDATE",
            fx.table()
        )))
        .bind(&idem_sql::record_key(id)[..])
        .execute(&mut *lock)
        .await
        .expect("lock");
        lock
    }
    async fn unlock(&self, locked: Transaction<'static, Postgres>) {
        locked.rollback().await.expect("rollback");
    }
}

/// Every connection dropped through a proxy, and new ones refused, until
/// it lets them through again (a server restart, a failover).
#[derive(Debug)]
pub struct ProxyOutage(Proxy);

impl Outage for ProxyOutage {
    async fn down(&mut self) {
        self.0.set_down(true);
        self.0.kill_all();
    }
    async fn up(&mut self) {
        self.0.set_down(false);
    }
}

impl OutageDialect for Pg {
    type Outage = ProxyOutage;
    async fn outage(&self, own_pool: bool) -> (PgFixture, ProxyOutage) {
        let proxy = Proxy::start(upstream().await, Protocol::Postgres).await;
        let options = PgPoolOptions::new()
            .max_connections(4)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(2));
        let store = if own_pool {
            batched_if_asked(
                PgStore::connect_with(options, via(&proxy))
                    .await
                    .expect("connect through proxy"),
            )
        } else {
            PgStore::new(
                options
                    .connect_with(via(&proxy))
                    .await
                    .expect("connect through proxy"),
            )
        };
        (PgFixture::migrated(store).await, ProxyOutage(proxy))
    }
}

/// Whether `e` is the store refusing a server whose commits wait for no
/// standby: a 503 whose source is [`idem_postgres::Error::NotSynchronous`].
pub fn is_not_synchronous(e: &Error) -> bool {
    backend_error(e).is_some_and(|b| matches!(b, idem_postgres::Error::NotSynchronous { .. }))
}

/// Whether `e` is a write cut off by the store's call timeout
/// ([`idem_postgres::Error::Timeout`]).
pub fn is_timeout(e: &Error) -> bool {
    backend_error(e).is_some_and(|b| matches!(b, idem_postgres::Error::Timeout { .. }))
}

/// The backend's own error under an `Unavailable` store error.
fn backend_error(e: &Error) -> Option<&idem_postgres::Error> {
    let Error::Store(idem_core::store::StoreError::Unavailable { source, .. }) = e else {
        return None;
    };
    source.downcast_ref::<idem_postgres::Error>()
}

impl idem_test_support::sql::PoisonDialect for Pg {
    async fn poison(&self, fx: &PgFixture, key: &'static str) {
        let t = fx.table();
        fx.store
            .pool()
            .execute(sqlx::AssertSqlSafe(format!(
                "ALTER TABLE {t} ADD CONSTRAINT idem_poison CHECK (key <> '{key}')"
            )))
            .await
            .expect("poison");
    }
}
