//! Shared test setup: a real server, one fresh schema per test, and the
//! Postgres glue of the SQL suite ([`Pg`]): the one place that knows how the
//! suite's stores are built here.

#![allow(dead_code, unreachable_pub, unused_imports)]

use std::time::Duration;

use idem_core::{Error, IdempotencyKey, RecordId};
use idem_postgres::PgStore;
use idem_postgres::sqlx::pool::PoolConnection;
use idem_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use idem_postgres::sqlx::{self, PgPool, Postgres, Transaction};
use idem_test_support::sql::proxy::{Protocol, Proxy};
use idem_test_support::sql::{
    Cost, Costs, Isolated, KillDialect, POSTGRES, ProxyOutage, ServerDialect, SharedServer,
    WireDialect, lock_row, poll,
};

pub use idem_test_support::sql::{Dialect, Teardown, count_rows, pg_cluster as cluster, proxy};

/// One test's store on a schema of its own, dropped on teardown.
pub type PgFixture = Isolated<Pg>;

/// The server URL: `IDEM_POSTGRES_URL`, or the local default.
pub fn url() -> String {
    POSTGRES.url()
}

/// Connect options for the test server; panics with what to start if the
/// URL is malformed.
pub fn options() -> PgConnectOptions {
    Pg::options()
}

/// The server's socket address (for the proxy).
pub async fn upstream() -> std::net::SocketAddr {
    Pg.upstream().await
}

/// Connect options that go through `proxy` (without TLS, so it can count).
pub fn via(proxy: &Proxy) -> PgConnectOptions {
    Pg::through(options(), proxy)
}

/// A pool on the test server (fails the test, never skips, if unreachable).
pub async fn pool(max: u32, options: PgConnectOptions) -> PgPool {
    Pg::pool(max, options).await
}

/// Pool options of the tests: `max` connections, a 10 s acquire timeout.
pub fn pool_options(max: u32) -> PgPoolOptions {
    SharedServer::pool_options(max)
}

/// A store with pools of its own (`PgStore::connect_with`), on the default
/// table (fails the test, never skips, if the server is unreachable),
/// batched if the test binary asked.
pub async fn connect(max: u32, options: PgConnectOptions) -> PgStore {
    Pg::connect(max, options).await
}

/// A fresh schema name.
pub fn schema_name() -> String {
    idem_test_support::sql::server::fresh_name()
}

/// The Postgres dialect of the SQL suite.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pg;

impl Pg {
    /// The dialect, with every store this test binary builds on a pool of
    /// its own sending every call through the batched path.
    pub fn batched() -> Self {
        idem_test_support::work::batch_every_call();
        Self
    }
}

impl ServerDialect for Pg {
    type Db = Postgres;
    type Store = PgStore;
    type Outage = ProxyOutage;
    const SERVER: SharedServer = POSTGRES;
    const PROTOCOL: Protocol = Protocol::Postgres;
    const QUOTE: char = '"';
    const FIRST: &'static str = "$1";
    const ORDERS: &'static str = "(id bigserial PRIMARY KEY, note text NOT NULL)";
    /// Text columns, read as their UTF-8 bytes.
    const IDENTITY: &'static str =
        "convert_to(owner, 'UTF8'), convert_to(operation, 'UTF8'), convert_to(key, 'UTF8')";

    async fn connect_with(
        pool: PgPoolOptions,
        options: PgConnectOptions,
    ) -> Result<PgStore, String> {
        PgStore::connect_with(pool, options)
            .await
            .map_err(|e| e.to_string())
    }
    fn over(&self, pool: PgPool) -> PgStore {
        PgStore::new(pool)
    }
    fn through(options: PgConnectOptions, proxy: &Proxy) -> PgConnectOptions {
        options
            .host("127.0.0.1")
            .port(proxy.addr.port())
            .ssl_mode(PgSslMode::Disable)
    }
    fn with_coalescing(store: PgStore, mode: idem_sql::Coalescing) -> PgStore {
        store.with_coalescing_mode(mode)
    }
    /// The schema `name`, dropped with everything in it.
    fn named(&self, store: PgStore, name: &str) -> (PgStore, String, Vec<String>) {
        let store = store.with_schema_name(name).expect("valid schema name");
        let table = format!("\"{name}\".\"{}\"", store.table_name());
        (
            store,
            table,
            vec![format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE")],
        )
    }
    async fn migrate(store: &PgStore) {
        store.migrate().await.expect("migrate");
    }
    fn qualify(fx: &PgFixture, table: &str) -> String {
        format!("\"{}\".\"{table}\"", fx.name)
    }
    /// With two connections: the shared server allows 100 in all, and the
    /// 64 racers of `races.rs` over eight pools of eight run next to these.
    async fn store_on(&self, fx: &PgFixture) -> PgStore {
        connect(2, options())
            .await
            .with_schema_name(&fx.name)
            .expect("schema")
    }
    async fn check_constraints(&self, _fx: &PgFixture) -> Vec<String> {
        // None: the store checks what it reads (see the migration).
        Vec::new()
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
    fn with_tx_lock_timeout(&self, store: PgStore, timeout: Duration) -> PgStore {
        store.with_tx_lock_timeout(timeout)
    }
    /// A backend whose statement names the fixture's schema, waiting on a
    /// lock (`pg_stat_activity`).
    fn waiting_sql(&self, fx: &PgFixture) -> String {
        format!(
            "SELECT 1 FROM pg_stat_activity \
             WHERE wait_event_type = 'Lock' AND strpos(query, '\"{}\".') > 0 LIMIT 1",
            fx.name
        )
    }
    fn expected_costs(&self) -> Costs<Cost> {
        Costs {
            // The rare path: the claim reads the released record, then
            // takes it over (on the same checkout).
            takeover: (2, 2, 0),
            fresh: (2, 2, 0),
            // BEGIN+SET LOCAL (one simple query), claim, complete, COMMIT.
            tx_fresh: (4, 4, 0),
            // BEGIN+SET LOCAL, claim, ROLLBACK.
            tx_replay: (3, 3, 0),
            // Planned at every run (an unnamed statement): sqlx has it
            // prepared, then runs it.
            purge: (1, 2, 1),
            ..Costs::each((1, 1, 0))
        }
    }
    /// A proxy in front of the server: it drops every connection and
    /// refuses new ones until it is up again (a restart, a failover).
    async fn outage_server(&self) -> (ProxyOutage, PgConnectOptions, PgConnectOptions) {
        let proxy = Proxy::start(upstream().await, Protocol::Postgres).await;
        let through = via(&proxy);
        (ProxyOutage(proxy), through, options())
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
        let fx = Pg.fixture(2, options().application_name(&app)).await;
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
        lock_row(fx, blocker, id).await
    }
    async fn unlock(&self, locked: Transaction<'static, Postgres>) {
        locked.rollback().await.expect("rollback");
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
