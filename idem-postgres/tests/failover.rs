//! Issue 23: a primary dies while its standby's replication link is stalled,
//! the standby is promoted, the store follows it.
//!
//! Each test owns a throwaway primary and streaming standby
//! ([`support::cluster`]: `initdb`, `pg_basebackup`, free loopback ports);
//! the standby streams through a proxy the test stalls. The application
//! reaches the primary through a second proxy, `front` (a virtual IP or a
//! DNS name), which is pointed at the standby once it is promoted. Then:
//!
//! * **asynchronous** replication loses exactly what the standby had not
//!   received: every completion acknowledged while the link was stalled is
//!   gone, and its next request runs the work again as a fresh call;
//!   everything acknowledged before is replayed;
//! * **synchronous** replication (`on`, and `remote_apply` with a quorum
//!   `ANY 1 (…)`) loses nothing acknowledged: a claim or a completion
//!   issued while the link is stalled waits on the commit, is never
//!   reported stored, and fails typed (503) when the primary dies, or when
//!   the store's [call timeout](PgStore::with_call_timeout) passes; a store
//!   that [requires](PgStore::require_synchronous_replication) it refuses the
//!   promoted server, which has no synchronous standby of its own;
//! * a store that does not require it keeps a completion whose COMMIT was
//!   waiting for the standby when the primary died (the caller is told it
//!   is pending, not stored) and stores it on the promoted server in the
//!   background: the retry replays it, and the work ran once;
//! * during the switch every error a caller sees is a typed 503 with a
//!   `Retry-After`, and the work never ran for a call that failed before it;
//! * a store opened on a standby fails at start with [`Error::Standby`].

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::clock::ManualClock;
use idem_core::store::RecordState;
use idem_core::store::StoreError;
use idem_core::{Error as IdemError, Idem, Scope};
use idem_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use idem_postgres::sqlx::{self, PgPool};
use idem_postgres::{Error, PgIdemExt, PgStore, TxFuture};
use idem_test_support::sql::{Counter, Out, policy, request, scope};
use idem_test_support::work::{
    acknowledged_batch, assert_switch_error, assert_waiting_calls_never_stored, call, call_held,
    call_until_answered, state,
};
use support::cluster::{Cluster, Mode};
use support::proxy::{Protocol, Proxy};
use support::{is_not_synchronous, is_timeout};
use tokio::sync::watch;

/// Acknowledged calls per phase.
const CALLS: usize = 12;

type Engine = idem_test_support::work::Engine<PgStore>;

fn pool_options() -> PgPoolOptions {
    // A short acquire timeout: while the primary is down, a call that needs
    // a new connection fails in one second instead of sqlx's thirty.
    PgPoolOptions::new()
        .max_connections(6)
        .acquire_timeout(Duration::from_secs(1))
}

/// A store reaching the primary through `front`.
async fn store_via(front: &Proxy, cluster: &Cluster) -> PgStore {
    let options: PgConnectOptions = cluster.primary.options().port(front.addr.port());
    let store = PgStore::connect_with(pool_options(), options)
        .await
        .expect("connect through the front proxy");
    <support::Pg as idem_test_support::sql::ServerDialect>::batched_if_asked(store)
}

fn engine(store: &PgStore, clock: &ManualClock) -> Engine {
    Arc::new(idem_test_support::sql::engine(store, clock))
}

/// Kills the primary, promotes the standby, points `front` at it (open
/// connections are cut, as a moved virtual IP or a DNS change plus the dead
/// server would), and checks a call made in between is a typed 503 that ran
/// nothing.
async fn fail_over(cluster: &Cluster, front: &Proxy, engine: &Engine, scope: &Scope) {
    kill_primary_behind(cluster, front).await;
    idem_test_support::sql::assert_call_fails_without_server(engine, scope).await;
    promote_behind(cluster, front).await;
}

/// The first half of [`fail_over`]: the primary SIGKILLed, `front`'s open
/// connections cut and new ones refused (no server behind the name yet).
async fn kill_primary_behind(cluster: &Cluster, front: &Proxy) {
    cluster.kill_primary().await;
    front.kill_all();
    front.set_down(true);
}

/// The second half of [`fail_over`]: the standby promoted, `front` pointed
/// at it.
async fn promote_behind(cluster: &Cluster, front: &Proxy) {
    cluster.promote_standby().await;
    front.set_upstream(cluster.standby.addr());
    front.set_down(false);
}

/// Waits (bounded) until a client backend on `admin`'s server waits for
/// synchronous replication; returns how many do.
async fn wait_for_syncrep_waiters(admin: &PgPool, at_least: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'",
        )
        .fetch_one(admin)
        .await
        .expect("pg_stat_activity");
        if n >= at_least {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no commit ever waited for the standby"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asynchronous_replication_loses_what_the_standby_had_not_received() {
    let started = Instant::now();
    let cluster = Cluster::start(Mode::Asynchronous).await;

    // A store opened on the standby fails at start, typed, not at the
    // first claim.
    let on_standby = PgStore::connect(&cluster.standby.url()).await;
    assert!(matches!(on_standby, Err(Error::Standby)), "{on_standby:?}");
    // Over a pool: `migrate` refuses it, and so does a first call (a 503,
    // before any write, the work not run).
    let over_pool = PgStore::new(cluster.standby.pool().await);
    let migrated = over_pool.migrate().await;
    assert!(matches!(migrated, Err(Error::Standby)), "{migrated:?}");
    let standby_runs = Counter::default();
    let refused = call(
        &engine(&over_pool, &ManualClock::starting_now()),
        &scope(),
        "on-the-standby",
        &standby_runs,
    )
    .await
    .expect_err("a standby takes no claim");
    assert_switch_error(&refused);
    let IdemError::Store(StoreError::Unavailable { source, .. }) = &refused else {
        unreachable!("checked above");
    };
    assert!(
        matches!(source.downcast_ref::<Error>(), Some(Error::Standby)),
        "{refused:?}"
    );
    assert_eq!(standby_runs.get(), 0);
    over_pool.pool().close().await;

    let front = Proxy::start(cluster.primary.addr(), Protocol::Postgres).await;
    let store = store_via(&front, &cluster).await;
    let found = store.migrate().await.expect("migrate");
    assert!(!found.is_synchronous() && !found.in_recovery, "{found:?}");
    let refused = store.clone().require_synchronous_replication().await;
    assert!(
        matches!(refused, Err(Error::NotSynchronous { .. })),
        "{refused:?}"
    );
    let clock = ManualClock::starting_now();
    let engine = engine(&store, &clock);
    let (scope, runs) = (scope(), Counter::default());

    // Replicated before the stall: survives the failover.
    let before = acknowledged_batch(&engine, &scope, &runs, CALLS).await;
    cluster.wait_streaming(false).await;

    // Acknowledged while the standby receives nothing: lost.
    cluster.link.set_stalled(true);
    let during = acknowledged_batch(&engine, &scope, &runs, CALLS).await;
    assert_eq!(runs.get(), 2 * CALLS);

    fail_over(&cluster, &front, &engine, &scope).await;

    for key in &before {
        let reply = call_until_answered(&engine, &scope, key, &runs, is_not_synchronous)
            .await
            .expect("replayed");
        assert!(reply.is_replay(), "{key}: replicated before the stall");
    }
    assert_eq!(runs.get(), 2 * CALLS, "nothing replicated ran again");
    for key in &during {
        assert_eq!(state(&engine, &scope, key).await, None, "{key}: lost");
        let reply = call(&engine, &scope, key, &runs).await.expect("runs again");
        assert!(
            !reply.is_replay(),
            "{key}: the documented loss: acknowledged, then executed again"
        );
    }
    assert_eq!(runs.get(), 3 * CALLS, "every lost call ran a second time");
    eprintln!("asynchronous failover test: {:?}", started.elapsed());
}

async fn synchronous_replication_loses_nothing_acknowledged(mode: Mode) {
    let started = Instant::now();
    let cluster = Cluster::start(mode).await;
    let front = Proxy::start(cluster.primary.addr(), Protocol::Postgres).await;
    let store = store_via(&front, &cluster)
        .await
        .require_synchronous_replication()
        .await
        .expect("commits wait for the standby: the requirement is met");
    let found = store.migrate().await.expect("migrate");
    assert!(found.is_synchronous() && !found.in_recovery, "{found:?}");
    let clock = ManualClock::starting_now();
    let engine = engine(&store, &clock);
    let (scope, runs) = (scope(), Counter::default());

    // Acknowledged: each commit waited for the standby.
    let acknowledged = acknowledged_batch(&engine, &scope, &runs, CALLS).await;
    sqlx::query("CREATE TABLE orders (note text NOT NULL)")
        .execute(store.pool())
        .await
        .expect("create orders");

    // A call whose claim committed, whose completion will be sent while the
    // link is stalled.
    let (go, gate) = watch::channel(false);
    let held_runs = Counter::default();
    let held = call_held(&engine, &scope, "held", &held_runs, &gate).await;

    // The link stalls. A store with a call timeout answers a claim 503 once
    // the bound passes; its commit still waits on the primary.
    cluster.link.set_stalled(true);
    let bounded = Arc::new(
        Idem::new(store.clone().with_call_timeout(Duration::from_millis(300)))
            .with_clock(clock.clone())
            .with_policy(policy(1)),
    );
    let timed_out_runs = Counter::default();
    let timed_out = call(&bounded, &scope, "timed-out", &timed_out_runs)
        .await
        .expect_err("the claim's commit cannot return: no standby confirms it");
    assert_switch_error(&timed_out);
    assert!(is_timeout(&timed_out), "{timed_out:?}");
    assert_eq!(timed_out_runs.get(), 0, "no work without a confirmed claim");

    // In the transactional mode the bound applies to the COMMIT (not the
    // work): the caller gets the 503, and the record and the work's row
    // wait together.
    let tx_runs = Counter::default();
    let in_tx = {
        let runs = tx_runs.clone();
        bounded
            .execute_in_tx(
                &scope,
                "tx-timed-out",
                &request(),
                move |_attempt, conn| -> TxFuture<'_, Out> {
                    Box::pin(async move {
                        runs.hit();
                        sqlx::query("INSERT INTO orders (note) VALUES ('tx-timed-out')")
                            .execute(&mut *conn)
                            .await
                            .expect("insert the order");
                        Out::Success("order".into())
                    })
                },
            )
            .await
            .expect_err("the commit cannot return")
    };
    assert!(is_timeout(&in_tx), "{in_tx:?}");
    assert_eq!(tx_runs.get(), 1);

    // Without a bound, a fresh claim waits on its commit, and so does the
    // held call's completion.
    let claim_runs = Counter::default();
    let claim = {
        let (engine, scope, runs) = (Arc::clone(&engine), scope.clone(), claim_runs.clone());
        tokio::spawn(async move { call(&engine, &scope, "stalled-claim", &runs).await })
    };
    go.send_replace(true);
    let admin = cluster.primary.pool().await;
    wait_for_syncrep_waiters(&admin, 4).await;
    admin.close().await;
    assert!(!claim.is_finished() && !held.is_finished(), "both wait");

    fail_over(&cluster, &front, &engine, &scope).await;

    // What the waiting calls were told: never "stored".
    assert_waiting_calls_never_stored(claim, &claim_runs, held, &held_runs).await;

    // The store that requires synchronous replication refuses the promoted
    // server (no synchronous standby of its own), typed, and runs nothing.
    let refused_runs = Counter::default();
    let refused = call_until_answered(&engine, &scope, "after", &refused_runs, is_not_synchronous)
        .await
        .expect_err("no synchronous standby: refused");
    assert!(is_not_synchronous(&refused), "{refused:?}");
    assert_eq!(refused.http_status(), 503);
    assert!(refused.retry_after().is_some());
    let again = call(&engine, &scope, "after", &refused_runs).await;
    assert!(
        again.as_ref().is_err_and(is_not_synchronous),
        "refused until a check passes: {again:?}"
    );
    let refused_tx = engine
        .execute_in_tx(
            &scope,
            "after-tx",
            &request(),
            |_attempt, _conn| -> TxFuture<'_, Out> {
                Box::pin(async { panic!("the transactional work must not run") })
            },
        )
        .await
        .expect_err("the transactional mode is refused too");
    assert!(is_not_synchronous(&refused_tx), "{refused_tx:?}");
    assert_eq!(refused_runs.get(), 0);

    // Read through a store that does not require it: nothing acknowledged
    // was lost.
    let plain = PgStore::connect(&cluster.standby.url())
        .await
        .expect("the promoted standby accepts a store")
        .with_schema_name(store.schema_name())
        .expect("schema");
    let promoted = self::engine(&plain, &clock);
    for key in &acknowledged {
        let reply = call(&promoted, &scope, key, &runs).await.expect("replayed");
        assert!(reply.is_replay(), "{key}: acknowledged, kept");
    }
    assert_eq!(runs.get(), CALLS, "nothing acknowledged ran twice");
    // The claim that was never acknowledged is not there; the held call's
    // claim is (it committed), its unacknowledged completion is not: the
    // record is in flight and recovered after its lease.
    assert_eq!(state(&promoted, &scope, "stalled-claim").await, None);
    assert_eq!(state(&promoted, &scope, "timed-out").await, None);
    assert_eq!(state(&promoted, &scope, "tx-timed-out").await, None);
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(plain.pool())
        .await
        .expect("count orders");
    assert_eq!(orders, 0, "the work's row went with its record");
    assert_eq!(
        state(&promoted, &scope, "held").await,
        Some((RecordState::InFlight, 1))
    );
    eprintln!(
        "synchronous failover test ({mode:?}): {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_replication_on_loses_nothing_acknowledged() {
    synchronous_replication_loses_nothing_acknowledged(Mode::Synchronous {
        names: "standby1",
        level: "on",
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_remote_apply_loses_nothing_acknowledged() {
    synchronous_replication_loses_nothing_acknowledged(Mode::Synchronous {
        names: "ANY 1 (standby1)",
        level: "remote_apply",
    })
    .await;
}

/// Synchronous replication, a store that does not require it (the promoted
/// server has no standby of its own): a completion whose COMMIT was waiting
/// for the standby when the primary died is not lost with it. The caller is
/// told the outcome is pending, not stored; the engine keeps the completion
/// and, once `front` reaches the promoted server, stores it there under the
/// attempt's fencing token (the claim had committed on both). The retry then
/// replays the first outcome: the work ran once.
///
/// The background writes pause on the runtime's timer, not the engine's
/// clock, which only ends them at the lease's end: the clock stands still
/// here, the lease never ends, and the test waits (bounded) on the promoted
/// server's record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_cut_off_by_the_failover_is_stored_on_the_promoted_server() {
    let started = Instant::now();
    let cluster = Cluster::start(Mode::Synchronous {
        names: "standby1",
        level: "on",
    })
    .await;
    let front = Proxy::start(cluster.primary.addr(), Protocol::Postgres).await;
    let store = store_via(&front, &cluster).await;
    let found = store.migrate().await.expect("migrate");
    assert!(found.is_synchronous() && !found.in_recovery, "{found:?}");
    let clock = ManualClock::starting_now();
    let engine = engine(&store, &clock);
    let (scope, runs) = (scope(), Counter::default());

    // The claim commits (the standby confirmed it) and the work runs; the
    // link stalls before the work answers, so the completion's COMMIT waits
    // for the standby.
    let (go, gate) = watch::channel(false);
    let held = call_held(&engine, &scope, "order", &runs, &gate).await;
    cluster.link.set_stalled(true);
    go.send_replace(true);
    let admin = cluster.primary.pool().await;
    wait_for_syncrep_waiters(&admin, 1).await;
    admin.close().await;
    assert!(!held.is_finished(), "the completion waits for the standby");

    // The primary dies with the COMMIT unconfirmed: the caller gets the
    // work's outcome, pending, and the engine keeps the completion.
    kill_primary_behind(&cluster, &front).await;
    let first = held.await.expect("join").expect("the work's outcome");
    assert!(first.is_pending() && !first.is_stored(), "{first:?}");
    assert!(!first.is_replay());
    assert_eq!(engine.pending_completions(), 1, "kept in the background");
    let answered = first.outcome().clone();
    assert_eq!(answered, Out::Success("charge for order".to_owned()));

    // The standby is promoted and `front` follows it: the background write
    // lands there. Read on the promoted server itself, not through `front`.
    promote_behind(&cluster, &front).await;
    let promoted_at = Instant::now();
    let direct = PgStore::connect(&cluster.standby.url())
        .await
        .expect("the promoted standby accepts a store")
        .with_schema_name(store.schema_name())
        .expect("schema");
    let promoted = self::engine(&direct, &clock);
    let deadline = Instant::now() + Duration::from_secs(30);
    let stored_after = loop {
        if state(&promoted, &scope, "order").await == Some((RecordState::Completed, 1)) {
            break promoted_at.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "the kept completion never reached the promoted server: {:?}",
            state(&promoted, &scope, "order").await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        engine.drain_completions(Duration::from_secs(10)).await,
        0,
        "nothing left in the background"
    );

    // The retry replays what the caller was first answered, marked
    // replayed, byte for byte; the work ran once.
    let again = call(&engine, &scope, "order", &runs)
        .await
        .expect("replayed");
    assert!(again.is_replay() && again.is_stored(), "{again:?}");
    assert_eq!(again.attempt(), 1);
    assert_eq!(again.outcome(), &answered, "the same body, byte for byte");
    assert_eq!(runs.get(), 1, "the work ran exactly once");
    direct.close().await;
    eprintln!(
        "completion stored {stored_after:?} after the promotion; test: {:?}",
        started.elapsed()
    );
}
