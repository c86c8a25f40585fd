//! Real concurrency over several pools ("several processes"): one key
//! raced by many tasks runs its work once, and racing takeovers have exactly
//! one winner.

mod support;

use std::sync::Arc;
use std::time::Duration;

use idem_core::adapter::fingerprint;
use idem_core::clock::{Clock, ManualClock};
use idem_core::store::RecordState;
use idem_core::store::{ClaimOutcome, ClaimRequest, Store, StoreError, Token};
use idem_core::{Error, FieldFilter, IdempotencyKey, RecordId};
use support::PgFixture;
use support::proxy::Proxy;
use support::scenario::{Counter, LEASE, Out, count_rows, engine, request, scope, with_fixture};

/// 64 tasks on one key, spread over 8 separate pools ("8 processes"): the
/// work runs exactly once; everyone else gets the replay or a 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_racers_over_eight_pools_run_the_work_once() {
    with_fixture(PgFixture::new(2).await, |fx| async move {
        let clock = ManualClock::starting_now();
        // All 8 pools go through one counting proxy, to count statements.
        let proxy = Proxy::start(support::upstream().await).await;
        let mut engines = Vec::new();
        for _ in 0..8 {
            let store = support::connect(8, support::via(&proxy))
                .await
                .with_schema_name(&fx.schema)
                .expect("schema");
            // The start check, before the counted race (a store over a
            // pool checks at its first call otherwise).
            store.check_replication().await.expect("check");
            engines.push(engine(&store, &clock));
        }
        // The eight start checks went through the proxy too: count from here.
        let setup = proxy.snapshot().statements();
        let (scope, key, runs) = (scope(), IdempotencyKey::random(), Counter::default());
        let barrier = Arc::new(tokio::sync::Barrier::new(64));
        let tasks: Vec<_> = (0..64)
            .map(|i| {
                let idem = engines[i % 8].clone();
                let (scope, key, runs, barrier) = (
                    scope.clone(),
                    key.clone(),
                    runs.clone(),
                    Arc::clone(&barrier),
                );
                tokio::spawn(async move {
                    barrier.wait().await;
                    idem.execute(&scope, &key, &request(), move |_| async move {
                        runs.hit();
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Out::Success(format!("ch_{i}"))
                    })
                    .await
                })
            })
            .collect();
        let (mut executed, mut replayed, mut in_flight) = (0, 0, 0);
        for t in tasks {
            match t.await.expect("join") {
                Ok(r) if r.is_replay() => replayed += 1,
                Ok(_) => executed += 1,
                Err(Error::InFlight { .. }) => in_flight += 1,
                Err(e) => panic!("unexpected error under contention: {e:?}"),
            }
        }
        let statements = proxy.snapshot().statements() - setup;
        println!(
            "64 racers / 8 pools: executed {executed}, replayed {replayed}, 409 {in_flight}; \
             {statements} statements in all (64 calls, 1 completion)"
        );
        // Every call is one claim; only a loser of the race on the fresh key
        // runs its claim a second time (never more under this race).
        assert!(statements > 64 && statements <= 64 * 2 + 1, "{statements}");
        assert_eq!(runs.get(), 1, "the work must run exactly once");
        assert_eq!(executed, 1);
        assert_eq!(executed + replayed + in_flight, 64);
        assert_eq!(count_rows(&fx, "idem_records").await, 1);
        for e in &engines {
            e.store().close().await;
        }
    })
    .await;
}

/// Racing takeovers: 32 claimers over 4 pools on a released record, on an
/// expired lease, and on an expired key (different requests): each time
/// exactly one takes it, everyone else gets the standing record.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_takeovers_have_exactly_one_winner() {
    with_fixture(PgFixture::new(2).await, |fx| async move {
        let mut stores = Vec::new();
        for _ in 0..4 {
            stores.push(
                support::connect(8, support::options())
                    .await
                    .with_schema_name(&fx.schema)
                    .expect("schema"),
            );
        }
        let clock = ManualClock::starting_now();
        let scope = scope();
        let id = RecordId::new(scope.clone(), IdempotencyKey::random());
        let fp = |amount: u64| {
            fingerprint(
                scope.operation(),
                &serde_json::json!({ "amount": amount }),
                &FieldFilter::All,
            )
            .expect("fp")
        };
        let race = |now: idem_core::clock::Timestamp, distinct: bool| {
            let barrier = Arc::new(tokio::sync::Barrier::new(32));
            let tasks: Vec<_> = (0..32u64)
                .map(|i| {
                    let (store, id, barrier) = (
                        stores[(i % 4) as usize].clone(),
                        id.clone(),
                        Arc::clone(&barrier),
                    );
                    let fingerprint = if distinct { fp(i) } else { fp(1) };
                    tokio::spawn(async move {
                        let token = Token::random();
                        barrier.wait().await;
                        let req = ClaimRequest::new(
                            &id,
                            fingerprint,
                            token,
                            now,
                            now.plus(LEASE),
                            now.plus(Duration::from_secs(86_400)),
                        );
                        (token, store.claim(&req).await.expect("claim"))
                    })
                })
                .collect();
            async move {
                let mut winners = Vec::new();
                for t in tasks {
                    match t.await.expect("join") {
                        (token, ClaimOutcome::Claimed(c)) => winners.push((token, c)),
                        (_, ClaimOutcome::Existing(rec)) => {
                            assert_eq!(rec.state, RecordState::InFlight)
                        }
                    }
                }
                assert_eq!(winners.len(), 1, "exactly one claimer wins: {winners:?}");
                winners.remove(0)
            }
        };
        let store = &stores[0];
        let (t1, first) = race(clock.now(), false).await;
        assert_eq!(first.attempt, 1);
        store.release(&id, t1, clock.now()).await.expect("release");
        let (t2, second) = race(clock.now(), false).await;
        assert_eq!(second.attempt, 2);
        assert_eq!(
            second.previous.expect("previous").reason,
            idem_core::TakeoverReason::Released
        );
        assert!(matches!(
            store.release(&id, t1, clock.now()).await,
            Err(StoreError::LeaseLost)
        ));
        clock.advance(LEASE);
        let (_, third) = race(clock.now(), false).await;
        assert_eq!(third.attempt, 3);
        assert_eq!(
            third.previous.expect("previous").reason,
            idem_core::TakeoverReason::LeaseExpired
        );
        assert!(matches!(
            store.save_resource_id(&id, t2, "zombie").await,
            Err(StoreError::LeaseLost)
        ));
        clock.advance(Duration::from_secs(86_400));
        let (_, fresh) = race(clock.now(), true).await;
        assert_eq!(fresh.attempt, 1, "an expired key is a new operation");
        assert!(fresh.previous.is_none());
        assert_eq!(count_rows(&fx, "idem_records").await, 1);
        for s in &stores {
            s.close().await;
        }
    })
    .await;
}
