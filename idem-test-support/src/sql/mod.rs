//! One SQL test suite, written once and run by each SQL crate against its
//! dialect (feature `sql`): the transactional mode, the table's values and
//! corrupted rows, races over several pools, wire costs, an outage, and the
//! transactional mode's metrics.
//!
//! A dialect implements [`Dialect`] once in its `tests/` (how to open a
//! store on a fresh, isolated table or schema, and the few queries the
//! scenarios need), plus [`TxDialect`] if it has a transactional mode,
//! [`WireDialect`] if it is reached over TCP (the counting [`proxy`]),
//! [`OutageDialect`] if it can be taken away and brought back, and
//! [`CorruptDialect`] if its check constraints can be dropped. Then each test
//! file expands [`sql_suite!`](crate::sql_suite) with the scenarios that apply:
//!
//! ```text
//! idem_test_support::sql_suite!(crate::support::Pg::default();
//!     tx_commits_claim_writes_and_response_together,
//!     racing_takeovers_have_exactly_one_winner,
//! );
//! ```
//!
//! The throwaway servers the SQL crates start live here too: a `mariadbd`
//! (`mariadb`, feature `sql-mysql`), a MariaDB primary and replica
//! (`mariadb_cluster`, feature `sql-mysql`) and a Postgres primary and
//! standby (`pg_cluster`, feature `sql-postgres`).

pub mod coalescing;
pub mod costs;
pub mod faults;
#[cfg(feature = "sql-mysql")]
pub mod mariadb;
#[cfg(feature = "sql-mysql")]
pub mod mariadb_cluster;
pub mod metrics;
#[cfg(feature = "sql-postgres")]
pub mod pg_cluster;
pub mod proxy;
pub mod races;
pub mod schema;
pub mod server;
pub mod transactional;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use idem_core::adapter::fingerprint;
use idem_core::clock::{ManualClock, Timestamp};
use idem_core::store::{AdminStore, ClaimRequest, Token};
use idem_core::{
    Attempt, Error, FieldFilter, Idem, IdempotencyKey, InFlightMode, IntoKey, Policy,
    PolicyBuilder, RecordId, Reply, Scope,
};

pub use coalescing::*;
pub use costs::*;
pub use faults::*;
pub use metrics::*;
pub use races::*;
pub use schema::*;
pub use server::{Isolated, ProxyOutage, ServerDialect, TestDb, count_rows, lock_row};
pub use transactional::*;

pub use crate::servers::{MYSQL, POSTGRES, SharedServer, poll};
pub use crate::teardown::{Teardown, with_fixture};

use idem_sql::{Driver, SqlIdemExt, TxConnection, TxStore};
use proxy::{Protocol, Proxy};

pub use crate::work::{Counter, Out, request};

/// The lease of [`policy`].
pub const LEASE: Duration = Duration::from_secs(60);

/// A boxed future borrowing `'c` (a transactional work's, which borrows its
/// connection).
pub type TxFuture<'c, T> = Pin<Box<dyn Future<Output = T> + Send + 'c>>;

/// The tests' policy: a 60 s lease, duplicates rejected (409), `retries`
/// store retries 5 ms apart.
///
/// # Panics
///
/// Never (the policy is valid).
pub fn policy(retries: u32) -> Policy {
    policy_builder(retries).build().expect("policy")
}

/// What [`policy`] builds, to change before building.
pub fn policy_builder(retries: u32) -> PolicyBuilder {
    Policy::builder()
        .lease(LEASE)
        .response_ttl(Duration::from_secs(3600))
        .key_ttl(Duration::from_secs(86_400))
        .in_flight(InFlightMode::Reject)
        .store_retries(retries, Duration::from_millis(5))
}

/// An engine on `store` with `clock` and `policy(2)`.
pub fn engine<S: AdminStore + Clone>(store: &S, clock: &ManualClock) -> Idem<S> {
    Idem::new(store.clone())
        .with_clock(clock.clone())
        .with_policy(policy(2))
}

/// A call made while no server is behind the store's address: a typed 503
/// ([`assert_switch_error`](crate::work::assert_switch_error)) whose work
/// never ran.
///
/// # Panics
///
/// When the call succeeds, fails otherwise, or its work ran.
pub async fn assert_call_fails_without_server<S: AdminStore>(
    engine: &crate::work::Engine<S>,
    scope: &Scope,
) {
    let runs = Counter::default();
    let during = crate::work::call(engine, scope, "during-the-switch", &runs)
        .await
        .expect_err("no server: the call fails");
    crate::work::assert_switch_error(&during);
    assert_eq!(runs.get(), 0, "the work never ran without a claim");
}

/// A scope of its own (a random tenant).
///
/// # Panics
///
/// Never (the scope is valid).
pub fn scope() -> Scope {
    Scope::new(
        format!("tenant-{}", IdempotencyKey::random()),
        "POST /charges",
    )
    .expect("scope")
}

/// A claim request for `id` at `now` with a fresh token, for [`request`].
///
/// # Panics
///
/// Never (the request fingerprints).
pub fn claim_request(id: &RecordId, now: Timestamp) -> ClaimRequest<'_> {
    let fp = fingerprint(id.operation(), &request(), &FieldFilter::All).expect("fp");
    ClaimRequest::new(
        id,
        fp,
        Token::random(),
        now,
        now.plus(LEASE),
        now.plus(Duration::from_secs(86_400)),
    )
}

/// One test's store on its own table, schema or file; its teardown drops
/// them (and whatever the test made next to them) and closes the store.
pub trait SqlFixture: Teardown {
    /// The store under test.
    type Store: AdminStore + Clone;
    /// The store.
    fn store(&self) -> &Self::Store;
}

/// A [`SqlFixture`] as the store conformance suite's
/// [`Fixture`](idem_core::testkit::Fixture): the same store (cloned for each
/// engine), the same teardown. Build one with [`conformance`].
#[derive(Debug)]
pub struct Conformance<Fx>(pub Fx);

impl<Fx: SqlFixture> idem_core::testkit::Fixture for Conformance<Fx> {
    type Store = Fx::Store;
    fn store(&self) -> Fx::Store {
        self.0.store().clone()
    }
    async fn teardown(self) {
        self.0.teardown().await;
    }
}

/// `idem_core::store_conformance!(conformance(setup()))`: the suite on the
/// SQL fixture `setup` makes.
pub async fn conformance<Fx: SqlFixture>(setup: impl Future<Output = Fx>) -> Conformance<Fx> {
    Conformance(setup.await)
}

/// A SQL dialect's glue for the suite: the one place per dialect that knows
/// how its stores are built.
pub trait Dialect: Clone + Send + Sync + 'static {
    /// Its store.
    type Store: AdminStore + Clone;
    /// One test's isolated store.
    type Fixture: SqlFixture<Store = Self::Store>;
    /// A migrated store of `max` connections on a fresh table or schema.
    fn open(&self, max: u32) -> impl Future<Output = Self::Fixture> + Send;
    /// `n` more stores on the fixture's table, each with a pool of its own
    /// (several processes), closed with [`close`](Dialect::close).
    fn stores_on(
        &self,
        fx: &Self::Fixture,
        n: usize,
    ) -> impl Future<Output = Vec<Self::Store>> + Send;
    /// Closes a store of [`stores_on`](Dialect::stores_on).
    fn close(&self, store: &Self::Store) -> impl Future<Output = ()> + Send;
    /// `store` with coalescing `mode` (`with_coalescing_mode`).
    fn coalescing(store: Self::Store, mode: idem_sql::Coalescing) -> Self::Store;
    /// The rows of the fixture's records table.
    fn count_records(&self, fx: &Self::Fixture) -> impl Future<Output = i64> + Send;
    /// `(owner, operation, key)` of the one row of the fixture's table, as
    /// stored.
    fn stored_identity(&self, fx: &Self::Fixture) -> impl Future<Output = [Vec<u8>; 3]> + Send;
    /// Checks the identity columns' types (where the dialect's types, not
    /// the data, make comparisons byte-exact); nothing by default.
    fn check_identity_columns(&self, fx: &Self::Fixture) -> impl Future<Output = ()> + Send {
        let _ = fx;
        async {}
    }
}

/// A dialect whose check constraints can be dropped, to corrupt rows by hand.
pub trait CorruptDialect: Dialect {
    /// Drops the table's check constraints.
    fn drop_checks(&self, fx: &Self::Fixture) -> impl Future<Output = ()> + Send;
    /// `(key, SET clause)` per corruption; the key names the column.
    fn corruptions(&self) -> Vec<(&'static str, &'static str)>;
    /// Runs `UPDATE <table> SET <set> WHERE key = <key>`.
    fn corrupt(&self, fx: &Self::Fixture, set: &str, key: &str) -> impl Future<Output = ()> + Send;
}

/// A dialect with a transactional mode (`execute_in_tx`).
pub trait TxDialect: Dialect<Store: TxStore> {
    /// `idem.execute_in_tx(scope, key, request, work)`.
    fn execute_in_tx<K, F>(
        &self,
        idem: &Idem<Self::Store>,
        scope: &Scope,
        key: K,
        request: &serde_json::Value,
        work: F,
    ) -> impl Future<Output = Result<Reply<String, String>, Error>> + Send
    where
        K: IntoKey + Send,
        F: for<'c> FnOnce(Attempt, &'c mut TxConnection<Self::Store>) -> TxFuture<'c, Out> + Send,
    {
        idem.execute_in_tx(scope, key, request, work)
    }
    /// Creates the caller's own `orders` table next to the fixture's.
    fn create_orders(&self, fx: &Self::Fixture) -> impl Future<Output = ()> + Send;
    /// The statement inserting one order note (one bind parameter).
    fn insert_order_sql(&self, fx: &Self::Fixture) -> String;
    /// Runs [`insert_order_sql`](TxDialect::insert_order_sql) with `note` on
    /// a transactional work's connection.
    fn insert_order<'c>(
        conn: &'c mut TxConnection<Self::Store>,
        sql: String,
        note: &'static str,
    ) -> TxFuture<'c, ()> {
        type Db<S> = <<S as TxStore>::Dialect as idem_sql::Dialect>::Db;
        let query = idem_sql::query(&sql.into());
        let query = <Db<Self::Store> as Driver>::bind_value(query, idem_sql::Value::Text(note));
        Box::pin(async move {
            <Db<Self::Store> as Driver>::execute(query, conn)
                .await
                .expect("insert");
        })
    }
    /// The rows of the `orders` table.
    fn count_orders(&self, fx: &Self::Fixture) -> impl Future<Output = i64> + Send;
    /// The store with its transactional lock wait bounded by `timeout`.
    fn with_tx_lock_timeout(&self, store: Self::Store, timeout: Duration) -> Self::Store;
    /// Whether a claim on the fixture's table is seen waiting on a lock on
    /// the server (polled for up to 10 s, on a connection of its own).
    fn claim_waiting(&self, fx: &Self::Fixture) -> impl Future<Output = bool> + Send;
    /// Checks left after a transactional call gave up on its lock wait;
    /// nothing by default.
    fn after_tx_lock_timeout(&self, store: &Self::Store) -> impl Future<Output = ()> + Send {
        let _ = store;
        async {}
    }
}

/// A dialect reached over TCP, measured through the counting [`Proxy`].
pub trait WireDialect: TxDialect {
    /// Its wire protocol.
    const PROTOCOL: Protocol;
    /// The server's address.
    fn upstream(&self) -> impl Future<Output = SocketAddr> + Send;
    /// A migrated store on a fresh table through `proxy` (without TLS),
    /// with one connection: of its own (`connect_with`, `own_pool`) or over a
    /// sqlx pool built here (`new`).
    fn open_via(&self, proxy: &Proxy, own_pool: bool)
    -> impl Future<Output = Self::Fixture> + Send;
    /// Whether every connection of the store's sqlx pool is idle.
    fn pool_idle(store: &Self::Store) -> bool;
    /// What each transition costs on a warm connection.
    fn expected_costs(&self) -> Costs<Cost>;
}

/// A dialect whose server can go away and come back.
pub trait OutageDialect: Dialect {
    /// How the server goes away.
    type Outage: Outage;
    /// A migrated store of four connections (a 2 s acquire timeout) on a
    /// server this test can take away: of its own (`own_pool`) or over a
    /// sqlx pool.
    fn outage(&self, own_pool: bool) -> impl Future<Output = (Self::Fixture, Self::Outage)> + Send;
}

/// A dialect whose server can kill one of the store's connections in the
/// middle of a statement (`pg_terminate_backend`, `KILL <id>`).
pub trait KillDialect: Dialect {
    /// What [`open_killable`](KillDialect::open_killable) returns besides
    /// the fixture (a throwaway server, kept until after the teardown, or
    /// the name the store's connections go by).
    type Handle: Send + Sync + 'static;
    /// A connection of its own, not the store's.
    type Blocker: Send + 'static;
    /// A transaction holding a row lock on a blocker.
    type Locked: Send + 'static;
    /// A migrated store of two connections whose connections the killer can
    /// find.
    fn open_killable(&self) -> impl Future<Output = (Self::Fixture, Self::Handle)> + Send;
    /// A fresh blocker.
    fn blocker(
        &self,
        fx: &Self::Fixture,
        handle: &Self::Handle,
    ) -> impl Future<Output = Self::Blocker> + Send;
    /// Kills, once, the first of the store's connections seen waiting on a
    /// lock or running a statement on the fixture's table (never `spare`'s),
    /// polling for a while; panics if there is none.
    fn killer(
        &self,
        fx: &Self::Fixture,
        handle: &Self::Handle,
        spare: &Self::Blocker,
    ) -> impl Future<Output = ()> + Send + 'static;
    /// Begins a transaction on `blocker` and locks `id`'s row (`FOR UPDATE`).
    fn lock(
        &self,
        fx: &Self::Fixture,
        blocker: Self::Blocker,
        id: &RecordId,
    ) -> impl Future<Output = Self::Locked> + Send;
    /// Rolls the lock's transaction back.
    fn unlock(&self, locked: Self::Locked) -> impl Future<Output = ()> + Send;
}

/// A server taken away and brought back.
pub trait Outage: Send + Sync + 'static {
    /// Every connection is dropped and no new one gets through.
    fn down(&mut self) -> impl Future<Output = ()> + Send;
    /// The server answers again.
    fn up(&mut self) -> impl Future<Output = ()> + Send;
}

/// Expands one `#[tokio::test]` per named scenario of [`sql`](crate::sql),
/// each run with `$dialect` (an expression, evaluated per test).
///
/// The calling crate needs `tokio` (features `macros`, `rt-multi-thread`)
/// as a dev-dependency.
///
/// Three named groups stand for the scenarios every dialect runs together:
/// `@races` (64 racers over several stores, racing takeovers, a thousand
/// keys), `@values` (hostile values, byte-exact identities, binary
/// bodies) and `@coalescing` (a lone task, a busy store's steady load, a
/// failing call in a batch, 96 mixed callers when busy and always batched):
/// `sql_suite!(d; @races)`.
#[macro_export]
macro_rules! sql_suite {
    ($dialect:expr; @coalescing) => {
        $crate::sql_suite!($dialect;
            a_lone_task_never_waits_for_a_batch,
            busy_stores_gather_their_calls_in_batches,
            one_failing_call_fails_no_other_in_its_batch,
            coalesced_calls_keep_every_answer_when_busy,
            coalesced_calls_keep_every_answer_always,
        );
    };
    ($dialect:expr; @races) => {
        $crate::sql_suite!($dialect;
            sixty_four_racers,
            racing_takeovers_have_exactly_one_winner,
            thousand_keys,
        );
    };
    ($dialect:expr; @values) => {
        $crate::sql_suite!($dialect;
            hostile_values_go_through_bind_parameters_only,
            identities_are_byte_exact,
            binary_bodies_round_trip,
        );
    };
    ($dialect:expr; $($name:ident),+ $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                $crate::sql::$name($dialect).await;
            }
        )+
    };
}
