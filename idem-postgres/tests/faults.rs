//! Faults against the real server: the SQL suite's backend killed
//! mid-call (`pg_terminate_backend`) and every connection dropped (through a
//! proxy), then what only Postgres has here: a statement cut short by the
//! call timeout, and an idle connection the server terminates. Typed errors,
//! never a second execution, and a pool that recovers by itself.

mod support;

use std::time::Duration;

use idem_core::clock::{Clock, ManualClock};
use idem_core::store::RecordState;
use idem_core::store::{ClaimOutcome, Store, StoreError};
use idem_core::{IdempotencyKey, RecordId};
use idem_postgres::sqlx;
use idem_test_support::sql::claim_request;
use idem_test_support::sql::{scope, with_fixture};
use support::PgFixture;
use support::proxy::{Protocol, Proxy};

idem_test_support::sql_suite!(crate::support::Pg;
    killed_connection_mid_statement,
    pool_recovers_after_connections_are_dropped,
    a_sqlx_pool_recovers_after_connections_are_dropped,
);

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
    let app = support::app_name();
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
