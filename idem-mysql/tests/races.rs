//! Real concurrency over several pools ("several processes"), under both
//! InnoDB isolation levels an application runs (`REPEATABLE READ`, the
//! default, with its gap locks, and `READ COMMITTED`) and with both claim
//! paths: one key raced by many tasks runs its work once, racing takeovers
//! have exactly one winner, 1,000 distinct keys each run once, and
//! transactional racers whose winners roll back (InnoDB's classic
//! duplicate-key deadlock) end with one stored outcome.

mod support;

use std::sync::Arc;
use std::time::Duration;

use idem_core::adapter::fingerprint;
use idem_core::clock::{Clock, ManualClock};
use idem_core::store::RecordState;
use idem_core::store::{ClaimOutcome, ClaimRequest, Store, StoreError, Token};
use idem_core::{Error, FieldFilter, Idem, IdempotencyKey, Outcome, RecordId};
use idem_mysql::sqlx;
use idem_mysql::{MySqlIdemExt, MySqlStore, Server};
use support::MyFixture;
use support::scenario::{Counter, LEASE, Out, count_rows, engine, request, scope, with_fixture};

const RR: &str = "REPEATABLE READ";
const RC: &str = "READ COMMITTED";

/// `n` stores on the fixture's table, each with a pool of its own at
/// `isolation`, running `server`'s statements.
async fn stores(
    fx: &MyFixture,
    n: usize,
    isolation: &'static str,
    server: Server,
) -> Vec<MySqlStore> {
    let mut stores = Vec::new();
    for _ in 0..n {
        let store = MySqlStore::new(support::pool_at(8, isolation).await)
            .with_table_name(&fx.table)
            .expect("table")
            .with_server(server);
        stores.push(store);
    }
    stores
}

/// 64 tasks on one key over 8 pools: while the winner's work is held, the
/// other 63 get 409; let go, it completes once, and 64 more get the
/// replay. No sleeps: the work waits for the test to let it go.
async fn sixty_four_racers(isolation: &'static str, server: Server) {
    with_fixture(MyFixture::new(2).await, move |fx| async move {
        let clock = ManualClock::starting_now();
        let stores = stores(&fx, 8, isolation, server).await;
        let engines: Vec<Idem<MySqlStore>> = stores.iter().map(|s| engine(s, &clock)).collect();
        let (scope, key, runs) = (scope(), IdempotencyKey::random(), Counter::default());
        let go = Arc::new(tokio::sync::Semaphore::new(0));
        let race = |round: usize| {
            let barrier = Arc::new(tokio::sync::Barrier::new(64));
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            for i in 0..64 {
                let idem = engines[i % 8].clone();
                let (scope, key, runs, barrier, go, tx) = (
                    scope.clone(),
                    key.clone(),
                    runs.clone(),
                    Arc::clone(&barrier),
                    Arc::clone(&go),
                    tx.clone(),
                );
                tokio::spawn(async move {
                    barrier.wait().await;
                    let r = idem
                        .execute(&scope, &key, &request(), move |_| async move {
                            runs.hit();
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
        assert_eq!(count_rows(&fx, &fx.table).await, 1);
        for s in &stores {
            s.pool().close().await;
        }
    })
    .await;
}

/// Racing takeovers: 32 claimers over 4 pools on a released record, on an
/// expired lease, and on an expired key (different requests): each time
/// exactly one takes it, everyone else gets the standing record.
async fn racing_takeovers(isolation: &'static str, server: Server) {
    with_fixture(MyFixture::new(2).await, move |fx| async move {
        let stores = stores(&fx, 4, isolation, server).await;
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
                            assert_eq!(rec.state, RecordState::InFlight);
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
        store.save_resource_id(&id, t1, "ch_1").await.expect("save");
        store.release(&id, t1, clock.now()).await.expect("release");
        let (t2, second) = race(clock.now(), false).await;
        assert_eq!(second.attempt, 2);
        let previous = second.previous.expect("previous");
        assert_eq!(previous.reason, idem_core::TakeoverReason::Released);
        assert_eq!(previous.resource_id.as_deref(), Some("ch_1"));
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
        assert_eq!(count_rows(&fx, &fx.table).await, 1);
        for s in &stores {
            s.pool().close().await;
        }
    })
    .await;
}

/// 1,000 distinct keys at once over one pool of 16: each runs once, and
/// each is stored.
async fn thousand_keys(isolation: &'static str, server: Server) {
    with_fixture(MyFixture::new(2).await, move |fx| async move {
        let stores = stores(&fx, 1, isolation, server).await;
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
        assert_eq!(count_rows(&fx, &fx.table).await, 1000);
        stores[0].pool().close().await;
    })
    .await;
}

/// 16 transactional racers on one key over 4 pools, whose first three
/// winners fail transiently (their transaction, claim included, rolls
/// back): the waiters behind a rolled-back insert hit InnoDB's
/// duplicate-key deadlock, which starts their transaction again. In the
/// end exactly one success is stored, and no caller saw anything but an
/// outcome, a replay or a 409.
async fn transactional_racers_with_rollbacks(isolation: &'static str, server: Server) {
    with_fixture(MyFixture::new(2).await, move |fx| async move {
        let stores = stores(&fx, 4, isolation, server).await;
        let clock = ManualClock::starting_now();
        let engines: Vec<Idem<MySqlStore>> = stores.iter().map(|s| engine(s, &clock)).collect();
        let (scope, key, runs) = (scope(), IdempotencyKey::random(), Counter::default());
        let deadlocks_before = deadlocks(&stores[0]).await;
        let barrier = Arc::new(tokio::sync::Barrier::new(16));
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let idem = engines[i % 4].clone();
                let (scope, key, runs, barrier) = (
                    scope.clone(),
                    key.clone(),
                    runs.clone(),
                    Arc::clone(&barrier),
                );
                tokio::spawn(async move {
                    barrier.wait().await;
                    idem.execute_in_tx(&scope, &key, &request(), move |_, _| {
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
                })
            })
            .collect();
        let (mut executed, mut other) = (0, 0);
        for t in tasks {
            match t.await.expect("join") {
                Ok(r) if !r.is_replay() && matches!(r.outcome(), Outcome::Success(_)) => {
                    executed += 1
                }
                Ok(_) | Err(Error::InFlight { .. }) => other += 1,
                Err(e) => panic!("a transactional racer got {e:?}"),
            }
        }
        let deadlocks = deadlocks(&stores[0]).await - deadlocks_before;
        println!(
            "{isolation} / {server:?}: {executed} executed, {other} other, {} runs, \
             {deadlocks} deadlocks on the server meanwhile",
            runs.get()
        );
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
            s.pool().close().await;
        }
    })
    .await;
}

/// The server's deadlock counter (MariaDB and MySQL both keep it, as a
/// status variable or in `information_schema.INNODB_METRICS`).
async fn deadlocks(store: &MySqlStore) -> i64 {
    let v: Option<(String, String)> = sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")
        .fetch_optional(store.pool())
        .await
        .expect("status");
    v.and_then(|(_, n)| n.parse().ok()).unwrap_or(0)
}

macro_rules! per_level_and_path {
    ($($scenario:ident),+ $(,)?) => {
        $(
            mod $scenario {
                use super::*;
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn repeatable_read_mariadb() {
                    super::$scenario(RR, Server::MariaDb).await;
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn read_committed_mariadb() {
                    super::$scenario(RC, Server::MariaDb).await;
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn repeatable_read_mysql_path() {
                    super::$scenario(RR, Server::MySql).await;
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn read_committed_mysql_path() {
                    super::$scenario(RC, Server::MySql).await;
                }
            }
        )+
    };
}

per_level_and_path!(
    sixty_four_racers,
    racing_takeovers,
    thousand_keys,
    transactional_racers_with_rollbacks,
);
