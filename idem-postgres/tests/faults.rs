//! Faults against the real server: a backend killed mid-call, every
//! connection dropped. Typed errors, never a second execution, and a pool
//! that recovers by itself.

mod support;

use std::time::Duration;

use idem_core::adapter::fingerprint;
use idem_core::clock::{Clock, ManualClock};
use idem_core::ops::RecordState;
use idem_core::store::{ClaimOutcome, ClaimRequest, Store, StoreError, Token};
use idem_core::{Error, FieldFilter, Idem, IdempotencyKey, RecordId};
use idem_postgres::{PgStore, sqlx};
use support::PgFixture;
use support::proxy::Proxy;
use support::scenario::{Counter, LEASE, Out, engine, policy, request, scope, with_fixture};

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
