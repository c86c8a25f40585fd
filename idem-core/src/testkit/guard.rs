//! The claim guard: `Idem::begin`, `Claim::complete`, `release`, and a
//! dropped claim.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::ManualClock;
use crate::store::RecordState;
use crate::store::Store;
use crate::{Begin, Claim, Error, Idem, IdempotencyKey, Outcome, Scope, TakeoverReason};

use super::support::{
    Charge, Decline, LEASE, charge, charge_request, engine, fetch, key, scope, setup,
};

type Guarded<S> = Begin<Arc<S>, Charge, Decline>;

/// `begin` with the charge request of `amount` on a key that must be
/// claimed (`why` says why, should it not be): the claim.
async fn claimed<S: Store>(
    idem: &Idem<Arc<S>>,
    scope: &Scope,
    key: &IdempotencyKey,
    amount: u64,
    why: &str,
) -> Claim<Arc<S>, Charge, Decline> {
    let begun: Guarded<S> = idem
        .begin(scope, key, &charge_request(amount))
        .await
        .expect("begin");
    let Begin::Run(claim) = begun else {
        panic!("{why}");
    };
    claim
}

/// `begin` hands the first caller the claim; completing it stores the
/// outcome, and the next `begin` is the replay, equal to what the first
/// caller got.
pub async fn guard_begin_runs_then_replays<S: Store>(store: Arc<S>) {
    let (_, idem, scope, key) = setup(&store, "POST /charges");
    let claim = claimed(&idem, &scope, &key, 100, "a fresh key must be claimed").await;
    assert_eq!(claim.attempt().number(), 1);
    assert!(!claim.attempt().is_recovery());
    let executed = claim.complete(charge("ch_1")).await.expect("complete");
    assert!(!executed.is_replay());
    assert!(executed.is_stored());
    let again: Guarded<S> = idem
        .begin(&scope, &key, &charge_request(100))
        .await
        .expect("begin again");
    let Begin::Replay(replay) = again else {
        panic!("a completed key must replay");
    };
    assert!(replay.is_replay());
    assert_eq!(replay.outcome(), executed.outcome());
}

/// A claim dropped without completing is a crash: duplicates get 409 until
/// the lease ends, then the next `begin` takes the record over as a recovery
/// (lease expired). The record is never deleted.
pub async fn guard_dropped_claim_is_recovered_after_the_lease<S: Store>(store: Arc<S>) {
    let (clock, idem, scope, key) = setup(&store, "POST /charges");
    let claim = claimed(&idem, &scope, &key, 100, "a fresh key must be claimed").await;
    claim
        .attempt()
        .save_resource_id("ch_before_crash")
        .await
        .expect("save_resource_id");
    drop(claim);
    let record = fetch(&store, &scope, &key, &clock)
        .await
        .expect("the record stays");
    assert_eq!(record.state, RecordState::InFlight);
    let dup: Result<Guarded<S>, Error> = idem.begin(&scope, &key, &charge_request(100)).await;
    assert!(matches!(dup, Err(Error::InFlight { .. })), "{dup:?}");
    clock.advance(LEASE + Duration::from_millis(1));
    let recovery = claimed(
        &idem,
        &scope,
        &key,
        100,
        "an expired lease must be taken over",
    )
    .await;
    assert_eq!(recovery.attempt().number(), 2);
    assert_eq!(
        recovery.attempt().recovery_reason(),
        Some(TakeoverReason::LeaseExpired)
    );
    assert_eq!(
        recovery.attempt().previous_resource_id(),
        Some("ch_before_crash")
    );
    let reply = recovery
        .complete(charge("ch_before_crash"))
        .await
        .expect("complete");
    assert!(reply.is_stored());
}

/// `release` frees the key at once: the next `begin` with the same request
/// runs again as a recovery (released), keeping the attempt count.
pub async fn guard_release_makes_the_next_attempt_a_recovery<S: Store>(store: Arc<S>) {
    let (_, idem, scope, key) = setup(&store, "POST /charges");
    let claim = claimed(&idem, &scope, &key, 100, "a fresh key must be claimed").await;
    claim.release().await.expect("release");
    let again = claimed(
        &idem,
        &scope,
        &key,
        100,
        "a released key must be claimable at once",
    )
    .await;
    assert_eq!(again.attempt().number(), 2);
    assert_eq!(
        again.attempt().recovery_reason(),
        Some(TakeoverReason::Released)
    );
    again.release().await.expect("release again");
}

/// `complete_not_stored` finishes the record without a body: retries get
/// 409 "not stored" with the resource id, never a second run.
pub async fn guard_complete_not_stored_is_never_rerun<S: Store>(store: Arc<S>) {
    let (_, idem, scope, key) = setup(&store, "POST /secrets");
    let claim = claimed(&idem, &scope, &key, 1, "a fresh key must be claimed").await;
    claim.attempt().set_resource_id("sk_1");
    assert!(claim.complete_not_stored().await.expect("complete"));
    let retry = idem
        .begin::<Charge, Decline, _, _>(&scope, &key, &charge_request(1))
        .await;
    match retry {
        Err(Error::ResponseNotStored { resource_id }) => {
            assert_eq!(resource_id.as_deref(), Some("sk_1"));
        }
        other => panic!("expected ResponseNotStored, got {other:?}"),
    }
}

/// Every write of a holder whose record a newer attempt took over answers
/// the same way, [`Error::LeaseLost`]: completing with a success, completing
/// with a transient failure (which would release), completing without a body,
/// and releasing. None of them touches the newer attempt's record.
pub async fn guard_every_write_of_a_fenced_holder_is_lease_lost<S: Store>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let idem = engine(&store, &clock);
    let scope = scope("POST /charges");
    let request = charge_request(100);
    for finish in 0..4 {
        let key = key();
        let begin = || idem.begin::<Charge, Decline, _, _>(&scope, &key, &request);
        let Begin::Run(old) = begin().await.expect("begin") else {
            panic!("a fresh key must be claimed");
        };
        clock.advance(LEASE + Duration::from_secs(1));
        let Begin::Run(newer) = begin().await.expect("takeover") else {
            panic!("an expired lease must be taken over");
        };
        assert_eq!(
            newer.attempt().recovery_reason(),
            Some(TakeoverReason::LeaseExpired)
        );
        let err = match finish {
            0 => old.complete(charge("ch_old")).await.map(drop),
            1 => old
                .complete(Outcome::Transient(Decline {
                    code: "busy".into(),
                }))
                .await
                .map(drop),
            2 => old.complete_not_stored().await.map(drop),
            _ => old.release().await,
        }
        .expect_err("a fenced holder cannot write");
        assert!(matches!(err, Error::LeaseLost { .. }), "{finish}: {err:?}");
        let record = fetch(&store, &scope, &key, &clock)
            .await
            .expect("record kept");
        assert_eq!(
            (record.state, record.attempt),
            (RecordState::InFlight, 2),
            "{finish}: the newer attempt's record is untouched"
        );
        newer
            .complete(charge("ch_new"))
            .await
            .expect("newer completes");
    }
}
