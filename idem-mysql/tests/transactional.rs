//! The transactional mode (`MySqlIdemExt::execute_in_tx`) against the real
//! server: the claim, the caller's writes and the response commit or roll
//! back together, and duplicates wait for the winner's transaction (seen on
//! the server, in `information_schema.INNODB_TRX`, not by timing).

mod support;

use std::sync::Arc;
use std::time::Duration;

use idem_core::Error;
use idem_core::clock::ManualClock;
use idem_core::store::RecordState;
use idem_mysql::sqlx;
use idem_mysql::{MySqlIdemExt, Server};
use support::MyFixture;
use support::scenario::{
    Counter, Out, count_rows, create_orders, engine, insert_order, orders_table, request, scope,
    with_fixture,
};

/// Whether a claim statement on the fixture's table is seen running on the
/// server while the winner's transaction sits idle (so it is queued on the
/// winner's lock), polled on a connection of its own for up to 10 s. The
/// caller lets the winner go either way, so a failure never leaves a
/// transaction open behind the teardown.
///
/// `PROCESSLIST`, not `INNODB_TRX`: InnoDB refreshes that table's cache
/// only after 0.1 s without a reader, so tests polling it in parallel keep
/// each other's view stale.
async fn lock_wait_seen(fx: &MyFixture) -> bool {
    // The table name is a validated identifier: safe to splice.
    let sql = format!(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST
         WHERE COMMAND <> 'Sleep' AND INFO LIKE 'INSERT INTO `{}`%'",
        fx.table
    );
    let pool = support::pool(1, support::options()).await;
    let mut seen = false;
    for _ in 0..2000 {
        let waiting: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.clone()))
            .fetch_one(&pool)
            .await
            .expect("processlist");
        if waiting > 0 {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    pool.close().await;
    seen
}

async fn commits_claim_writes_and_response_together(server: Server) {
    with_fixture(MyFixture::new(4).await, move |fx| async move {
        create_orders(&fx).await;
        let clock = ManualClock::starting_now();
        let idem = engine(&fx.store.clone().with_server(server), &clock);
        let (scope, runs) = (scope(), Counter::default());
        for i in 0..3 {
            let (r, insert) = (runs.clone(), insert_order(&fx));
            let reply = idem
                .execute_in_tx(&scope, "order-1", &request(), move |attempt, conn| {
                    Box::pin(async move {
                        r.hit();
                        attempt
                            .save_resource_id("ord_1")
                            .await
                            .expect("save_resource_id");
                        insert
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
            count_rows(&fx, &orders_table(&fx)).await,
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
async fn tx_commits_claim_writes_and_response_together_mariadb() {
    commits_claim_writes_and_response_together(Server::MariaDb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_commits_claim_writes_and_response_together_mysql_path() {
    commits_claim_writes_and_response_together(Server::MySql).await;
}

async fn transient_failure_or_dropped_future_leaves_nothing(server: Server) {
    with_fixture(MyFixture::new(4).await, move |fx| async move {
        create_orders(&fx).await;
        let clock = ManualClock::starting_now();
        let idem = engine(&fx.store.clone().with_server(server), &clock);
        let scope = scope();
        let insert = insert_order(&fx);
        let reply = idem
            .execute_in_tx(&scope, "k", &request(), move |_, conn| {
                Box::pin(async move {
                    insert
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
        assert_eq!(count_rows(&fx, &orders_table(&fx)).await, 0);
        assert_eq!(
            idem.admin()
                .inspect(&scope, "k", true)
                .await
                .expect("inspect"),
            None
        );

        // A future dropped mid-work (a crash, a cancelled request).
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let (idem2, scope2, insert) = (idem.clone(), scope.clone(), insert_order(&fx));
        let task = tokio::spawn(async move {
            idem2
                .execute_in_tx(&scope2, "k", &request(), move |_, conn| {
                    Box::pin(async move {
                        insert
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
        // The dropped transaction rolls back (sqlx rolls it back as the
        // connection goes back to the pool); its locks go with it, so a
        // retry claims.
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
        assert_eq!(count_rows(&fx, &orders_table(&fx)).await, 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_transient_failure_or_dropped_future_leaves_nothing_mariadb() {
    transient_failure_or_dropped_future_leaves_nothing(Server::MariaDb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_transient_failure_or_dropped_future_leaves_nothing_mysql_path() {
    transient_failure_or_dropped_future_leaves_nothing(Server::MySql).await;
}

async fn duplicate_waits_for_the_winner_then_replays(server: Server) {
    with_fixture(MyFixture::new(4).await, move |fx| async move {
        create_orders(&fx).await;
        let clock = ManualClock::starting_now();
        let idem = engine(&fx.store.clone().with_server(server), &clock);
        let (scope, runs) = (scope(), Counter::default());
        let (started_tx, started) = tokio::sync::oneshot::channel();
        let go = Arc::new(tokio::sync::Notify::new());
        let first = {
            let (idem, scope, runs, go, insert) = (
                idem.clone(),
                scope.clone(),
                runs.clone(),
                Arc::clone(&go),
                insert_order(&fx),
            );
            tokio::spawn(async move {
                idem.execute_in_tx(&scope, "k", &request(), move |_, conn| {
                    Box::pin(async move {
                        runs.hit();
                        insert
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
        let waited = lock_wait_seen(&fx).await && !second.is_finished();
        go.notify_one();
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
        assert_eq!(count_rows(&fx, &orders_table(&fx)).await, 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_duplicate_waits_for_the_winner_then_replays_mariadb() {
    duplicate_waits_for_the_winner_then_replays(Server::MariaDb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_duplicate_waits_for_the_winner_then_replays_mysql_path() {
    duplicate_waits_for_the_winner_then_replays(Server::MySql).await;
}

/// A duplicate waiting behind a transaction that rolls back (transient
/// failure) claims and runs the work itself; a plain `Idem::execute`
/// duplicate waits behind an open transaction the same way and replays once
/// it commits.
async fn duplicate_runs_after_a_rollback_and_plain_calls_wait_too(server: Server) {
    with_fixture(MyFixture::new(4).await, move |fx| async move {
        let clock = ManualClock::starting_now();
        let idem = engine(&fx.store.clone().with_server(server), &clock);
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
        let waited = lock_wait_seen(&fx).await && !second.is_finished();
        go.notify_one();
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
        let waited = lock_wait_seen(&fx).await && !plain.is_finished();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_duplicate_runs_after_a_rollback_and_plain_calls_wait_too_mariadb() {
    duplicate_runs_after_a_rollback_and_plain_calls_wait_too(Server::MariaDb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_duplicate_runs_after_a_rollback_and_plain_calls_wait_too_mysql_path() {
    duplicate_runs_after_a_rollback_and_plain_calls_wait_too(Server::MySql).await;
}

/// Past the lock wait (1 s, the server's smallest unit), a transactional
/// duplicate gets 409 without comparing fingerprints; once the winner
/// commits, the same call replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tx_duplicate_gets_409_after_the_lock_wait_timeout() {
    with_fixture(MyFixture::new(4).await, |fx| async move {
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
        let err = idem
            .execute_in_tx(&scope, "k", &request(), |_, _| {
                Box::pin(async { Out::Success("never".into()) })
            })
            .await
            .expect_err("409 after the lock wait");
        assert!(matches!(err, Error::InFlight { .. }), "{err:?}");
        assert_eq!(err.http_status(), 409);
        go.notify_one();
        assert!(!first.await.expect("join").expect("first").is_replay());
        let replay = idem
            .execute_in_tx(&scope, "k", &request(), |_, _| {
                Box::pin(async { Out::Success("never".into()) })
            })
            .await
            .expect("replay");
        assert_eq!(replay.into_result(), Ok("winner".to_owned()));
        // The session keeps the transactional mode's bound (no `SET LOCAL`
        // in MySQL): documented, and checked here.
        let bound: u64 = sqlx::query_scalar("SELECT @@SESSION.innodb_lock_wait_timeout")
            .fetch_one(store.pool())
            .await
            .expect("bound");
        assert!(bound == 1 || bound == 50, "{bound}");
    })
    .await;
}
