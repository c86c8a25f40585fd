//! Choosing storage: the same short workload on every backend this build
//! enables and can reach, through the library and through the raw driver.
//!
//! A bench binary (it reuses the store bench's workload), not an example.
//!
//! Run with: `cargo bench --bench compare_backends` (MemoryStore and
//! SQLite), or `cargo bench --bench compare_backends --all-features`
//! to add Postgres (`IDEM_POSTGRES_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`), MySQL/MariaDB
//! (`IDEM_MYSQL_URL`, default `mysql://root@127.0.0.1:3306/test`) and Redis (`IDEM_REDIS_URL`,
//! default `redis://127.0.0.1:6379/`). `IDEM_COMPARE_CALLS` sets the calls
//! per measurement (default 2000).
//!
//! For each backend it measures fresh keys (claim, work, complete; 8 tasks),
//! replays of completed keys (8 tasks) and contended calls (64 tasks on 16
//! hot keys), with a 256-byte response, and prints ops/s (best of two
//! interleaved runs), p50 and p99 latency, and the throughput ratio to the
//! raw baseline (the same
//! statements or scripts without the library). Postgres uses its own schema
//! `idem_bench` and Redis its own key prefix, both removed at the end. The
//! workload is the store bench's (`benches/common/stores`).

// Every backend's workload is awaited from one `main`: the layout of its
// future takes more than the compiler's default 128 nested queries.
#![recursion_limit = "256"]

#[allow(dead_code, reason = "each bench uses a part of the shared helpers")]
mod common;

use std::io::Write;
use std::sync::Arc;

use common::stores::memory::RawMemory;
use common::stores::workload::{Lib, Plan, Scenario, Target, run, run_id};
use idem::MemoryStore;

/// The body size of every call.
const BODY: usize = 256;

/// One scenario's figures.
#[derive(Debug, Clone, Copy, Default)]
struct Figures {
    ops: f64,
    p50_us: f64,
    p99_us: f64,
    ratio: f64,
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64 / 1000.0
}

fn calls() -> u64 {
    std::env::var("IDEM_COMPARE_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

/// Measures one backend: library and raw baseline, every scenario.
async fn measure<L: Target, R: Target>(backend: &str, lib: L, raw: R) -> [Figures; 3] {
    let id = run_id();
    let lib = Arc::new(Plan::new(lib, format!("{id}-{backend}-lib")));
    let raw = Arc::new(Plan::new(raw, format!("{id}-{backend}-raw")));
    progress(backend, "preparing replay keys");
    lib.prepare_replays().await;
    raw.prepare_replays().await;
    let mut out = [Figures::default(); 3];
    let scenarios = [
        (Scenario::Fresh, 8),
        (Scenario::Replay, 8),
        (Scenario::Contended, 64),
    ];
    for (slot, (scenario, tasks)) in out.iter_mut().zip(scenarios) {
        // Interleaved, twice each, best run of each side: the fairest short
        // comparison on a shared machine.
        let (mut ops, mut raw_ops, mut latencies) = (0.0f64, 0.0f64, Vec::new());
        for round in 1..=2 {
            let what = format!("{} ({tasks} tasks), round {round}/2", scenario.name());
            progress(backend, &format!("{what}: raw baseline"));
            let r = run(&raw, scenario, tasks, calls(), false).await;
            raw_ops = raw_ops.max(calls() as f64 / r.elapsed.as_secs_f64());
            progress(backend, &format!("{what}: library"));
            let l = run(&lib, scenario, tasks, calls(), true).await;
            ops = ops.max(calls() as f64 / l.elapsed.as_secs_f64());
            latencies.extend(l.latencies);
        }
        latencies.sort_unstable();
        *slot = Figures {
            ops,
            p50_us: percentile(&latencies, 0.50),
            p99_us: percentile(&latencies, 0.99),
            ratio: ops / raw_ops,
        };
    }
    out
}

/// Measures `backend` (the library `lib`, the baseline `raw`) and adds its
/// row to `rows`.
async fn add_row<L: Target, R: Target>(
    rows: &mut Vec<(String, [Figures; 3])>,
    backend: &str,
    lib: L,
    raw: R,
) {
    rows.push((backend.to_owned(), measure(backend, lib, raw).await));
}

/// The URL of a server the bench may use: `$env`, else `default`.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "redis"))]
fn server_url(env: &str, default: &str) -> String {
    std::env::var(env).unwrap_or_else(|_| default.to_owned())
}

fn progress(backend: &str, what: &str) {
    let mut err = std::io::stderr();
    let _ = write!(err, "\r\x1b[2K{backend}: {what}...");
    let _ = err.flush();
}

fn print_table(rows: &[(String, [Figures; 3])]) {
    eprint!("\r\x1b[2K");
    println!(
        "{:<14} | {:>31} | {:>31} | {:>31}",
        "backend", "fresh (8 tasks)", "replay (8 tasks)", "contended (64 on 16 keys)"
    );
    let sub = format!(
        "{:>7} {:>8} {:>8} {:>5}",
        "ops/s", "p50 µs", "p99 µs", "×raw"
    );
    println!("{:<14} | {sub} | {sub} | {sub}", "");
    println!("{}", "-".repeat(14 + 3 * 34));
    for (name, figs) in rows {
        let cells: Vec<String> = figs
            .iter()
            .map(|f| {
                format!(
                    "{:>7.0} {:>8.1} {:>8.1} {:>5.2}",
                    f.ops, f.p50_us, f.p99_us, f.ratio
                )
            })
            .collect();
        println!("{name:<14} | {}", cells.join(" | "));
    }
    println!(
        "\n×raw: library throughput / raw-driver baseline throughput (same statements or scripts, same pool or connection).\n\
         Latencies are the library's. Round trips: fresh = claim + complete, replay = one claim \
         (SQLite: the claim reads first; a fresh key then runs the claim write on the same connection)."
    );
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let mut rows = Vec::new();
    let (lib, raw) = (Lib::new(MemoryStore::new(), BODY), RawMemory::new(BODY));
    add_row(&mut rows, "memory", lib, raw).await;

    #[cfg(feature = "sqlite")]
    {
        use common::stores::sqlite::RawSqlite;
        use idem::sqlite::SqliteStore;

        let db = common::stores::TempDb::new("compare");
        match SqliteStore::open(&db.0).await {
            Ok(store) => {
                let raw = RawSqlite::new(&store, BODY);
                add_row(&mut rows, "sqlite-file", Lib::new(store, BODY), raw).await;
            }
            Err(e) => eprintln!("\nNOTE: SQLite file unavailable ({e}): skipped"),
        }
        match SqliteStore::memory().await {
            Ok(store) => {
                let raw = RawSqlite::new(&store, BODY);
                add_row(&mut rows, "sqlite-memory", Lib::new(store, BODY), raw).await;
            }
            Err(e) => eprintln!("\nNOTE: SQLite memory unavailable ({e}): skipped"),
        }
    }

    #[cfg(feature = "postgres")]
    {
        use common::stores::postgres::RawPostgres;
        use idem::postgres::PgStore;

        let url = server_url(
            "IDEM_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432/test",
        );
        match PgStore::connect(&url).await {
            Ok(store) => {
                let store = store
                    .with_schema_name("idem_bench")
                    .and_then(|s| s.with_table_name("compare_records"))
                    .expect("valid names");
                store.migrate().await.expect("migrate the bench schema");
                let raw = RawPostgres::new(&store, BODY);
                add_row(&mut rows, "postgres", Lib::new(store.clone(), BODY), raw).await;
                let drop = idem::postgres::sqlx::AssertSqlSafe(
                    "DROP SCHEMA IF EXISTS \"idem_bench\" CASCADE",
                );
                if let Err(e) = idem::postgres::sqlx::raw_sql(drop)
                    .execute(store.pool())
                    .await
                {
                    eprintln!("\nNOTE: could not drop schema idem_bench: {e}");
                }
            }
            Err(e) => eprintln!("\nNOTE: Postgres at {url} unreachable ({e}): skipped"),
        }
    }

    #[cfg(feature = "mysql")]
    {
        use common::stores::mysql::RawMySql;
        use idem::mysql::MySqlStore;

        let url = server_url("IDEM_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
        match MySqlStore::connect(&url).await {
            Ok(store) => {
                let store = store
                    .with_table_name("idem_compare_records")
                    .expect("valid name");
                store.migrate().await.expect("migrate the bench table");
                let raw = RawMySql::new(&store, BODY);
                add_row(&mut rows, "mysql", Lib::new(store.clone(), BODY), raw).await;
                let drop =
                    idem::mysql::sqlx::AssertSqlSafe("DROP TABLE IF EXISTS `idem_compare_records`");
                if let Err(e) = idem::mysql::sqlx::raw_sql(drop).execute(store.pool()).await {
                    eprintln!("\nNOTE: could not drop table idem_compare_records: {e}");
                }
            }
            Err(e) => eprintln!("\nNOTE: MySQL at {url} unreachable ({e}): skipped"),
        }
    }

    #[cfg(feature = "redis")]
    {
        use common::stores::redis::{RawRedis, clean};
        use idem::redis::RedisStore;
        use idem::redis::redis::aio::ConnectionManager;

        let url = server_url("IDEM_REDIS_URL", "redis://127.0.0.1:6379/");
        let conn = match idem::redis::redis::Client::open(url.as_str()) {
            Ok(client) => ConnectionManager::new(client).await,
            Err(e) => Err(e),
        };
        match conn {
            Ok(conn) => {
                let prefix = format!("idem-compare-{}:", std::process::id());
                let store = RedisStore::new(conn.clone())
                    .with_prefix(&prefix)
                    .expect("valid prefix");
                let raw = RawRedis::new(conn.clone(), &format!("{prefix}raw:"), BODY);
                add_row(&mut rows, "redis", Lib::new(store, BODY), raw).await;
                clean(&conn, &prefix).await;
            }
            Err(e) => eprintln!("\nNOTE: Redis at {url} unreachable ({e}): skipped"),
        }
    }

    print_table(&rows);
}
