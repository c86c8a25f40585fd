//! A lease is never outlived by its key: while a record is in flight under a
//! valid lease, no claim treats it as expired, whatever `key_ttl` says.

use std::sync::Arc;
use std::time::Duration;

use crate::adapter::fingerprint;
use crate::clock::{Clock, ManualClock};
use crate::store::RecordState;
use crate::store::{ClaimOutcome, ClaimRequest, Store, Token};
use crate::{Error, FieldFilter, Idem, IdempotencyKey, Policy, Scope};

use super::support::{
    Counter, LEASE, charge, charge_request, counted_charge, crash, inspect, key, record_id, scope,
    start_blocked, try_charge,
};

/// `key_ttl` only twice the lease, so long work outlives the key easily.
const SHORT_KEY_TTL: Duration = Duration::from_secs(120);

fn short_key_engine<S: Store>(store: &Arc<S>, clock: &ManualClock) -> Idem<Arc<S>> {
    let policy = Policy::builder()
        .lease(LEASE)
        .response_ttl(LEASE)
        .key_ttl(SHORT_KEY_TTL)
        .store_retries(2, Duration::from_millis(5))
        .build()
        .expect("test policy is valid");
    Idem::new(Arc::clone(store))
        .with_clock(clock.clone())
        .with_policy(policy)
}

/// A duplicate of the same request and one of another request, both of which
/// must be refused without running.
async fn assert_duplicates_refused<S: Store>(
    idem: &Idem<Arc<S>>,
    scope: &Scope,
    key: &IdempotencyKey,
    runs: &Counter,
) {
    let err = counted_charge(idem, scope, key, 100, "ch_duplicate", runs)
        .await
        .expect_err("the first attempt still holds its lease");
    assert!(matches!(err, Error::InFlight { .. }), "{err:?}");
    let err = counted_charge(idem, scope, key, 999, "ch_other", runs)
        .await
        .expect_err("another request under a leased key");
    assert!(matches!(err, Error::FingerprintMismatch), "{err:?}");
    let record = inspect(idem, scope, key, true)
        .await
        .expect("a leased record is visible");
    assert_eq!(record.state, RecordState::InFlight);
}

/// Work that extends its lease past `key_ttl` keeps its key: duplicates get
/// 409 (not a fresh attempt 1), another request gets 422, and the first
/// attempt's outcome is stored and replayed. The work runs once.
pub async fn extended_lease_outlives_key_ttl<S: Store>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let idem = short_key_engine(&store, &clock);
    let (scope, key, runs) = (scope("POST /exports"), key(), Counter::default());
    let (first, started, finish) = start_blocked(&idem, &scope, &key, 100, &runs);
    let holder = started.await.expect("first started");
    holder
        .extend_lease(Duration::from_secs(300))
        .await
        .expect("extend");
    clock.advance(SHORT_KEY_TTL + Duration::from_secs(80));
    assert_duplicates_refused(&idem, &scope, &key, &runs).await;
    // Renewing again, long after key_ttl, still works and still protects.
    clock.advance(Duration::from_secs(90));
    holder
        .extend_lease(LEASE)
        .await
        .expect("renew past key_ttl");
    clock.advance(LEASE - Duration::from_secs(1));
    assert_duplicates_refused(&idem, &scope, &key, &runs).await;
    finish.send(charge("ch_long")).expect("finish");
    let reply = first.await.expect("join").expect("first completes");
    assert!(reply.is_stored());
    let replay = try_charge(&idem, &scope, &key, 100, "no")
        .await
        .expect("replay");
    assert!(replay.is_replay());
    assert_eq!(replay.into_result().expect("ok").id, "ch_long");
    assert_eq!(runs.get(), 1, "the work ran more than once");
}

/// A recovery that takes a record over shortly before its key expires holds
/// the key for its whole new lease.
pub async fn takeover_lease_outlives_key_ttl<S: Store>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let idem = short_key_engine(&store, &clock);
    let (scope, key, runs) = (scope("POST /exports"), key(), Counter::default());
    let (crashed, started, _finish) = start_blocked(&idem, &scope, &key, 100, &runs);
    drop(started.await.expect("first started"));
    crash(crashed).await;
    // The lease ended at 60 s; the key expires at 120 s. Recover at 100 s:
    // the new lease runs to 160 s.
    clock.advance(Duration::from_secs(100));
    let (recovery, started, finish) = start_blocked(&idem, &scope, &key, 100, &runs);
    let attempt = started.await.expect("recovery started");
    assert!(attempt.is_recovery());
    clock.advance(Duration::from_secs(40));
    assert_duplicates_refused(&idem, &scope, &key, &runs).await;
    finish.send(charge("ch_recovered")).expect("finish");
    recovery.await.expect("join").expect("recovery completes");
    let replay = try_charge(&idem, &scope, &key, 100, "no")
        .await
        .expect("replay");
    assert_eq!(replay.into_result().expect("ok").id, "ch_recovered");
    assert_eq!(runs.get(), 2, "crashed attempt + one recovery");
}

/// At the store level: a record whose lease ends after its key expiry (as a
/// store written before this rule may hold) is in flight, not expired, until
/// the lease ends: claim reports it and fetch shows it.
pub async fn claim_checks_the_lease_before_key_expiry<S: Store>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let id = record_id(&scope("POST /exports"), &key());
    let fp = fingerprint("POST /exports", &charge_request(1), &FieldFilter::All).expect("fp");
    let claim = |token: Token| {
        let now = clock.now();
        ClaimRequest {
            id: &id,
            fingerprint: fp,
            token,
            now,
            lease_until: now.plus(Duration::from_secs(60)),
            key_expires_at: now.plus(Duration::from_secs(10)),
        }
    };
    let first = store.claim(&claim(Token::random())).await.expect("claim");
    assert!(matches!(first, ClaimOutcome::Claimed(_)), "{first:?}");
    clock.advance(Duration::from_secs(30));
    let again = store.claim(&claim(Token::random())).await.expect("claim");
    match again {
        ClaimOutcome::Existing(r) => assert_eq!(r.state, RecordState::InFlight),
        other @ ClaimOutcome::Claimed(_) => {
            panic!("a leased record was claimed again: {other:?}")
        }
    }
    let seen = store.fetch(&id, clock.now()).await.expect("fetch");
    assert!(
        seen.is_some_and(|r| r.state == RecordState::InFlight),
        "a leased record must stay visible"
    );
    let purged = store.purge_expired(clock.now(), 100).await.expect("purge");
    assert_eq!(purged.keys_removed, 0, "a leased record must not be purged");
    clock.advance(Duration::from_secs(31));
    let after = store.claim(&claim(Token::random())).await.expect("claim");
    assert!(
        matches!(after, ClaimOutcome::Claimed(ref c) if c.attempt == 1),
        "after both the key and the lease ended the key is new: {after:?}"
    );
}
