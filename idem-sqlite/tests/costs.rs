//! What a call costs in hops to the connection's worker thread: each
//! command sqlx sends a SQLite connection (a statement, a ping) wakes the
//! thread that owns it, which then blocks again for the next one, so the
//! voluntary context switches of the store's worker threads (named for the
//! test, counted from `/proc`) count the commands. A store with its own pool
//! sends a fresh key's three statements and a replay's one read, nothing
//! else; a store over a sqlx pool adds sqlx's ping per checkout.

mod support;

use std::time::Duration;

use idem_core::clock::ManualClock;
use idem_core::{Idem, IdempotencyKey, InFlightMode, Outcome, Policy, Scope};
use idem_sqlite::SqliteStore;
use idem_sqlite::sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
};

/// Calls measured per scenario (the average smooths a wake-up the kernel
/// merged or split).
const CALLS: u32 = 20;

/// The voluntary context switches of this process's threads whose name
/// starts with `prefix`, summed.
fn switches(prefix: &str) -> u64 {
    let mut total = 0;
    let tasks = std::fs::read_dir("/proc/self/task").expect("/proc/self/task (Linux)");
    for task in tasks.flatten() {
        let path = task.path();
        let Ok(comm) = std::fs::read_to_string(path.join("comm")) else {
            continue; // the thread ended meanwhile
        };
        if !comm.starts_with(prefix) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(path.join("status")) else {
            continue;
        };
        total += status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .expect("voluntary_ctxt_switches in /proc status");
    }
    total
}

/// Waits for anything a call leaves running (sqlx's return ping is a
/// spawned task) to reach the worker and let it block again.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(15)).await;
}

fn options(prefix: &str, path: &std::path::Path) -> SqliteConnectOptions {
    let prefix = prefix.to_owned();
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .thread_name(move |id| format!("{prefix}{id}"))
}

/// Worker hops per fresh key and per replay, averaged over `CALLS` calls
/// each, one at a time, on a warm connection.
async fn hops(store: SqliteStore, prefix: &str) -> (f64, f64) {
    store.migrate().await.expect("migrate");
    let idem = Idem::new(store.clone())
        .with_clock(ManualClock::starting_now())
        .with_policy(
            Policy::builder()
                .in_flight(InFlightMode::Reject)
                .build()
                .expect("policy"),
        );
    let scope = Scope::new("acct", "POST /charges").expect("scope");
    let request = serde_json::json!({"amount": 100});
    let call = async |key: &str| {
        idem.execute(&scope, key, &request, |_| async {
            Outcome::<String, String>::Success("ok".into())
        })
        .await
        .expect("call")
    };
    let warm = IdempotencyKey::random();
    call(warm.as_str()).await;
    call(warm.as_str()).await;
    settle().await;

    let keys: Vec<_> = (0..CALLS).map(|_| IdempotencyKey::random()).collect();
    let before = switches(prefix);
    for key in &keys {
        call(key.as_str()).await;
        settle().await;
    }
    let fresh = switches(prefix) - before;
    let before = switches(prefix);
    for key in &keys {
        assert!(call(key.as_str()).await.is_replay());
        settle().await;
    }
    let replay = switches(prefix) - before;
    store.close().await;
    (
        f64::from(u32::try_from(fresh).expect("small")) / f64::from(CALLS),
        f64::from(u32::try_from(replay).expect("small")) / f64::from(CALLS),
    )
}

/// A short thread-name prefix of its own (Linux keeps 15 bytes of a name).
fn prefix() -> String {
    format!("iq{}-", &IdempotencyKey::random().as_str()[..6])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_with_its_own_pool_sends_its_statements_and_nothing_else() {
    let path = support::temp_path();
    let prefix = prefix();
    let store = SqliteStore::connect_with(
        SqlitePoolOptions::new().max_connections(1),
        options(&prefix, &path),
    )
    .await
    .expect("open");
    let (fresh, replay) = hops(store, &prefix).await;
    support::remove(&path);
    println!("own pool: {fresh:.2} worker hops per fresh key, {replay:.2} per replay");
    // A read, the claim, the completion; one read. No ping (which would
    // make it 5 and 2). Two commands sent back to back sometimes find the
    // worker still awake: fewer wakes, never more.
    assert!(fresh <= 3.5, "{fresh} hops per fresh key");
    assert!(replay <= 1.5, "{replay} hops per replay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_over_a_sqlx_pool_pays_a_ping_per_checkout() {
    let path = support::temp_path();
    let prefix = prefix();
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect_with(options(&prefix, &path))
        .await
        .expect("open");
    let (fresh, replay) = hops(SqliteStore::new(pool), &prefix).await;
    support::remove(&path);
    println!("sqlx pool: {fresh:.2} worker hops per fresh key, {replay:.2} per replay");
    // The same statements, and a ping after each of the two checkouts
    // (5 and 2).
    assert!(fresh >= 4.0, "{fresh} hops per fresh key");
    assert!(replay >= 1.75, "{replay} hops per replay");
}
