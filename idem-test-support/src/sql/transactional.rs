//! The transactional mode (`execute_in_tx`) against the real server: the
//! claim, the caller's writes and the response commit or roll back together,
//! and duplicates wait for the winner's transaction (seen waiting on the
//! server, not by timing).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::clock::ManualClock;
use idem_core::store::RecordState;
use idem_core::{Error, Idem, Reply, Scope};
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;

use super::{Counter, Out, SqlFixture, TxDialect, engine, request, scope, with_fixture};

/// The claim, the work's write and the outcome (with its resource id)
/// commit together, once; the next calls replay.
pub async fn tx_commits_claim_writes_and_response_together<D: TxDialect>(d: D) {
    with_orders(d, true, |d, fx, clock| async move {
        let idem = engine(fx.store(), &clock);
        let (scope, runs) = (scope(), Counter::default());
        for i in 0..3 {
            let (r, insert) = (runs.clone(), d.insert_order_sql(&fx));
            let reply = d
                .execute_in_tx(
                    &idem,
                    &scope,
                    "order-1",
                    &request(),
                    move |attempt, conn| {
                        Box::pin(async move {
                            r.hit();
                            attempt
                                .save_resource_id("ord_1")
                                .await
                                .expect("save_resource_id");
                            D::insert_order(conn, insert, "first").await;
                            Out::Success(format!("order-{}", attempt.number()))
                        })
                    },
                )
                .await
                .expect("call");
            assert_eq!(reply.is_replay(), i > 0);
            assert_eq!(reply.into_result(), Ok("order-1".to_owned()));
        }
        assert_eq!(runs.get(), 1);
        assert_eq!(
            d.count_orders(&fx).await,
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

/// A transient failure rolls back the claim and the work's write; so does a
/// future dropped mid-work, after which a retry claims afresh.
pub async fn tx_transient_failure_or_dropped_future_leaves_nothing<D: TxDialect>(d: D) {
    with_orders(d, true, |d, fx, clock| async move {
        let idem = engine(fx.store(), &clock);
        let scope = scope();
        let insert = d.insert_order_sql(&fx);
        let reply = d
            .execute_in_tx(&idem, &scope, "k", &request(), move |_, conn| {
                Box::pin(async move {
                    D::insert_order(conn, insert, "rolled back").await;
                    Out::Transient("provider 503".into())
                })
            })
            .await
            .expect("transient is returned");
        assert_eq!(reply.into_result(), Err("provider 503".to_owned()));
        assert_eq!(d.count_orders(&fx).await, 0);
        assert_eq!(
            idem.admin()
                .inspect(&scope, "k", true)
                .await
                .expect("inspect"),
            None
        );

        // A future dropped mid-work (a crash, a cancelled request).
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let (d2, idem2, scope2, insert) = (
            d.clone(),
            idem.clone(),
            scope.clone(),
            d.insert_order_sql(&fx),
        );
        let task = tokio::spawn(async move {
            d2.execute_in_tx(&idem2, &scope2, "k", &request(), move |_, conn| {
                Box::pin(async move {
                    D::insert_order(conn, insert, "never committed").await;
                    let _ = started_tx.send(());
                    std::future::pending::<Out>().await
                })
            })
            .await
        });
        started.await.expect("work started");
        task.abort();
        let _ = task.await;
        // The dropped transaction rolls back; its locks go with it, so a
        // retry claims (bounded by the lock timeout if it did not).
        let runs = Counter::default();
        let r = runs.clone();
        let reply = d
            .execute_in_tx(&idem, &scope, "k", &request(), move |attempt, _| {
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
        assert_eq!(d.count_orders(&fx).await, 0);
    })
    .await;
}

/// A duplicate waits on the winner's uncommitted record, then replays the
/// committed outcome; the work ran once.
pub async fn tx_duplicate_waits_for_the_winner_then_replays<D: TxDialect>(d: D) {
    with_orders(d, true, |d, fx, clock| async move {
        let idem = engine(fx.store(), &clock);
        let (scope, runs) = (scope(), Counter::default());
        let write = Some((d.insert_order_sql(&fx), "winner"));
        let winner = Out::Success("winner".into());
        let (first, second, waited) =
            duplicate_behind_held(&d, &fx, &idem, (&scope, &runs), write, winner).await;
        assert!(waited, "the duplicate waits on the uncommitted record");
        let a = first.await.expect("join").expect("first");
        let b = second.await.expect("join").expect("second");
        assert!(!a.is_replay());
        assert!(
            b.is_replay(),
            "after the winner commits the duplicate replays"
        );
        assert_eq!(b.into_result(), Ok("winner".to_owned()));
        assert_eq!(runs.get(), 1);
        assert_eq!(d.count_orders(&fx).await, 1);
    })
    .await;
}

/// A duplicate waiting behind a transaction that rolls back (transient
/// failure) claims and runs the work itself; a plain `Idem::execute`
/// duplicate waits behind an open transaction the same way and replays once
/// it commits.
pub async fn tx_duplicate_runs_after_a_rollback_and_plain_calls_wait_too<D: TxDialect>(d: D) {
    with_orders(d, false, |d, fx, clock| async move {
        let idem = engine(fx.store(), &clock);
        let (scope, runs) = (scope(), Counter::default());
        // 1. The first rolls back: the waiting duplicate runs.
        let transient = Out::Transient("provider 503".into());
        let (first, second, waited) =
            duplicate_behind_held(&d, &fx, &idem, (&scope, &runs), None, transient).await;
        assert!(waited, "waits on the uncommitted claim");
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
        let winner = Out::Success("tx winner".into());
        let (first, started, go) = hold_in_tx(&d, &idem, (&scope, "k2"), &runs, None, winner);
        started.await.expect("started");
        let plain = tokio::spawn(async move {
            idem2
                .execute(&scope2, "k2", &request(), move |_| async move {
                    runs2.hit();
                    Out::Success("plain".into())
                })
                .await
        });
        let waited = d.claim_waiting(&fx).await && !plain.is_finished();
        go.notify_one();
        assert!(waited, "a plain call waits on the uncommitted claim too");
        assert!(!first.await.expect("join").expect("first").is_replay());
        let p = plain.await.expect("join").expect("plain");
        assert!(p.is_replay());
        assert_eq!(p.into_result(), Ok("tx winner".to_owned()));
        assert_eq!(runs.get(), 3);
    })
    .await;
}

/// Past the store's lock wait, a transactional duplicate gets 409 without
/// comparing fingerprints (after waiting for the lock first); once the
/// winner commits, the same call replays.
pub async fn tx_duplicate_gets_409_after_the_lock_timeout<D: TxDialect>(d: D) {
    with_orders(d, false, |d, fx, clock| async move {
        let store = d.with_tx_lock_timeout(fx.store().clone(), Duration::from_millis(200));
        let idem = engine(&store, &clock);
        let scope = scope();
        let winner = Out::Success("winner".into());
        let runs = Counter::default();
        let (first, started, go) = hold_in_tx(&d, &idem, (&scope, "k"), &runs, None, winner);
        started.await.expect("started");
        let t0 = Instant::now();
        let err = d
            .execute_in_tx(&idem, &scope, "k", &request(), |_, _| {
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
        go.notify_one();
        assert!(!first.await.expect("join").expect("first").is_replay());
        let replay = d
            .execute_in_tx(&idem, &scope, "k", &request(), |_, _| {
                Box::pin(async { Out::Success("never".into()) })
            })
            .await
            .expect("replay");
        assert_eq!(replay.into_result(), Ok("winner".to_owned()));
        d.after_tx_lock_timeout(&store).await;
    })
    .await;
}

/// Runs `body` on a fixture of four connections (with the caller's own
/// `orders` table if `orders`) and a clock starting now.
async fn with_orders<D, F, Fut>(d: D, orders: bool, body: F)
where
    D: TxDialect,
    F: FnOnce(D, Arc<D::Fixture>, ManualClock) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let fx = d.open(4).await;
    with_fixture(fx, move |fx| async move {
        if orders {
            d.create_orders(&fx).await;
        }
        body(d, fx, ManualClock::starting_now()).await;
    })
    .await;
}

/// What a transactional call answers.
type TxReply = Result<Reply<String, String>, Error>;

/// Spawns a transactional call on `key` whose work counts its run, writes
/// `write` (an insert and its note) on its transaction, says it started, and
/// holds its transaction open until `go` before returning `outcome`.
fn hold_in_tx<D: TxDialect>(
    d: &D,
    idem: &Idem<D::Store>,
    (scope, key): (&Scope, &'static str),
    runs: &Counter,
    write: Option<(String, &'static str)>,
    outcome: Out,
) -> (JoinHandle<TxReply>, oneshot::Receiver<()>, Arc<Notify>) {
    let (d, idem, scope, runs) = (d.clone(), idem.clone(), scope.clone(), runs.clone());
    let (started_tx, started) = oneshot::channel();
    let go = Arc::new(Notify::new());
    let g = Arc::clone(&go);
    let task = tokio::spawn(async move {
        d.execute_in_tx(&idem, &scope, key, &request(), move |_, conn| {
            Box::pin(async move {
                runs.hit();
                if let Some((sql, note)) = write {
                    D::insert_order(conn, sql, note).await;
                }
                let _ = started_tx.send(());
                g.notified().await;
                outcome
            })
        })
        .await
    });
    (task, started, go)
}

/// A call held in its transaction on key `k` ([`hold_in_tx`]) and a
/// transactional duplicate of it ([`duplicate_in_tx`]): once the first is in
/// its work the duplicate starts, and the first is let go after looking
/// whether the duplicate waits on the server for the held record. Both
/// calls, and whether it waited.
async fn duplicate_behind_held<D: TxDialect>(
    d: &D,
    fx: &D::Fixture,
    idem: &Idem<D::Store>,
    (scope, runs): (&Scope, &Counter),
    write: Option<(String, &'static str)>,
    outcome: Out,
) -> (JoinHandle<TxReply>, JoinHandle<TxReply>, bool) {
    let (first, started, go) = hold_in_tx(d, idem, (scope, "k"), runs, write, outcome);
    started.await.expect("first is in its work");
    let second = duplicate_in_tx(d, idem, scope, "k", runs);
    let waited = d.claim_waiting(fx).await && !second.is_finished();
    go.notify_one();
    (first, second, waited)
}

/// Spawns a transactional duplicate on `key` whose work counts its run and
/// answers with its attempt number.
fn duplicate_in_tx<D: TxDialect>(
    d: &D,
    idem: &Idem<D::Store>,
    scope: &Scope,
    key: &'static str,
    runs: &Counter,
) -> JoinHandle<TxReply> {
    let (d, idem, scope, runs) = (d.clone(), idem.clone(), scope.clone(), runs.clone());
    tokio::spawn(async move {
        d.execute_in_tx(&idem, &scope, key, &request(), move |attempt, _| {
            Box::pin(async move {
                runs.hit();
                Out::Success(format!("second, attempt {}", attempt.number()))
            })
        })
        .await
    })
}
