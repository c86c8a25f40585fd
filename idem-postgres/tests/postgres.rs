//! Backend-specific tests against the real server: transactional mode, real
//! concurrency over several pools, faults (killed backends, dropped
//! connections), hostile input, corrupted rows, index use of the purge, and
//! statements per transition.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use idem_core::Error;
use idem_core::FieldFilter;
use idem_core::Idem;
use idem_core::IdempotencyKey;
use idem_core::InFlightMode;
use idem_core::Outcome;
use idem_core::Policy;
use idem_core::RecordId;
use idem_core::Scope;
use idem_core::adapter::fingerprint;
use idem_core::clock::Clock;
use idem_core::clock::ManualClock;
use idem_core::ops::OutcomeKind;
use idem_core::ops::RecordState;
use idem_core::store::ClaimOutcome;
use idem_core::store::ClaimRequest;
use idem_core::store::Completion;
use idem_core::store::Store;
use idem_core::store::StoreError;
use idem_core::store::Token;
use idem_postgres::sqlx::{self, Executor, Row};
use idem_postgres::{PgIdemExt, PgStore};
use support::PgFixture;
use support::proxy::{Proxy, Snapshot};

type Out = Outcome<String, String>;

const LEASE: Duration = Duration::from_secs(60);

fn policy(retries: u32) -> Policy {
    Policy::builder()
        .lease(LEASE)
        .response_ttl(Duration::from_secs(3600))
        .key_ttl(Duration::from_secs(86_400))
        .in_flight(InFlightMode::Reject)
        .store_retries(retries, Duration::from_millis(5))
        .build()
        .expect("policy")
}

fn engine(store: &PgStore, clock: &ManualClock) -> Idem<PgStore> {
    Idem::new(store.clone())
        .with_clock(clock.clone())
        .with_policy(policy(2))
}

fn scope() -> Scope {
    Scope::new(
        format!("tenant-{}", IdempotencyKey::random()),
        "POST /charges",
    )
    .expect("scope")
}

fn request() -> serde_json::Value {
    serde_json::json!({"amount": 100, "currency": "eur"})
}

#[derive(Debug, Clone, Default)]
struct Counter(Arc<AtomicUsize>);
impl Counter {
    fn hit(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
    fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Runs `body` and drops the fixture's schema even if it panics.
async fn with_fixture<F, Fut>(fx: PgFixture, body: F)
where
    F: FnOnce(Arc<PgFixture>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let fx = Arc::new(fx);
    let result = tokio::spawn(body(Arc::clone(&fx))).await;
    fx.drop_schema().await;
    if let Err(e) = result {
        std::panic::resume_unwind(e.into_panic());
    }
}

async fn count_rows(fx: &PgFixture, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{}\".\"{table}\"",
        fx.schema
    )))
    .fetch_one(fx.store.pool())
    .await
    .expect("count")
}

async fn create_orders(fx: &PgFixture) {
    fx.store
        .pool()
        .execute(sqlx::AssertSqlSafe(format!(
            "CREATE TABLE \"{}\".orders (id bigserial PRIMARY KEY, note text NOT NULL)",
            fx.schema
        )))
        .await
        .expect("create orders");
}

fn insert_order(
    schema: &str,
) -> sqlx::query::Query<'static, sqlx::Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO \"{schema}\".orders (note) VALUES ($1)"
    )))
}

// ---------------------------------------------------------------- transactional mode

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_commits_claim_writes_and_response_together() {
    with_fixture(PgFixture::new(4).await, |fx| async move {
        create_orders(&fx).await;
        let clock = ManualClock::starting_now();
        let idem = engine(&fx.store, &clock);
        let (scope, runs) = (scope(), Counter::default());
        for i in 0..3 {
            let (r, schema) = (runs.clone(), fx.schema.clone());
            let reply = idem
                .execute_in_tx(&scope, "order-1", &request(), move |attempt, conn| {
                    Box::pin(async move {
                        r.hit();
                        attempt
                            .save_resource_id("ord_1")
                            .await
                            .expect("save_resource_id");
                        insert_order(&schema)
                            .bind("first")
                            .execute(&mut *conn)
                            .await
                            .expect("insert");
                        Out::Success(format!("order-{}", attempt.number()))
                    })
                })
                .await
                .expect("call");
            assert_eq!(reply.is_replay(), i > 0);
            assert_eq!(reply.into_result(), Ok("order-1".to_owned()));
        }
        assert_eq!(runs.get(), 1);
        assert_eq!(
            count_rows(&fx, "orders").await,
            1,
            "the work's write committed once"
        );
        let rec = idem
            .admin()
            .inspect(&scope, "order-1", true)
            .await
            .expect("inspect")
            .expect("record");
        assert_eq!(rec.state, RecordState::Completed);
        assert_eq!(
            rec.resource_id.as_deref(),
            Some("ord_1"),
            "resource id written with the outcome"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_transient_failure_or_dropped_future_leaves_nothing() {
    with_fixture(PgFixture::new(4).await, |fx| async move {
        create_orders(&fx).await;
        let clock = ManualClock::starting_now();
        let idem = engine(&fx.store, &clock);
        let scope = scope();
        let schema = fx.schema.clone();
        let reply = idem
            .execute_in_tx(&scope, "k", &request(), move |_, conn| {
                Box::pin(async move {
                    insert_order(&schema)
                        .bind("rolled back")
                        .execute(&mut *conn)
                        .await
                        .expect("insert");
                    Out::Transient("provider 503".into())
                })
            })
            .await
            .expect("transient is returned");
        assert_eq!(reply.into_result(), Err("provider 503".to_owned()));
        assert_eq!(count_rows(&fx, "orders").await, 0);
        assert_eq!(
            idem.admin()
                .inspect(&scope, "k", true)
                .await
                .expect("inspect"),
            None
        );

        // A future dropped mid-work (a crash, a cancelled request).
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let (idem2, scope2, schema) = (idem.clone(), scope.clone(), fx.schema.clone());
        let task = tokio::spawn(async move {
            idem2
                .execute_in_tx(&scope2, "k", &request(), move |_, conn| {
                    Box::pin(async move {
                        insert_order(&schema)
                            .bind("never committed")
                            .execute(&mut *conn)
                            .await
                            .expect("insert");
                        let _ = started_tx.send(());
                        std::future::pending::<Out>().await
                    })
                })
                .await
        });
        started.await.expect("work started");
        task.abort();
        let _ = task.await;
        // The dropped transaction rolls back; its row lock goes with it, so a
        // retry claims (bounded by the lock timeout if it did not).
        let runs = Counter::default();
        let r = runs.clone();
        let reply = idem
            .execute_in_tx(&scope, "k", &request(), move |attempt, _| {
                Box::pin(async move {
                    r.hit();
                    assert_eq!(
                        attempt.number(),
                        1,
                        "nothing of the dropped attempt remains"
                    );
                    Out::Success("ok".into())
                })
            })
            .await
            .expect("retry");
        assert!(!reply.is_replay());
        assert_eq!(runs.get(), 1);
        assert_eq!(count_rows(&fx, "orders").await, 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_duplicate_waits_for_the_winner_then_replays() {
    with_fixture(PgFixture::new(4).await, |fx| async move {
        create_orders(&fx).await;
        let clock = ManualClock::starting_now();
        let idem = engine(&fx.store, &clock);
        let (scope, runs) = (scope(), Counter::default());
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let go = Arc::new(tokio::sync::Notify::new());
        let first = {
            let (idem, scope, runs, go, schema) = (
                idem.clone(),
                scope.clone(),
                runs.clone(),
                Arc::clone(&go),
                fx.schema.clone(),
            );
            tokio::spawn(async move {
                idem.execute_in_tx(&scope, "k", &request(), move |_, conn| {
                    Box::pin(async move {
                        runs.hit();
                        insert_order(&schema)
                            .bind("winner")
                            .execute(&mut *conn)
                            .await
                            .expect("insert");
                        let _ = started_tx.send(());
                        go.notified().await;
                        Out::Success("winner".into())
                    })
                })
                .await
            })
        };
        started.await.expect("first is in its work");
        let second = {
            let (idem, scope, runs) = (idem.clone(), scope.clone(), runs.clone());
            tokio::spawn(async move {
                idem.execute_in_tx(&scope, "k", &request(), move |_, _| {
                    Box::pin(async move {
                        runs.hit();
                        Out::Success("second".into())
                    })
                })
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !second.is_finished(),
            "the duplicate waits on the uncommitted record"
        );
        go.notify_one();
        let a = first.await.expect("join").expect("first");
        let b = second.await.expect("join").expect("second");
        assert!(!a.is_replay());
        assert!(
            b.is_replay(),
            "after the winner commits the duplicate replays"
        );
        assert_eq!(b.into_result(), Ok("winner".to_owned()));
        assert_eq!(runs.get(), 1);
        assert_eq!(count_rows(&fx, "orders").await, 1);
    })
    .await;
}

/// A duplicate waiting behind a transaction that rolls back (transient
/// failure) claims and runs the work itself; a plain `Idem::execute`
/// duplicate waits behind an open transaction the same way and replays once
/// it commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_duplicate_runs_after_a_rollback_and_plain_calls_wait_too() {
    with_fixture(PgFixture::new(4).await, |fx| async move {
        let clock = ManualClock::starting_now();
        let idem = engine(&fx.store, &clock);
        let (scope, runs) = (scope(), Counter::default());
        let spawn_first = |key: &'static str, outcome: Out| {
            let (idem, scope, runs) = (idem.clone(), scope.clone(), runs.clone());
            let (started_tx, started) = tokio::sync::oneshot::channel();
            let go = Arc::new(tokio::sync::Notify::new());
            let g = Arc::clone(&go);
            let task = tokio::spawn(async move {
                idem.execute_in_tx(&scope, key, &request(), move |_, _| {
                    Box::pin(async move {
                        runs.hit();
                        let _ = started_tx.send(());
                        g.notified().await;
                        outcome
                    })
                })
                .await
            });
            (task, started, go)
        };
        // 1. The first rolls back: the waiting duplicate runs.
        let (first, started, go) = spawn_first("k", Out::Transient("provider 503".into()));
        started.await.expect("started");
        let second = {
            let (idem, scope, runs) = (idem.clone(), scope.clone(), runs.clone());
            tokio::spawn(async move {
                idem.execute_in_tx(&scope, "k", &request(), move |attempt, _| {
                    Box::pin(async move {
                        runs.hit();
                        Out::Success(format!("second, attempt {}", attempt.number()))
                    })
                })
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!second.is_finished(), "waits on the uncommitted claim");
        go.notify_one();
        assert!(
            first
                .await
                .expect("join")
                .expect("first")
                .into_result()
                .is_err()
        );
        let b = second.await.expect("join").expect("second");
        assert!(
            !b.is_replay(),
            "the rollback left nothing: the duplicate runs"
        );
        assert_eq!(b.into_result(), Ok("second, attempt 1".to_owned()));
        assert_eq!(runs.get(), 2);

        // 2. A plain `Idem::execute` behind an open transaction on a new key.
        let scope2 = scope.clone();
        let (idem2, runs2) = (idem.clone(), runs.clone());
        let (first, started, go) = spawn_first("k2", Out::Success("tx winner".into()));
        started.await.expect("started");
        let plain = tokio::spawn(async move {
            idem2
                .execute(&scope2, "k2", &request(), move |_| async move {
                    runs2.hit();
                    Out::Success("plain".into())
                })
                .await
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !plain.is_finished(),
            "a plain call waits on the uncommitted claim too"
        );
        go.notify_one();
        assert!(!first.await.expect("join").expect("first").is_replay());
        let p = plain.await.expect("join").expect("plain");
        assert!(p.is_replay());
        assert_eq!(p.into_result(), Ok("tx winner".to_owned()));
        assert_eq!(runs.get(), 3);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_duplicate_gets_409_after_the_lock_timeout() {
    with_fixture(PgFixture::new(4).await, |fx| async move {
        let clock = ManualClock::starting_now();
        let store = fx
            .store
            .clone()
            .with_tx_lock_timeout(Duration::from_millis(200));
        let idem = engine(&store, &clock);
        let scope = scope();
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let go = Arc::new(tokio::sync::Notify::new());
        let first = {
            let (idem, scope, go) = (idem.clone(), scope.clone(), Arc::clone(&go));
            tokio::spawn(async move {
                idem.execute_in_tx(&scope, "k", &request(), move |_, _| {
                    Box::pin(async move {
                        let _ = started_tx.send(());
                        go.notified().await;
                        Out::Success("winner".into())
                    })
                })
                .await
            })
        };
        started.await.expect("started");
        let t0 = Instant::now();
        let err = idem
            .execute_in_tx(&scope, "k", &request(), |_, _| {
                Box::pin(async { Out::Success("never".into()) })
            })
            .await
            .expect_err("409 after the lock timeout");
        assert!(matches!(err, Error::InFlight { .. }), "{err:?}");
        assert_eq!(err.http_status(), 409);
        assert!(
            t0.elapsed() >= Duration::from_millis(150),
            "it waited for the lock first"
        );
        // The non-transactional path behind an open transaction: same wait,
        // here bounded by the test's own patience.
        go.notify_one();
        assert!(!first.await.expect("join").expect("first").is_replay());
        let replay = idem
            .execute_in_tx(&scope, "k", &request(), |_, _| {
                Box::pin(async { Out::Success("never".into()) })
            })
            .await
            .expect("replay");
        assert_eq!(replay.into_result(), Ok("winner".to_owned()));
    })
    .await;
}

// ---------------------------------------------------------------- concurrency

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
            let pool = support::pool(8, support::via(&proxy)).await;
            let store = PgStore::new(pool)
                .with_schema_name(&fx.schema)
                .expect("schema");
            engines.push(engine(&store, &clock));
        }
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
        let statements = proxy.snapshot().statements();
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
            e.store().pool().close().await;
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
            let pool = support::pool(8, support::options()).await;
            stores.push(
                PgStore::new(pool)
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
            s.pool().close().await;
        }
    })
    .await;
}

// ---------------------------------------------------------------- faults

async fn terminate_when_waiting(app: String) -> i32 {
    let admin = support::pool(1, support::options()).await;
    for _ in 0..200 {
        let pid: Option<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock' LIMIT 1",
        )
        .bind(&app)
        .fetch_optional(&admin)
        .await
        .expect("pg_stat_activity");
        if let Some(pid) = pid {
            let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
                .bind(pid)
                .fetch_one(&admin)
                .await
                .expect("kill");
            assert!(killed);
            admin.close().await;
            return pid;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no backend of {app} ever waited on a lock");
}

fn app_name() -> String {
    format!("idem-test-{}", &IdempotencyKey::random().as_str()[..12])
}

/// A backend killed with `pg_terminate_backend` in the middle of the claim
/// gives a typed 503 and runs nothing; killed in the middle of the
/// completion, the caller still gets the work's result, duplicates get 409
/// (no second execution), and after the lease the record is recovered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_backend_mid_call_is_a_typed_error_and_never_a_second_run() {
    let app = app_name();
    let fx = PgFixture::with_options(2, support::options().application_name(&app)).await;
    with_fixture(fx, |fx| async move {
        let clock = ManualClock::starting_now();
        let idem = Idem::new(fx.store.clone())
            .with_clock(clock.clone())
            .with_policy(policy(1));
        let (scope, runs) = (scope(), Counter::default());
        let id = RecordId::new(scope.clone(), IdempotencyKey::parse("k").expect("key"));
        let blocker = support::pool(1, support::options()).await;
        let lock_row = format!(
            "SELECT 1 FROM {} WHERE owner = $1 AND operation = $2 AND key = $3 FOR UPDATE",
            fx.table()
        );

        // 1. Mid-claim: a released record, row-locked by someone else, so the
        //    takeover waits; the backend is killed while it waits.
        let fp = fingerprint(scope.operation(), &request(), &FieldFilter::All).expect("fp");
        let t = Token::random();
        let now = clock.now();
        let req = ClaimRequest::new(
            &id,
            fp,
            t,
            now,
            now.plus(LEASE),
            now.plus(Duration::from_secs(86_400)),
        );
        assert!(matches!(
            fx.store.claim(&req).await.expect("claim"),
            ClaimOutcome::Claimed(_)
        ));
        fx.store.release(&id, t, now).await.expect("release");
        let mut lock = blocker.begin().await.expect("begin");
        sqlx::query(sqlx::AssertSqlSafe(lock_row.clone()))
            .bind(id.owner())
            .bind(id.operation())
            .bind("k")
            .execute(&mut *lock)
            .await
            .expect("lock");
        let killer = tokio::spawn(terminate_when_waiting(app.clone()));
        let r = runs.clone();
        let err = idem
            .execute(&scope, "k", &request(), move |_| async move {
                r.hit();
                Out::Success("no".into())
            })
            .await
            .expect_err("killed mid-claim");
        killer.await.expect("killer");
        assert!(
            matches!(err, Error::Store(StoreError::Unavailable { .. })),
            "{err:?}"
        );
        assert_eq!(err.http_status(), 503);
        assert_eq!(runs.get(), 0, "nothing ran");
        lock.rollback().await.expect("rollback");

        // 2. Mid-completion: the work locks its own record (from another
        //    connection) before returning, so the completion waits and is killed.
        let (r, blocker2, sql) = (runs.clone(), blocker.clone(), lock_row.clone());
        let (hold_tx, hold) = tokio::sync::oneshot::channel();
        let killer = tokio::spawn(terminate_when_waiting(app.clone()));
        let reply = idem
            .execute(&scope, "k", &request(), move |a| async move {
                r.hit();
                let mut lock = blocker2.begin().await.expect("begin");
                let id = a.record();
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(id.owner())
                    .bind(id.operation())
                    .bind(id.key().as_str())
                    .execute(&mut *lock)
                    .await
                    .expect("lock");
                let _ = hold_tx.send(lock);
                Out::Success("ch_1".into())
            })
            .await
            .expect("the caller gets the work's result");
        killer.await.expect("killer");
        assert!(!reply.is_stored(), "the completion was killed");
        assert_eq!(reply.into_result(), Ok("ch_1".to_owned()));
        hold.await
            .expect("lock")
            .rollback()
            .await
            .expect("rollback");
        let rec = fx
            .store
            .fetch(&id, clock.now())
            .await
            .expect("fetch")
            .expect("record");
        assert_eq!(rec.state, RecordState::InFlight, "left to lease expiry");
        let r = runs.clone();
        let err = idem
            .execute(&scope, "k", &request(), move |_| async move {
                r.hit();
                Out::Success("no".into())
            })
            .await
            .expect_err("lease still held");
        assert!(matches!(err, Error::InFlight { .. }), "{err:?}");
        assert_eq!(runs.get(), 1, "no second execution while the lease holds");
        clock.advance(LEASE + Duration::from_secs(1));
        let reply = idem
            .execute(&scope, "k", &request(), |a| async move {
                assert!(a.is_recovery());
                Out::Success("ch_1 (reconciled)".into())
            })
            .await
            .expect("recovery");
        assert!(reply.is_stored());
        blocker.close().await;
    })
    .await;
}

/// Every connection dropped (a server restart, a failover): calls fail
/// with a typed 503 while the server is away, never run the work twice, and
/// the pool recovers on its own once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_recovers_after_connections_are_dropped() {
    let proxy = Proxy::start(support::upstream().await).await;
    let options = support::via(&proxy);
    let pool = idem_postgres::sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .test_before_acquire(false)
        .acquire_timeout(Duration::from_secs(2))
        .connect_with(options)
        .await
        .expect("connect through proxy");
    let schema = support::schema_name();
    let store = PgStore::new(pool)
        .with_schema_name(&schema)
        .expect("schema");
    store.migrate().await.expect("migrate");
    let fx = PgFixture { store, schema };
    with_fixture(fx, move |fx| async move {
        let clock = ManualClock::starting_now();
        let idem = engine(&fx.store, &clock);
        let (scope, runs) = (scope(), Counter::default());
        let call = |key: String| {
            let (idem, scope, runs) = (idem.clone(), scope.clone(), runs.clone());
            async move {
                idem.execute(&scope, key, &request(), move |_| async move {
                    runs.hit();
                    Out::Success("ok".into())
                })
                .await
            }
        };
        for i in 0..4 {
            call(format!("before-{i}")).await.expect("healthy");
        }
        proxy.set_down(true);
        proxy.kill_all();
        for i in 0..3 {
            let err = call(format!("down-{i}")).await.expect_err("server away");
            assert!(
                matches!(err, Error::Store(StoreError::Unavailable { .. })),
                "{err:?}"
            );
        }
        proxy.set_down(false);
        let mut failures = 0;
        let mut i = 0;
        while call(format!("after-{i}")).await.is_err() {
            failures += 1;
            i += 1;
            assert!(failures <= 5, "the pool did not recover");
        }
        for j in 0..10 {
            call(format!("steady-{j}")).await.expect("recovered");
        }
        assert_eq!(runs.get(), 4 + 1 + 10, "every key ran once, none twice");
        // A key whose first call failed is retried and runs once.
        call("down-0".into()).await.expect("retry after recovery");
        assert_eq!(runs.get(), 16);
    })
    .await;
}

// ---------------------------------------------------------------- hostile input

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_values_go_through_bind_parameters_only() {
    with_fixture(PgFixture::new(4).await, |fx| async move {
        let clock = ManualClock::starting_now();
        let idem = engine(&fx.store, &clock);
        let owner = "o'; DROP TABLE idem_records; --";
        let operation = "POST /\"x\"; SELECT pg_sleep(10); \\";
        let scope = Scope::new(owner, operation).expect("scope");
        let long_key: String = (0..255)
            .map(|i| ['\'', ';', '"', '\\', 'a', '%', '_', ' '][i % 8])
            .collect();
        let long_key = format!("k{}z", &long_key[2..]);
        assert_eq!(long_key.len(), 255);
        let first = idem
            .execute(&scope, long_key.as_str(), &request(), |_| async {
                Out::Success("one".into())
            })
            .await
            .expect("hostile values are data");
        assert!(!first.is_replay());
        let again = idem
            .execute(&scope, long_key.as_str(), &request(), |_| async {
                Out::Success("two".into())
            })
            .await
            .expect("replay");
        assert_eq!(again.into_result(), Ok("one".to_owned()));
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT owner, operation, key FROM {}",
            fx.table()
        )))
        .fetch_one(fx.store.pool())
        .await
        .expect("the table is still there, with one row");
        assert_eq!(row.get::<String, _>("owner"), owner);
        assert_eq!(row.get::<String, _>("operation"), operation);
        assert_eq!(row.get::<String, _>("key"), long_key);
        // A LIKE-ish neighbour owner never sees it.
        let other = Scope::new("o'; DROP TABLE idem_records; -%", operation).expect("scope");
        let mine = idem
            .execute(&other, long_key.as_str(), &request(), |_| async {
                Out::Success("other".into())
            })
            .await
            .expect("other owner");
        assert!(!mine.is_replay());
        assert!(
            Scope::new("own\0er", "op").is_err(),
            "NUL is refused before any SQL"
        );
        let too_long = "k".repeat(256);
        let err = idem
            .execute(&scope, too_long.as_str(), &request(), |_| async {
                Out::Success("x".into())
            })
            .await
            .expect_err("256 characters");
        assert_eq!(err.http_status(), 400);
        assert_eq!(count_rows(&fx, "idem_records").await, 2);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_and_schema_names_are_validated_and_configurable() {
    let fx = PgFixture::new(2).await;
    with_fixture(fx, |fx| async move {
        for bad in ["x; DROP TABLE y", "a\"b", "", "1t", "pg_x", "t-1"] {
            assert!(
                matches!(
                    fx.store.clone().with_table_name(bad),
                    Err(idem_postgres::Error::InvalidIdentifier { .. })
                ),
                "{bad:?}"
            );
            assert!(fx.store.clone().with_schema_name(bad).is_err(), "{bad:?}");
        }
        // `connect` builds its own pool; eight instances migrating at once
        // are serialized by the advisory lock, and migrating again is a no-op.
        let custom = PgStore::connect(&support::url())
            .await
            .expect("connect")
            .with_schema_name(&fx.schema)
            .expect("schema")
            .with_table_name("Payments_Idem")
            .expect("valid");
        let migrations: Vec<_> = (0..8)
            .map(|_| {
                let s = custom.clone();
                tokio::spawn(async move { s.migrate().await })
            })
            .collect();
        for m in migrations {
            m.await.expect("join").expect("concurrent migrate");
        }
        custom.migrate().await.expect("migrate is idempotent");
        let clock = ManualClock::starting_now();
        let idem = engine(&custom, &clock);
        idem.execute(&scope(), "k", &request(), |_| async {
            Out::Success("x".into())
        })
        .await
        .expect("call");
        assert_eq!(count_rows(&fx, "Payments_Idem").await, 1);
        assert_eq!(count_rows(&fx, "idem_records").await, 0);
        assert!(
            custom
                .migration_sql()
                .contains("\"Payments_Idem_key_expires_idx\"")
        );
        custom.pool().close().await;
    })
    .await;
}

// ---------------------------------------------------------------- corrupted rows

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_rows_are_typed_errors_not_panics() {
    with_fixture(PgFixture::new(2).await, |fx| async move {
        let clock = ManualClock::starting_now();
        let idem = engine(&fx.store, &clock);
        let scope = scope();
        for k in ["state", "fingerprint", "outcome"] {
            idem.execute(&scope, k, &request(), |_| async {
                Out::Success("x".into())
            })
            .await
            .expect("call");
        }
        let t = fx.table();
        let p = fx.store.table_name();
        for c in ["state_check", "fingerprint_check", "outcome_check"] {
            fx.store
                .pool()
                .execute(sqlx::AssertSqlSafe(format!(
                    "ALTER TABLE {t} DROP CONSTRAINT \"{p}_{c}\""
                )))
                .await
                .expect("drop check");
        }
        for (k, set) in [
            ("state", "state = 'exploded'"),
            ("fingerprint", "fingerprint = '\\x0102'::bytea"),
            ("outcome", "outcome = 'maybe'"),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "UPDATE {t} SET {set} WHERE key = $1"
            )))
            .bind(k)
            .execute(fx.store.pool())
            .await
            .expect("corrupt");
            let id = RecordId::new(scope.clone(), IdempotencyKey::parse(k).expect("key"));
            let fetched = fx.store.fetch(&id, clock.now()).await;
            assert!(
                matches!(fetched, Err(StoreError::Corrupt { .. })),
                "{k}: {fetched:?}"
            );
            let runs = Counter::default();
            let r = runs.clone();
            let err = idem
                .execute(&scope, k, &request(), move |_| async move {
                    r.hit();
                    Out::Success("no".into())
                })
                .await
                .expect_err("corrupt");
            assert!(matches!(err, Error::CorruptRecord { .. }), "{k}: {err:?}");
            assert_eq!(err.http_status(), 500);
            assert_eq!(
                runs.get(),
                0,
                "{k}: the work does not run over a corrupted record"
            );
        }
    })
    .await;
}

// ---------------------------------------------------------------- purge and indexes

/// The purge walks the sweep index, never the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_uses_the_sweep_index() {
    with_fixture(PgFixture::new(2).await, |fx| async move {
        let t = fx.table();
        let now: i64 = 1_000_000_000_000;
        // 20,000 live rows with bodies, 50 expired keys, 50 expired bodies.
        fx.store
            .pool()
            .execute(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {t} (owner, operation, key, fingerprint, state, token, attempt, lease_until,
                                  outcome, response, response_expires_at, key_expires_at)
                 SELECT 'o', 'op', 'k' || i, sha256(i::text::bytea), 'completed', i, 1, 0,
                        'success', '\\x00'::bytea,
                        CASE WHEN i % 400 = 1 THEN {now} - 1 ELSE {now} + i END,
                        CASE WHEN i % 400 = 0 THEN {now} - 1 ELSE {now} + 100000 + i END
                 FROM generate_series(1, 20000) AS i;
                 -- Where a purge has filed them: at the next expiry.
                 UPDATE {t} SET sweep_at = LEAST(response_expires_at, key_expires_at);
                 ANALYZE {t};"
            )))
            .await
            .expect("seed");
        let sql = idem_postgres::statements::purge(&fx.store).replace("$1", &now.to_string()).replace("$2", "100");
        let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN {sql}")))
            .fetch_all(fx.store.pool())
            .await
            .expect("explain");
        let plan = plan.join("\n");
        println!("{plan}");
        let p = fx.store.table_name();
        assert!(plan.contains(&format!("{p}_sweep_idx")), "the purge must walk the sweep index:\n{plan}");
        assert!(!plan.contains("Seq Scan"), "no sequential scan:\n{plan}");
        assert_eq!(plan.matches("Tid Scan").count(), 2, "the batch is then reached by ctid:\n{plan}");
        let clock = ManualClock::new(idem_core::clock::Timestamp::from_unix_millis(now));
        let idem = engine(&fx.store, &clock);
        let report = idem.admin().purge_expired(30).await.expect("purge");
        assert_eq!(report.keys_removed, 50);
        assert_eq!(report.bodies_dropped, 50);
        assert_eq!(count_rows(&fx, "idem_records").await, 20_000 - 50);
    })
    .await;
}

/// The operator listing walks the sweep index (an in-flight record sits at
/// its lease end), never the table, and pages through exactly the stuck
/// rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_listing_uses_the_sweep_index() {
    with_fixture(PgFixture::new(2).await, |fx| async move {
        let t = fx.table();
        let now: i64 = 1_000_000_000_000;
        // 20,000 completed rows, 30 stuck in flight, 30 in flight under a live lease.
        fx.store
            .pool()
            .execute(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {t} (owner, operation, key, fingerprint, state, token, attempt, lease_until,
                                  outcome, response, response_expires_at, key_expires_at)
                 SELECT 'o', 'op', 'k' || i, sha256(i::text::bytea),
                        CASE WHEN i <= 60 THEN 'in_flight' ELSE 'completed' END, i, 1,
                        CASE WHEN i <= 30 THEN {now} - i ELSE {now} + 60000 END,
                        CASE WHEN i <= 60 THEN NULL ELSE 'success' END, NULL, NULL, {now} + 100000
                 FROM generate_series(1, 20000) AS i;
                 -- In flight: at the lease end; completed: where a purge filed them.
                 UPDATE {t} SET sweep_at = CASE WHEN state = 'in_flight' THEN lease_until ELSE key_expires_at END;
                 ANALYZE {t};"
            )))
            .await
            .expect("seed");
        let sql = idem_postgres::statements::list_in_flight(&fx.store)
            .replace("$1", &now.to_string())
            .replace("$2", &now.to_string())
            .replace("$3", "8");
        let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN {sql}")))
            .fetch_all(fx.store.pool())
            .await
            .expect("explain");
        let plan = plan.join("\n");
        let p = fx.store.table_name();
        assert!(plan.contains(&format!("{p}_sweep_idx")), "listing must use its index:\n{plan}");
        assert!(!plan.contains("Seq Scan"), "no sequential scan:\n{plan}");
        let clock = ManualClock::new(idem_core::clock::Timestamp::from_unix_millis(now));
        let idem = engine(&fx.store, &clock);
        let (mut seen, mut cursor) = (Vec::new(), None);
        loop {
            let page = idem
                .admin().list_stuck(std::time::Duration::ZERO, cursor.as_ref(), 7)
                .await
                .expect("list");
            assert!(page.records.len() <= 7);
            seen.extend(page.records.into_iter().map(|r| r.id.key().as_str().to_owned()));
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        let want: Vec<String> = (1..=30).rev().map(|i| format!("k{i}")).collect();
        assert_eq!(seen, want, "oldest lease first, each once");
    })
    .await;
}

// ---------------------------------------------------------------- HOT completions and the upgrade

/// `(n_tup_upd, n_tup_hot_upd)` of the fixture's table, as seen after this
/// backend's own pending counters are flushed (the pool has one connection,
/// so every statement of the test ran on it).
async fn update_counts(fx: &PgFixture) -> (i64, i64) {
    let pool = fx.store.pool();
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(pool)
        .await
        .expect("flush");
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = '{}'::regclass",
        fx.table()
    )))
    .fetch_one(pool)
    .await
    .expect("stats");
    (row.get(0), row.get(1))
}

/// A completion changes no indexed column, so Postgres updates the row in
/// place (HOT): no new index entry per completion. A scripted run of 300
/// fresh keys on one connection: one update each, nearly all HOT (a
/// completion misses only when its page filled up since the claim).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_are_hot_updates() {
    with_fixture(PgFixture::new(1).await, |fx| async move {
        let clock = ManualClock::starting_now();
        let idem = engine(&fx.store, &clock);
        let scope = scope();
        let (upd0, hot0) = update_counts(&fx).await;
        for i in 0..300 {
            idem.execute(&scope, format!("k{i}").as_str(), &request(), |_| async {
                Out::Success("a 256-byte body would do the same".into())
            })
            .await
            .expect("fresh");
        }
        let (upd, hot) = update_counts(&fx).await;
        let (upd, hot) = (upd - upd0, hot - hot0);
        println!("300 fresh keys: {upd} updates, {hot} HOT");
        assert_eq!(upd, 300, "one update (the completion) per fresh key");
        assert!(
            hot >= 285,
            "at least 95 % of completions HOT: {hot} of {upd}"
        );
    })
    .await;
}

/// A table made by the first migration (three expiry and in-flight indexes,
/// no `sweep_at`) is upgraded in place by `migrate`: records survive, an
/// in-flight one keeps its place in the stuck list, the old indexes go, and
/// a purge re-files or removes the old records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_upgrades_a_first_version_table() {
    let schema = support::schema_name();
    let pool = support::pool(2, support::options()).await;
    let store = PgStore::new(pool.clone())
        .with_schema_name(&schema)
        .expect("schema");
    let fx = PgFixture {
        store: store.clone(),
        schema: schema.clone(),
    };
    with_fixture(fx, |fx| async move {
        let t = fx.table();
        let v1 = include_str!("../migrations/0001_idem.sql")
            .replace("{schema}", &format!("\"{}\"", fx.schema))
            .replace("{table}", "\"idem_records\"")
            .replace("{prefix}", "idem_records");
        let now: i64 = 1_000_000_000_000;
        fx.store
            .pool()
            .execute(sqlx::AssertSqlSafe(format!(
                "{v1};
                 INSERT INTO {t} (owner, operation, key, fingerprint, state, token, attempt, lease_until,
                                  outcome, response, response_expires_at, key_expires_at)
                 VALUES ('o', 'op', 'stuck', sha256('1'), 'in_flight', 1, 1, {now} - 10, NULL, NULL, NULL, {now} + 1000),
                        ('o', 'op', 'live', sha256('2'), 'completed', 2, 1, {now} - 500, 'success', '\\x01', {now} + 500, {now} + 1000),
                        ('o', 'op', 'old-body', sha256('3'), 'completed', 3, 1, {now} - 500, 'success', '\\x01', {now} - 1, {now} + 1000),
                        ('o', 'op', 'expired', sha256('4'), 'completed', 4, 1, {now} - 500, 'success', '\\x01', {now} - 1, {now} - 1);"
            )))
            .await
            .expect("a first-version table");
        fx.store.migrate().await.expect("upgrade");
        fx.store.migrate().await.expect("upgrade again: idempotent");
        let indexes: Vec<String> = sqlx::query_scalar(
            "SELECT indexname::text FROM pg_indexes WHERE schemaname = $1 ORDER BY 1",
        )
        .bind(&fx.schema)
        .fetch_all(fx.store.pool())
        .await
        .expect("indexes");
        assert_eq!(indexes, ["idem_records_pkey", "idem_records_sweep_idx"]);
        let sweep: Vec<(String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT key, sweep_at FROM {t} ORDER BY key"
        )))
        .fetch_all(fx.store.pool())
        .await
        .expect("sweep_at");
        assert_eq!(
            sweep,
            [
                ("expired".to_owned(), 0),
                ("live".to_owned(), 0),
                ("old-body".to_owned(), 0),
                ("stuck".to_owned(), now - 10)
            ],
            "in-flight records at their lease end, the rest due now"
        );
        let clock = ManualClock::new(idem_core::clock::Timestamp::from_unix_millis(now));
        let idem = engine(&fx.store, &clock);
        let stuck = idem
            .admin().list_stuck(Duration::ZERO, None, 10)
            .await
            .expect("stuck list");
        let keys: Vec<&str> = stuck.records.iter().map(|r| r.id.key().as_str()).collect();
        assert_eq!(keys, ["stuck"]);
        let report = idem.admin().purge_expired(1).await.expect("purge");
        assert_eq!((report.keys_removed, report.bodies_dropped), (1, 1));
        let sweep: Vec<(String, i64, bool)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT key, sweep_at, response IS NOT NULL FROM {t} ORDER BY key"
        )))
        .fetch_all(fx.store.pool())
        .await
        .expect("sweep_at");
        assert_eq!(
            sweep,
            [
                ("live".to_owned(), now + 500, true),
                ("old-body".to_owned(), now + 1000, false),
                ("stuck".to_owned(), now - 10, false)
            ],
            "re-filed at the next expiry; the stuck record stays at its lease end"
        );
        // The upgraded table serves calls.
        idem.execute(&scope(), "after-upgrade", &request(), |_| async {
            Out::Success("x".into())
        })
        .await
        .expect("call");
    })
    .await;
}

/// `migrate` runs at every start, while other instances write: on a table it
/// has already brought up to date it builds nothing and takes no lock that
/// waits for a writer. A transaction holding an uncommitted insert (the
/// `ROW EXCLUSIVE` lock every write takes) stays open across it. Before this
/// held, the first file rebuilt three indexes the second one then dropped,
/// and `CREATE INDEX IF NOT EXISTS` waited for the writer even when the index
/// was there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_again_neither_rebuilds_nor_waits_for_writers() {
    let fx = PgFixture::new(2).await;
    with_fixture(fx, |fx| async move {
        let t = fx.table();
        let oids = |pool: sqlx::PgPool, schema: String| async move {
            sqlx::query_as::<_, (String, sqlx::postgres::types::Oid)>(
                "SELECT c.relname::text, c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relkind = 'i' ORDER BY 1",
            )
            .bind(schema)
            .fetch_all(&pool)
            .await
            .expect("indexes")
        };
        let before = oids(fx.store.pool().clone(), fx.schema.clone()).await;
        let mut writer = fx.store.pool().acquire().await.expect("connection");
        writer
            .execute(sqlx::AssertSqlSafe(format!(
                "BEGIN; INSERT INTO {t} (owner, operation, key, fingerprint, state, token, attempt, lease_until, key_expires_at) \
                 VALUES ('o', 'op', 'held', sha256('x'), 'in_flight', 1, 1, 1, 1)"
            )))
            .await
            .expect("an open write");
        let again = tokio::time::timeout(Duration::from_secs(20), fx.store.migrate()).await;
        writer.execute("ROLLBACK").await.expect("rollback");
        again
            .expect("migrate must not wait for the open writer")
            .expect("migrate");
        let after = oids(fx.store.pool().clone(), fx.schema.clone()).await;
        assert_eq!(before, after, "the same indexes, none rebuilt");
        assert_eq!(
            after.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ["idem_records_pkey", "idem_records_sweep_idx"]
        );
    })
    .await;
}

// ---------------------------------------------------------------- statements per transition

/// Counts the statements and round trips each transition sends, through a
/// counting proxy, on a warm connection (statements already prepared).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_statement_per_transition() {
    let proxy = Proxy::start(support::upstream().await).await;
    let options = support::via(&proxy);
    let pool = support::pool(1, options).await;
    let schema = support::schema_name();
    let store = PgStore::new(pool)
        .with_schema_name(&schema)
        .expect("schema");
    store.migrate().await.expect("migrate");
    let fx = PgFixture { store, schema };
    with_fixture(fx, move |fx| async move {
        let store = fx.store.clone();
        let clock = ManualClock::starting_now();
        let idem = engine(&store, &clock);
        let scope = scope();
        let fp = fingerprint(scope.operation(), &request(), &FieldFilter::All).expect("fp");
        let measure =
            |name: &'static str, before: Snapshot, after: Snapshot, rows: &mut Vec<String>| {
                let d = after - before;
                rows.push(format!(
                    "{name:<34} statements {}  round trips {}  (+{} release ping)",
                    d.statements(),
                    d.round_trips(),
                    d.ping
                ));
                d
            };
        let mut rows = Vec::new();
        // Round trips count what the caller waits for; sqlx also pings each
        // connection as it goes back to the pool (a bare Sync, no statement),
        // reported separately.
        // Two passes: the first prepares every statement on the connection,
        // the second is what a warm pool pays.
        for pass in 0..2 {
            let id = RecordId::new(scope.clone(), IdempotencyKey::random());
            let (t1, t2) = (Token::random(), Token::random());
            let now = clock.now();
            let req = |t| {
                ClaimRequest::new(
                    &id,
                    fp,
                    t,
                    now,
                    now.plus(LEASE),
                    now.plus(Duration::from_secs(86_400)),
                )
            };
            let done = Completion::new(
                OutcomeKind::Success,
                Some(b"body"),
                None,
                now,
                now.plus(Duration::from_secs(3600)),
                now.plus(Duration::from_secs(86_400)),
            );
            let mut r = Vec::new();
            let s = proxy.snapshot();
            store.claim(&req(t1)).await.expect("claim");
            let claim = measure("claim (fresh)", s, proxy.snapshot(), &mut r);
            let s = proxy.snapshot();
            store
                .save_resource_id(&id, t1, "ch")
                .await
                .expect("save_resource_id");
            let save_resource_id = measure("save_resource_id", s, proxy.snapshot(), &mut r);
            let s = proxy.snapshot();
            store
                .extend_lease(&id, t1, now.plus(LEASE * 2))
                .await
                .expect("extend");
            let extend = measure("extend_lease", s, proxy.snapshot(), &mut r);
            let s = proxy.snapshot();
            store.release(&id, t1, now).await.expect("release");
            let release = measure("release", s, proxy.snapshot(), &mut r);
            let s = proxy.snapshot();
            store.claim(&req(t2)).await.expect("takeover");
            let takeover = measure("claim (takeover of released)", s, proxy.snapshot(), &mut r);
            let s = proxy.snapshot();
            store.complete(&id, t2, &done).await.expect("complete");
            let complete = measure("complete", s, proxy.snapshot(), &mut r);
            let s = proxy.snapshot();
            let existing = store.claim(&req(Token::random())).await.expect("replay");
            assert!(matches!(existing, ClaimOutcome::Existing(_)));
            let replay = measure("claim → existing (replay)", s, proxy.snapshot(), &mut r);
            let s = proxy.snapshot();
            store.fetch(&id, now).await.expect("fetch");
            let fetch = measure("fetch", s, proxy.snapshot(), &mut r);
            let s = proxy.snapshot();
            store.purge_expired(now, 100).await.expect("purge");
            let purge = measure("purge_expired (one batch)", s, proxy.snapshot(), &mut r);
            let key = IdempotencyKey::random();
            let s = proxy.snapshot();
            idem.execute(&scope, &key, &request(), |_| async {
                Out::Success("x".into())
            })
            .await
            .expect("execute");
            let fresh = measure("Idem::execute, fresh key", s, proxy.snapshot(), &mut r);
            let s = proxy.snapshot();
            idem.execute(&scope, &key, &request(), |_| async {
                Out::Success("x".into())
            })
            .await
            .expect("replay");
            let replayed = measure("Idem::execute, replay", s, proxy.snapshot(), &mut r);
            let key = IdempotencyKey::random();
            let s = proxy.snapshot();
            idem.execute_in_tx(&scope, &key, &request(), |_, _| {
                Box::pin(async { Out::Success("x".into()) })
            })
            .await
            .expect("tx");
            let tx_fresh = measure("execute_in_tx, fresh key", s, proxy.snapshot(), &mut r);
            let s = proxy.snapshot();
            idem.execute_in_tx(&scope, &key, &request(), |_, _| {
                Box::pin(async { Out::Success("x".into()) })
            })
            .await
            .expect("tx replay");
            let tx_replay = measure("execute_in_tx, replay", s, proxy.snapshot(), &mut r);
            if pass == 1 {
                for d in [
                    claim,
                    save_resource_id,
                    extend,
                    release,
                    complete,
                    replay,
                    fetch,
                    purge,
                ] {
                    assert_eq!(
                        (d.statements(), d.round_trips(), d.parse),
                        (1, 1, 0),
                        "{d:?}\n{}",
                        r.join("\n")
                    );
                }
                // The rare path: the claim reads the released record, then
                // takes it over (on the same checkout).
                assert_eq!(
                    (
                        takeover.statements(),
                        takeover.round_trips(),
                        takeover.parse
                    ),
                    (2, 2, 0),
                    "{takeover:?}"
                );
                assert_eq!((fresh.statements(), fresh.round_trips()), (2, 2));
                assert_eq!((replayed.statements(), replayed.round_trips()), (1, 1));
                // BEGIN+SET LOCAL (one simple query), claim, complete, COMMIT.
                assert_eq!((tx_fresh.statements(), tx_fresh.round_trips()), (4, 4));
                // BEGIN+SET LOCAL, claim, ROLLBACK.
                assert_eq!((tx_replay.statements(), tx_replay.round_trips()), (3, 3));
                rows = r;
            }
        }
        println!(
            "statements per transition (warm connection):\n{}",
            rows.join("\n")
        );
    })
    .await;
}
