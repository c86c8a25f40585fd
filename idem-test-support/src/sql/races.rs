//! Real concurrency over several pools ("several processes"): one key raced
//! by many tasks runs its work once, racing takeovers have exactly one
//! winner, 1,000 distinct keys each run once, and transactional racers whose
//! winners roll back end with one stored outcome.

use std::sync::Arc;
use std::time::Duration;

use idem_core::adapter::fingerprint;
use idem_core::clock::{Clock, ManualClock, Timestamp};
use idem_core::store::RecordState;
use idem_core::store::{ClaimOutcome, ClaimRequest, Store, StoreError, Token};
use idem_core::testkit::race;
use idem_core::{Error, FieldFilter, Idem, IdempotencyKey, Outcome, RecordId, TakeoverReason};

use super::{Counter, Dialect, LEASE, Out, TxDialect, engine, request, scope, with_fixture};

/// 64 tasks on one key over 8 pools: while the winner's work is held, the
/// other 63 get 409; let go, it completes once, and 64 more get the
/// replay. No sleeps: the work waits for the test to let it go.
pub async fn sixty_four_racers<D: Dialect>(d: D) {
    let fx = d.open(2).await;
    with_fixture(fx, move |fx| async move {
        let clock = ManualClock::starting_now();
        let stores = d.stores_on(&fx, 8).await;
        let engines: Vec<Idem<D::Store>> = stores.iter().map(|s| engine(s, &clock)).collect();
        let (scope, key, runs) = (scope(), IdempotencyKey::random(), Counter::default());
        let go = Arc::new(tokio::sync::Semaphore::new(0));
        // Said by a work as it starts (the winner's claim returns before its
        // work runs, so the losers' answers can come first).
        let started = Arc::new(tokio::sync::Notify::new());
        let race = |round: usize| {
            let barrier = Arc::new(tokio::sync::Barrier::new(64));
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            for i in 0..64 {
                let idem = engines[i % 8].clone();
                let (scope, key, runs, barrier, go, started, tx) = (
                    scope.clone(),
                    key.clone(),
                    runs.clone(),
                    Arc::clone(&barrier),
                    Arc::clone(&go),
                    Arc::clone(&started),
                    tx.clone(),
                );
                tokio::spawn(async move {
                    barrier.wait().await;
                    let r = idem
                        .execute(&scope, &key, &request(), move |_| async move {
                            runs.hit();
                            started.notify_one();
                            go.acquire().await.expect("open").forget();
                            Out::Success(format!("ch_{round}_{i}"))
                        })
                        .await;
                    let _ = tx.send(r);
                });
            }
            rx
        };
        let mut results = race(0);
        for _ in 0..63 {
            match results.recv().await.expect("a result") {
                Err(Error::InFlight { .. }) => {}
                other => panic!("while the work is held, a duplicate gets 409: {other:?}"),
            }
        }
        started.notified().await;
        assert_eq!(runs.get(), 1, "one claim won");
        go.add_permits(1);
        let first = results.recv().await.expect("the winner").expect("executed");
        assert!(!first.is_replay());
        let stored = first.into_result().expect("success");
        // A second round: everyone replays (permits in place so that a
        // wrongly run work would finish, and be counted, not hang).
        go.add_permits(64);
        let mut results = race(1);
        for _ in 0..64 {
            let r = results.recv().await.expect("a result").expect("replay");
            assert!(r.is_replay());
            assert_eq!(r.into_result().as_ref(), Ok(&stored));
        }
        assert_eq!(runs.get(), 1, "the work runs exactly once");
        assert_eq!(d.count_records(&fx).await, 1);
        for s in &stores {
            d.close(s).await;
        }
    })
    .await;
}

/// 32 claimers over 4 pools, all released at once on `id` at `now`, with
/// one request (`distinct` false) or 32 different ones: exactly one wins;
/// everyone else gets the standing record, in flight.
async fn race_claims<S: Store + Clone>(
    stores: &[S],
    id: &RecordId,
    now: Timestamp,
    distinct: bool,
) -> (Token, idem_core::store::Claimed) {
    let fp = |amount: u64| {
        fingerprint(
            id.operation(),
            &serde_json::json!({ "amount": amount }),
            &FieldFilter::All,
        )
        .expect("fp")
    };
    let tasks = race(32, |i| {
        let (store, id) = (stores[i % 4].clone(), id.clone());
        let amount = if distinct {
            u64::try_from(i).expect("small")
        } else {
            1
        };
        let fingerprint = fp(amount);
        async move {
            let token = Token::random();
            let req = ClaimRequest::new(
                &id,
                fingerprint,
                token,
                now,
                now.plus(LEASE),
                now.plus(Duration::from_secs(86_400)),
            );
            (token, store.claim(&req).await.expect("claim"))
        }
    });
    let mut winners = Vec::new();
    for t in tasks {
        match t.await.expect("join") {
            (token, ClaimOutcome::Claimed(c)) => winners.push((token, c)),
            (_, ClaimOutcome::Existing(rec)) => {
                assert_eq!(rec.state, RecordState::InFlight);
            }
        }
    }
    assert_eq!(winners.len(), 1, "exactly one claimer wins: {winners:?}");
    winners.remove(0)
}

/// Racing takeovers: 32 claimers over 4 pools on a released record, on an
/// expired lease, and on an expired key (different requests): each time
/// exactly one takes it, everyone else gets the standing record.
pub async fn racing_takeovers_have_exactly_one_winner<D: Dialect>(d: D) {
    let fx = d.open(2).await;
    with_fixture(fx, move |fx| async move {
        let stores = d.stores_on(&fx, 4).await;
        let clock = ManualClock::starting_now();
        let id = RecordId::new(scope(), IdempotencyKey::random());
        let store = &stores[0];
        let (t1, first) = race_claims(&stores, &id, clock.now(), false).await;
        assert_eq!(first.attempt, 1);
        store.save_resource_id(&id, t1, "ch_1").await.expect("save");
        store.release(&id, t1, clock.now()).await.expect("release");
        let (t2, second) = race_claims(&stores, &id, clock.now(), false).await;
        assert_eq!(second.attempt, 2);
        let previous = second.previous.expect("previous");
        assert_eq!(previous.reason, TakeoverReason::Released);
        assert_eq!(previous.resource_id.as_deref(), Some("ch_1"));
        assert!(matches!(
            store.release(&id, t1, clock.now()).await,
            Err(StoreError::LeaseLost)
        ));
        clock.advance(LEASE);
        let (_, third) = race_claims(&stores, &id, clock.now(), false).await;
        assert_eq!(third.attempt, 3);
        assert_eq!(
            third.previous.expect("previous").reason,
            TakeoverReason::LeaseExpired
        );
        assert!(matches!(
            store.save_resource_id(&id, t2, "zombie").await,
            Err(StoreError::LeaseLost)
        ));
        clock.advance(Duration::from_secs(86_400));
        let (_, fresh) = race_claims(&stores, &id, clock.now(), true).await;
        assert_eq!(fresh.attempt, 1, "an expired key is a new operation");
        assert!(fresh.previous.is_none());
        assert_eq!(d.count_records(&fx).await, 1);
        for s in &stores {
            d.close(s).await;
        }
    })
    .await;
}

/// 1,000 distinct keys at once over one pool: each runs once, and each is
/// stored.
pub async fn thousand_keys<D: Dialect>(d: D) {
    let fx = d.open(2).await;
    with_fixture(fx, move |fx| async move {
        let stores = d.stores_on(&fx, 1).await;
        let clock = ManualClock::starting_now();
        let idem = engine(&stores[0], &clock);
        let (scope, runs) = (scope(), Counter::default());
        let tasks: Vec<_> = (0..1000)
            .map(|i| {
                let (idem, scope, runs) = (idem.clone(), scope.clone(), runs.clone());
                tokio::spawn(async move {
                    idem.execute(
                        &scope,
                        format!("key-{i}").as_str(),
                        &request(),
                        move |_| async move {
                            runs.hit();
                            Out::Success(format!("r{i}"))
                        },
                    )
                    .await
                })
            })
            .collect();
        for t in tasks {
            let r = t.await.expect("join").expect("each key runs");
            assert!(!r.is_replay());
        }
        assert_eq!(runs.get(), 1000);
        assert_eq!(d.count_records(&fx).await, 1000);
        d.close(&stores[0]).await;
    })
    .await;
}

/// 16 transactional racers on one key over 4 pools, whose first three
/// winners fail transiently (their transaction, claim included, rolls
/// back; on InnoDB the waiters behind a rolled-back insert hit the
/// duplicate-key deadlock, which starts their transaction again). In the end
/// at most one success is stored, and no caller saw anything but an
/// outcome, a replay or a 409.
pub async fn transactional_racers_with_rollbacks<D: TxDialect>(d: D) {
    let fx = d.open(2).await;
    with_fixture(fx, move |fx| async move {
        let stores = d.stores_on(&fx, 4).await;
        let clock = ManualClock::starting_now();
        let engines: Vec<Idem<D::Store>> = stores.iter().map(|s| engine(s, &clock)).collect();
        let (scope, key, runs) = (scope(), IdempotencyKey::random(), Counter::default());
        let tasks = race(16, |i| {
            let (d, idem) = (d.clone(), engines[i % 4].clone());
            let (scope, key, runs) = (scope.clone(), key.clone(), runs.clone());
            async move {
                d.execute_in_tx(&idem, &scope, &key, &request(), move |_, _| {
                    Box::pin(async move {
                        runs.hit();
                        if runs.get() <= 3 {
                            Out::Transient("provider 503".into())
                        } else {
                            Out::Success(format!("ch_{i}"))
                        }
                    })
                })
                .await
            }
        });
        let (mut executed, mut other) = (0, 0);
        for t in tasks {
            match t.await.expect("join") {
                Ok(r) if !r.is_replay() && matches!(r.outcome(), Outcome::Success(_)) => {
                    executed += 1;
                }
                Ok(_) | Err(Error::InFlight { .. }) => other += 1,
                Err(e) => panic!("a transactional racer got {e:?}"),
            }
        }
        println!("{executed} executed, {other} other, {} runs", runs.get());
        let id = RecordId::new(scope.clone(), key.clone());
        let record = stores[0].fetch(&id, clock.now()).await.expect("fetch");
        if executed == 1 {
            assert_eq!(record.expect("stored").state, RecordState::Completed);
        } else {
            // Every racer came while a transient winner held the key.
            assert_eq!(executed, 0);
            assert!(record.is_none());
        }
        assert_eq!(executed + other, 16);
        for s in &stores {
            d.close(s).await;
        }
    })
    .await;
}
