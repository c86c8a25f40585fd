//! Faults against the real server: one of the store's connections killed
//! in the middle of a statement, and the server gone away under the store
//! (every connection dropped, a restart, a failover). Typed retryable
//! errors, nothing reported stored that was not, never a second execution,
//! and a pool that recovers by itself.

use std::sync::Arc;
use std::time::Duration;

use idem_core::clock::{Clock, ManualClock};
use idem_core::store::RecordState;
use idem_core::store::{AdminStore, ClaimOutcome, Store, StoreError};
use idem_core::{Error, Idem, IdempotencyKey, RecordId, Scope};
use tokio::sync::Mutex;

use super::{
    Counter, KillDialect, LEASE, Out, Outage, OutageDialect, SqlFixture, claim_request, engine,
    policy_builder, request, scope, with_fixture,
};

/// A connection killed while its claim waits on a row lock: a typed,
/// retryable 503, nothing ran. Killed while its completion waits: the caller
/// gets the work's result marked not stored, the record is still in flight
/// (it was not stored), duplicates get 409 (no second run), and after the
/// lease the record is recovered.
pub async fn killed_connection_mid_statement<D: KillDialect>(d: D) {
    let (fx, handle) = d.open_killable().await;
    // The handle (a throwaway server) outlives the fixture's teardown.
    let handle = Arc::new(handle);
    let h = Arc::clone(&handle);
    with_fixture(fx, move |fx| async move {
        let clock = ManualClock::starting_now();
        // No background completions: the killed completion is left to the
        // lease and the recovery, the path this test is about (kept, it
        // could be stored once the lock is gone, and replayed).
        let idem = Idem::new(fx.store().clone())
            .with_clock(clock.clone())
            .with_policy(
                policy_builder(1)
                    .completion_backlog(0)
                    .build()
                    .expect("policy"),
            );
        let (scope, runs) = (scope(), Counter::default());
        let id = RecordId::new(scope.clone(), IdempotencyKey::parse("k").expect("key"));

        // 1. Mid-claim: a released record, row-locked by someone else, so the
        //    claim waits; its connection is killed while it waits.
        let req = claim_request(&id, clock.now());
        assert!(matches!(
            fx.store().claim(&req).await.expect("claim"),
            ClaimOutcome::Claimed(_)
        ));
        fx.store()
            .release(&id, req.token, clock.now())
            .await
            .expect("release");
        let blocker = d.blocker(&fx, &h).await;
        let killer = tokio::spawn(d.killer(&fx, &h, &blocker));
        let lock = d.lock(&fx, blocker, &id).await;
        let err = refused(&idem, &scope, &runs, "killed mid-claim").await;
        killer.await.expect("killer");
        assert!(
            matches!(err, Error::Store(StoreError::Unavailable { .. })),
            "{err:?}"
        );
        assert!(err.is_retryable());
        assert_eq!(err.http_status(), 503);
        assert_eq!(runs.get(), 0, "nothing ran");
        d.unlock(lock).await;

        // 2. Mid-completion: the work locks its own record (from another
        //    connection) before returning, so the completion waits and is
        //    killed. The killer starts looking only once the work runs: the
        //    claim before it is a statement on the table too, and a loaded
        //    machine can be caught running it.
        let blocker = d.blocker(&fx, &h).await;
        let looking = d.killer(&fx, &h, &blocker);
        let (ran_tx, ran) = tokio::sync::oneshot::channel::<()>();
        let killer = tokio::spawn(async move {
            ran.await.expect("the work ran");
            looking.await;
        });
        let (hold_tx, hold) = tokio::sync::oneshot::channel();
        let (r, d2, fx2) = (runs.clone(), d.clone(), Arc::clone(&fx));
        let reply = idem
            .execute(&scope, "k", &request(), move |a| async move {
                r.hit();
                let _ = ran_tx.send(());
                let lock = d2.lock(&fx2, blocker, a.record()).await;
                let _ = hold_tx.send(lock);
                Out::Success("ch_1".into())
            })
            .await
            .expect("the caller gets the work's result");
        killer.await.expect("killer");
        assert!(
            !reply.is_stored(),
            "the completion was killed: not reported stored"
        );
        assert_eq!(reply.into_result(), Ok("ch_1".to_owned()));
        d.unlock(hold.await.expect("lock")).await;
        // The killed connection may still sit in the store's pool and fail
        // the first call that takes it (at most one per connection).
        let mut fetched = fx.store().fetch(&id, clock.now()).await;
        for _ in 0..2 {
            if !matches!(fetched, Err(StoreError::Unavailable { .. })) {
                break;
            }
            fetched = fx.store().fetch(&id, clock.now()).await;
        }
        let rec = fetched.expect("fetch").expect("record");
        assert_eq!(
            rec.state,
            RecordState::InFlight,
            "indeed not stored: left to lease expiry"
        );
        let err = refused(&idem, &scope, &runs, "lease still held").await;
        assert!(matches!(err, Error::InFlight { .. }), "{err:?}");
        assert_eq!(runs.get(), 1, "no second execution while the lease holds");
        clock.advance(LEASE + Duration::from_secs(1));
        let reply = idem
            .execute(&scope, "k", &request(), |a| async move {
                assert!(a.is_recovery());
                Out::Success("ch_1 (reconciled)".into())
            })
            .await
            .expect("recovery");
        assert!(reply.is_stored());
    })
    .await;
    drop(handle);
}

/// Calls `k` with a work that counts its run and expects the call to fail
/// (`why`); the error.
async fn refused<S: AdminStore + Clone>(
    idem: &Idem<S>,
    scope: &Scope,
    runs: &Counter,
    why: &str,
) -> Error {
    let r = runs.clone();
    idem.execute(scope, "k", &request(), move |_| async move {
        r.hit();
        Out::Success("no".into())
    })
    .await
    .expect_err(why)
}

/// For a store with pools of its own: see [`recovers_after_an_outage`].
pub async fn pool_recovers_after_connections_are_dropped<D: OutageDialect>(d: D) {
    recovers_after_an_outage(d, true).await;
}

/// For a store over the caller's sqlx pool: see [`recovers_after_an_outage`].
pub async fn a_sqlx_pool_recovers_after_connections_are_dropped<D: OutageDialect>(d: D) {
    recovers_after_an_outage(d, false).await;
}

/// Calls fail with a typed, retryable 503 while the server is away and
/// never run the work twice; once it is back the pool recovers on its own
/// (at most five failed calls), the records completed before the outage
/// replay, and a key whose first call failed runs once.
pub async fn recovers_after_an_outage<D: OutageDialect>(d: D, own_pool: bool) {
    let (fx, outage) = d.outage(own_pool).await;
    // The outage (a throwaway server) outlives the fixture's teardown.
    let outage = Arc::new(Mutex::new(outage));
    let o = Arc::clone(&outage);
    with_fixture(fx, move |fx| async move {
        let clock = ManualClock::starting_now();
        let idem = engine(fx.store(), &clock);
        let (scope, runs) = (scope(), Counter::default());
        let call = |key: String| {
            let (idem, scope, runs) = (idem.clone(), scope.clone(), runs.clone());
            async move {
                idem.execute(&scope, key, &request(), move |_| async move {
                    runs.hit();
                    Out::Success("ok".into())
                })
                .await
            }
        };
        for i in 0..4 {
            call(format!("before-{i}")).await.expect("healthy");
        }
        o.lock().await.down().await;
        for i in 0..3 {
            let err = call(format!("down-{i}")).await.expect_err("server away");
            assert!(
                matches!(err, Error::Store(StoreError::Unavailable { .. })),
                "{err:?}"
            );
            assert!(err.is_retryable());
        }
        o.lock().await.up().await;
        let mut failures = 0;
        let mut i = 0;
        while call(format!("after-{i}")).await.is_err() {
            failures += 1;
            i += 1;
            assert!(failures <= 5, "the pool did not recover");
        }
        for j in 0..10 {
            call(format!("steady-{j}")).await.expect("recovered");
        }
        assert_eq!(runs.get(), 4 + 1 + 10, "every key ran once, none twice");
        for i in 0..4 {
            let r = call(format!("before-{i}")).await.expect("replay");
            assert!(
                r.is_replay(),
                "completed before the outage, still there after"
            );
        }
        // A key whose first call failed is retried and runs once.
        call("down-0".into()).await.expect("retry after recovery");
        assert_eq!(runs.get(), 16);
    })
    .await;
    drop(outage);
}
