//! Faults against the real server: the SQL suite's backend killed
//! mid-call (`pg_terminate_backend`) and every connection dropped (through a
//! proxy), then what only Postgres has here: a statement cut short by the
//! call timeout, an idle connection the server terminates, and a completion
//! the store never took, reconciled from the saved resource id. Typed
//! errors, never a second execution (or effect), and a pool that recovers
//! by itself.

mod support;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use idem_core::clock::{Clock, ManualClock};
use idem_core::store::RecordState;
use idem_core::store::{ClaimOutcome, Store, StoreError};
use idem_core::{Attempt, Idem, IdempotencyKey, RecordId};
use idem_postgres::PgStore;
use idem_postgres::sqlx::{self, postgres::PgPoolOptions};
use idem_test_support::sql::ServerDialect;
use idem_test_support::sql::{Counter, LEASE, Out, claim_request, policy, request};
use idem_test_support::sql::{scope, with_fixture};
use support::Pg;
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
    let fx = Pg.fixture(1, support::via(&proxy)).await;
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
    let fx = Pg
        .fixture(1, support::options().application_name(&app))
        .await;
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

/// An orders ledger that is not the store: what an order's handler creates.
#[derive(Debug, Clone, Default)]
struct Ledger(Arc<Mutex<Vec<String>>>);

impl Ledger {
    /// A new order; its id.
    fn create(&self) -> String {
        let mut orders = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let id = format!("ord_{}", orders.len() + 1);
        orders.push(id.clone());
        id
    }

    fn find(&self, id: &str) -> Option<String> {
        let orders = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        orders.iter().find(|o| *o == id).cloned()
    }

    fn created(&self) -> usize {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// The order handler: a recovery given a saved resource id reconciles from
/// it (the order it names, from the ledger); any other attempt creates an
/// order and saves its id before answering.
async fn place_order(attempt: Attempt, ledger: Ledger, runs: Counter) -> Out {
    runs.hit();
    if let Some(id) = attempt.previous_resource_id() {
        return ledger.find(id).map_or_else(
            || Out::Failure(format!("{id}: not in the ledger")),
            Out::Success,
        );
    }
    let id = ledger.create();
    match attempt.save_resource_id(&id).await {
        Ok(()) => Out::Success(id),
        Err(e) => Out::Transient(e.to_string()),
    }
}

/// A handler saved its order's id, then the store became unreachable
/// (every connection cut, new ones refused) before the outcome could be
/// stored, and stayed so until the lease ended: the caller got the order,
/// pending; the engine kept the completion in the background and gave it up
/// at the lease's end. The retry after the lease runs as a recovery, is
/// given the saved id and reconciles from it: one order created, and the
/// reply (then every replay) carries the first order's id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_reconciles_from_the_saved_resource_id_when_the_completion_was_lost() {
    let started = Instant::now();
    let proxy = Proxy::start(support::upstream().await, Protocol::Postgres).await;
    // A short acquire timeout: with the server unreachable, a call fails in
    // a second, not ten.
    let options = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(1));
    let store = PgStore::connect_with(options, support::via(&proxy))
        .await
        .expect("connect through the proxy");
    let fx = Pg.isolate(store, support::options(), true).await;
    let proxy = Arc::new(proxy);
    with_fixture(fx, move |fx| async move {
        let clock = ManualClock::starting_now();
        let engine = Idem::new(fx.store.clone())
            .with_clock(clock.clone())
            .with_policy(policy(2));
        let (scope, ledger, runs) = (scope(), Ledger::default(), Counter::default());
        // `cut`: the store goes away once the handler has answered (its id
        // saved), before the outcome is written.
        let order = |cut: Option<Arc<Proxy>>| {
            let (ledger, runs) = (ledger.clone(), runs.clone());
            move |attempt: Attempt| async move {
                let out = place_order(attempt, ledger, runs).await;
                if let Some(proxy) = cut {
                    proxy.set_down(true);
                    proxy.kill_all();
                }
                out
            }
        };

        let first = engine
            .execute(
                &scope,
                "order-1",
                &request(),
                order(Some(Arc::clone(&proxy))),
            )
            .await
            .expect("the handler's answer");
        assert!(first.is_pending() && !first.is_stored(), "{first:?}");
        assert_eq!(first.outcome(), &Out::Success("ord_1".to_owned()));
        assert_eq!(engine.pending_completions(), 1, "kept in the background");

        // Unreachable until the lease ends: the background write gives up.
        clock.advance(LEASE + Duration::from_secs(1));
        assert_eq!(
            engine.drain_completions(Duration::from_secs(10)).await,
            0,
            "given up at the lease's end"
        );
        proxy.set_down(false);
        let left = engine
            .admin()
            .inspect(&scope, "order-1", false)
            .await
            .expect("inspect")
            .expect("the record");
        assert_eq!(
            (left.state, left.resource_id.as_deref()),
            (RecordState::InFlight, Some("ord_1")),
            "the claim and the saved id, no outcome"
        );

        let recovered = engine
            .execute(&scope, "order-1", &request(), order(None))
            .await
            .expect("the recovery's answer");
        assert!(
            recovered.is_stored() && !recovered.is_replay(),
            "{recovered:?}"
        );
        assert_eq!(recovered.attempt(), 2, "a second attempt: the recovery");
        assert_eq!(recovered.outcome(), first.outcome(), "the first order");
        let replayed = engine
            .execute(&scope, "order-1", &request(), order(None))
            .await
            .expect("replayed");
        assert!(replayed.is_replay(), "{replayed:?}");
        assert_eq!(replayed.outcome(), first.outcome());
        assert_eq!(ledger.created(), 1, "one order created");
        assert_eq!(runs.get(), 2, "the first run and the reconciling recovery");
        eprintln!(
            "recovery from the saved resource id: {:?}",
            started.elapsed()
        );
    })
    .await;
}
