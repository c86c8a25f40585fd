//! What each transition costs on the wire: statements and round trips,
//! counted through a proxy on a warm connection, for both claim paths
//! (MariaDB's `INSERT … RETURNING`, and the portable MySQL statements).

mod support;

use std::time::Duration;

use idem_core::adapter::fingerprint;
use idem_core::clock::{Clock, ManualClock};
use idem_core::store::OutcomeKind;
use idem_core::store::{ClaimOutcome, ClaimRequest, Completion, Store, Token};
use idem_core::{FieldFilter, IdempotencyKey, RecordId};
use idem_mysql::sqlx::MySqlPool;
use idem_mysql::{MySqlIdemExt, MySqlStore, Server};
use support::MyFixture;
use support::proxy::{Proxy, Snapshot};
use support::scenario::{LEASE, Out, engine, request, scope, with_fixture};

/// (statements, round trips) of every transition, on one warm connection.
#[derive(Debug)]
struct Costs {
    claim: Snapshot,
    save_resource_id: Snapshot,
    extend: Snapshot,
    release: Snapshot,
    takeover: Snapshot,
    complete: Snapshot,
    replay: Snapshot,
    fetch: Snapshot,
    purge: Snapshot,
    fresh: Snapshot,
    replayed: Snapshot,
    tx_fresh: Snapshot,
    tx_replay: Snapshot,
}

/// Waits until every connection of the store's sqlx pool is idle again,
/// i.e. until sqlx's return ping (a spawned task) was answered, then a
/// little longer for anything else that would go on the wire after a call.
async fn settle(pool: &MySqlPool) {
    for _ in 0..500 {
        if usize::try_from(pool.size()).ok() == Some(pool.num_idle()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// The costs of every transition through a store built by `connect_with`
/// (`own_pool`: the calls on idem-sqlx's pool) or over a sqlx pool.
async fn measure(server: Server, own_pool: bool) -> Costs {
    let proxy = Proxy::start(support::upstream().await).await;
    let table = support::unique("idem_costs");
    let store = if own_pool {
        support::connect(1, support::via(&proxy)).await
    } else {
        MySqlStore::new(support::pool(1, support::via(&proxy)).await)
    };
    let store = store
        .with_table_name(&table)
        .expect("table")
        .with_server(server);
    store.migrate().await.expect("migrate");
    let fx = MyFixture { store, table };
    let (tx, rx) = tokio::sync::oneshot::channel();
    with_fixture(fx, move |fx| async move {
        let store = fx.store.clone();
        let clock = ManualClock::starting_now();
        let idem = engine(&store, &clock);
        let scope = scope();
        let fp = fingerprint(scope.operation(), &request(), &FieldFilter::All).expect("fp");
        let mut rows = Vec::new();
        let mut costs = None;
        // Round trips count what the caller waits for; sqlx also pings each
        // connection as it goes back to the pool (`COM_PING`), reported
        // separately. Two passes: the first prepares every statement on the
        // connection, the second is what a warm pool pays.
        for pass in 0..2 {
            let mut r = Vec::new();
            let mut m = async |name: &str, before: Snapshot| {
                settle(store.pool()).await;
                let d = proxy.snapshot() - before;
                r.push(format!(
                    "{name:<34} statements {}  round trips {}  (+{} release ping, {} prepared)",
                    d.statements(),
                    d.round_trips(),
                    d.ping,
                    d.prepare
                ));
                d
            };
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
            let s = proxy.snapshot();
            store.claim(&req(t1)).await.expect("claim");
            let claim = m("claim (fresh)", s).await;
            let s = proxy.snapshot();
            store
                .save_resource_id(&id, t1, "ch")
                .await
                .expect("save_resource_id");
            let save_resource_id = m("save_resource_id", s).await;
            let s = proxy.snapshot();
            store
                .extend_lease(&id, t1, now.plus(LEASE * 2))
                .await
                .expect("extend");
            let extend = m("extend_lease", s).await;
            let s = proxy.snapshot();
            store.release(&id, t1, now).await.expect("release");
            let release = m("release", s).await;
            let s = proxy.snapshot();
            let took = store.claim(&req(t2)).await.expect("takeover");
            assert!(matches!(took, ClaimOutcome::Claimed(c) if c.attempt == 2));
            let takeover = m("claim (takeover of released)", s).await;
            let s = proxy.snapshot();
            store.complete(&id, t2, &done).await.expect("complete");
            let complete = m("complete", s).await;
            let s = proxy.snapshot();
            let existing = store.claim(&req(Token::random())).await.expect("replay");
            assert!(matches!(existing, ClaimOutcome::Existing(_)));
            let replay = m("claim → existing (replay)", s).await;
            let s = proxy.snapshot();
            store.fetch(&id, now).await.expect("fetch");
            let fetch = m("fetch", s).await;
            let s = proxy.snapshot();
            store.purge_expired(now, 100).await.expect("purge");
            let purge = m("purge_expired (nothing due)", s).await;
            let key = IdempotencyKey::random();
            let s = proxy.snapshot();
            idem.execute(&scope, &key, &request(), |_| async {
                Out::Success("x".into())
            })
            .await
            .expect("execute");
            let fresh = m("Idem::execute, fresh key", s).await;
            let s = proxy.snapshot();
            let again = idem
                .execute(&scope, &key, &request(), |_| async {
                    Out::Success("x".into())
                })
                .await
                .expect("replay");
            assert!(again.is_replay());
            let replayed = m("Idem::execute, replay", s).await;
            let key = IdempotencyKey::random();
            let s = proxy.snapshot();
            idem.execute_in_tx(&scope, &key, &request(), |_, _| {
                Box::pin(async { Out::Success("x".into()) })
            })
            .await
            .expect("tx");
            let tx_fresh = m("execute_in_tx, fresh key", s).await;
            let s = proxy.snapshot();
            let again = idem
                .execute_in_tx(&scope, &key, &request(), |_, _| {
                    Box::pin(async { Out::Success("x".into()) })
                })
                .await
                .expect("tx replay");
            assert!(again.is_replay());
            let tx_replay = m("execute_in_tx, replay", s).await;
            if pass == 1 {
                rows = r;
                costs = Some(Costs {
                    claim,
                    save_resource_id,
                    extend,
                    release,
                    takeover,
                    complete,
                    replay,
                    fetch,
                    purge,
                    fresh,
                    replayed,
                    tx_fresh,
                    tx_replay,
                });
            }
        }
        println!(
            "{server:?} statements: statements per transition (warm connection):\n{}",
            rows.join("\n")
        );
        tx.send(costs.expect("two passes")).expect("send");
    })
    .await;
    rx.await.expect("costs")
}

fn pair(s: Snapshot) -> (u64, u64, u64) {
    (s.statements(), s.round_trips(), s.prepare)
}

/// MariaDB's statements: a claim is one statement and one round trip whether
/// the key is fresh or replayed; a takeover adds one guarded update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_one_statement_per_transition() {
    let c = measure(Server::MariaDb, true).await;
    for (name, d) in [
        ("claim", c.claim),
        ("save_resource_id", c.save_resource_id),
        ("extend", c.extend),
        ("release", c.release),
        ("complete", c.complete),
        ("replay", c.replay),
        ("fetch", c.fetch),
    ] {
        assert_eq!(pair(d), (1, 1, 0), "{name}: {d:?}");
    }
    assert_eq!(pair(c.takeover), (2, 2, 0), "{:?}", c.takeover);
    // The purge with nothing due: delete, drop bodies, re-file.
    assert_eq!(pair(c.purge), (3, 3, 0), "{:?}", c.purge);
    assert_eq!(pair(c.fresh), (2, 2, 0), "claim + complete");
    assert_eq!(pair(c.replayed), (1, 1, 0), "one claim");
    // SET SESSION …; BEGIN (one text query), claim, complete, COMMIT.
    assert_eq!(pair(c.tx_fresh), (4, 4, 0));
    // SET SESSION …; BEGIN, claim, ROLLBACK.
    assert_eq!(pair(c.tx_replay), (3, 3, 0));
    no_ping(&c);
}

/// A store with its own pool sends no `COM_PING` between its calls, the
/// transactional mode's included (it runs on the same pool).
fn no_ping(c: &Costs) {
    for d in [
        c.claim,
        c.save_resource_id,
        c.extend,
        c.release,
        c.takeover,
        c.complete,
        c.replay,
        c.fetch,
        c.purge,
        c.fresh,
        c.replayed,
        c.tx_fresh,
        c.tx_replay,
    ] {
        assert_eq!(d.ping, 0, "{d:?}");
    }
}

/// The same statements through a store over the caller's sqlx pool, and
/// sqlx's `COM_PING` as each connection goes back to it: one per checkout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_over_a_sqlx_pool_pays_its_ping_per_checkout() {
    let c = measure(Server::MariaDb, false).await;
    assert_eq!(pair(c.fresh), (2, 2, 0), "claim + complete");
    assert_eq!(pair(c.replayed), (1, 1, 0), "one claim");
    for d in [
        c.claim,
        c.save_resource_id,
        c.extend,
        c.release,
        c.takeover,
        c.complete,
        c.replay,
        c.fetch,
        c.purge,
        c.replayed,
        c.tx_fresh,
        c.tx_replay,
    ] {
        assert_eq!(d.ping, 1, "{d:?}");
    }
    assert_eq!(c.fresh.ping, 2, "two checkouts: {:?}", c.fresh);
}

/// The portable MySQL statements (no `RETURNING`): a fresh key is one
/// insert; a key that exists costs the failed insert and a read; a takeover
/// one guarded update more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_path_statements_per_transition() {
    let c = measure(Server::MySql, true).await;
    for (name, d) in [
        ("claim", c.claim),
        ("save_resource_id", c.save_resource_id),
        ("extend", c.extend),
        ("release", c.release),
        ("complete", c.complete),
        ("fetch", c.fetch),
    ] {
        assert_eq!(pair(d), (1, 1, 0), "{name}: {d:?}");
    }
    assert_eq!(pair(c.replay), (2, 2, 0), "{:?}", c.replay);
    assert_eq!(pair(c.takeover), (3, 3, 0), "{:?}", c.takeover);
    assert_eq!(pair(c.purge), (3, 3, 0), "{:?}", c.purge);
    assert_eq!(pair(c.fresh), (2, 2, 0), "insert + complete");
    assert_eq!(pair(c.replayed), (2, 2, 0), "insert + read");
    assert_eq!(pair(c.tx_fresh), (4, 4, 0));
    assert_eq!(pair(c.tx_replay), (4, 4, 0));
    no_ping(&c);
}
