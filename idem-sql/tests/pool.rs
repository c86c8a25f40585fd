//! The pool against real SQLite connections (a temporary file each): what
//! is reused without a round trip, what is re-validated, what is closed.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_sql::{ConnectCheck, ConnectionError, Pool, PoolConfig, Stats};
use sqlx::SqliteConnection;
use sqlx::sqlite::SqliteConnectOptions;

/// A database file of its own, removed at the end.
struct TempDb(PathBuf);

impl TempDb {
    fn new() -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        Self(std::env::temp_dir().join(format!(
            "idem-sql-test-{}-{}.db",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        )))
    }

    fn pool(&self, config: PoolConfig) -> Pool<SqliteConnection> {
        let options = SqliteConnectOptions::new()
            .filename(&self.0)
            .create_if_missing(true);
        Pool::new(options, config)
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

async fn select(pool: &Pool<SqliteConnection>, n: i64) -> i64 {
    let mut conn = pool.get().await.expect("checkout");
    conn.run(|c| sqlx::query_scalar("SELECT ?").bind(n).fetch_one(c))
        .await
        .expect("select")
}

fn counts(s: Stats) -> (u64, u64, u64, u64) {
    (s.opened, s.reused, s.revalidated, s.discarded)
}

/// A statement a SQLite connection spends a while on (a recursive count).
const SLOW: &str = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3000000) \
                    SELECT count(*) FROM n";

/// Checks a connection out, starts [`SLOW`] on it, drops the statement's
/// future 20 ms in (while it still runs), then the checkout.
async fn drop_mid_statement(pool: &Pool<SqliteConnection>) {
    let mut conn = pool.get().await.expect("checkout");
    let cut = tokio::time::timeout(
        Duration::from_millis(20),
        conn.run(|c| sqlx::query_scalar::<_, i64>(SLOW).fetch_one(c)),
    )
    .await;
    assert!(cut.is_err(), "the slow statement was still running");
}

#[tokio::test]
async fn clean_calls_reuse_one_connection_with_no_revalidation() {
    let db = TempDb::new();
    let pool = db.pool(PoolConfig::new(4));
    assert_eq!(pool.stats().size, 0, "nothing is opened up front");
    for i in 0..10 {
        assert_eq!(select(&pool, i).await, i);
    }
    assert_eq!(counts(pool.stats()), (1, 9, 0, 0));
    assert_eq!((pool.stats().size, pool.stats().idle), (1, 1));
}

#[tokio::test]
async fn an_error_the_server_answered_leaves_the_connection_sound() {
    let db = TempDb::new();
    let pool = db.pool(PoolConfig::new(1));
    let mut conn = pool.get().await.expect("checkout");
    let err = conn
        .run(|c| sqlx::query("SELECT * FROM no_such_table").execute(c))
        .await
        .expect_err("no such table");
    assert!(matches!(err, sqlx::Error::Database(_)), "{err:?}");
    let err = conn
        .run(|c| sqlx::query("SELECT 1 WHERE 0").fetch_one(c))
        .await
        .expect_err("no row");
    assert!(matches!(err, sqlx::Error::RowNotFound), "{err:?}");
    drop(conn);
    assert_eq!(select(&pool, 3).await, 3);
    assert_eq!(counts(pool.stats()), (1, 1, 0, 0));
}

/// An error that cannot vouch for the connection.
#[derive(Debug)]
struct OffTheWire;

impl ConnectionError for OffTheWire {
    fn leaves_connection_sound(&self) -> bool {
        false
    }
}

#[tokio::test]
async fn a_connection_left_unsound_is_closed_and_replaced() {
    let db = TempDb::new();
    let pool = db.pool(PoolConfig::new(1));
    let mut conn = pool.get().await.expect("checkout");
    let failed: Result<(), OffTheWire> = conn.run(|_| async { Err(OffTheWire) }).await;
    assert!(failed.is_err());
    // A later success on the same checkout does not vouch for it either.
    let ok: Result<(), OffTheWire> = conn.run(|_| async { Ok(()) }).await;
    assert!(ok.is_ok());
    drop(conn);
    assert_eq!(pool.stats().size, 0, "closed at once, its place freed");
    assert_eq!(select(&pool, 5).await, 5);
    assert_eq!(counts(pool.stats()), (2, 0, 0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_dropped_mid_flight_is_waited_for_then_the_connection_reused() {
    let db = TempDb::new();
    let pool = db.pool(PoolConfig::new(1).acquire_timeout(Some(Duration::from_secs(30))));
    drop_mid_statement(&pool).await;
    // The connection keeps its place while its statement finishes: the
    // next checkout waits for it, then gets it back re-validated, and sees
    // its own answer, not the dropped statement's.
    assert_eq!(pool.stats().size, 1);
    assert_eq!(select(&pool, 7).await, 7);
    assert_eq!(counts(pool.stats()), (1, 1, 1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_dropped_mid_flight_that_outlasts_the_revalidate_timeout_is_closed() {
    let db = TempDb::new();
    let pool = db.pool(
        PoolConfig::new(1)
            .acquire_timeout(Some(Duration::from_secs(30)))
            .revalidate_timeout(Some(Duration::from_millis(1))),
    );
    drop_mid_statement(&pool).await;
    // The slow statement cannot answer within 1 ms: the connection is
    // closed and its place freed, so the next checkout gets a new one
    // instead of waiting for the statement to end.
    assert_eq!(select(&pool, 8).await, 8);
    assert_eq!(counts(pool.stats()), (2, 0, 0, 1));
}

#[test]
fn a_connection_dropped_in_flight_without_a_runtime_is_replaced_at_its_next_checkout() {
    let db = TempDb::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let pool = db.pool(PoolConfig::new(1));
    let conn = rt.block_on(async {
        let mut conn = pool.get().await.expect("checkout");
        let cut = tokio::time::timeout(
            Duration::from_millis(20),
            conn.run(|c| sqlx::query_scalar::<_, i64>(SLOW).fetch_one(c)),
        )
        .await;
        assert!(cut.is_err());
        conn
    });
    drop(conn); // no runtime here: returned marked
    assert_eq!(rt.block_on(select(&pool, 9)), 9);
    assert_eq!(counts(pool.stats()), (2, 0, 0, 1));
}

#[tokio::test]
async fn the_most_recently_returned_connection_is_handed_out_first() {
    let db = TempDb::new();
    let pool = db.pool(PoolConfig::new(2));
    let mut first = pool.get().await.expect("first");
    let mut second = pool.get().await.expect("second");
    // A temporary table is private to its connection: it marks `second`.
    first
        .run(|c| sqlx::query("SELECT 1").execute(c))
        .await
        .expect("first");
    second
        .run(|c| sqlx::query("CREATE TEMP TABLE mark (x)").execute(c))
        .await
        .expect("mark");
    drop(first);
    drop(second);
    let mut next = pool.get().await.expect("next");
    let marked: i64 = next
        .run(|c| {
            sqlx::query_scalar("SELECT count(*) FROM temp.sqlite_master WHERE name = 'mark'")
                .fetch_one(c)
        })
        .await
        .expect("look");
    assert_eq!(marked, 1, "LIFO: the connection returned last");
}

#[tokio::test]
async fn a_full_pool_times_out_and_a_closed_one_refuses() {
    let db = TempDb::new();
    let pool = db.pool(PoolConfig::new(1).acquire_timeout(Some(Duration::from_millis(50))));
    let held = pool.get().await.expect("checkout");
    let err = pool.get().await.expect_err("full");
    assert!(matches!(err, sqlx::Error::PoolTimedOut), "{err:?}");
    drop(held);
    pool.close();
    assert!(pool.is_closed());
    let err = pool.get().await.expect_err("closed");
    assert!(matches!(err, sqlx::Error::PoolClosed), "{err:?}");
}

#[tokio::test]
async fn connections_idle_too_long_or_too_old_are_replaced() {
    let db = TempDb::new();
    let idle = db.pool(PoolConfig::new(1).idle_timeout(Some(Duration::from_millis(30))));
    assert_eq!(select(&idle, 1).await, 1);
    assert_eq!(select(&idle, 1).await, 1);
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(select(&idle, 1).await, 1);
    assert_eq!(counts(idle.stats()), (2, 1, 0, 1));

    let old = db.pool(PoolConfig::new(1).max_lifetime(Some(Duration::from_millis(30))));
    assert_eq!(select(&old, 1).await, 1);
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(select(&old, 1).await, 1);
    assert_eq!(counts(old.stats()), (2, 0, 0, 1));
}

/// Every new connection passes the pool's check before its first checkout:
/// one it refuses is closed and the checkout fails with the check's error;
/// one it accepts is reused afterwards without being checked again.
#[tokio::test(flavor = "current_thread")]
async fn new_connections_pass_the_check_before_they_serve() {
    let db = TempDb::new();
    let refuse = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let checked = std::sync::Arc::new(AtomicU64::new(0));
    let check: ConnectCheck<SqliteConnection> = {
        let (refuse, checked) = (refuse.clone(), checked.clone());
        std::sync::Arc::new(move |conn: &mut SqliteConnection| {
            let (refuse, checked) = (refuse.clone(), checked.clone());
            Box::pin(async move {
                // The check runs statements on the new connection.
                let one: i64 = sqlx::query_scalar("SELECT 1").fetch_one(&mut *conn).await?;
                checked.fetch_add(u64::try_from(one).unwrap_or(0), Ordering::SeqCst);
                if refuse.load(Ordering::SeqCst) {
                    return Err(sqlx::Error::Configuration("not this server".into()));
                }
                Ok(())
            })
        })
    };
    let options = SqliteConnectOptions::new()
        .filename(&db.0)
        .create_if_missing(true);
    let pool = Pool::checked(options, PoolConfig::new(1), Some(check));

    let refused = pool.get().await.expect_err("refused by the check");
    assert!(
        matches!(&refused, sqlx::Error::Configuration(e) if e.to_string() == "not this server"),
        "{refused:?}"
    );
    let stats = pool.stats();
    assert_eq!((stats.size, counts(stats)), (0, (1, 0, 0, 1)), "closed");

    refuse.store(false, Ordering::SeqCst);
    assert_eq!(select(&pool, 7).await, 7);
    assert_eq!(select(&pool, 8).await, 8);
    assert_eq!(
        checked.load(Ordering::SeqCst),
        2,
        "each new connection, once"
    );
    assert_eq!(
        counts(pool.stats()),
        (2, 1, 0, 1),
        "the second call reused it"
    );
}

/// A checkout dropped while it opens a connection (here while the new
/// connection's check still runs) leaves the handshake to finish: the
/// connection goes to the pool, and the next checkout takes it instead of
/// opening another. Dropped half-way, each such checkout cost the server a
/// session for nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkout_dropped_while_it_opens_leaves_the_connection_to_the_pool() {
    let db = TempDb::new();
    let checks = std::sync::Arc::new(AtomicU64::new(0));
    let check: ConnectCheck<SqliteConnection> = {
        let checks = checks.clone();
        std::sync::Arc::new(move |conn: &mut SqliteConnection| {
            let checks = checks.clone();
            Box::pin(async move {
                checks.fetch_add(1, Ordering::SeqCst);
                sqlx::query_scalar::<_, i64>(SLOW)
                    .fetch_one(&mut *conn)
                    .await
                    .map(drop)
            })
        })
    };
    let options = SqliteConnectOptions::new()
        .filename(&db.0)
        .create_if_missing(true);
    let pool = Pool::checked(options, PoolConfig::new(1), Some(check));

    let dropped = tokio::time::timeout(Duration::from_millis(5), pool.get()).await;
    assert!(dropped.is_err(), "the checkout ends before the check");
    assert_eq!(select(&pool, 7).await, 7);
    assert_eq!(checks.load(Ordering::SeqCst), 1, "one connection checked");
    let stats = pool.stats();
    assert_eq!((stats.size, stats.opened), (1, 1), "{stats:?}");
}
