//! The operator operations ([`AdminStore`]): listing, release, delete, counts.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, ManualClock, Timestamp};
use crate::ops::AdminOutcome;
use crate::store::{AdminStore, ClaimOutcome, InFlightQuery, Token};
use crate::store::{Cursor, OutcomeKind, RecordState};
use crate::{Error, Outcome, RecordId, TakeoverReason};

use super::support::{
    Charge, Counter, KEY_TTL, LEASE, charge, charge_request, claim_req, completion, engine,
    inspect, key, record_id, scope,
};

/// Claims `id` directly with a lease of `lease` from the clock's now.
async fn claim<S: AdminStore>(
    store: &S,
    id: &RecordId,
    clock: &ManualClock,
    lease: Duration,
) -> Token {
    let token = Token::random();
    let req = claim_req(id, token, clock, 100, lease);
    let won = store.claim(&req).await.expect("claim");
    assert!(matches!(won, ClaimOutcome::Claimed(_)), "{won:?}");
    token
}

async fn complete<S: AdminStore>(store: &S, id: &RecordId, token: Token, clock: &ManualClock) {
    let now = clock.now();
    let c = completion(
        now,
        OutcomeKind::Success,
        Some(b"{\"id\":\"ch\"}"),
        Some("ch"),
    );
    store.complete(id, token, &c).await.expect("complete");
}

/// Walks every page of a listing, checking that no page is empty while more
/// follow forever (the walk ends).
async fn list_all<S: AdminStore>(
    store: &S,
    now: Timestamp,
    lease_before: Timestamp,
    limit: u32,
) -> Vec<RecordId> {
    let mut out = Vec::new();
    let mut cursor: Option<Cursor> = None;
    for _ in 0..10_000 {
        let page = store
            .list_in_flight(&InFlightQuery {
                now,
                lease_before,
                cursor: cursor.as_ref(),
                limit,
            })
            .await
            .expect("list");
        for r in &page.records {
            assert_eq!(r.state, RecordState::InFlight);
            assert!(r.lease_until <= lease_before, "{r:?}");
        }
        out.extend(page.records.into_iter().map(|r| r.id));
        match page.next {
            Some(next) => cursor = Some(next),
            None => return out,
        }
    }
    panic!("the listing never ended");
}

/// Listing pages through exactly the in-flight records whose lease ended
/// (or ends before the bound asked for), never completed or released ones,
/// and never a record twice on the SQL backends.
pub async fn admin_lists_stuck_records_in_pages<S: AdminStore>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let sc = scope("POST /charges");
    let ids: Vec<RecordId> = (0..9).map(|_| record_id(&sc, &key())).collect();
    // 0..5: short leases that will end; 5..7: long leases; 7: completed; 8: released.
    for id in &ids[..5] {
        claim(&*store, id, &clock, Duration::from_secs(1)).await;
    }
    for id in &ids[5..7] {
        claim(&*store, id, &clock, Duration::from_secs(3600)).await;
    }
    let t = claim(&*store, &ids[7], &clock, Duration::from_secs(1)).await;
    complete(&*store, &ids[7], t, &clock).await;
    let t = claim(&*store, &ids[8], &clock, Duration::from_secs(1)).await;
    store
        .release(&ids[8], t, clock.now())
        .await
        .expect("release");
    let now = clock.now();
    assert!(
        list_all(&*store, now, now, 2).await.is_empty(),
        "nothing stuck yet"
    );

    clock.advance(Duration::from_secs(2));
    let now = clock.now();
    let stuck = list_all(&*store, now, now, 2).await;
    let want: BTreeSet<_> = ids[..5].iter().map(RecordId::encoded).collect();
    let got: BTreeSet<_> = stuck.iter().map(RecordId::encoded).collect();
    assert_eq!(got, want, "exactly the records past their lease");
    if !store.capabilities().native_expiry {
        assert_eq!(stuck.len(), 5, "no record twice");
    }
    let soon = list_all(&*store, now, now.plus(Duration::from_secs(7200)), 3).await;
    let got: BTreeSet<_> = soon.iter().map(RecordId::encoded).collect();
    let want: BTreeSet<_> = ids[..7].iter().map(RecordId::encoded).collect();
    assert_eq!(got, want, "and the long leases when asked");
    let one = store
        .list_in_flight(&InFlightQuery {
            now,
            lease_before: now,
            cursor: None,
            limit: 1,
        })
        .await
        .expect("list");
    if !store.capabilities().native_expiry {
        assert_eq!(one.records.len(), 1, "a page holds at most `limit`");
        assert!(one.next.is_some());
    }
}

/// An operator releases a record stuck in flight under a long lease: the next
/// attempt runs as a recovery (lease expired, resource id kept), the old
/// holder is fenced out, and the work ran once per attempt only.
pub async fn admin_release_makes_the_next_attempt_a_recovery<S: AdminStore>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let idem = engine(&store, &clock);
    let (sc, k, runs) = (scope("POST /charges"), key(), Counter::default());
    let id = record_id(&sc, &k);
    let old = claim(&*store, &id, &clock, LEASE).await;
    store
        .save_resource_id(&id, old, "ch_1")
        .await
        .expect("save_resource_id");

    let view = inspect(&idem, &sc, &k, false).await.expect("record");
    assert_eq!(view.state, RecordState::InFlight);
    assert_eq!(view.attempt, 1);
    assert!(!view.lease_expired);
    assert_eq!(view.resource_id.as_deref(), Some("ch_1"));
    assert_eq!((view.body, view.body_len), (None, None));

    let r = runs.clone();
    let retry = || {
        let (idem, sc, k, r) = (idem.clone(), sc.clone(), k.clone(), r.clone());
        async move {
            idem.execute(&sc, &k, &charge_request(100), move |a| async move {
                r.hit();
                assert!(a.is_recovery(), "runs only as a recovery");
                assert_eq!(a.recovery_reason(), Some(TakeoverReason::LeaseExpired));
                assert_eq!(a.previous_resource_id(), Some("ch_1"));
                assert_eq!(a.number(), 2);
                charge("ch_1")
            })
            .await
        }
    };
    assert!(matches!(retry().await, Err(Error::InFlight { .. })));
    assert_eq!(
        idem.admin()
            .release_stuck(&sc, &k, Some(2))
            .await
            .expect("release"),
        AdminOutcome::Refused {
            state: RecordState::InFlight,
            attempt: 1
        },
        "fenced by the attempt the operator saw"
    );
    assert_eq!(
        idem.admin()
            .release_stuck(&sc, &k, Some(1))
            .await
            .expect("release"),
        AdminOutcome::Done
    );
    let view = inspect(&idem, &sc, &k, false).await.expect("record");
    assert!(view.lease_expired);
    assert_eq!(
        view.state,
        RecordState::InFlight,
        "still in flight until retried"
    );

    let reply = retry().await.expect("recovery");
    assert!(!reply.is_replay());
    assert_eq!(runs.get(), 1);
    let now = clock.now();
    let c = completion(now, OutcomeKind::Success, Some(b"zombie"), None);
    assert!(
        store.complete(&id, old, &c).await.is_err(),
        "old holder fenced"
    );
    let view = inspect(&idem, &sc, &k, true).await.expect("record");
    assert_eq!(view.state, RecordState::Completed);
    assert!(view.body.is_some() && view.body_len == view.body.as_ref().map(Vec::len));
    assert_eq!(
        idem.admin()
            .release_stuck(&sc, &k, None)
            .await
            .expect("release"),
        AdminOutcome::Refused {
            state: RecordState::Completed,
            attempt: 2
        }
    );
    assert_eq!(
        idem.admin()
            .release_stuck(&sc, key(), None)
            .await
            .expect("release"),
        AdminOutcome::Absent
    );
    let replay = retry().await.expect("replay");
    assert!(replay.is_replay());
    assert_eq!(runs.get(), 1);
}

/// Only completed records can be deleted; in-flight and released ones are
/// refused untouched. After a delete the key is a new operation.
pub async fn admin_delete_refuses_unfinished_records<S: AdminStore>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let idem = engine(&store, &clock);
    let sc = scope("POST /charges");
    let (flying, released, done) = (key(), key(), key());
    claim(&*store, &record_id(&sc, &flying), &clock, LEASE).await;
    let t = claim(&*store, &record_id(&sc, &released), &clock, LEASE).await;
    store
        .release(&record_id(&sc, &released), t, clock.now())
        .await
        .expect("release");
    let t = claim(&*store, &record_id(&sc, &done), &clock, LEASE).await;
    complete(&*store, &record_id(&sc, &done), t, &clock).await;

    for (k, state) in [
        (&flying, RecordState::InFlight),
        (&released, RecordState::Released),
    ] {
        assert_eq!(
            idem.admin().delete_record(&sc, k).await.expect("delete"),
            AdminOutcome::Refused { state, attempt: 1 }
        );
        assert!(inspect(&idem, &sc, k, false).await.is_some());
    }
    assert_eq!(
        idem.admin()
            .delete_record(&sc, &done)
            .await
            .expect("delete"),
        AdminOutcome::Done
    );
    assert!(inspect(&idem, &sc, &done, false).await.is_none());
    assert_eq!(
        idem.admin()
            .delete_record(&sc, &done)
            .await
            .expect("delete"),
        AdminOutcome::Absent
    );
    let runs = Counter::default();
    let r = runs.clone();
    let reply = idem
        .execute(&sc, &done, &charge_request(100), move |a| async move {
            r.hit();
            assert_eq!(a.number(), 1);
            Outcome::<Charge, super::support::Decline>::Success(Charge {
                id: "ch_2".into(),
                amount: 100,
            })
        })
        .await
        .expect("new operation");
    assert!(!reply.is_replay());
    assert_eq!(runs.get(), 1);
}

/// Counts by state see every live record once; stuck ones are in flight
/// with an ended lease; keys that expired but are still stored count apart.
pub async fn admin_counts_records_by_state<S: AdminStore>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let sc = scope("POST /charges");
    for _ in 0..2 {
        claim(
            &*store,
            &record_id(&sc, &key()),
            &clock,
            Duration::from_secs(1),
        )
        .await;
    }
    claim(&*store, &record_id(&sc, &key()), &clock, LEASE).await;
    let id = record_id(&sc, &key());
    let t = claim(&*store, &id, &clock, LEASE).await;
    store.release(&id, t, clock.now()).await.expect("release");
    for _ in 0..3 {
        let id = record_id(&sc, &key());
        let t = claim(&*store, &id, &clock, LEASE).await;
        complete(&*store, &id, t, &clock).await;
    }
    clock.advance(Duration::from_secs(2));
    let c = store.count_states(clock.now()).await.expect("count");
    assert_eq!(
        (c.in_flight, c.stuck, c.released, c.completed, c.expired),
        (3, 2, 1, 3, 0),
        "{c:?}"
    );
    clock.advance(KEY_TTL);
    let c = store.count_states(clock.now()).await.expect("count");
    assert_eq!((c.in_flight, c.released, c.completed), (0, 0, 0), "{c:?}");
    if !store.capabilities().native_expiry {
        assert_eq!(c.expired, 7, "{c:?}");
    }
}

/// A background purger removes expired keys by itself, batch after batch,
/// and stops gracefully; on a store with native expiry it calls nothing.
pub async fn purger_runs_by_itself_and_stops<S: AdminStore>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let idem = engine(&store, &clock);
    let sc = scope("POST /charges");
    for _ in 0..5 {
        let id = record_id(&sc, &key());
        let t = claim(&*store, &id, &clock, Duration::from_secs(1)).await;
        complete(&*store, &id, t, &clock).await;
    }
    clock.advance(KEY_TTL + Duration::from_secs(1));
    let native = store.capabilities().native_expiry;
    let purger = idem.spawn_purger(crate::ops::PurgerConfig {
        interval: Duration::from_millis(5),
        batch: 2,
        jitter: Duration::from_millis(5),
        timeout: Duration::from_secs(30),
    });
    if !native {
        let mut left = u64::MAX;
        for _ in 0..1000 {
            left = store
                .count_states(clock.now())
                .await
                .expect("count")
                .expired;
            if left == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(left, 0, "the purger never emptied the store");
    }
    let total = purger.stop().await;
    if native {
        assert_eq!(total, crate::store::PurgeReport::default());
    } else {
        assert_eq!(total.keys_removed, 5, "{total:?}");
    }
}

/// A listing cursor the store did not write (garbage, empty, another
/// backend's shape) is the caller's input: [`StoreError::InvalidCursor`]
/// (HTTP 400, `invalid_cursor`), never a backend error, on every store.
///
/// [`StoreError::InvalidCursor`]: crate::store::StoreError::InvalidCursor
pub async fn admin_refuses_a_cursor_it_did_not_write<S: AdminStore>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let now = clock.now();
    for text in [
        "garbage",
        "",
        "0:x",
        "not-a-node:0",
        r#"{"not":"a position"}"#,
    ] {
        let cursor = Cursor::new(text);
        let listed = store
            .list_in_flight(&InFlightQuery {
                now,
                lease_before: now,
                cursor: Some(&cursor),
                limit: 10,
            })
            .await;
        assert!(
            matches!(listed, Err(crate::store::StoreError::InvalidCursor)),
            "cursor {text:?}: {listed:?}"
        );
    }
}
