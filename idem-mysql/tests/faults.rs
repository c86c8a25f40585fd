//! Faults on a throwaway `mariadbd` (a free loopback port, its own data
//! directory): a connection killed with `KILL <id>` in the middle of a
//! statement, and the server restarted. Typed retryable errors, nothing
//! reported stored that was not, never a second execution, and a store that
//! recovers by itself.

mod support;

use std::time::Duration;

use idem_core::adapter::fingerprint;
use idem_core::clock::{Clock, ManualClock};
use idem_core::ops::RecordState;
use idem_core::store::{ClaimOutcome, ClaimRequest, Store, StoreError, Token};
use idem_core::{Error, FieldFilter, Idem, IdempotencyKey, RecordId};
use idem_mysql::sqlx::mysql::MySqlPoolOptions;
use idem_mysql::sqlx::{self, Acquire};
use idem_mysql::{MySqlStore, Server};
use support::scenario::{Counter, LEASE, Out, policy, request, scope};
use support::server::Throwaway;

// The server stopped and restarted under the store (a throwaway
// `mariadbd`): `idem_test_support::sql::faults`.
mod mariadb {
    idem_test_support::sql_suite!(crate::support::MySql::MARIADB;
        pool_recovers_after_connections_are_dropped,
        a_sqlx_pool_recovers_after_connections_are_dropped,
    );
}

async fn store_on(url: &str, max: u32, server: Server) -> MySqlStore {
    let pool = MySqlPoolOptions::new()
        .max_connections(max)
        .test_before_acquire(false)
        .acquire_timeout(Duration::from_secs(2))
        .connect(url)
        .await
        .expect("connect to the throwaway server");
    let store = MySqlStore::new(pool)
        .await
        .expect("version")
        .with_server(server);
    store.migrate().await.expect("migrate");
    store
}

/// Kills (`KILL <id>`) the first connection found running a statement on
/// `table`, except `spare`; returns its id.
async fn kill_when_running(url: String, table: String, spare: u64) -> u64 {
    let admin = MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .expect("admin");
    let sql = format!(
        "SELECT CAST(ID AS UNSIGNED) FROM information_schema.PROCESSLIST
         WHERE COMMAND <> 'Sleep' AND INFO LIKE '%`{table}`%' AND ID <> CONNECTION_ID() AND ID <> {spare}
         LIMIT 1"
    );
    for _ in 0..1000 {
        let id: Option<u64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.clone()))
            .fetch_optional(&admin)
            .await
            .expect("processlist");
        if let Some(id) = id {
            sqlx::query(sqlx::AssertSqlSafe(format!("KILL {id}")))
                .execute(&admin)
                .await
                .expect("KILL");
            admin.close().await;
            return id;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no connection ever ran a statement on {table}");
}

/// A connection killed while its claim waits on a row lock: a typed 503
/// (retryable), nothing ran. Killed while its completion waits: the caller
/// gets the work's result marked not stored, the record is still in flight
/// (it was not stored), duplicates get 409 (no second run), and after the
/// lease the record is recovered. On both claim paths.
async fn killed_connection_mid_statement(server: Server) {
    let db = Throwaway::start().await;
    let url = db.url();
    let store = store_on(&url, 2, server).await;
    let table = store.table_name().to_owned();
    let clock = ManualClock::starting_now();
    let idem = Idem::new(store.clone())
        .with_clock(clock.clone())
        .with_policy(policy(1));
    let (scope, runs) = (scope(), Counter::default());
    let id = RecordId::new(scope.clone(), IdempotencyKey::parse("k").expect("key"));
    let blocker = MySqlPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await
        .expect("blocker");
    let lock_row = format!(
        "SELECT 1 FROM `{table}` WHERE owner = ? AND operation = ? AND `key` = ? FOR UPDATE"
    );

    // 1. Mid-claim: a released record, row-locked by someone else, so the
    //    claim waits; its connection is killed while it waits.
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
        store.claim(&req).await.expect("claim"),
        ClaimOutcome::Claimed(_)
    ));
    store.release(&id, t, now).await.expect("release");
    let mut conn = blocker.acquire().await.expect("conn");
    let spare: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
        .fetch_one(&mut *conn)
        .await
        .expect("id");
    let mut lock = conn.begin().await.expect("begin");
    sqlx::query(sqlx::AssertSqlSafe(lock_row.clone()))
        .bind(id.owner())
        .bind(id.operation())
        .bind("k")
        .execute(&mut *lock)
        .await
        .expect("lock");
    let killer = tokio::spawn(kill_when_running(url.clone(), table.clone(), spare));
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
    assert!(err.is_retryable());
    assert_eq!(err.http_status(), 503);
    assert_eq!(runs.get(), 0, "nothing ran");
    lock.rollback().await.expect("rollback");
    drop(conn);

    // 2. Mid-completion: the work locks its own record (from another
    //    connection) before returning, so the completion waits and is killed.
    let mut conn = blocker.acquire().await.expect("conn");
    let spare: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
        .fetch_one(&mut *conn)
        .await
        .expect("id");
    let (r, sql) = (runs.clone(), lock_row.clone());
    let (hold_tx, hold) = tokio::sync::oneshot::channel();
    // The killer starts looking only once the work runs: the claim before it
    // is a statement on the table too, and a loaded machine can be caught
    // running it.
    let (ran_tx, ran) = tokio::sync::oneshot::channel::<()>();
    let killer = tokio::spawn({
        let (url, table) = (url.clone(), table.clone());
        async move {
            ran.await.expect("the work ran");
            kill_when_running(url, table, spare).await
        }
    });
    let reply = idem
        .execute(&scope, "k", &request(), move |a| async move {
            r.hit();
            let _ = ran_tx.send(());
            let mut lock = sqlx::Transaction::begin(conn, None).await.expect("begin");
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
    assert!(
        !reply.is_stored(),
        "the completion was killed: not reported stored"
    );
    assert_eq!(reply.into_result(), Ok("ch_1".to_owned()));
    hold.await
        .expect("lock")
        .rollback()
        .await
        .expect("rollback");
    let rec = store
        .fetch(&id, clock.now())
        .await
        .expect("fetch")
        .expect("record");
    assert_eq!(
        rec.state,
        RecordState::InFlight,
        "indeed not stored: left to lease expiry"
    );
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
    store.pool().close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connection_mid_statement_mariadb() {
    killed_connection_mid_statement(Server::MariaDb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connection_mid_statement_mysql_path() {
    killed_connection_mid_statement(Server::MySql).await;
}
