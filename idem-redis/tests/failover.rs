//! Issue 13: a primary dies while its replica lags, the replica is promoted.
//!
//! One Redis Cluster with a replica per primary (started and SIGKILLed by the
//! test, loopback ports 17200-17299), two stores on it: `plain` (no `WAIT`)
//! and `acked` ([`RedisStore::with_replica_ack`], one replica, 200 ms). One
//! shard's replica is made to lag (`DEBUG SLEEP` on it, its replication link
//! killed on the primary), both stores write during the lag, the primary is
//! SIGKILLed and the replica taken over (`CLUSTER FAILOVER TAKEOVER`). Then:
//!
//! * `plain` lost what it told its clients was done (the documented loss):
//!   a completed record is gone and its next request runs the work again as
//!   attempt 1; another is back in flight;
//! * `acked` lost nothing it acknowledged: writes made during the lag were
//!   refused (503 before the work, or the outcome returned with
//!   `is_stored() == false`), and what it confirmed before is still there.
//!
//! Also the option on standalone Redis (a primary and its replica), with
//! bodies in the body key and kept inside their record: every acknowledged
//! write, then each of them refused once the replica is gone.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::clock::ManualClock;
use idem_core::store::RecordState;
use idem_core::store::StoreError;
use idem_core::{Error, Idem, IdempotencyKey, Outcome, Policy, Scope};
use idem_redis::{NotAcknowledged, RedisStore};
use idem_test_support::work::{Counter, Out, call, call_held, request, state};
use support::replicated::{ReplicatedCluster, ReplicatedPair, Shard};
use tokio::sync::watch;

const LAG_SECS: u32 = 4;

fn policy() -> Policy {
    idem_test_support::work::policy(Duration::from_secs(86_400), 2, Duration::from_millis(10))
}

type Engine = idem_test_support::work::Engine<RedisStore>;

async fn engine(cluster: &ReplicatedCluster, clock: &ManualClock, ack: bool) -> Engine {
    let store = RedisStore::connect_cluster(cluster.urls())
        .await
        .expect("connect to the cluster")
        .with_prefix("idem-failover:")
        .expect("prefix");
    let store = if ack {
        store.with_replica_ack(1, Duration::from_millis(200))
    } else {
        store
    };
    Arc::new(
        Idem::new(store)
            .with_clock(clock.clone())
            .with_policy(policy()),
    )
}

/// A fresh key whose record lives on `shard`.
fn key_on(cluster: &ReplicatedCluster, engine: &Engine, scope: &Scope, shard: &Shard) -> String {
    loop {
        let key = IdempotencyKey::random();
        let id = idem_core::RecordId::new(scope.clone(), key.clone());
        if shard.serves(cluster.slot(&engine.store().record_key(&id))) {
            return key.as_str().to_owned();
        }
    }
}

fn is_unacknowledged(e: &Error) -> bool {
    let Error::Store(StoreError::Unavailable { source, .. }) = e else {
        return false;
    };
    source.downcast_ref::<NotAcknowledged>().is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_replica_promoted_loses_only_what_was_not_acknowledged() {
    let cluster = ReplicatedCluster::start();
    let clock = ManualClock::new(idem_core::clock::Timestamp::from_unix_millis(
        1_800_000_000_000,
    ));
    let plain = engine(&cluster, &clock, false).await;
    let acked = engine(&cluster, &clock, true).await;
    let scope = Scope::new(
        format!("tenant-{}", IdempotencyKey::random()),
        "POST /charges",
    )
    .expect("scope");
    let shard = cluster.shards().into_iter().next().expect("a shard");
    let mut keys = HashMap::new();
    for (name, engine) in [
        ("a0", &plain),
        ("a", &acked),
        ("x0", &plain),
        ("x", &acked),
        ("y0", &plain),
        ("y", &acked),
    ] {
        keys.insert(name, key_on(&cluster, engine, &scope, &shard));
    }
    let runs: HashMap<&str, Counter> = keys.keys().map(|&k| (k, Counter::default())).collect();

    // Before the lag: a0 (plain) and a (acked) complete; x0 (plain) and x
    // (acked) are claimed and their work is held. a's and x's
    // acknowledgements cover every earlier write of the primary (one ordered
    // replication stream), so the replica holds all four claims.
    let a0 = call(&plain, &scope, &keys["a0"], &runs["a0"])
        .await
        .expect("a0");
    let a = call(&acked, &scope, &keys["a"], &runs["a"])
        .await
        .expect("a");
    assert!(a0.is_stored() && a.is_stored());
    let (open, go) = watch::channel(false);
    let x0 = call_held(&plain, &scope, &keys["x0"], &runs["x0"], &go).await;
    let x = call_held(&acked, &scope, &keys["x"], &runs["x"], &go).await;

    // The lag: from here on the primary's writes reach no replica.
    let (sleeper, wakes) = cluster.lag(&shard, LAG_SECS);
    open.send_replace(true);
    let x0 = x0.await.expect("join").expect("x0 completes");
    let x = x.await.expect("join").expect("x returns its outcome");
    let y0 = call(&plain, &scope, &keys["y0"], &runs["y0"])
        .await
        .expect("y0");
    let y = call(&acked, &scope, &keys["y"], &runs["y"]).await;

    // What the callers were told.
    assert!(x0.is_stored(), "plain: completion reported stored");
    assert!(y0.is_stored(), "plain: fresh record reported stored");
    assert!(
        !x.is_stored(),
        "acked: completion not confirmed, not stored"
    );
    assert_eq!(
        x.outcome(),
        &Outcome::Success(format!("charge for {}", keys["x"]))
    );
    let y = y.expect_err("acked: the claim is not confirmed");
    assert!(is_unacknowledged(&y), "{y:?}");
    assert_eq!(y.http_status(), 503);
    assert_eq!(
        runs["y"].get(),
        0,
        "the work never ran on an unconfirmed claim"
    );

    // The primary dies before the replica wakes up and could resync.
    assert!(
        Instant::now() + Duration::from_millis(300) < wakes,
        "the lag window was too short on this machine: the test proves nothing"
    );
    cluster.kill(shard.primary);
    sleeper.join().expect("the sleeper thread");
    cluster.take_over(&shard);
    let started = Instant::now();
    while plain
        .admin()
        .inspect(&scope, keys["a"].as_str(), true)
        .await
        .is_err()
        || acked
            .admin()
            .inspect(&scope, keys["a"].as_str(), true)
            .await
            .is_err()
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no route to the new primary"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Acknowledged before the lag: still there (and, since a's
    // acknowledgement covered it, a0 too).
    assert_eq!(
        state(&acked, &scope, &keys["a"]).await,
        Some((RecordState::Completed, 1))
    );
    assert_eq!(
        state(&plain, &scope, &keys["a0"]).await,
        Some((RecordState::Completed, 1))
    );
    let replay = call(&acked, &scope, &keys["a"], &runs["a"])
        .await
        .expect("replay");
    assert!(replay.is_replay());
    assert_eq!(runs["a"].get(), 1);

    // plain, the documented loss: y0 was completed and is gone, so the next
    // request runs the work again as attempt 1; x0 was completed and is back
    // in flight (its claim replicated, its completion did not).
    assert_eq!(state(&plain, &scope, &keys["y0"]).await, None);
    let again = call(&plain, &scope, &keys["y0"], &runs["y0"])
        .await
        .expect("y0 again");
    assert!(!again.is_replay());
    assert_eq!(again.attempt(), 1);
    assert_eq!(runs["y0"].get(), 2, "the work ran twice for one record");
    assert_eq!(
        state(&plain, &scope, &keys["x0"]).await,
        Some((RecordState::InFlight, 1)),
        "the completion the client was told about is gone"
    );

    // acked: nothing acknowledged was lost. x's claim was confirmed and is
    // there; its completion was not, and the caller was told so
    // (`is_stored() == false`): the record waits for its lease and a
    // recovery. y was refused with 503 and is absent, consistently.
    assert_eq!(
        state(&acked, &scope, &keys["x"]).await,
        Some((RecordState::InFlight, 1))
    );
    assert_eq!(state(&acked, &scope, &keys["y"]).await, None);
    // The new primary has no replica: the acked store now refuses to write.
    // (While the cluster client still reconnects, the call may fail on the
    // connection first: that is retried, never counted as the refusal.)
    let started = Instant::now();
    let alone = loop {
        let alone = call(&acked, &scope, &keys["y"], &runs["y"]).await;
        let reconnecting = matches!(&alone, Err(Error::Store(StoreError::Unavailable { .. })))
            && !alone.as_ref().is_err_and(is_unacknowledged);
        if !reconnecting || started.elapsed() > Duration::from_secs(60) {
            break alone;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(alone.as_ref().is_err_and(is_unacknowledged), "{alone:?}");
    assert_eq!(runs["y"].get(), 0);
    // Plain and acked stores share the key prefix; the cluster goes away
    // with its keys when `cluster` drops.
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_writes_are_acknowledged_only_while_a_replica_confirms() {
    acknowledged_only_while_a_replica_confirms(0).await;
}

/// The same with bodies kept inside their record: the claim is one `SET`
/// and its `WAIT`, the completion one script and its `WAIT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_writes_with_inline_bodies_are_acknowledged_only_while_a_replica_confirms() {
    acknowledged_only_while_a_replica_confirms(1024).await;
}

async fn acknowledged_only_while_a_replica_confirms(inline_limit: usize) {
    let pair = ReplicatedPair::start();
    let clock = ManualClock::new(idem_core::clock::Timestamp::from_unix_millis(
        1_800_000_000_000,
    ));
    // A fresh server: the first call of each script also takes the NOSCRIPT
    // reload path of the pipeline.
    // Two engines on one server: the first writes (which also take the
    // NOSCRIPT reload path on a fresh server, and the first `WAIT` on a
    // replica that has just synchronised) get a generous acknowledgement
    // timeout; the refusals below a short one. The connections' response
    // timeout (500 ms by default) is raised above both, or it would answer
    // first ("timed out") on a loaded machine.
    let engine = |ack: Duration| {
        let (url, clock) = (pair.url(), clock.clone());
        async move {
            let manager =
                support::manager_with_response_timeout(&url, Duration::from_secs(10)).await;
            let store = RedisStore::new(manager)
                .with_prefix("idem-ack:")
                .expect("prefix")
                .with_replica_ack(1, ack)
                .with_inline_body_limit(inline_limit);
            let store = support::batched_if_asked(store);
            assert_eq!(store.replica_ack().map(|a| a.replicas()), Some(1));
            let idem: Engine = Arc::new(Idem::new(store).with_clock(clock).with_policy(policy()));
            idem
        }
    };
    let warm = engine(Duration::from_millis(2000)).await;
    let idem = engine(Duration::from_millis(300)).await;
    let scope = Scope::new("tenant", "POST /charges").expect("scope");

    // With the replica: claim, saved resource id, extension and completion are
    // confirmed; the replay needs nothing.
    let runs = Counter::default();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (r, s) = (runs.clone(), Arc::clone(&seen));
    let done = warm
        .execute(&scope, "k1", &request(), |attempt| async move {
            r.hit();
            let saved = attempt
                .save_resource_id("ch_1")
                .await
                .map_err(|e| e.http_status());
            let extend = attempt
                .extend_lease(Duration::from_secs(60))
                .await
                .map_err(|e| e.http_status());
            s.lock().expect("seen").extend([saved, extend]);
            Out::Success("ch_1".to_owned())
        })
        .await
        .expect("k1");
    assert!(done.is_stored() && !done.is_replay());
    assert_eq!(*seen.lock().expect("seen"), vec![Ok(()), Ok(())]);
    let replay = call(&idem, &scope, "k1", &runs).await.expect("replay");
    assert!(replay.is_replay());
    assert_eq!(runs.get(), 1);

    // The operator's release is confirmed by the replica like any write.
    let operator_id = idem_core::RecordId::new(
        scope.clone(),
        idem_core::IdempotencyKey::parse("op-1").expect("key"),
    );
    let now = idem_core::clock::Clock::now(&clock);
    let held = idem_core::store::ClaimRequest::new(
        &operator_id,
        idem_core::store::Fingerprint::from_slice(&[1; 32]).expect("fingerprint"),
        idem_core::store::Token::random(),
        now,
        now.plus(Duration::from_secs(60)),
        now.plus(Duration::from_secs(3600)),
    );
    idem_core::store::Store::claim(warm.store(), &held)
        .await
        .expect("claim");
    assert!(
        idem_core::store::AdminStore::release_in_flight(warm.store(), &operator_id, None, now)
            .await
            .expect("an acknowledged operator release")
    );

    // The replica dies during the work: the saved resource id and the completion
    // are refused (the outcome still reaches the caller, not stored).
    let (r, s, p) = (runs.clone(), Arc::clone(&seen), &pair);
    s.lock().expect("seen").clear();
    let unconfirmed = idem
        .execute(&scope, "k2", &request(), |attempt| async move {
            r.hit();
            p.kill_replica();
            let saved = attempt
                .save_resource_id("ch_2")
                .await
                .map_err(|e| e.http_status());
            s.lock().expect("seen").push(saved);
            Out::Success("ch_2".to_owned())
        })
        .await
        .expect("k2 returns its outcome");
    assert!(!unconfirmed.is_stored());
    assert_eq!(unconfirmed.outcome(), &Outcome::Success("ch_2".to_owned()));
    assert_eq!(*seen.lock().expect("seen"), vec![Err(503)]);
    assert_eq!(runs.get(), 2);

    // No replica: a new claim is refused with 503 before the work, and given
    // back (released) so the next retry need not wait for the lease.
    let refused = call(&idem, &scope, "k3", &runs).await.expect_err("503");
    assert!(is_unacknowledged(&refused), "{refused:?}");
    assert_eq!(runs.get(), 2, "the work did not run");
    assert_eq!(
        state(&idem, &scope, "k3").await,
        Some((RecordState::Released, 1))
    );
    // Reads and replays still work.
    let replay = call(&idem, &scope, "k1", &runs).await.expect("replay");
    assert!(replay.is_replay());

    // No replica: the operator's delete is refused the same way (it is on
    // the primary, not confirmed).
    let k1 = idem_core::RecordId::new(
        scope.clone(),
        idem_core::IdempotencyKey::parse("k1").expect("key"),
    );
    let refused = idem_core::store::AdminStore::delete_completed(
        idem.store(),
        &k1,
        idem_core::clock::Clock::now(&clock),
    )
    .await;
    let Err(idem_core::store::StoreError::Unavailable { source, .. }) = &refused else {
        panic!("{refused:?}");
    };
    assert!(
        source.downcast_ref::<NotAcknowledged>().is_some(),
        "{source}"
    );
}
