//! The store failing around the work.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::ManualClock;
use crate::store::RecordState;
use crate::store::Store;
use crate::{Error, Idem};

use super::support::{
    Charge, Counter, FailingStore, LEASE, Out, charge, charge_request, counted_charge, fetch, key,
    policy, policy_builder, reconcile, scope,
};

/// The test policy, keeping no completion in the background.
fn no_backlog() -> crate::Policy {
    policy_builder(crate::InFlightMode::Reject)
        .completion_backlog(0)
        .build()
        .expect("valid policy")
}

/// An engine on `store` behind a [`FailingStore`] (returned too, to switch
/// its failures), on `clock`, in reject mode.
fn failing_engine<S: Store>(
    store: &Arc<S>,
    clock: &ManualClock,
) -> (FailingStore<S>, Idem<FailingStore<S>>) {
    let failing = FailingStore::new(Arc::clone(store));
    let idem = Idem::new(failing.clone())
        .with_clock(clock.clone())
        .with_policy(policy(crate::InFlightMode::Reject));
    (failing, idem)
}

/// If the outcome cannot be stored after the work succeeded, and the engine
/// keeps no completion in the background (`completion_backlog(0)`), the
/// caller still gets the work's result (marked not stored), duplicates get
/// 409 (never a second run while the lease holds), and after the lease the
/// next attempt is a recovery that finds the saved resource id and
/// reconciles. A store that is down before the claim gives a typed 503 and
/// runs nothing.
pub async fn completion_failure_leaves_record_to_recovery<S: Store>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let (failing, idem) = failing_engine(&store, &clock);
    let idem = idem.with_policy(no_backlog());
    let (scope, key, runs) = (scope("POST /charges"), key(), Counter::default());

    failing.fail_all(true);
    let err = counted_charge(&idem, &scope, &key, 100, "no", &runs)
        .await
        .expect_err("store down");
    assert!(matches!(err, Error::Store(_)), "{err:?}");
    assert_eq!(err.http_status(), 503);
    assert_eq!(err.retry_after(), Some(Duration::from_secs(1)));
    assert_eq!(runs.get(), 0);
    failing.fail_all(false);

    failing.fail_complete(true);
    let r = runs.clone();
    let reply = idem
        .execute(&scope, &key, &charge_request(100), |a| async move {
            r.hit();
            a.save_resource_id("ch_1").await.expect("save_resource_id");
            charge("ch_1")
        })
        .await
        .expect("the caller still gets the work's result");
    assert!(!reply.is_stored());
    assert_eq!(reply.into_result().expect("ok").id, "ch_1");
    failing.fail_complete(false);
    let rec = fetch(&store, &scope, &key, &clock).await.expect("record");
    assert_eq!(rec.state, RecordState::InFlight);
    let err = counted_charge(&idem, &scope, &key, 100, "no", &runs)
        .await
        .expect_err("lease still held");
    assert!(matches!(err, Error::InFlight { .. }), "{err:?}");
    assert_eq!(runs.get(), 1);
    clock.advance(LEASE + Duration::from_secs(1));
    let reply = reconcile(&idem, &scope, &key, |_| {})
        .await
        .expect("recovery");
    assert!(reply.is_stored());
    assert_eq!(reply.into_result().expect("ok").id, "ch_1");
}

/// A completion that reached the store but whose reply was lost (a timeout
/// after the write) is retried by the engine; the retry finds the record
/// completed under the attempt's own token, so the caller gets its outcome
/// reported stored, not a lost lease, and a duplicate replays it. The work
/// runs once.
pub async fn completion_with_a_lost_reply_is_reported_stored<S: Store>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let (failing, idem) = failing_engine(&store, &clock);
    let (scope, key, runs) = (scope("POST /charges"), key(), Counter::default());
    let work = |runs: Counter| {
        move |_| async move {
            runs.hit();
            Out::Success(Charge {
                id: "ch_9".into(),
                amount: 900,
            })
        }
    };

    failing.lose_complete_replies(1);
    let reply = idem
        .execute(&scope, &key, &charge_request(900), work(runs.clone()))
        .await
        .expect("a retried completion that already applied is not a lost lease");
    assert!(reply.is_stored(), "the outcome is stored and said so");
    assert!(!reply.is_replay());
    assert_eq!(reply.into_result().expect("ok").id, "ch_9");

    let replay = idem
        .execute(&scope, &key, &charge_request(900), work(runs.clone()))
        .await
        .expect("replay");
    assert!(replay.is_replay());
    assert_eq!(replay.into_result().expect("ok").id, "ch_9");
    assert_eq!(runs.get(), 1, "the work ran once");
    let record = fetch(&store, &scope, &key, &clock).await.expect("record");
    assert_eq!(record.state, RecordState::Completed);
    assert_eq!(record.attempt, 1);
}

/// How long a test waits for the engine's background completions.
const DRAIN: Duration = Duration::from_secs(10);

/// A completion whose write still fails after the store retries is kept and
/// written again in the background under the attempt's token: while the
/// store fails, duplicates get 409 (nothing runs); once the store answers,
/// the completion is stored (the process survived its database's failover),
/// and the retry replays the first outcome. The work runs once.
pub async fn unstored_completion_is_written_in_the_background<S: Store>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let (failing, idem) = failing_engine(&store, &clock);
    let (scope, key, runs) = (scope("POST /charges"), key(), Counter::default());
    let work = |runs: Counter, id: &'static str| {
        move |_| async move {
            runs.hit();
            charge(id)
        }
    };

    failing.fail_complete(true);
    let reply = idem
        .execute(
            &scope,
            &key,
            &charge_request(100),
            work(runs.clone(), "ch_1"),
        )
        .await
        .expect("the caller gets the work's result");
    assert!(!reply.is_stored(), "not stored yet");
    assert_eq!(idem.pending_completions(), 1, "kept in the background");
    let err = idem
        .execute(&scope, &key, &charge_request(100), work(runs.clone(), "no"))
        .await
        .expect_err("in flight while the store fails");
    assert!(matches!(err, Error::InFlight { .. }), "{err:?}");

    failing.fail_complete(false);
    assert_eq!(
        idem.drain_completions(DRAIN).await,
        0,
        "stored in the background"
    );
    let rec = fetch(&store, &scope, &key, &clock).await.expect("record");
    assert_eq!(rec.state, RecordState::Completed);
    let replay = idem
        .execute(&scope, &key, &charge_request(100), work(runs.clone(), "no"))
        .await
        .expect("replay");
    assert!(replay.is_replay());
    assert_eq!(replay.into_result().expect("ok").id, "ch_1");
    assert_eq!(runs.get(), 1, "the work ran once");
}

/// A completion kept in the background is given up when the attempt's
/// lease ends (the store never came back in time): the record is then left
/// to recovery, which reconciles from the saved resource id; the late write
/// never lands after the lease. And the backlog is bounded: over
/// `completion_backlog`, a completion is not kept (left to recovery).
pub async fn background_completion_ends_with_the_lease<S: Store>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let (failing, idem) = failing_engine(&store, &clock);
    let one = policy_builder(crate::InFlightMode::Reject)
        .completion_backlog(1)
        .build()
        .expect("valid policy");
    let idem = idem.with_policy(one);
    let scope = scope("POST /charges");
    let (key, other, runs) = (key(), super::support::key(), Counter::default());

    failing.fail_complete(true);
    for (k, id) in [(&key, "ch_1"), (&other, "ch_2")] {
        let r = runs.clone();
        let reply = idem
            .execute(&scope, k, &charge_request(100), move |a| async move {
                r.hit();
                a.save_resource_id(id).await.expect("save_resource_id");
                charge(id)
            })
            .await
            .expect("the work's result");
        assert!(!reply.is_stored());
    }
    assert_eq!(
        idem.pending_completions(),
        1,
        "one kept, the second over the bound"
    );

    clock.advance(LEASE + Duration::from_secs(1));
    assert_eq!(
        idem.drain_completions(DRAIN).await,
        0,
        "given up at the lease's end"
    );
    failing.fail_complete(false);
    let rec = fetch(&store, &scope, &key, &clock).await.expect("record");
    assert_eq!(
        rec.state,
        RecordState::InFlight,
        "never written after the lease"
    );
    for (k, id) in [(&key, "ch_1"), (&other, "ch_2")] {
        let reply = reconcile(&idem, &scope, k, |_| {}).await.expect("recovery");
        assert!(reply.is_stored());
        assert_eq!(reply.into_result().expect("ok").id, id);
    }
    assert_eq!(runs.get(), 2, "each ran once; the recoveries reconciled");
}
