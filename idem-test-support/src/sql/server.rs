//! The glue of a SQL server reached over TCP (PostgreSQL, MySQL/MariaDB),
//! written once: a dialect says how its stores are built and where a test's
//! own schema or table goes, and gives the text of the few statements the
//! scenarios run by hand ([`ServerDialect`]). [`Dialect`],
//! [`CorruptDialect`], [`TxDialect`], [`WireDialect`], [`OutageDialect`] and
//! [`PoisonDialect`] follow from it, each test on a schema or table of its
//! own ([`Isolated`]); what stays the dialect's own is how a connection is
//! killed ([`KillDialect`](super::KillDialect)).

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use idem_core::store::AdminStore;
use idem_core::{IdempotencyKey, RecordId};
use idem_sql::{Coalescing, Driver, TxStore, Value};
use sqlx::pool::{PoolConnection, PoolOptions};
use sqlx::{ColumnIndex, ConnectOptions, Connection, Database, Decode, Pool, Transaction, Type};

use super::proxy::{Protocol, Proxy};
use super::{
    CorruptDialect, Cost, Costs, Dialect, Outage, OutageDialect, PoisonDialect, SharedServer,
    SqlFixture, Teardown, TxDialect, WireDialect,
};

/// A driver's connect options.
pub type OptionsOf<DB> = <<DB as Database>::Connection as Connection>::Options;

/// What the glue reads back from rows besides the shared statements' counts:
/// bytes by column position. Every sqlx database that has them has it (a
/// blanket implementation).
pub trait TestDb: Driver {
    /// Column `i` of `row`, as bytes.
    ///
    /// # Panics
    ///
    /// When the column is not binary.
    fn bytes(row: &Self::Row, i: usize) -> Vec<u8>;
}

impl<DB> TestDb for DB
where
    DB: Driver,
    Vec<u8>: for<'r> Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    fn bytes(row: &Self::Row, i: usize) -> Vec<u8> {
        sqlx::Row::try_get(row, i).expect("a binary column")
    }
}

/// A SQL server's dialect for the suite: how its stores are built, named and
/// measured, and the text of the statements the scenarios run by hand.
/// Every value those statements take is bound; identifiers come from the
/// fixture (validated names, quoted).
pub trait ServerDialect: Clone + Send + Sync + 'static {
    /// The driver.
    type Db: TestDb;
    /// Its store.
    type Store: TxStore<Dialect: idem_sql::Dialect<Db = Self::Db>> + AdminStore + Clone;
    /// How a server of the outage scenarios goes away.
    type Outage: Outage;
    /// The shared server.
    const SERVER: SharedServer;
    /// Its wire protocol.
    const PROTOCOL: Protocol;
    /// The quote around an identifier.
    const QUOTE: char;
    /// The placeholder of a statement's first bind parameter.
    const FIRST: &'static str;
    /// What follows `CREATE TABLE <name>` for the caller's own `orders`
    /// table of the transactional scenarios.
    const ORDERS: &'static str;
    /// The select list of the identity columns, as bytes.
    const IDENTITY: &'static str;

    /// A store on a pool of its own (`connect_with`).
    fn connect_with(
        pool: PoolOptions<Self::Db>,
        options: OptionsOf<Self::Db>,
    ) -> impl Future<Output = Result<Self::Store, String>> + Send;
    /// A store over `pool` (`new`).
    fn over(&self, pool: Pool<Self::Db>) -> Self::Store;
    /// `options` through `proxy`: its loopback port, without TLS (so it can
    /// count).
    fn through(options: OptionsOf<Self::Db>, proxy: &Proxy) -> OptionsOf<Self::Db>;
    /// `store` with coalescing `mode` (`with_coalescing_mode`).
    fn with_coalescing(store: Self::Store, mode: Coalescing) -> Self::Store;
    /// `store` on the schema or table `name` (not made yet): the store, its
    /// records table quoted (and qualified), and the statements that drop
    /// what the test made under `name`.
    fn named(&self, store: Self::Store, name: &str) -> (Self::Store, String, Vec<String>);
    /// Creates the store's table (`migrate`).
    fn migrate(store: &Self::Store) -> impl Future<Output = ()> + Send;
    /// `table`, a table of the test's own, quoted (and qualified by the
    /// fixture's schema).
    fn qualify(fx: &Isolated<Self>, table: &str) -> String;
    /// One more store on the fixture's table, on a pool of its own (another
    /// process).
    fn store_on(&self, fx: &Isolated<Self>) -> impl Future<Output = Self::Store> + Send;
    /// The names of the table's check constraints.
    fn check_constraints(&self, fx: &Isolated<Self>) -> impl Future<Output = Vec<String>> + Send;
    /// `(key, SET clause)` per corruption; the key names the column.
    fn corruptions(&self) -> Vec<(&'static str, &'static str)>;
    /// The store with its transactional lock wait bounded by `timeout`.
    fn with_tx_lock_timeout(&self, store: Self::Store, timeout: Duration) -> Self::Store;
    /// A statement that returns a row while a claim on the fixture's table
    /// waits on a lock.
    fn waiting_sql(&self, fx: &Isolated<Self>) -> String;
    /// Checks left after a transactional call gave up on its lock wait;
    /// nothing by default.
    fn after_tx_lock_timeout(&self, store: &Self::Store) -> impl Future<Output = ()> + Send {
        let _ = store;
        async {}
    }
    /// Checks the identity columns' types; nothing by default.
    fn identity_columns(&self, fx: &Isolated<Self>) -> impl Future<Output = ()> + Send {
        let _ = fx;
        async {}
    }
    /// What each transition costs on a warm connection.
    fn expected_costs(&self) -> Costs<Cost>;
    /// A server this test can take away: how, the options that reach it,
    /// and the options the teardown uses.
    fn outage_server(
        &self,
    ) -> impl Future<Output = (Self::Outage, OptionsOf<Self::Db>, OptionsOf<Self::Db>)> + Send;

    /// The server's connect options; panics with what to fix if its URL is
    /// malformed.
    fn options() -> OptionsOf<Self::Db> {
        Self::SERVER.options()
    }

    /// A pool of `max` connections through `options` (fails the test, never
    /// skips, if the server is unreachable).
    fn pool(max: u32, options: OptionsOf<Self::Db>) -> impl Future<Output = Pool<Self::Db>> + Send {
        Self::SERVER.pool(max, options)
    }

    /// A store on a pool of its own of `max` connections through `options`
    /// (fails the test, never skips, if the server is unreachable), batched
    /// if the test binary asked ([`forced_coalescing`](crate::work::forced_coalescing)).
    fn connect(max: u32, options: OptionsOf<Self::Db>) -> impl Future<Output = Self::Store> + Send {
        async move {
            let store = Self::connect_with(SharedServer::pool_options(max), options)
                .await
                .unwrap_or_else(|e| Self::SERVER.unreachable(&e));
            Self::batched_if_asked(store)
        }
    }

    /// `store`, sending every call through the batched path if this test
    /// binary asked for it.
    fn batched_if_asked(store: Self::Store) -> Self::Store {
        match crate::work::forced_coalescing() {
            Some(mode) => Self::with_coalescing(store, mode),
            None => store,
        }
    }

    /// `store` on a fresh schema or table, migrated if `migrate`; torn down
    /// through `admin`.
    fn isolate(
        &self,
        store: Self::Store,
        admin: OptionsOf<Self::Db>,
        migrate: bool,
    ) -> impl Future<Output = Isolated<Self>> + Send {
        async move {
            let name = fresh_name();
            let (store, table, drops) = self.named(store, &name);
            if migrate {
                Self::migrate(&store).await;
            }
            Isolated {
                store,
                name,
                table,
                admin,
                drops,
            }
        }
    }

    /// A store of `max` connections of its own through `options`, on a fresh,
    /// migrated schema or table.
    fn fixture(
        &self,
        max: u32,
        options: OptionsOf<Self::Db>,
    ) -> impl Future<Output = Isolated<Self>> + Send {
        async move {
            let store = Self::connect(max, options).await;
            self.isolate(store, Self::options(), true).await
        }
    }

    /// A store over a sqlx pool of `max` connections built here (`new`), on
    /// a fresh schema or table, migrated if `migrate`.
    fn fixture_over_pool(
        &self,
        max: u32,
        migrate: bool,
    ) -> impl Future<Output = Isolated<Self>> + Send {
        async move {
            let store = self.over(Self::pool(max, Self::options()).await);
            self.isolate(store, Self::options(), migrate).await
        }
    }
}

/// A fresh schema or table name, `idem_test_` and a random key in lower
/// case: a plain identifier on every server.
pub fn fresh_name() -> String {
    let key = IdempotencyKey::random();
    format!(
        "idem_test_{}",
        key.as_str().to_ascii_lowercase().replace('-', "_")
    )
}

/// One test's store on a schema (Postgres) or table (MySQL) of its own,
/// dropped on teardown.
pub struct Isolated<D: ServerDialect> {
    /// The store.
    pub store: D::Store,
    /// The schema or table made for the test.
    pub name: String,
    /// The records table, quoted (and qualified).
    pub table: String,
    /// Where the teardown connects.
    admin: OptionsOf<D::Db>,
    /// What the teardown runs.
    drops: Vec<String>,
}

impl<D: ServerDialect> fmt::Debug for Isolated<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Isolated")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl<D: ServerDialect> Isolated<D> {
    /// The caller's own `orders` table of the transactional scenarios.
    pub fn orders(&self) -> String {
        D::qualify(self, &format!("{}_orders", self.name))
    }

    /// Drops what the test made (and the tables `extra` name), and closes
    /// the store.
    ///
    /// # Panics
    ///
    /// When the server cannot be reached or a drop fails.
    pub async fn teardown_with(&self, extra: &[&str]) {
        let mut admin = connection::<D>(&self.admin).await;
        let extra = extra
            .iter()
            .map(|t| format!("DROP TABLE IF EXISTS {}", D::qualify(self, t)));
        for sql in self.drops.iter().cloned().chain(extra) {
            run::<D>(&mut admin, &sql, &[]).await;
        }
        let _ = admin.close().await;
        self.store.sql_core().connections().close().await;
    }
}

impl<D: ServerDialect> Teardown for Isolated<D> {
    async fn teardown(&self) {
        self.teardown_with(&[]).await;
    }
}

impl<D: ServerDialect> SqlFixture for Isolated<D> {
    type Store = D::Store;
    fn store(&self) -> &D::Store {
        &self.store
    }
}

/// A connection of its own through `options`.
async fn connection<D: ServerDialect>(
    options: &OptionsOf<D::Db>,
) -> <D::Db as Database>::Connection {
    <D::Db as Database>::Connection::connect_with(options)
        .await
        .unwrap_or_else(|e| D::SERVER.unreachable(&e))
}

/// Runs `sql` with `binds` on `conn`; the rows it matched.
async fn run<D: ServerDialect>(
    conn: &mut <D::Db as Database>::Connection,
    sql: &str,
    binds: &[Value<'_>],
) -> u64 {
    let query = bound::<D>(sql, binds);
    D::Db::execute(query, conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// `sql` with `binds` bound.
fn bound<'q, D: ServerDialect>(
    sql: &str,
    binds: &[Value<'_>],
) -> sqlx::query::Query<'q, D::Db, <D::Db as Database>::Arguments> {
    let mut query = idem_sql::query(&sql.into());
    for &value in binds {
        query = D::Db::bind_value(query, value);
    }
    query
}

/// A connection of the store's sqlx pool.
async fn checkout<D: ServerDialect>(store: &D::Store) -> PoolConnection<D::Db> {
    let pool = store.sql_core().connections().pool();
    pool.acquire().await.expect("a connection")
}

/// The rows of `sql` (with `binds`) on a connection of the store's pool.
async fn rows<D: ServerDialect>(
    store: &D::Store,
    sql: &str,
    binds: &[Value<'_>],
) -> Vec<<D::Db as Database>::Row> {
    let mut conn = checkout::<D>(store).await;
    D::Db::fetch_all(bound::<D>(sql, binds), &mut conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Runs `sql` (with `binds`) on a connection of the store's pool.
async fn execute<D: ServerDialect>(store: &D::Store, sql: &str, binds: &[Value<'_>]) -> u64 {
    let mut conn = checkout::<D>(store).await;
    run::<D>(&mut conn, sql, binds).await
}

/// The rows of `table`, a table of the test's (in the fixture's schema).
pub async fn count_rows<D: ServerDialect>(fx: &Isolated<D>, table: &str) -> i64 {
    count_quoted(fx, &D::qualify(fx, table)).await
}

/// The rows of the quoted (and qualified) `table`.
async fn count_quoted<D: ServerDialect>(fx: &Isolated<D>, table: &str) -> i64 {
    let found = rows::<D>(&fx.store, &format!("SELECT 1 FROM {table}"), &[]).await;
    i64::try_from(found.len()).expect("rows")
}

/// Begins a transaction on `conn` and locks `id`'s row (`FOR UPDATE`).
pub async fn lock_row<D: ServerDialect>(
    fx: &Isolated<D>,
    conn: PoolConnection<D::Db>,
    id: &RecordId,
) -> Transaction<'static, D::Db> {
    let mut tx = Transaction::begin(conn, None).await.expect("begin");
    let sql = format!(
        "SELECT 1 FROM {} WHERE id = {} FOR UPDATE",
        fx.table,
        D::FIRST
    );
    let key = idem_sql::record_key(id);
    run::<D>(&mut tx, &sql, &[Value::Bytes(&key)]).await;
    tx
}

impl<D: ServerDialect> Dialect for D {
    type Store = D::Store;
    type Fixture = Isolated<D>;
    async fn open(&self, max: u32) -> Isolated<D> {
        self.fixture(max, D::options()).await
    }
    async fn stores_on(&self, fx: &Isolated<D>, n: usize) -> Vec<D::Store> {
        let mut stores = Vec::with_capacity(n);
        for _ in 0..n {
            stores.push(self.store_on(fx).await);
        }
        stores
    }
    async fn close(&self, store: &D::Store) {
        store.sql_core().connections().close().await;
    }
    fn coalescing(store: D::Store, mode: Coalescing) -> D::Store {
        D::with_coalescing(store, mode)
    }
    async fn count_records(&self, fx: &Isolated<D>) -> i64 {
        count_quoted(fx, &fx.table).await
    }
    async fn stored_identity(&self, fx: &Isolated<D>) -> [Vec<u8>; 3] {
        let sql = format!("SELECT {} FROM {}", D::IDENTITY, fx.table);
        let found = rows::<D>(&fx.store, &sql, &[]).await;
        let [row] = &found[..] else {
            panic!("one row, not {}", found.len());
        };
        [0, 1, 2].map(|i| D::Db::bytes(row, i))
    }
    async fn check_identity_columns(&self, fx: &Isolated<D>) {
        self.identity_columns(fx).await;
    }
}

impl<D: ServerDialect> CorruptDialect for D {
    async fn drop_checks(&self, fx: &Isolated<D>) {
        for c in self.check_constraints(fx).await {
            let q = D::QUOTE;
            let sql = format!("ALTER TABLE {} DROP CONSTRAINT {q}{c}{q}", fx.table);
            execute::<D>(&fx.store, &sql, &[]).await;
        }
    }
    fn corruptions(&self) -> Vec<(&'static str, &'static str)> {
        ServerDialect::corruptions(self)
    }
    async fn corrupt(&self, fx: &Isolated<D>, set: &str, key: &str) {
        let (q, first) = (D::QUOTE, D::FIRST);
        let sql = format!("UPDATE {} SET {set} WHERE {q}key{q} = {first}", fx.table);
        execute::<D>(&fx.store, &sql, &[Value::Text(key)]).await;
    }
}

impl<D: ServerDialect> PoisonDialect for D {
    async fn poison(&self, fx: &Isolated<D>, key: &'static str) {
        let (q, name) = (D::QUOTE, &fx.name);
        let sql = format!(
            "ALTER TABLE {} ADD CONSTRAINT {q}{name}_poison{q} CHECK ({q}key{q} <> '{key}')",
            fx.table
        );
        execute::<D>(&fx.store, &sql, &[]).await;
    }
}

impl<D: ServerDialect> TxDialect for D {
    async fn create_orders(&self, fx: &Isolated<D>) {
        let sql = format!("CREATE TABLE {} {}", fx.orders(), D::ORDERS);
        execute::<D>(&fx.store, &sql, &[]).await;
    }
    fn insert_order_sql(&self, fx: &Isolated<D>) -> String {
        format!("INSERT INTO {} (note) VALUES ({})", fx.orders(), D::FIRST)
    }
    async fn count_orders(&self, fx: &Isolated<D>) -> i64 {
        count_quoted(fx, &fx.orders()).await
    }
    fn with_tx_lock_timeout(&self, store: D::Store, timeout: Duration) -> D::Store {
        ServerDialect::with_tx_lock_timeout(self, store, timeout)
    }
    /// Polled on a connection of its own.
    async fn claim_waiting(&self, fx: &Isolated<D>) -> bool {
        let sql = self.waiting_sql(fx);
        let mut admin = connection::<D>(&D::options()).await;
        let mut seen = false;
        for _ in 0..2000 {
            let row = D::Db::fetch_optional(bound::<D>(&sql, &[]), &mut admin).await;
            if row.expect("the waiting statement").is_some() {
                seen = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let _ = admin.close().await;
        seen
    }
    async fn after_tx_lock_timeout(&self, store: &D::Store) {
        ServerDialect::after_tx_lock_timeout(self, store).await;
    }
}

impl<D: ServerDialect> WireDialect for D {
    const PROTOCOL: Protocol = <D as ServerDialect>::PROTOCOL;
    async fn upstream(&self) -> SocketAddr {
        let url = D::options().to_url_lossy();
        let host = url.host_str().unwrap_or("127.0.0.1").to_owned();
        D::SERVER
            .addr(&host, url.port().expect("a port in the URL"))
            .await
    }
    async fn open_via(&self, proxy: &Proxy, own_pool: bool) -> Isolated<D> {
        let options = D::through(D::options(), proxy);
        let store = if own_pool {
            D::connect(1, options).await
        } else {
            self.over(D::pool(1, options).await)
        };
        self.isolate(store, D::options(), true).await
    }
    fn pool_idle(store: &D::Store) -> bool {
        let pool = store.sql_core().connections().pool();
        usize::try_from(pool.size()).ok() == Some(pool.num_idle())
    }
    fn expected_costs(&self) -> Costs<Cost> {
        ServerDialect::expected_costs(self)
    }
}

impl<D: ServerDialect> OutageDialect for D {
    type Outage = D::Outage;
    async fn outage(&self, own_pool: bool) -> (Isolated<D>, D::Outage) {
        let (outage, options, admin) = self.outage_server().await;
        let pool = PoolOptions::new()
            .max_connections(4)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(2));
        let store = if own_pool {
            let store = D::connect_with(pool, options).await;
            D::batched_if_asked(store.expect("connect to the server"))
        } else {
            let pool = pool.connect_with(options).await;
            self.over(pool.expect("connect to the server"))
        };
        (self.isolate(store, admin, true).await, outage)
    }
}

/// Every connection dropped through a proxy, and new ones refused, until
/// it lets them through again (a server restart, a failover).
#[derive(Debug)]
pub struct ProxyOutage(pub Proxy);

impl Outage for ProxyOutage {
    async fn down(&mut self) {
        self.0.set_down(true);
        self.0.kill_all();
    }
    async fn up(&mut self) {
        self.0.set_down(false);
    }
}
