//! In-flight duplicates, leases, takeover, fencing, failures.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::clock::ManualClock;
use crate::store::RecordState;
use crate::store::Store;
use crate::{Error, Idem, InFlightMode, Outcome, Scope, TakeoverReason};

use super::support::{
    Counter, Decline, LEASE, Out, charge, charge_request, counted_charge, crash, engine, inspect,
    policy, reconcile, setup, start_blocked, try_charge,
};

/// An engine on `store` in wait mode: a duplicate waits up to `timeout`
/// for the first attempt's outcome.
fn waiting_engine<S: Store>(
    store: &Arc<S>,
    clock: &ManualClock,
    timeout: Duration,
) -> Idem<Arc<S>> {
    engine(store, clock).with_policy(policy(InFlightMode::Wait {
        timeout,
        poll: Duration::from_millis(5),
    }))
}

/// While the first attempt runs, a duplicate gets 409 with a `Retry-After`
/// equal to the lease's remaining time (at least 1 s), without running.
pub async fn in_flight_duplicate_is_rejected_with_retry_after<S: Store>(store: Arc<S>) {
    let (clock, idem, scope, key) = setup(&store, "POST /charges");
    let runs = Counter::default();
    let (first, started, finish) = start_blocked(&idem, &scope, &key, 100, &Counter::default());
    started.await.expect("first started");
    let dup = || counted_charge(&idem, &scope, &key, 100, "ch_dup", &runs);
    let err = dup().await.expect_err("in flight");
    assert!(matches!(err, Error::InFlight { .. }), "{err:?}");
    assert_eq!(err.http_status(), 409);
    assert_eq!(err.retry_after(), Some(LEASE));
    clock.advance(Duration::from_millis(59_500));
    let err = dup().await.expect_err("in flight");
    assert_eq!(
        err.retry_after(),
        Some(Duration::from_secs(1)),
        "at least 1 s"
    );
    assert_eq!(runs.get(), 0);
    finish.send(charge("ch_1")).expect("finish");
    first.await.expect("join").expect("first");
    let reply = dup().await.expect("replay");
    assert!(reply.is_replay());
    assert_eq!(reply.into_result().expect("ok").id, "ch_1");
    assert_eq!(runs.get(), 0);
}

/// In wait mode a duplicate waits for the first attempt and then replays its
/// outcome instead of getting 409.
pub async fn in_flight_wait_mode_replays_when_first_finishes<S: Store>(store: Arc<S>) {
    let (clock, idem, scope, key) = setup(&store, "POST /charges");
    let waiting = waiting_engine(&store, &clock, Duration::from_secs(10));
    let (first, started, finish) = start_blocked(&idem, &scope, &key, 100, &Counter::default());
    started.await.expect("first started");
    let dup = {
        let (scope, key) = (scope.clone(), key.clone());
        tokio::spawn(async move { try_charge(&waiting, &scope, &key, 100, "ch_dup").await })
    };
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert!(
        !dup.is_finished(),
        "the duplicate must wait while the first runs"
    );
    finish.send(charge("ch_1")).expect("finish");
    first.await.expect("join").expect("first");
    let reply = dup.await.expect("join").expect("waited replay");
    assert!(reply.is_replay());
    assert_eq!(reply.into_result().expect("ok").id, "ch_1");
}

/// In wait mode a duplicate that outwaits its timeout gets 409 with
/// `Retry-After`.
pub async fn in_flight_wait_mode_times_out<S: Store>(store: Arc<S>) {
    let (clock, idem, scope, key) = setup(&store, "POST /charges");
    let waiting = waiting_engine(&store, &clock, Duration::from_millis(40));
    let (first, started, finish) = start_blocked(&idem, &scope, &key, 100, &Counter::default());
    started.await.expect("first started");
    let err = try_charge(&waiting, &scope, &key, 100, "ch_dup")
        .await
        .expect_err("timed out");
    assert!(matches!(err, Error::InFlight { .. }), "{err:?}");
    assert!(err.retry_after().is_some());
    finish.send(charge("ch_1")).expect("finish");
    first.await.expect("join").expect("first");
}

/// An attempt that dies mid-work leaves the record in flight: duplicates get
/// 409 until its lease ends; then the same request takes the record over as
/// a *recovery* with a new token, attempt 2 and the dead attempt's saved resource id.
pub async fn expired_lease_is_taken_over_as_recovery_with_resource_id<S: Store>(store: Arc<S>) {
    let (clock, idem, scope, key) = setup(&store, "POST /charges");
    let (first, started, _finish) = start_blocked(&idem, &scope, &key, 100, &Counter::default());
    let dead = started.await.expect("first started");
    dead.save_resource_id("ch_created_before_crash")
        .await
        .expect("save_resource_id");
    crash(first).await; // the process dies: no completion, no release
    let err = try_charge(&idem, &scope, &key, 100, "too early")
        .await
        .expect_err("lease still held");
    assert!(matches!(err, Error::InFlight { .. }), "{err:?}");
    clock.advance(LEASE + Duration::from_millis(1));
    // Reconcile: the charge exists, so return it instead of charging again.
    let reply = reconcile(&idem, &scope, &key, |attempt| {
        assert_eq!(
            attempt.recovery_reason(),
            Some(TakeoverReason::LeaseExpired)
        );
        assert_eq!(attempt.number(), 2);
        assert_ne!(attempt.token(), dead.token());
    })
    .await
    .expect("recovery");
    assert!(!reply.is_replay());
    assert_eq!(reply.attempt(), 2);
    assert_eq!(
        reply.into_result().expect("ok").id,
        "ch_created_before_crash"
    );
    let replay = try_charge(&idem, &scope, &key, 100, "no")
        .await
        .expect("replay");
    assert!(replay.is_replay());
}

/// After a crashed attempt's lease ends, another request under the same key
/// is still a mismatch (422) and does not take the record over.
pub async fn expired_lease_with_other_request_is_a_mismatch<S: Store>(store: Arc<S>) {
    let (clock, idem, scope, key) = setup(&store, "POST /charges");
    let (first, started, _finish) = start_blocked(&idem, &scope, &key, 100, &Counter::default());
    started.await.expect("first started");
    crash(first).await;
    clock.advance(LEASE * 2);
    let err = try_charge(&idem, &scope, &key, 555, "no")
        .await
        .expect_err("mismatch");
    assert!(matches!(err, Error::FingerprintMismatch), "{err:?}");
    let reply = idem
        .execute(&scope, &key, &charge_request(100), |a| async move {
            assert!(a.is_recovery());
            charge("ch_recovered")
        })
        .await
        .expect("recovery by the same request");
    assert_eq!(reply.attempt(), 2);
}

/// A holder whose lease was taken over can no longer complete, save a resource id or
/// extend: the store checks its token, and the newer outcome stands.
pub async fn zombie_holder_cannot_complete_save_resource_id_or_extend<S: Store>(store: Arc<S>) {
    let (clock, idem, scope, key) = setup(&store, "POST /charges");
    let (zombie_task, started, finish) =
        start_blocked(&idem, &scope, &key, 100, &Counter::default());
    let zombie = started.await.expect("first started");
    clock.advance(LEASE + Duration::from_secs(1));
    let newer = idem
        .execute(&scope, &key, &charge_request(100), |a| async move {
            assert!(a.is_recovery());
            charge("ch_newer")
        })
        .await
        .expect("takeover");
    assert_eq!(newer.attempt(), 2);
    let err = zombie
        .save_resource_id("ch_zombie")
        .await
        .expect_err("zombie save_resource_id");
    assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
    assert_eq!(err.http_status(), 409);
    let err = zombie.extend_lease(LEASE).await.expect_err("zombie extend");
    assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
    finish.send(charge("ch_zombie")).expect("finish zombie");
    let err = zombie_task
        .await
        .expect("join")
        .expect_err("zombie completion refused");
    assert!(matches!(err, Error::LeaseLost { .. }), "{err:?}");
    assert!(err.retry_after().is_some());
    let replay = try_charge(&idem, &scope, &key, 100, "no")
        .await
        .expect("replay");
    assert_eq!(replay.into_result().expect("ok").id, "ch_newer");
    let record = inspect(&idem, &scope, &key, true).await.expect("record");
    assert_eq!(
        record.resource_id, None,
        "the zombie's save_resource_id was refused"
    );
}

/// Long work that extends its lease keeps duplicates out past the original
/// lease; once the extended lease ends too, the record can be recovered.
pub async fn extended_lease_keeps_duplicates_out<S: Store>(store: Arc<S>) {
    let (clock, idem, scope, key) = setup(&store, "POST /charges");
    let (first, started, _finish) = start_blocked(&idem, &scope, &key, 100, &Counter::default());
    let holder = started.await.expect("first started");
    holder
        .extend_lease(Duration::from_secs(300))
        .await
        .expect("extend");
    clock.advance(Duration::from_secs(200));
    let err = try_charge(&idem, &scope, &key, 100, "no")
        .await
        .expect_err("still leased");
    assert!(matches!(err, Error::InFlight { .. }), "{err:?}");
    assert_eq!(err.retry_after(), Some(Duration::from_secs(100)));
    holder
        .extend_lease(LEASE)
        .await
        .expect("renew by the policy's lease");
    clock.advance(LEASE - Duration::from_secs(1));
    assert!(try_charge(&idem, &scope, &key, 100, "no").await.is_err());
    crash(first).await;
    clock.advance(Duration::from_secs(2));
    let reply = idem
        .execute(&scope, &key, &charge_request(100), |a| async move {
            assert_eq!(a.recovery_reason(), Some(TakeoverReason::LeaseExpired));
            charge("ch_after")
        })
        .await
        .expect("recovered after the extended lease");
    assert_eq!(reply.attempt(), 2);
}

/// A transient failure is not stored: the key is released, the caller gets
/// the failure, and the next attempt with the same request runs the work
/// again (told it follows a release, with the saved resource id).
pub async fn transient_failure_releases_the_key_for_a_rerun<S: Store>(store: Arc<S>) {
    let (_, idem, scope, key) = setup(&store, "POST /charges");
    let runs = Counter::default();
    let r = runs.clone();
    let reply = idem
        .execute(&scope, &key, &charge_request(100), |a| async move {
            r.hit();
            a.save_resource_id("pi_pending")
                .await
                .expect("save_resource_id");
            Out::Transient(Decline {
                code: "provider_503".into(),
            })
        })
        .await
        .expect("transient reply");
    assert!(!reply.is_stored());
    assert!(matches!(reply.outcome(), Outcome::Transient(d) if d.code == "provider_503"));
    let record = inspect(&idem, &scope, &key, true).await.expect("record");
    assert_eq!(record.state, RecordState::Released);
    let err = try_charge(&idem, &scope, &key, 7, "no")
        .await
        .expect_err("released key still belongs to its request");
    assert!(matches!(err, Error::FingerprintMismatch), "{err:?}");
    let r = runs.clone();
    let reply = idem
        .execute(&scope, &key, &charge_request(100), |a| async move {
            r.hit();
            assert_eq!(a.recovery_reason(), Some(TakeoverReason::Released));
            assert_eq!(a.previous_resource_id(), Some("pi_pending"));
            assert_eq!(a.number(), 2);
            charge("ch_2")
        })
        .await
        .expect("rerun");
    assert!(!reply.is_replay());
    assert_eq!(runs.get(), 2);
    let replay = try_charge(&idem, &scope, &key, 100, "no")
        .await
        .expect("replay");
    assert_eq!(replay.into_result().expect("ok").id, "ch_2");
    assert_eq!(runs.get(), 2);
}

/// A permanent failure is stored and replayed like a success: the work runs
/// once and every retry gets the same failure.
pub async fn permanent_failure_is_stored_and_replayed<S: Store>(store: Arc<S>) {
    let (_, idem, scope, key) = setup(&store, "POST /charges");
    let runs = Counter::default();
    for round in 0..3 {
        let r = runs.clone();
        let reply = idem
            .execute(&scope, &key, &charge_request(100), |_| async move {
                r.hit();
                Out::Failure(Decline {
                    code: "card_declined".into(),
                })
            })
            .await
            .expect("call");
        assert_eq!(reply.is_replay(), round > 0);
        assert_eq!(
            reply.into_result(),
            Err(Decline {
                code: "card_declined".into()
            })
        );
    }
    assert_eq!(runs.get(), 1);
}

/// The downstream key is the same on every attempt of a record (so a re-run
/// is a retry at the provider), differs between owners using the same key,
/// and changes with the version.
pub async fn downstream_key_is_stable_across_recovery<S: Store>(store: Arc<S>) {
    let (clock, idem, scope, key) = setup(&store, "POST /charges");
    let (first, started, _finish) = start_blocked(&idem, &scope, &key, 100, &Counter::default());
    let crashed = started.await.expect("started");
    let before = crashed.downstream_key("provider-charge", 1);
    crash(first).await;
    clock.advance(LEASE * 2);
    let (tx, rx) = oneshot::channel();
    idem.execute(&scope, &key, &charge_request(100), |a| async move {
        let _ = tx.send((
            a.downstream_key("provider-charge", 1),
            a.downstream_key("provider-charge", 2),
        ));
        charge("ch")
    })
    .await
    .expect("recovery");
    let (after, v2) = rx.await.expect("keys");
    assert_eq!(before, after);
    assert_ne!(before, v2);
    let other = Scope::new(format!("{}-other", scope.owner()), scope.operation()).expect("scope");
    let (tx, rx) = oneshot::channel();
    idem.execute(&other, &key, &charge_request(100), |a| async move {
        let _ = tx.send(a.downstream_key("provider-charge", 1));
        charge("ch")
    })
    .await
    .expect("other owner");
    assert_ne!(rx.await.expect("key"), before);
}
