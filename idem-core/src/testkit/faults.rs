//! The store failing around the work.

use std::sync::Arc;
use std::time::Duration;

use crate::engine::Idem;
use crate::error::Error;
use crate::store::{RecordState, Store};
use crate::{Clock, ManualClock};

use super::support::{
    Charge, Counter, FailingStore, LEASE, Out, charge_request, key, policy, scope,
};

/// If the outcome cannot be stored after the work succeeded, the caller still
/// gets the work's result (marked not stored), duplicates get 409 (never a
/// second run while the lease holds), and after the lease the next attempt is
/// a recovery that finds the saved resource id and reconciles. A store that is down
/// before the claim gives a typed 503 and runs nothing.
pub async fn completion_failure_leaves_record_to_recovery<S: Store>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let failing = FailingStore::new(Arc::clone(&store));
    let idem = Idem::new(failing.clone())
        .with_clock(clock.clone())
        .with_policy(policy(crate::InFlightMode::Reject));
    let (scope, key, runs) = (scope("POST /charges"), key(), Counter::default());

    failing.fail_all(true);
    let r = runs.clone();
    let err = idem
        .execute(&scope, &key, &charge_request(100), |_| async move {
            r.hit();
            Out::Success(Charge {
                id: "no".into(),
                amount: 0,
            })
        })
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
            Out::Success(Charge {
                id: "ch_1".into(),
                amount: 100,
            })
        })
        .await
        .expect("the caller still gets the work's result");
    assert!(!reply.is_stored());
    assert_eq!(reply.into_result().expect("ok").id, "ch_1");
    failing.fail_complete(false);
    let rec = store
        .fetch(&super::support::record_id(&scope, &key), clock.now())
        .await
        .expect("fetch")
        .expect("record");
    assert_eq!(rec.state, RecordState::InFlight);
    let r = runs.clone();
    let err = idem
        .execute(&scope, &key, &charge_request(100), |_| async move {
            r.hit();
            Out::Success(Charge {
                id: "no".into(),
                amount: 0,
            })
        })
        .await
        .expect_err("lease still held");
    assert!(matches!(err, Error::InFlight { .. }), "{err:?}");
    assert_eq!(runs.get(), 1);
    clock.advance(LEASE + Duration::from_secs(1));
    let reply = idem
        .execute(&scope, &key, &charge_request(100), |a| async move {
            assert!(a.is_recovery());
            let id = a
                .previous_resource_id()
                .expect("saved resource id")
                .to_owned();
            Out::Success(Charge { id, amount: 100 })
        })
        .await
        .expect("recovery");
    assert!(reply.is_stored());
    assert_eq!(reply.into_result().expect("ok").id, "ch_1");
}
