//! The two clocks: response expiry, key expiry, purges, oversize responses.

use std::sync::Arc;
use std::time::Duration;

use crate::Error;
use crate::clock::{Clock, ManualClock};
use crate::store::Store;
use crate::store::{OutcomeKind, PurgeReport, RecordState};

use super::support::{
    Charge, Counter, KEY_TTL, MAX_RESPONSE, Out, RESPONSE_TTL, charge, charge_request,
    counted_charge, engine, inspect, key, scope, setup, try_charge,
};

/// After `response_ttl` the body is gone but the key is known: a retry gets
/// 409 "already done" with the resource id, and the work does not run.
pub async fn expired_response_answers_with_the_resource_id<S: Store>(store: Arc<S>) {
    let (clock, idem, scope, key) = setup(&store, "POST /charges");
    let runs = Counter::default();
    let (scope2, key2) = (scope.clone(), super::support::key());
    idem.execute(&scope, &key, &charge_request(100), |a| async move {
        a.save_resource_id("ch_9").await.expect("save_resource_id");
        charge("ch_9")
    })
    .await
    .expect("first");
    idem.execute(&scope2, &key2, &charge_request(100), |a| async move {
        a.set_resource_id("ch_set_at_completion");
        charge("ch_set_at_completion")
    })
    .await
    .expect("first");
    clock.advance(RESPONSE_TTL - Duration::from_secs(1));
    assert!(
        try_charge(&idem, &scope, &key, 100, "no")
            .await
            .expect("still replayed")
            .is_replay()
    );
    clock.advance(Duration::from_secs(2));
    for (k, rid) in [(&key, "ch_9"), (&key2, "ch_set_at_completion")] {
        let err = counted_charge(&idem, &scope, k, 100, "no", &runs)
            .await
            .expect_err("response expired");
        assert!(matches!(err, Error::ResponseExpired { .. }), "{err:?}");
        assert_eq!(err.http_status(), 409);
        assert_eq!(err.resource_id(), Some(rid));
    }
    assert_eq!(runs.get(), 0);
    let record = inspect(&idem, &scope, &key, true).await.expect("key kept");
    assert_eq!(record.state, RecordState::Completed);
    assert_eq!(record.body, None);
    let err = try_charge(&idem, &scope, &key, 1, "no")
        .await
        .expect_err("mismatch still detected");
    assert!(matches!(err, Error::FingerprintMismatch), "{err:?}");
}

/// After `key_ttl` the same key is a new operation: the work runs again as
/// attempt 1 (not a recovery), even with another request.
pub async fn expired_key_is_a_new_operation<S: Store>(store: Arc<S>) {
    let (clock, idem, scope, key) = setup(&store, "POST /charges");
    let runs = Counter::default();
    let r = runs.clone();
    idem.execute(&scope, &key, &charge_request(100), |_| async move {
        r.hit();
        charge("ch_old")
    })
    .await
    .expect("first");
    clock.advance(KEY_TTL + Duration::from_secs(1));
    assert!(inspect(&idem, &scope, &key, true).await.is_none());
    let r = runs.clone();
    let reply = idem
        .execute(&scope, &key, &charge_request(300), |a| async move {
            r.hit();
            assert!(!a.is_recovery());
            assert_eq!(a.number(), 1);
            charge("ch_new")
        })
        .await
        .expect("new operation");
    assert!(!reply.is_replay());
    assert_eq!(runs.get(), 2);
    let replay = try_charge(&idem, &scope, &key, 300, "no")
        .await
        .expect("replay of the new one");
    assert_eq!(replay.into_result().expect("ok").id, "ch_new");
}

/// Purges in batches of `limit` until a batch drops nothing that `counted`
/// counts, each batch within the limit and passing `check`: the sum
/// counted, and the calls made (the last, empty one included).
async fn purge_in_batches<S: Store>(
    store: &S,
    clock: &ManualClock,
    limit: u32,
    counted: fn(&PurgeReport) -> u64,
    check: impl Fn(&PurgeReport),
) -> (u64, u32) {
    let (mut total, mut calls) = (0, 0);
    loop {
        let r = store
            .purge_expired(clock.now(), limit)
            .await
            .expect("purge");
        assert!(
            counted(&r) <= u64::from(limit),
            "batch over the limit: {r:?}"
        );
        check(&r);
        calls += 1;
        if counted(&r) == 0 {
            return (total, calls);
        }
        total += counted(&r);
    }
}

/// Purges are bounded: each call drops at most `limit` bodies and deletes at
/// most `limit` expired keys; bodies go at `response_ttl` while keys stay
/// until `key_ttl`. (A store with native expiry reports zero and relies on
/// its own TTLs; the engine's answers are the same either way.)
pub async fn purge_runs_in_bounded_batches<S: Store>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let idem = engine(&store, &clock);
    let native = store.capabilities().native_expiry;
    let scope = scope("POST /charges");
    let keys: Vec<_> = (0..25).map(|_| key()).collect();
    for k in &keys {
        try_charge(&idem, &scope, k, 100, "ch").await.expect("call");
    }
    let limit = 10;
    let first = store
        .purge_expired(clock.now(), limit)
        .await
        .expect("purge");
    assert_eq!(
        first.keys_removed + first.bodies_dropped,
        0,
        "nothing is expired yet"
    );
    clock.advance(RESPONSE_TTL + Duration::from_secs(1));
    let (bodies, _) = purge_in_batches(
        &store,
        &clock,
        limit,
        |r| r.bodies_dropped,
        |r| {
            assert_eq!(r.keys_removed, 0, "keys outlive bodies");
        },
    )
    .await;
    assert_eq!(bodies, if native { 0 } else { 25 });
    for k in &keys[..3] {
        let rec = inspect(&idem, &scope, k, true).await.expect("key kept");
        assert_eq!(rec.body, None);
        assert_eq!(rec.outcome, Some(OutcomeKind::Success));
    }
    clock.advance(KEY_TTL);
    let (removed, calls) =
        purge_in_batches(&store, &clock, limit, |r| r.keys_removed, |_| {}).await;
    if native {
        assert_eq!(removed, 0);
    } else {
        assert_eq!(removed, 25);
        assert_eq!(calls, 4, "25 keys in batches of 10, then an empty call");
    }
    for k in &keys[..3] {
        assert!(inspect(&idem, &scope, k, true).await.is_none());
    }
    let total = idem.admin().purge_expired(limit).await.expect("purge all");
    assert_eq!(total.keys_removed, 0);
}

/// A purge in batches of one over records whose body and key have both
/// expired counts each record once, as a removed key: a body dropped from a
/// record that a later batch deletes is not reported too (the purge metrics
/// add these reports up).
pub async fn purge_counts_each_record_once<S: Store>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let idem = engine(&store, &clock);
    let native = store.capabilities().native_expiry;
    let scope = scope("POST /charges");
    for _ in 0..6 {
        idem.execute(&scope, key(), &charge_request(100), |_| async {
            charge("ch")
        })
        .await
        .expect("call");
    }
    clock.advance(KEY_TTL + Duration::from_secs(1));
    let total = idem.admin().purge_expired(1).await.expect("purge");
    let expected = if native { 0 } else { 6 };
    assert_eq!(
        (total.keys_removed, total.bodies_dropped),
        (expected, 0),
        "{total:?}"
    );
}

/// A response over `max_response_bytes` is not stored: the caller gets the
/// work's outcome (marked not stored), and every retry gets a typed 409
/// instead of a second execution.
pub async fn oversize_response_is_not_stored_and_never_rerun<S: Store>(store: Arc<S>) {
    let (_, idem, scope, key) = setup(&store, "GET /export");
    let runs = Counter::default();
    let big = "x".repeat(MAX_RESPONSE + 1);
    let r = runs.clone();
    let reply = idem
        .execute(&scope, &key, &charge_request(1), |a| async move {
            r.hit();
            a.set_resource_id("export_1");
            Out::Success(Charge { id: big, amount: 1 })
        })
        .await
        .expect("first call returns the work's outcome");
    assert!(!reply.is_stored());
    assert_eq!(reply.into_result().expect("ok").id.len(), MAX_RESPONSE + 1);
    for _ in 0..2 {
        let err = counted_charge(&idem, &scope, &key, 1, "no", &runs)
            .await
            .expect_err("not stored");
        assert!(matches!(err, Error::ResponseNotStored { .. }), "{err:?}");
        assert_eq!(err.http_status(), 409);
        assert_eq!(err.resource_id(), Some("export_1"));
        assert!(err.to_string().contains("max_response_bytes"));
    }
    assert_eq!(runs.get(), 1);
}
