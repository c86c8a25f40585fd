//! Store benches: for each backend and scenario, the library call
//! (`Idem::execute`) and its raw-driver baseline (the same statements or
//! script calls through the same pool or connection) in one criterion group,
//! so their ratio comes from one run on one machine.
//!
//! Scenarios: a fresh key (claim, no-op work returning the body, complete), a
//! replay of a completed key, and contention (64 tasks on 16 hot keys:
//! claims, conflicts and replays mixed); 1, 8 and 64 concurrent tasks;
//! 256-byte and 4 KiB bodies.
//!
//! Backends: `MemoryStore` (baseline: a `HashMap` behind a `Mutex`), SQLite
//! file (WAL) and SQLite memory with the `sqlite` feature, Postgres with
//! `postgres` (`IDEM_POSTGRES_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`; schema `idem_bench`, dropped at
//! the end) and Redis with `redis` (`IDEM_REDIS_URL`, default
//! `redis://127.0.0.1:6379/`; keys under `idem-bench-<pid>:`, deleted at the
//! end). An unreachable server is reported and its groups skipped.
//!
//! Run with: `cargo bench --bench store` (`IDEM_BENCH_QUICK=1` for a short
//! run; a criterion filter such as `-- sqlite-file` picks groups). A table of
//! ratios is printed at the end and written to `target/idem-bench-store.md`.
//! `IDEM_BENCH_PAIRED=5` skips criterion and measures each group in 5
//! alternating library/raw rounds instead (median of the per-round ratios).

#[allow(dead_code, reason = "each bench uses a part of the shared helpers")]
mod common;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::stores::memory::RawMemory;
use common::stores::workload::{Lib, Plan, Scenario, Target, run, run_id};
use criterion::{Criterion, Throughput};
use idem_core::MemoryStore;
use tokio::runtime::Runtime;

/// Totals per group and side, for the ratio table.
#[derive(Debug, Default)]
struct Summary {
    rows: Mutex<BTreeMap<String, Row>>,
}

#[derive(Debug, Default)]
struct Row {
    /// Nanoseconds per call of every sample, library and raw baseline.
    lib: Vec<f64>,
    raw: Vec<f64>,
    /// raw time / library time of each alternating pair (paired mode).
    pairs: Vec<f64>,
    mix: Option<String>,
}

/// Calls per second at the median sample (robust to the odd stall of a
/// shared machine, as criterion's own estimates are).
fn median_rate(samples: &[f64]) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    match s.get(s.len() / 2) {
        Some(&ns) if ns > 0.0 => 1e9 / ns,
        _ => 0.0,
    }
}

impl Summary {
    fn add(&self, group: &str, lib: bool, calls: u64, took: Duration) {
        let mut rows = self
            .rows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let row = rows.entry(group.to_owned()).or_default();
        let side = if lib { &mut row.lib } else { &mut row.raw };
        side.push(took.as_nanos() as f64 / calls.max(1) as f64);
    }

    fn pair(&self, group: &str, ratio: f64) {
        let mut rows = self
            .rows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        rows.entry(group.to_owned()).or_default().pairs.push(ratio);
    }

    /// Notes how the contended calls ended, for a group that ran.
    fn mix(&self, group: &str, mix: String) {
        let mut rows = self
            .rows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(row) = rows.get_mut(group) {
            row.mix = Some(mix);
        }
    }

    fn table(&self) -> String {
        let rows = self
            .rows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out = String::from(
            "| group | idem ops/s | raw ops/s | idem / raw | contended mix (idem: executed/replayed/409) |\n|---|---:|---:|---:|---|\n",
        );
        for (group, row) in rows.iter() {
            let (l, r) = (median_rate(&row.lib), median_rate(&row.raw));
            let ratio = if row.pairs.is_empty() {
                if r > 0.0 { l / r } else { 0.0 }
            } else {
                let mut p = row.pairs.clone();
                p.sort_by(f64::total_cmp);
                p[p.len() / 2]
            };
            out.push_str(&format!(
                "| {group} | {l:.0} | {r:.0} | {ratio:.2} | {} |\n",
                row.mix.as_deref().unwrap_or("")
            ));
        }
        out
    }
}

fn concurrencies(scenario: Scenario) -> &'static [usize] {
    match scenario {
        Scenario::Contended => &[64],
        _ => &[1, 8, 64],
    }
}

/// `IDEM_BENCH_PAIRED=N`: instead of criterion, N alternating rounds of
/// library and raw baseline per group (order swapped every round), each
/// about 0.3 s; the ratio reported is the median of the N per-round ratios,
/// which cancels the slow drifts of a shared machine better than two
/// criterion runs one after the other.
fn paired_rounds() -> usize {
    std::env::var("IDEM_BENCH_PAIRED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn paired<L: Target, R: Target>(
    rt: &Runtime,
    summary: &Summary,
    group: &str,
    lib: &Arc<Plan<L>>,
    raw: &Arc<Plan<R>>,
    scenario: Scenario,
    tasks: usize,
) {
    // Calibrate on the library: enough calls for about 0.3 s per side.
    let probe = rt.block_on(run(lib, scenario, tasks, 64, false)).elapsed;
    let per_call = probe.as_secs_f64() / 64.0;
    let calls = ((0.3 / per_call.max(1e-9)) as u64).clamp(64, 500_000);
    eprint!("{group}: {} rounds of {calls} calls", paired_rounds());
    for round in 0..paired_rounds() {
        let (l, r) = if round % 2 == 0 {
            let r = rt.block_on(run(raw, scenario, tasks, calls, false)).elapsed;
            (
                rt.block_on(run(lib, scenario, tasks, calls, false)).elapsed,
                r,
            )
        } else {
            let l = rt.block_on(run(lib, scenario, tasks, calls, false)).elapsed;
            (
                l,
                rt.block_on(run(raw, scenario, tasks, calls, false)).elapsed,
            )
        };
        summary.add(group, true, calls, l);
        summary.add(group, false, calls, r);
        summary.pair(group, r.as_secs_f64() / l.as_secs_f64());
        eprint!(".");
    }
    eprintln!();
}

/// Every scenario and concurrency of one backend and body size.
fn bench_pair<L: Target, R: Target>(
    c: &mut Criterion,
    rt: &Runtime,
    summary: &Arc<Summary>,
    backend: &str,
    body: usize,
    lib: L,
    raw: R,
) {
    let run_id = run_id();
    let lib = Arc::new(Plan::new(lib, format!("{run_id}-{backend}-lib-{body}")));
    let raw = Arc::new(Plan::new(raw, format!("{run_id}-{backend}-raw-{body}")));
    rt.block_on(lib.prepare_replays());
    rt.block_on(raw.prepare_replays());
    for scenario in [Scenario::Fresh, Scenario::Replay, Scenario::Contended] {
        for &tasks in concurrencies(scenario) {
            let group = format!("{backend}/{}/{body}B/c{tasks}", scenario.name());
            if paired_rounds() > 0 {
                paired(rt, summary, &group, &lib, &raw, scenario, tasks);
                continue;
            }
            let mut g = c.benchmark_group(&group);
            g.throughput(Throughput::Elements(1));
            g.bench_function("idem", |b| {
                b.iter_custom(|calls| {
                    let took = rt
                        .block_on(run(&lib, scenario, tasks, calls, false))
                        .elapsed;
                    summary.add(&group, true, calls, took);
                    took
                });
            });
            g.bench_function("raw", |b| {
                b.iter_custom(|calls| {
                    let took = rt
                        .block_on(run(&raw, scenario, tasks, calls, false))
                        .elapsed;
                    summary.add(&group, false, calls, took);
                    took
                });
            });
            g.finish();
        }
    }
    let m = &lib.mix;
    let mix = format!(
        "{}/{}/{}",
        m.executed.load(Ordering::Relaxed),
        m.replayed.load(Ordering::Relaxed),
        m.conflicts.load(Ordering::Relaxed)
    );
    summary.mix(&format!("{backend}/contended/{body}B/c64"), mix);
}

fn memory(c: &mut Criterion, rt: &Runtime, summary: &Arc<Summary>) {
    for body in common::stores::BODIES {
        bench_pair(
            c,
            rt,
            summary,
            "memory",
            body,
            Lib::new(MemoryStore::new(), body),
            RawMemory::new(body),
        );
    }
}

#[cfg(feature = "sqlite")]
fn sqlite(c: &mut Criterion, rt: &Runtime, summary: &Arc<Summary>) {
    use common::stores::TempDb;
    use common::stores::sqlite::RawSqlite;
    use idem_sqlite::SqliteStore;

    for body in common::stores::BODIES {
        let db = TempDb::new(&format!("file-{body}"));
        let store = rt
            .block_on(SqliteStore::open(&db.0))
            .expect("open SQLite file");
        let raw = RawSqlite::new(&store, body);
        bench_pair(
            c,
            rt,
            summary,
            "sqlite-file",
            body,
            Lib::new(store, body),
            raw,
        );

        let store = rt
            .block_on(SqliteStore::memory())
            .expect("open SQLite memory");
        let raw = RawSqlite::new(&store, body);
        bench_pair(
            c,
            rt,
            summary,
            "sqlite-memory",
            body,
            Lib::new(store, body),
            raw,
        );
    }
}

/// Native cost of the engine's per-call pieces (`IDEM_STORE_PROFILE=parts`):
/// best of 5 runs of 100,000 calls each.
fn parts() {
    use idem_core::store::Token;
    use idem_core::{FieldFilter, IdempotencyKey, RecordId, Scope, fingerprint};
    use std::hint::black_box;
    use std::time::Instant;

    fn best(label: &str, mut f: impl FnMut()) {
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            for _ in 0..100_000 {
                f();
            }
            best = best.min(t.elapsed().as_secs_f64() * 1e9 / 100_000.0);
        }
        println!("{label:<40} {best:>8.0} ns");
    }
    let request = common::stores::workload::request();
    let scope = Scope::new("bench-owner", "POST /payments").expect("scope");
    let id = RecordId::new(
        scope.clone(),
        IdempotencyKey::parse("order-7").expect("key"),
    );
    best("fingerprint(request)", || {
        black_box(fingerprint(
            "POST /payments",
            black_box(&request),
            &FieldFilter::All,
        ))
        .ok();
    });
    best("RecordId::log_hash", || {
        black_box(black_box(&id).log_hash());
    });
    best("Token::random", || {
        black_box(Token::random());
    });
    best("IdempotencyKey::parse + RecordId::new", || {
        let key = IdempotencyKey::parse(black_box("order-7")).expect("key");
        black_box(RecordId::new(scope.clone(), key));
    });
}

/// `IDEM_STORE_PROFILE=fresh|replay` makes 20,000 such calls on
/// `MemoryStore` through the library (`raw-fresh|raw-replay`: on the raw
/// baseline) and exits: a fixed loop for
/// `valgrind --tool=callgrind` to count what the engine adds.
fn profile(which: &str, rt: &Runtime) {
    if which == "parts" {
        parts();
        return;
    }
    let scenario = if which.ends_with("fresh") {
        Scenario::Fresh
    } else {
        Scenario::Replay
    };
    // `raw-fresh|raw-replay`: the same loop on the raw baseline, so that
    // idem minus raw is the engine's own count.
    let took = if which.starts_with("raw-") {
        let plan = Arc::new(Plan::new(RawMemory::new(256), run_id()));
        rt.block_on(plan.prepare_replays());
        rt.block_on(run(&plan, scenario, 1, 20_000, false)).elapsed
    } else {
        let plan = Arc::new(Plan::new(Lib::new(MemoryStore::new(), 256), run_id()));
        rt.block_on(plan.prepare_replays());
        rt.block_on(run(&plan, scenario, 1, 20_000, false)).elapsed
    };
    println!("{which}: 20000 calls in {took:?}");
}

/// The Postgres URL of the tests (`IDEM_POSTGRES_URL`).
#[cfg(feature = "postgres")]
fn postgres_url() -> String {
    std::env::var("IDEM_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// The bench's own schema: created here, dropped at the end.
#[cfg(feature = "postgres")]
const PG_SCHEMA: &str = "idem_bench";

#[cfg(feature = "postgres")]
fn postgres(c: &mut Criterion, rt: &Runtime, summary: &Arc<Summary>) {
    use common::stores::postgres::RawPostgres;
    use idem_postgres::PgStore;

    let url = postgres_url();
    let store = match rt.block_on(PgStore::connect(&url)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("NOTE: Postgres at {url} unreachable ({e}): postgres groups NOT run");
            return;
        }
    };
    let store = store
        .with_schema_name(PG_SCHEMA)
        .and_then(|s| s.with_table_name("bench_records"))
        .expect("valid names");
    rt.block_on(store.migrate())
        .expect("migrate the bench schema");
    for body in common::stores::BODIES {
        let raw = RawPostgres::new(&store, body);
        bench_pair(
            c,
            rt,
            summary,
            "postgres",
            body,
            Lib::new(store.clone(), body),
            raw,
        );
    }
    let drop = format!("DROP SCHEMA IF EXISTS \"{PG_SCHEMA}\" CASCADE");
    rt.block_on(
        idem_postgres::sqlx::raw_sql(idem_postgres::sqlx::AssertSqlSafe(drop))
            .execute(store.pool()),
    )
    .expect("drop the bench schema");
}

/// The Redis URL of the tests (`IDEM_REDIS_URL`).
#[cfg(feature = "redis")]
fn redis_url() -> String {
    std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned())
}

#[cfg(feature = "redis")]
fn redis(c: &mut Criterion, rt: &Runtime, summary: &Arc<Summary>) {
    use common::stores::redis::{RawRedis, clean};
    use idem_redis::RedisStore;
    use idem_redis::redis::aio::ConnectionManager;

    let url = redis_url();
    let conn = match rt.block_on(async {
        let client = idem_redis::redis::Client::open(url.as_str())?;
        ConnectionManager::new(client).await
    }) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("NOTE: Redis at {url} unreachable ({e}): redis groups NOT run");
            return;
        }
    };
    // The bench's own key prefix; every key under it is deleted at the end.
    let prefix = format!("idem-bench-{}:", std::process::id());
    for body in common::stores::BODIES {
        // The store and the baseline share one multiplexed connection.
        let store = RedisStore::from_manager(conn.clone())
            .with_prefix(&prefix)
            .expect("valid prefix");
        let raw = RawRedis::new(conn.clone(), &format!("{prefix}raw:"), body);
        bench_pair(c, rt, summary, "redis", body, Lib::new(store, body), raw);
    }
    rt.block_on(clean(&conn, &prefix));
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Ok(which) = std::env::var("IDEM_STORE_PROFILE") {
        profile(&which, &rt);
        return;
    }
    let summary = Arc::new(Summary::default());
    let mut c = common::criterion();
    memory(&mut c, &rt, &summary);
    #[cfg(feature = "sqlite")]
    sqlite(&mut c, &rt, &summary);
    #[cfg(feature = "postgres")]
    postgres(&mut c, &rt, &summary);
    #[cfg(feature = "redis")]
    redis(&mut c, &rt, &summary);
    c.final_summary();
    let table = summary.table();
    println!("\n{table}");
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/idem-bench-store.md");
    if let Err(e) = std::fs::write(&path, &table) {
        eprintln!("could not write {}: {e}", path.display());
    }
}
