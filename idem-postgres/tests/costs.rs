//! What each transition costs on the wire: statements and round trips,
//! counted through a proxy on a warm connection, and what goes on the wire
//! between the calls (sqlx's pool pings each connection it takes back; the
//! store's own pool does not).

mod support;

use std::time::Duration;

use idem_core::adapter::fingerprint;
use idem_core::clock::{Clock, ManualClock};
use idem_core::store::OutcomeKind;
use idem_core::store::{ClaimOutcome, ClaimRequest, Completion, Store, Token};
use idem_core::{FieldFilter, IdempotencyKey, RecordId};
use idem_postgres::sqlx::PgPool;
use idem_postgres::{PgIdemExt, PgStore};
use support::PgFixture;
use support::proxy::{Proxy, Snapshot};
use support::scenario::{LEASE, Out, engine, request, scope, with_fixture};

/// Counts the statements and round trips each transition sends, through a
/// counting proxy, on a warm connection (statements already prepared), for
/// a store with a pool of its own (`PgStore::connect_with`): no ping on the
/// wire, before, between or after the calls (the transactional mode
/// included, which runs on the same pool).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_statement_per_transition() {
    let proxy = Proxy::start(support::upstream().await).await;
    let store = support::connect(1, support::via(&proxy)).await;
    transitions(store, proxy, Pings::None).await;
}

/// The same through a store over the caller's own sqlx pool
/// (`PgStore::new`): the same statements, and sqlx's ping as each
/// connection goes back to that pool, one per checkout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_over_a_sqlx_pool_pays_its_ping_per_checkout() {
    let proxy = Proxy::start(support::upstream().await).await;
    let store = PgStore::new(support::pool(1, support::via(&proxy)).await);
    transitions(store, proxy, Pings::OnePerCheckout).await;
}

/// What each store is expected to send between statements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pings {
    None,
    OnePerCheckout,
}

/// Waits until every connection of the store's sqlx pool is idle again,
/// i.e. until sqlx's return ping (a spawned task) was answered, then a
/// little longer for anything else that would go on the wire after a call.
async fn settle(pool: &PgPool) {
    for _ in 0..500 {
        if usize::try_from(pool.size()).ok() == Some(pool.num_idle()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
}

async fn transitions(store: PgStore, proxy: Proxy, pings: Pings) {
    let schema = support::schema_name();
    let store = store.with_schema_name(&schema).expect("schema");
    store.migrate().await.expect("migrate");
    let fx = PgFixture { store, schema };
    with_fixture(fx, move |fx| async move {
        let proxy = &proxy;
        let store = fx.store.clone();
        let clock = ManualClock::starting_now();
        let idem = engine(&store, &clock);
        let scope = scope();
        let fp = fingerprint(scope.operation(), &request(), &FieldFilter::All).expect("fp");
        let measure = async |name: &'static str, before: Snapshot, rows: &mut Vec<String>| {
            settle(store.pool()).await;
            let d = proxy.snapshot() - before;
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
        // connection as it goes back to its pool (a bare Sync, no statement),
        // reported separately, and counted once the pool is idle again.
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
            let claim = measure("claim (fresh)", s, &mut r).await;
            let s = proxy.snapshot();
            store
                .save_resource_id(&id, t1, "ch")
                .await
                .expect("save_resource_id");
            let save_resource_id = measure("save_resource_id", s, &mut r).await;
            let s = proxy.snapshot();
            store
                .extend_lease(&id, t1, now.plus(LEASE * 2))
                .await
                .expect("extend");
            let extend = measure("extend_lease", s, &mut r).await;
            let s = proxy.snapshot();
            store.release(&id, t1, now).await.expect("release");
            let release = measure("release", s, &mut r).await;
            let s = proxy.snapshot();
            store.claim(&req(t2)).await.expect("takeover");
            let takeover = measure("claim (takeover of released)", s, &mut r).await;
            let s = proxy.snapshot();
            store.complete(&id, t2, &done).await.expect("complete");
            let complete = measure("complete", s, &mut r).await;
            let s = proxy.snapshot();
            let existing = store.claim(&req(Token::random())).await.expect("replay");
            assert!(matches!(existing, ClaimOutcome::Existing(_)));
            let replay = measure("claim → existing (replay)", s, &mut r).await;
            let s = proxy.snapshot();
            store.fetch(&id, now).await.expect("fetch");
            let fetch = measure("fetch", s, &mut r).await;
            let s = proxy.snapshot();
            store.purge_expired(now, 100).await.expect("purge");
            let purge = measure("purge_expired (one batch)", s, &mut r).await;
            let key = IdempotencyKey::random();
            let s = proxy.snapshot();
            idem.execute(&scope, &key, &request(), |_| async {
                Out::Success("x".into())
            })
            .await
            .expect("execute");
            let fresh = measure("Idem::execute, fresh key", s, &mut r).await;
            let s = proxy.snapshot();
            idem.execute(&scope, &key, &request(), |_| async {
                Out::Success("x".into())
            })
            .await
            .expect("replay");
            let replayed = measure("Idem::execute, replay", s, &mut r).await;
            let key = IdempotencyKey::random();
            let s = proxy.snapshot();
            idem.execute_in_tx(&scope, &key, &request(), |_, _| {
                Box::pin(async { Out::Success("x".into()) })
            })
            .await
            .expect("tx");
            let tx_fresh = measure("execute_in_tx, fresh key", s, &mut r).await;
            let s = proxy.snapshot();
            idem.execute_in_tx(&scope, &key, &request(), |_, _| {
                Box::pin(async { Out::Success("x".into()) })
            })
            .await
            .expect("tx replay");
            let tx_replay = measure("execute_in_tx, replay", s, &mut r).await;
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
                // Between the statements: nothing, or sqlx's ping per checkout
                // (the transactional mode runs on the store's one pool too).
                let per_checkout = u64::from(pings == Pings::OnePerCheckout);
                for d in [
                    claim,
                    save_resource_id,
                    extend,
                    release,
                    takeover,
                    complete,
                    replay,
                    fetch,
                    purge,
                    replayed,
                ] {
                    assert_eq!(d.ping, per_checkout, "{d:?}\n{}", r.join("\n"));
                }
                assert_eq!(fresh.ping, 2 * per_checkout, "{}", r.join("\n"));
                assert_eq!(
                    (tx_fresh.ping, tx_replay.ping),
                    (per_checkout, per_checkout)
                );
                rows = r;
            }
        }
        println!(
            "statements per transition (warm connection, {pings:?}):\n{}",
            rows.join("\n")
        );
    })
    .await;
}
