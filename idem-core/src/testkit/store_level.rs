//! The `Store` methods called directly: fencing and what a claim reports.

use std::sync::Arc;

use crate::clock::{Clock, ManualClock};
use crate::store::{ClaimOutcome, Completion, Store, StoreError, Token};
use crate::store::{OutcomeKind, RecordState};
use crate::{RecordId, TakeoverReason};

use super::support::{KEY_TTL, LEASE, RESPONSE_TTL, claim_req, completion, key, record_id, scope};

/// A claim of `id` under `token` for the charge request of `amount`, with
/// the test policy's lease.
async fn claim<S: Store>(
    store: &S,
    id: &RecordId,
    token: Token,
    clock: &ManualClock,
    amount: u64,
) -> ClaimOutcome {
    store
        .claim(&claim_req(id, token, clock, amount, LEASE))
        .await
        .expect("claim")
}

fn lost<T: std::fmt::Debug>(r: Result<T, StoreError>) {
    assert!(
        matches!(r, Err(StoreError::LeaseLost)),
        "expected LeaseLost, got {r:?}"
    );
}

/// Complete, release, save_resource_id and extend change nothing unless the record
/// is in flight under exactly the caller's token; a completion retried under
/// the token that completed the record answers Ok and changes nothing.
pub async fn store_writes_are_fenced_by_token<S: Store>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let id = record_id(&scope("POST /charges"), &key());
    let (mine, other) = (Token::random(), Token::random());
    let claimed = claim(&store, &id, mine, &clock, 1).await;
    assert!(
        matches!(claimed, ClaimOutcome::Claimed(ref c) if c.attempt == 1 && c.previous.is_none())
    );
    let before = store
        .fetch(&id, clock.now())
        .await
        .expect("fetch")
        .expect("record");
    let now = clock.now();
    let done = completion(now, OutcomeKind::Success, Some(b"body"), Some("r"));
    lost(store.complete(&id, other, &done).await);
    lost(store.release(&id, other, now).await);
    lost(store.save_resource_id(&id, other, "x").await);
    lost(store.extend_lease(&id, other, now.plus(LEASE * 10)).await);
    assert_eq!(store.fetch(&id, now).await.expect("fetch"), Some(before));
    store
        .save_resource_id(&id, mine, "ch_1")
        .await
        .expect("save_resource_id");
    store
        .extend_lease(&id, mine, now.plus(LEASE * 2))
        .await
        .expect("extend");
    store
        .complete(
            &id,
            mine,
            &Completion {
                resource_id: None,
                ..done
            },
        )
        .await
        .expect("complete");
    let rec = store.fetch(&id, now).await.expect("fetch").expect("record");
    assert_eq!(rec.state, RecordState::Completed);
    assert_eq!(
        rec.resource_id.as_deref(),
        Some("ch_1"),
        "None keeps the saved resource id"
    );
    assert_eq!(rec.response.as_deref(), Some(b"body".as_slice()));
    // Completed: even the right token can no longer write. A completion
    // under the token that completed it answers Ok (a retry after a lost
    // reply) and changes nothing, even with other contents.
    let completed = store.fetch(&id, now).await.expect("fetch");
    store
        .complete(&id, mine, &done)
        .await
        .expect("a completion retried under its token is not a lost lease");
    assert_eq!(
        store.fetch(&id, now).await.expect("fetch"),
        completed,
        "a retried completion changes nothing"
    );
    lost(store.complete(&id, other, &done).await);
    lost(store.release(&id, mine, now).await);
    lost(store.save_resource_id(&id, mine, "y").await);
    lost(store.extend_lease(&id, mine, now).await);
    // Writes to a record that does not exist are refused too.
    let ghost = record_id(&scope("POST /charges"), &key());
    lost(store.complete(&ghost, mine, &done).await);
    lost(store.release(&ghost, mine, now).await);
    assert_eq!(store.fetch(&ghost, now).await.expect("fetch"), None);
}

/// A claim that loses reports the standing record: fingerprint, state, lease,
/// attempt, and the body only until `response_expires_at`; a released record
/// and an expired lease are taken over, keeping the saved resource id.
pub async fn claim_reports_existing_records<S: Store>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let id = record_id(&scope("POST /charges"), &key());
    let t1 = Token::random();
    let req = claim_req(&id, t1, &clock, 1, LEASE);
    store.claim(&req).await.expect("claim");
    let ClaimOutcome::Existing(rec) = claim(&store, &id, Token::random(), &clock, 1).await else {
        panic!("an in-flight record with a live lease must not be claimed");
    };
    assert_eq!(rec.state, RecordState::InFlight);
    assert_eq!(rec.fingerprint, req.fingerprint);
    assert_eq!(rec.lease_until, req.lease_until);
    assert_eq!(rec.attempt, 1);
    // Another fingerprint never takes over, even after the lease.
    clock.advance(LEASE * 2);
    assert!(matches!(
        claim(&store, &id, Token::random(), &clock, 2).await,
        ClaimOutcome::Existing(_)
    ));
    store
        .save_resource_id(&id, t1, "ch_a")
        .await
        .expect("still mine until taken over");
    let t2 = Token::random();
    let ClaimOutcome::Claimed(c) = claim(&store, &id, t2, &clock, 1).await else {
        panic!("an expired lease with the same fingerprint is taken over");
    };
    assert_eq!(c.attempt, 2);
    let prev = c.previous.expect("previous");
    assert_eq!(prev.reason, TakeoverReason::LeaseExpired);
    assert_eq!(prev.resource_id.as_deref(), Some("ch_a"));
    lost(store.save_resource_id(&id, t1, "zombie").await);
    store.release(&id, t2, clock.now()).await.expect("release");
    let t3 = Token::random();
    let ClaimOutcome::Claimed(c) = claim(&store, &id, t3, &clock, 1).await else {
        panic!("a released record is claimed by the same fingerprint");
    };
    assert_eq!(c.attempt, 3);
    assert_eq!(
        c.previous.expect("previous").reason,
        TakeoverReason::Released
    );
    let now = clock.now();
    store
        .complete(
            &id,
            t3,
            &completion(now, OutcomeKind::Failure, Some(b"declined"), None),
        )
        .await
        .expect("complete");
    let ClaimOutcome::Existing(rec) = claim(&store, &id, Token::random(), &clock, 1).await else {
        panic!("completed records are never claimed");
    };
    assert_eq!(rec.state, RecordState::Completed);
    assert_eq!(rec.outcome, Some(OutcomeKind::Failure));
    assert_eq!(rec.response.as_deref(), Some(b"declined".as_slice()));
    assert_eq!(rec.attempt, 3);
    assert_eq!(rec.resource_id.as_deref(), Some("ch_a"));
    clock.advance(RESPONSE_TTL);
    let ClaimOutcome::Existing(rec) = claim(&store, &id, Token::random(), &clock, 1).await else {
        panic!("completed records are never claimed");
    };
    assert_eq!(
        rec.response, None,
        "the body is not returned at or after response_expires_at"
    );
    assert_eq!(rec.outcome, Some(OutcomeKind::Failure));
    clock.advance(KEY_TTL);
    assert_eq!(store.fetch(&id, clock.now()).await.expect("fetch"), None);
    let ClaimOutcome::Claimed(c) = claim(&store, &id, Token::random(), &clock, 2).await else {
        panic!("an expired key is a new operation, whatever the fingerprint");
    };
    assert_eq!(c.attempt, 1);
    assert!(c.previous.is_none());
}
