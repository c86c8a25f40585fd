//! The synchronous-replication guard cannot be slipped past: a store that
//! [requires](PgStore::require_synchronous_replication) commits to wait for
//! a standby refuses every write on a server where they do not, however it
//! got there.
//!
//! * A connection replaced silently (past the pool's idle timeout, no
//!   error seen) after a failover reaches the promoted server, which has no
//!   synchronous standby: the new connection is checked before it serves
//!   the write, and the write is refused; on the store's own pool, and on a
//!   user's pool with `refuse_without_synchronous_standby` as its
//!   `after_connect` hook.
//! * `synchronous_standby_names` emptied on the live primary: refused
//!   within the check period (here zero: the next write), and a failed
//!   check latches, so that even with an hour-long period every write is
//!   refused until a check passes again.
//!
//! Each test owns a throwaway primary and synchronous standby
//! ([`support::cluster`]).

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::clock::ManualClock;
use idem_core::store::StoreError;
use idem_core::{Error as IdemError, Idem, IdempotencyKey, Reply};
use idem_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use idem_postgres::sqlx::{self, PgPool};
use idem_postgres::{Error, PgStore};
use idem_test_support::sql::{Counter, Out, policy, request, scope};
use support::cluster::{Cluster, Mode};
use support::is_not_synchronous;
use support::proxy::{Protocol, Proxy};

const SYNC: Mode = Mode::Synchronous {
    names: "standby1",
    level: "on",
};

type Engine = Arc<Idem<PgStore>>;

fn engine(store: &PgStore) -> Engine {
    Arc::new(
        Idem::new(store.clone())
            .with_clock(ManualClock::starting_now())
            .with_policy(policy(2)),
    )
}

/// One write through the engine under a fresh key, counting the runs.
async fn write(engine: &Engine, runs: &Counter) -> Result<Reply<String, String>, IdemError> {
    let runs = runs.clone();
    engine
        .execute(
            &scope(),
            IdempotencyKey::random().as_str(),
            &request(),
            |_| async move {
                runs.hit();
                Out::Success("done".into())
            },
        )
        .await
}

fn assert_refused(result: &Result<Reply<String, String>, IdemError>) {
    match result {
        Err(e) if is_not_synchronous(e) => assert_eq!(e.http_status(), 503, "{e:?}"),
        other => panic!("expected a NotSynchronous refusal, got {other:?}"),
    }
}

/// Rows in the store's table on `pool`'s server.
async fn rows(pool: &PgPool, store: &PgStore) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{}\".\"{}\"",
        store.schema_name(),
        store.table_name()
    )))
    .fetch_one(pool)
    .await
    .expect("count rows")
}

/// Sets `synchronous_standby_names` on the live primary (`admin`, reached
/// with `options`) and waits until a new session there reads it.
async fn set_standby_names(admin: &PgPool, options: &PgConnectOptions, names: &str) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER SYSTEM SET synchronous_standby_names = '{names}'"
    )))
    .execute(admin)
    .await
    .expect("alter system");
    sqlx::query("SELECT pg_reload_conf()")
        .execute(admin)
        .await
        .expect("reload");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect_with(options)
            .await
            .expect("a new session");
        let now: String = sqlx::query_scalar("SELECT current_setting('synchronous_standby_names')")
            .fetch_one(&mut conn)
            .await
            .expect("read the setting");
        drop(conn);
        if now == names {
            return;
        }
        assert!(Instant::now() < deadline, "the reload never took: {now:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whose pool the store runs on.
#[derive(Debug, Clone, Copy)]
enum Pool {
    /// The store's own (`connect_with`): it checks new connections itself.
    Own,
    /// The user's (`new(pool)`), with `refuse_without_synchronous_standby`
    /// as its `after_connect` hook.
    Yours,
}

/// A store reaching the primary through `front`, requiring synchronous
/// replication, whose idle connections are past their idle timeout by the
/// next checkout (the failover takes far longer than a millisecond), so the
/// pool replaces them without any call seeing an error.
async fn requiring_store(cluster: &Cluster, front: &Proxy, pool: Pool) -> PgStore {
    let options: PgConnectOptions = cluster.primary.options().port(front.addr.port());
    let pool_options = PgPoolOptions::new()
        .max_connections(2)
        .idle_timeout(Duration::from_millis(1));
    let store = match pool {
        Pool::Own => PgStore::connect_with(pool_options, options)
            .await
            .expect("connect"),
        Pool::Yours => PgStore::new(
            pool_options
                // sqlx retries a connection its hook refused until the
                // acquire timeout: the call then fails `PoolTimedOut`.
                .acquire_timeout(Duration::from_millis(500))
                .test_before_acquire(false)
                .after_connect(|conn, _meta| {
                    Box::pin(idem_postgres::refuse_without_synchronous_standby(conn))
                })
                .connect_lazy_with(options),
        ),
    };
    store
        .require_synchronous_replication()
        .await
        .expect("the primary has a synchronous standby")
        // Only the new-connection check can see the switch: no period
        // passes during the test.
        .with_replication_check_period(Duration::from_secs(3600))
}

async fn a_replaced_connection_is_checked_before_it_writes(pool: Pool) {
    let cluster = Cluster::start(SYNC).await;
    let front = Proxy::start(cluster.primary.addr(), Protocol::Postgres).await;
    let store = requiring_store(&cluster, &front, pool).await;
    store.migrate().await.expect("migrate");
    let (engine, runs) = (engine(&store), Counter::default());
    let before = write(&engine, &runs).await.expect("a synchronous write");
    assert!(before.is_stored());

    // The primary dies; the standby is promoted (with no synchronous
    // standby of its own) and the address now names it. No call runs
    // meanwhile, so nothing tells the store that its server changed.
    cluster.kill_primary().await;
    cluster.promote_standby().await;
    front.set_upstream(cluster.standby.addr());

    for _ in 0..3 {
        let refused = write(&engine, &runs).await;
        match pool {
            Pool::Own => assert_refused(&refused),
            // The hook's refusal reaches the store as the pool's timeout:
            // a 503 all the same, and nothing written.
            Pool::Yours => match &refused {
                Err(e) => {
                    assert!(
                        matches!(e, IdemError::Store(StoreError::Unavailable { .. })),
                        "{e:?}"
                    );
                    assert_eq!(e.http_status(), 503);
                }
                Ok(reply) => panic!("written on the promoted server: {reply:?}"),
            },
        }
    }
    assert_eq!(runs.get(), 1, "no work ran on the promoted server");
    let promoted = cluster.standby.pool().await;
    assert_eq!(
        rows(&promoted, &store).await,
        1,
        "only the write from before the failover is on the promoted server"
    );
    promoted.close().await;
    store.close().await;
    store.pool().close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_replaced_after_its_idle_timeout_is_checked_before_it_writes() {
    a_replaced_connection_is_checked_before_it_writes(Pool::Own).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_pool_with_the_connect_hook_checks_its_new_connections_too() {
    a_replaced_connection_is_checked_before_it_writes(Pool::Yours).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_names_emptied_on_the_live_primary_are_refused_until_restored() {
    let cluster = Cluster::start(SYNC).await;
    let admin = cluster.primary.pool().await;
    let connect = || {
        PgStore::connect_with(
            PgPoolOptions::new().max_connections(2),
            cluster.primary.options(),
        )
    };
    // Checked before every write.
    let every_write = connect()
        .await
        .expect("connect")
        .require_synchronous_replication()
        .await
        .expect("synchronous")
        .with_replication_check_period(Duration::ZERO);
    // Checked once an hour, and when a check fails.
    let hourly = connect()
        .await
        .expect("connect")
        .require_synchronous_replication()
        .await
        .expect("synchronous")
        .with_replication_check_period(Duration::from_secs(3600));
    every_write.migrate().await.expect("migrate");
    let (fast, slow, runs) = (engine(&every_write), engine(&hourly), Counter::default());
    write(&fast, &runs).await.expect("synchronous");
    write(&slow, &runs).await.expect("synchronous");

    set_standby_names(&admin, &cluster.primary.options(), "").await;
    // The next write checks first: refused, and so is every one after it.
    for _ in 0..3 {
        assert_refused(&write(&fast, &runs).await);
    }
    // The hourly store finds out when it checks: after that, no write
    // passes (before the latch, the next write succeeded).
    match hourly.check_replication().await {
        Err(Error::NotSynchronous {
            synchronous_standby_names,
            ..
        }) => assert_eq!(synchronous_standby_names, ""),
        other => panic!("expected NotSynchronous, got {other:?}"),
    }
    for _ in 0..3 {
        assert_refused(&write(&slow, &runs).await);
    }
    assert_eq!(runs.get(), 2, "no work ran while refused");

    set_standby_names(&admin, &cluster.primary.options(), "standby1").await;
    let after = write(&fast, &runs).await.expect("restored");
    assert!(after.is_stored());
    let after = write(&slow, &runs)
        .await
        .expect("restored: the latch lifts");
    assert!(after.is_stored());
    assert_eq!(runs.get(), 4);

    admin.close().await;
    every_write.close().await;
    hourly.close().await;
}
