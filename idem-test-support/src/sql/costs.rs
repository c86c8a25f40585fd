//! What each transition costs on the wire: statements, round trips and
//! statements prepared, counted through the proxy on a warm connection, and
//! what goes on the wire between the calls (a sqlx pool pings each
//! connection it takes back; the store's own pool does not).

use std::time::Duration;

use idem_core::adapter::fingerprint;
use idem_core::clock::{Clock, ManualClock};
use idem_core::store::OutcomeKind;
use idem_core::store::{ClaimOutcome, ClaimRequest, Completion, Store, Token};
use idem_core::{FieldFilter, IdempotencyKey, RecordId};

use super::proxy::{Proxy, Snapshot};
use super::{LEASE, Out, SqlFixture, WireDialect, engine, request, scope, with_fixture};

/// `(statements, round trips, statements prepared)` of one transition.
pub type Cost = (u64, u64, u64);

/// One value per transition measured.
#[derive(Debug, Clone, Copy)]
pub struct Costs<T> {
    /// A claim of a fresh key.
    pub claim: T,
    /// `save_resource_id`.
    pub save_resource_id: T,
    /// `extend_lease`.
    pub extend: T,
    /// `release`.
    pub release: T,
    /// A claim taking over a released record.
    pub takeover: T,
    /// `complete`.
    pub complete: T,
    /// A claim finding the completed record (the replay).
    pub replay: T,
    /// `fetch`.
    pub fetch: T,
    /// One batch of `purge_expired` with nothing due.
    pub purge: T,
    /// `Idem::execute` on a fresh key.
    pub fresh: T,
    /// `Idem::execute` replaying.
    pub replayed: T,
    /// `execute_in_tx` on a fresh key.
    pub tx_fresh: T,
    /// `execute_in_tx` replaying.
    pub tx_replay: T,
}

impl<T: Copy> Costs<T> {
    /// `value` for every transition: what a dialect changes the few that
    /// differ from (`Costs { takeover: .., ..Costs::each(one) }`).
    pub const fn each(value: T) -> Self {
        Self {
            claim: value,
            save_resource_id: value,
            extend: value,
            release: value,
            takeover: value,
            complete: value,
            replay: value,
            fetch: value,
            purge: value,
            fresh: value,
            replayed: value,
            tx_fresh: value,
            tx_replay: value,
        }
    }

    fn named(&self) -> [(&'static str, T); 13] {
        [
            ("claim", self.claim),
            ("save_resource_id", self.save_resource_id),
            ("extend_lease", self.extend),
            ("release", self.release),
            ("takeover", self.takeover),
            ("complete", self.complete),
            ("replay", self.replay),
            ("fetch", self.fetch),
            ("purge", self.purge),
            ("fresh", self.fresh),
            ("replayed", self.replayed),
            ("tx_fresh", self.tx_fresh),
            ("tx_replay", self.tx_replay),
        ]
    }
}

/// A store with a pool of its own sends the dialect's statements and no ping
/// before, between or after its calls, the transactional mode included (it
/// runs on the same pool).
pub async fn one_statement_per_transition<D: WireDialect>(d: D) {
    let c = measure(&d, true).await;
    check_statements(&d, &c);
    for (name, s) in c.named() {
        assert_eq!(s.ping, 0, "{name}: {s:?}");
    }
}

/// The same statements through a store over the caller's own sqlx pool,
/// and sqlx's ping as each connection goes back to that pool: one per
/// checkout.
pub async fn a_store_over_a_sqlx_pool_pays_its_ping_per_checkout<D: WireDialect>(d: D) {
    let c = measure(&d, false).await;
    check_statements(&d, &c);
    for (name, s) in c.named() {
        let want = if name == "fresh" { 2 } else { 1 };
        assert_eq!(s.ping, want, "{name}: {s:?}");
    }
}

fn check_statements<D: WireDialect>(d: &D, c: &Costs<Snapshot>) {
    let want = d.expected_costs();
    for ((name, s), (_, w)) in c.named().into_iter().zip(want.named()) {
        assert_eq!(
            (s.statements(), s.round_trips, s.prepare),
            w,
            "{name}: {s:?}"
        );
    }
}

/// Waits until every connection of the store's sqlx pool is idle again,
/// i.e. until sqlx's return ping (a spawned task) was answered, then a
/// little longer for anything else that would go on the wire after a call.
async fn settle<D: WireDialect>(store: &D::Store) {
    for _ in 0..500 {
        if D::pool_idle(store) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// The costs of every transition through a store of one connection, of its
/// own (`own_pool`) or over a sqlx pool, measured on the second of two
/// passes (the first prepares every statement on the connection).
async fn measure<D: WireDialect>(d: &D, own_pool: bool) -> Costs<Snapshot> {
    let proxy = Proxy::start(d.upstream().await, D::PROTOCOL).await;
    let fx = d.open_via(&proxy, own_pool).await;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let d = d.clone();
    with_fixture(fx, move |fx| async move {
        let proxy = &proxy;
        let store = fx.store().clone();
        let clock = ManualClock::starting_now();
        let idem = engine(&store, &clock);
        let scope = scope();
        let fp = fingerprint(scope.operation(), &request(), &FieldFilter::All).expect("fp");
        let mut rows = Vec::new();
        let mut costs = None;
        for pass in 0..2 {
            let mut r = Vec::new();
            let mut m = async |name: &str, before: Snapshot| {
                settle::<D>(&store).await;
                let s = proxy.snapshot() - before;
                r.push(format!(
                    "{name:<34} statements {}  round trips {}  (+{} release ping, {} prepared)",
                    s.statements(),
                    s.round_trips,
                    s.ping,
                    s.prepare
                ));
                s
            };
            let id = RecordId::new(scope.clone(), IdempotencyKey::random());
            let now = clock.now();
            let (t1, t2) = (Token::random(), Token::random());
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
            d.execute_in_tx(&idem, &scope, &key, &request(), |_, _| {
                Box::pin(async { Out::Success("x".into()) })
            })
            .await
            .expect("tx");
            let tx_fresh = m("execute_in_tx, fresh key", s).await;
            let s = proxy.snapshot();
            let again = d
                .execute_in_tx(&idem, &scope, &key, &request(), |_, _| {
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
            "statements per transition (warm connection, own pool: {own_pool}):\n{}",
            rows.join("\n")
        );
        tx.send(costs.expect("two passes")).expect("send");
    })
    .await;
    rx.await.expect("costs")
}
