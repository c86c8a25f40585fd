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
use idem_postgres::sqlx;
use idem_test_support::sql::claim_request;
use support::PgFixture;
use support::proxy::{Protocol, Proxy};
use support::scenario::{Counter, LEASE, Out, policy, request, scope, with_fixture};

idem_test_support::sql_suite!(crate::support::Pg;
    pool_recovers_after_connections_are_dropped,
    a_sqlx_pool_recovers_after_connections_are_dropped,
);

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

/// A statement cut short (the call's timeout passed while the proxy held
/// its bytes) leaves its connection in flight: it keeps its place in the
/// store's pool (of one), is waited for and pinged once the server answers,
/// and then serves the next call, which gets its own answer, not the cut
/// statement's. No connection is opened for it, and only that one ping goes
/// on the wire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_cut_short_is_awaited_and_pinged_before_its_connection_serves_again() {
    let proxy = Proxy::start(support::upstream().await, Protocol::Postgres).await;
    let fx = PgFixture::with_options(1, support::via(&proxy)).await;
    with_fixture(fx, move |fx| async move {
        let store = fx
            .store
            .clone()
            .with_call_timeout(Duration::from_millis(200));
        let now = ManualClock::starting_now().now();
        let scope = scope();
        let key = |k: &str| RecordId::new(scope.clone(), IdempotencyKey::parse(k).expect("key"));
        let (a, b, c) = (key("a"), key("b"), key("c"));
        let claimed = store.claim(&claim_request(&a, now)).await.expect("claim a");
        assert!(matches!(claimed, ClaimOutcome::Claimed(_)));
        assert!(store.fetch(&c, now).await.expect("fetch c").is_none());

        let before = proxy.snapshot();
        proxy.set_stalled(true);
        let cut = store
            .claim(&claim_request(&b, now))
            .await
            .expect_err("held by the proxy past the call timeout");
        assert!(matches!(cut, StoreError::Unavailable { .. }), "{cut:?}");
        proxy.set_stalled(false);

        // The pool's one connection is the cut one: this call waits for it.
        let rec = store
            .fetch(&a, now)
            .await
            .expect("fetch a")
            .expect("a is stored");
        assert_eq!(rec.state, RecordState::InFlight);
        assert!(
            store.fetch(&c, now).await.expect("fetch c").is_none(),
            "c was never claimed"
        );
        let d = proxy.snapshot() - before;
        assert_eq!(d.connections, 0, "the connection was kept: {d:?}");
        assert_eq!(d.ping, 1, "re-validated with one ping: {d:?}");
        assert_eq!(d.execute, 3, "the cut claim and the two reads: {d:?}");
        // The cut claim reached the server once released (it was never
        // reported stored: its record waits for its lease, as documented).
        let b = store.fetch(&b, now).await.expect("fetch b").expect("b");
        assert_eq!(b.state, RecordState::InFlight);
    })
    .await;
}

/// The server terminates the store's connection while it is idle
/// (`pg_terminate_backend`): at most the next call fails, typed 503; the
/// connection is replaced, not handed out again, and the calls after it
/// succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_the_server_terminates_fails_at_most_one_call() {
    let app = app_name();
    let fx = PgFixture::with_options(1, support::options().application_name(&app)).await;
    with_fixture(fx, move |fx| async move {
        let now = ManualClock::starting_now().now();
        let scope = scope();
        let key = |k: String| RecordId::new(scope.clone(), IdempotencyKey::parse(&k).expect("key"));
        let warm = key("warm".to_owned());
        fx.store
            .claim(&claim_request(&warm, now))
            .await
            .expect("warm");

        let admin = support::pool(1, support::options()).await;
        let killed: i64 = sqlx::query_scalar(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000)) \
             FROM pg_stat_activity WHERE application_name = $1",
        )
        .bind(&app)
        .fetch_one(&admin)
        .await
        .expect("terminate");
        admin.close().await;
        assert!(killed >= 1, "the store's connection was terminated");

        let mut outcomes = Vec::new();
        for i in 0..4 {
            let id = key(format!("after-{i}"));
            outcomes.push(fx.store.claim(&claim_request(&id, now)).await);
        }
        match &outcomes[0] {
            Ok(ClaimOutcome::Claimed(_)) | Err(StoreError::Unavailable { .. }) => {}
            other => panic!("the first call after the kill: {other:?}"),
        }
        for (i, o) in outcomes.iter().enumerate().skip(1) {
            assert!(
                matches!(o, Ok(ClaimOutcome::Claimed(_))),
                "call {i} after the kill: {o:?}"
            );
        }
    })
    .await;
}
