//! A MariaDB primary dies while its replica's replication link is stalled,
//! the replica is promoted, the store follows it: what each replication
//! setup of the README's durability table keeps, counted.
//!
//! Each test owns a throwaway primary and replica ([`support::cluster`]:
//! free loopback ports, directories of their own, GTID replication); the
//! replica reads the primary's binary log through a proxy the test stalls.
//! The application reaches the primary through a second proxy, `front` (a
//! virtual IP or a DNS name), pointed at the replica once it is promoted.
//! Then:
//!
//! * **asynchronous** replication loses exactly what the replica had not
//!   received: every completion acknowledged while the link was stalled is
//!   gone, and its next request runs the work again as a fresh call;
//!   everything acknowledged before is replayed;
//! * **semi-synchronous with a short `rpl_semi_sync_master_timeout`** waits
//!   that long once, then the primary goes on asynchronously without a word
//!   to the client, and loses as much;
//! * **semi-synchronous, `AFTER_SYNC`, a timeout longer than the outage**
//!   loses nothing acknowledged: a claim or a completion issued while the
//!   link is stalled waits on its commit, is never reported stored, and fails
//!   typed (503) when the primary dies; the completion the engine kept is
//!   written on the promoted server in the background, and no answered call
//!   runs its work twice.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::Scope;
use idem_core::clock::ManualClock;
use idem_core::store::RecordState;
use idem_mysql::MySqlStore;
use idem_mysql::sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions, MySqlSslMode};
use idem_test_support::sql::{Counter, scope};
use idem_test_support::work::{
    acknowledged_batch, assert_waiting_calls_never_stored, call, call_held, call_until_answered,
    state,
};
use support::cluster::{Cluster, Mode};
use support::proxy::{Protocol, Proxy};
use tokio::sync::watch;

/// Acknowledged calls per phase.
const CALLS: usize = 12;

type Engine = idem_test_support::work::Engine<MySqlStore>;

/// A store reaching the primary through `front`.
async fn store_via(front: &Proxy, cluster: &Cluster) -> MySqlStore {
    let options: MySqlConnectOptions = cluster.primary.url().parse().expect("url");
    let options = options
        .port(front.addr.port())
        .ssl_mode(MySqlSslMode::Disabled);
    // A short acquire timeout: while the primary is down, a call that needs
    // a new connection fails in one second instead of sqlx's thirty.
    let pool = MySqlPoolOptions::new()
        .max_connections(6)
        .acquire_timeout(Duration::from_secs(1));
    let store = MySqlStore::connect_with(pool, options)
        .await
        .expect("connect through the front proxy");
    store.migrate().await.expect("migrate");
    <support::MySql as idem_test_support::sql::ServerDialect>::batched_if_asked(store)
}

fn engine(store: &MySqlStore, clock: &ManualClock) -> Engine {
    Arc::new(idem_test_support::sql::engine(store, clock))
}

/// SIGKILLs the primary (its replication connection goes with it: the
/// bytes the link held never arrive), points `front` nowhere (open
/// connections are cut, as a moved virtual IP or a DNS change plus the dead
/// server would), and checks a call made then is a typed 503 that ran
/// nothing.
async fn lose_primary(cluster: &mut Cluster, front: &Proxy, engine: &Engine, scope: &Scope) {
    cluster.kill_primary().await;
    cluster.link.set_down(true);
    cluster.link.kill_all();
    front.set_down(true);
    front.kill_all();
    idem_test_support::sql::assert_call_fails_without_server(engine, scope).await;
}

/// Promotes the replica and points `front` at it.
async fn promote(cluster: &Cluster, front: &Proxy) {
    cluster.promote_replica().await;
    front.set_upstream(cluster.replica.addr());
    front.set_down(false);
}

/// Acknowledged calls before the stall (replicated) and during it, then a
/// failover: returns how many of those acknowledged during the stall the
/// promoted replica lost, after checking each lost one runs again and
/// every one acknowledged before is replayed.
async fn acknowledged_then_failover(mode: Mode) -> usize {
    let started = Instant::now();
    let mut cluster = Cluster::start(mode).await;
    let front = Proxy::start(cluster.primary.addr(), Protocol::MySql).await;
    let store = store_via(&front, &cluster).await;
    let clock = ManualClock::starting_now();
    let engine = engine(&store, &clock);
    let (scope, runs) = (scope(), Counter::default());

    // Replicated before the stall: survives the failover.
    let before = acknowledged_batch(&engine, &scope, &runs, CALLS).await;
    cluster.wait_replicated().await;

    // Acknowledged while the replica receives nothing.
    cluster.link.set_stalled(true);
    let stalled = Instant::now();
    let during = acknowledged_batch(&engine, &scope, &runs, CALLS).await;
    assert_eq!(runs.get(), 2 * CALLS);
    if let Mode::SemiSync { timeout, .. } = mode {
        // The silent fallback: one commit waited the timeout, then the
        // primary stopped waiting, and every call was answered "stored".
        assert!(stalled.elapsed() >= timeout, "{:?}", stalled.elapsed());
        assert!(
            !cluster.semi_sync_on().await,
            "the primary fell back to asynchronous"
        );
    }

    lose_primary(&mut cluster, &front, &engine, &scope).await;
    promote(&cluster, &front).await;

    for key in &before {
        let reply = call_until_answered(&engine, &scope, key, &runs, |_| false)
            .await
            .expect("the promoted server answers");
        assert!(reply.is_replay(), "{key}: replicated before the stall");
    }
    assert_eq!(runs.get(), 2 * CALLS, "nothing replicated ran again");
    let mut lost = 0;
    for key in &during {
        if state(&engine, &scope, key).await.is_none() {
            lost += 1;
        }
        let reply = call(&engine, &scope, key, &runs).await.expect("answered");
        assert!(
            !reply.is_replay(),
            "{key}: the documented loss: acknowledged, then executed again"
        );
    }
    assert_eq!(runs.get(), 2 * CALLS + lost, "every lost call ran again");
    eprintln!(
        "{mode:?}: lost {lost} of {CALLS} acknowledged during the stall, \
         0 of {CALLS} acknowledged before it ({:?})",
        started.elapsed()
    );
    lost
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asynchronous_replication_loses_what_the_replica_had_not_received() {
    let lost = acknowledged_then_failover(Mode::Asynchronous).await;
    assert_eq!(lost, CALLS, "the replica received none of them");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semi_sync_with_a_short_timeout_falls_back_and_loses_as_asynchronous() {
    let lost = acknowledged_then_failover(Mode::SemiSync {
        wait_point: "AFTER_SYNC",
        timeout: Duration::from_millis(300),
    })
    .await;
    assert_eq!(lost, CALLS, "acknowledged after the silent fallback");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semi_sync_after_sync_loses_nothing_acknowledged() {
    let started = Instant::now();
    // Longer than the test: the primary never falls back on its own.
    let mut cluster = Cluster::start(Mode::SemiSync {
        wait_point: "AFTER_SYNC",
        timeout: Duration::from_secs(3600),
    })
    .await;
    let front = Proxy::start(cluster.primary.addr(), Protocol::MySql).await;
    let store = store_via(&front, &cluster).await;
    let clock = ManualClock::starting_now();
    let engine = engine(&store, &clock);
    let (scope, runs) = (scope(), Counter::default());

    // Acknowledged: each commit waited for the replica's relay log. No
    // wait for the replica to apply them: the promotion does that.
    let acknowledged = acknowledged_batch(&engine, &scope, &runs, CALLS).await;

    // A call whose claim committed, whose completion will be sent while the
    // link is stalled.
    let (go, gate) = watch::channel(false);
    let held_runs = Counter::default();
    let held = call_held(&engine, &scope, "held", &held_runs, &gate).await;

    // The link stalls: a fresh claim waits on its commit, and so does the
    // held call's completion.
    cluster.link.set_stalled(true);
    let claim_runs = Counter::default();
    let claim = {
        let (engine, scope, runs) = (Arc::clone(&engine), scope.clone(), claim_runs.clone());
        tokio::spawn(async move { call(&engine, &scope, "stalled-claim", &runs).await })
    };
    go.send_replace(true);
    cluster.wait_for_held_commits(2).await;
    assert!(cluster.semi_sync_on().await, "still semi-synchronous");
    assert!(!claim.is_finished() && !held.is_finished(), "both wait");

    // What the waiting calls are told once the primary is gone (before
    // the promotion: a store retry after it could land on the promoted
    // replica): never "stored".
    lose_primary(&mut cluster, &front, &engine, &scope).await;
    assert_waiting_calls_never_stored(claim, &claim_runs, held, &held_runs).await;
    assert_eq!(engine.pending_completions(), 1, "the engine kept it");
    promote(&cluster, &front).await;

    // Nothing acknowledged was lost, and nothing answered runs again.
    for key in &acknowledged {
        let reply = call_until_answered(&engine, &scope, key, &runs, |_| false)
            .await
            .expect("the promoted server answers");
        assert!(reply.is_replay(), "{key}: acknowledged, kept");
    }
    assert_eq!(runs.get(), CALLS, "nothing acknowledged ran twice");
    // The claim that was never acknowledged is not there.
    assert_eq!(state(&engine, &scope, "stalled-claim").await, None);
    // The held call's claim was acknowledged, its completion was not: the
    // engine kept it and writes it on the promoted server, under the
    // attempt's token; the retry replays it.
    assert_eq!(
        engine.drain_completions(Duration::from_secs(20)).await,
        0,
        "the kept completion was written"
    );
    assert_eq!(
        state(&engine, &scope, "held").await,
        Some((RecordState::Completed, 1))
    );
    let again = call(&engine, &scope, "held", &held_runs)
        .await
        .expect("replayed");
    assert!(again.is_replay(), "{again:?}");
    assert_eq!(held_runs.get(), 1, "the answered call did not run again");
    eprintln!(
        "semi-synchronous AFTER_SYNC: lost 0 of {} acknowledged ({:?})",
        CALLS + 1,
        started.elapsed()
    );
}
