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
//! the end), MySQL/MariaDB with `mysql` (`IDEM_MYSQL_URL`, default
//! `mysql://root@127.0.0.1:3306/test`; tables `idem_bench_records` and
//! `idem_bench_min`, dropped at the end) and Redis with `redis` (`IDEM_REDIS_URL`, default
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
use common::stores::min::MinMemory;
use common::stores::workload::{Lib, Plan, Scenario, Target, run, run_id};
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use idem_core::MemoryStore;
use tokio::runtime::Runtime;

/// Totals per group and side, for the ratio table.
#[derive(Debug, Default)]
struct Summary {
    rows: Mutex<BTreeMap<String, Row>>,
}

#[derive(Debug, Default)]
struct Row {
    /// Nanoseconds per call of every sample: library, the store's own
    /// statements without the engine, the minimal hand-written pattern.
    lib: Vec<f64>,
    raw: Vec<f64>,
    min: Vec<f64>,
    /// The minimal pattern with one checkout per statement (SQL backends).
    min2: Vec<f64>,
    /// A peer library on the same store (Redis: the `idempotent` crate).
    peer: Vec<f64>,
    /// store-statements time / library time of each alternating round
    /// (paired mode).
    pairs: Vec<f64>,
    /// minimal-pattern time / library time of each alternating round.
    pairs_min: Vec<f64>,
    /// two-checkout minimal time / library time of each round.
    pairs_min2: Vec<f64>,
    /// peer library time / library time of each round.
    pairs_peer: Vec<f64>,
    mix: Option<String>,
}

/// Which side a sample belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Lib,
    Store,
    Min,
    Min2,
    Peer,
}

fn median(v: &[f64]) -> f64 {
    let mut p = v.to_vec();
    p.sort_by(f64::total_cmp);
    p.get(p.len() / 2).copied().unwrap_or(0.0)
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
    fn add(&self, group: &str, side: Side, calls: u64, took: Duration) {
        let mut rows = self
            .rows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let row = rows.entry(group.to_owned()).or_default();
        let side = match side {
            Side::Lib => &mut row.lib,
            Side::Store => &mut row.raw,
            Side::Min => &mut row.min,
            Side::Min2 => &mut row.min2,
            Side::Peer => &mut row.peer,
        };
        side.push(took.as_nanos() as f64 / calls.max(1) as f64);
    }

    fn pair(
        &self,
        group: &str,
        store_ratio: f64,
        min_ratio: f64,
        min2_ratio: Option<f64>,
        peer_ratio: Option<f64>,
    ) {
        let mut rows = self
            .rows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let row = rows.entry(group.to_owned()).or_default();
        row.pairs.push(store_ratio);
        row.pairs_min.push(min_ratio);
        row.pairs_min2.extend(min2_ratio);
        row.pairs_peer.extend(peer_ratio);
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
            "| group | idem ops/s | store-stmts ops/s | minimal ops/s | minimal-2co ops/s | idempotent ops/s | idem / store-stmts | idem / minimal | idem / minimal-2co | idem / idempotent | contended mix (idem: executed/replayed/409) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
        );
        for (group, row) in rows.iter() {
            let (l, r, m, m2, p) = (
                median_rate(&row.lib),
                median_rate(&row.raw),
                median_rate(&row.min),
                median_rate(&row.min2),
                median_rate(&row.peer),
            );
            let ratio = |pairs: &[f64], base: f64| {
                if pairs.is_empty() {
                    if base > 0.0 { l / base } else { 0.0 }
                } else {
                    median(pairs)
                }
            };
            // The two-checkout side runs on the SQL backends only, the peer
            // library on Redis only.
            let optional = |samples: &[f64], pairs: &[f64], rate: f64| {
                if samples.is_empty() {
                    ("–".to_owned(), "–".to_owned())
                } else {
                    (format!("{rate:.0}"), format!("{:.2}", ratio(pairs, rate)))
                }
            };
            let (m2_rate, m2_ratio) = optional(&row.min2, &row.pairs_min2, m2);
            let (p_rate, p_ratio) = optional(&row.peer, &row.pairs_peer, p);
            out.push_str(&format!(
                "| {group} | {l:.0} | {r:.0} | {m:.0} | {m2_rate} | {p_rate} | {:.2} | {:.2} | {m2_ratio} | {p_ratio} | {} |\n",
                ratio(&row.pairs, r),
                ratio(&row.pairs_min, m),
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

/// `IDEM_BENCH_ONLY=postgres,redis` and `IDEM_BENCH_BODIES=256` pick the
/// backends and body sizes measured (default: all).
fn selected(backend: &str, body: usize) -> bool {
    let listed = |var: &str, v: &str| {
        std::env::var(var).map_or(true, |list| {
            list.is_empty() || list.split(',').any(|x| x.trim() == v)
        })
    };
    listed("IDEM_BENCH_ONLY", backend) && listed("IDEM_BENCH_BODIES", &body.to_string())
}

/// The sides of one backend at one pool size: the library, the store's
/// statements, the minimal pattern, (SQL backends) the minimal pattern
/// with one checkout per statement, and (Redis) a peer library.
struct Sides<L, R, M, P> {
    lib: Arc<Plan<L>>,
    raw: Arc<Plan<R>>,
    min: Arc<Plan<M>>,
    min2: Option<Arc<Plan<M>>>,
    peer: Option<Arc<Plan<P>>>,
}

/// The peer side of a backend that has none.
enum NoPeer {}

impl Target for NoPeer {
    async fn fresh(&self, _: &str) {
        match *self {}
    }

    async fn replay(&self, _: &str) {
        match *self {}
    }

    async fn contended(&self, _: &str) -> common::stores::workload::Ended {
        match *self {}
    }
}

/// Where a side is measured: one group's scenario and concurrency.
struct At<'a> {
    rt: &'a Runtime,
    summary: &'a Summary,
    group: &'a str,
    scenario: Scenario,
    tasks: usize,
}

impl At<'_> {
    /// How long `calls` calls of the scenario take on `plan`.
    fn time<T: Target>(&self, plan: &Arc<Plan<T>>, calls: u64) -> Duration {
        self.rt
            .block_on(run(plan, self.scenario, self.tasks, calls, false))
            .elapsed
    }

    /// `plan` as the function `name` of criterion's group `g`, each timing
    /// also added to the summary as `side`.
    fn bench<T: Target>(
        &self,
        g: &mut BenchmarkGroup<'_, WallTime>,
        name: &str,
        side: Side,
        plan: &Arc<Plan<T>>,
    ) {
        g.bench_function(name, |b| {
            b.iter_custom(|calls| {
                let took = self.time(plan, calls);
                self.summary.add(self.group, side, calls, took);
                took
            });
        });
    }
}

fn paired<L: Target, R: Target, M: Target, P: Target>(
    rt: &Runtime,
    summary: &Summary,
    group: &str,
    sides: &Sides<L, R, M, P>,
    scenario: Scenario,
    tasks: usize,
) {
    let at = At {
        rt,
        summary,
        group,
        scenario,
        tasks,
    };
    // Calibrate on the library: enough calls for about 0.3 s per side.
    let probe = at.time(&sides.lib, 64);
    let per_call = probe.as_secs_f64() / 64.0;
    let calls = ((0.3 / per_call.max(1e-9)) as u64).clamp(64, 500_000);
    eprint!("{group}: {} rounds of {calls} calls", paired_rounds());
    for round in 0..paired_rounds() {
        // The order turns every round, so no side always runs first.
        let order = match round % 5 {
            0 => [Side::Min, Side::Store, Side::Peer, Side::Min2, Side::Lib],
            1 => [Side::Lib, Side::Min, Side::Store, Side::Peer, Side::Min2],
            2 => [Side::Min2, Side::Lib, Side::Min, Side::Store, Side::Peer],
            3 => [Side::Peer, Side::Min2, Side::Lib, Side::Min, Side::Store],
            _ => [Side::Store, Side::Peer, Side::Min2, Side::Lib, Side::Min],
        };
        let mut took = [Duration::ZERO; 5];
        for side in order {
            let t = match side {
                Side::Lib => at.time(&sides.lib, calls),
                Side::Store => at.time(&sides.raw, calls),
                Side::Min => at.time(&sides.min, calls),
                Side::Min2 => match &sides.min2 {
                    Some(min2) => at.time(min2, calls),
                    None => continue,
                },
                Side::Peer => match &sides.peer {
                    Some(peer) => at.time(peer, calls),
                    None => continue,
                },
            };
            summary.add(group, side, calls, t);
            took[side as usize] = t;
        }
        let l = took[0].as_secs_f64();
        let min2 = sides.min2.as_ref().map(|_| took[3].as_secs_f64() / l);
        let peer = sides.peer.as_ref().map(|_| took[4].as_secs_f64() / l);
        summary.pair(
            group,
            took[1].as_secs_f64() / l,
            took[2].as_secs_f64() / l,
            min2,
            peer,
        );
        eprint!(".");
    }
    eprintln!();
}

/// Every scenario and concurrency of one backend and body size. `make`
/// builds the sides on a pool of the given size (min(tasks, 16)), once per
/// concurrency: library, store statements, minimal pattern, the minimal
/// pattern with one checkout per statement where the backend has a pool,
/// and a peer library where one is measured.
fn bench_backend<L, R, M, P, F>(
    c: &mut Criterion,
    rt: &Runtime,
    summary: &Arc<Summary>,
    backend: &str,
    body: usize,
    make: impl Fn(u32) -> F,
) where
    L: Target,
    R: Target,
    M: Target,
    P: Target,
    F: std::future::Future<Output = (L, R, M, Option<M>, Option<P>)>,
{
    if !selected(backend, body) {
        return;
    }
    let run_id = run_id();
    for tasks in [1usize, 8, 64] {
        let (lib, raw, min, min2, peer) =
            rt.block_on(make(u32::try_from(tasks.min(16)).unwrap_or(16)));
        let prefix = format!("{run_id}-{backend}-{body}-c{tasks}");
        let sides = Sides {
            lib: Arc::new(Plan::new(lib, format!("{prefix}-lib"))),
            raw: Arc::new(Plan::new(raw, format!("{prefix}-raw"))),
            min: Arc::new(Plan::new(min, format!("{prefix}-min"))),
            min2: min2.map(|m| Arc::new(Plan::new(m, format!("{prefix}-min2")))),
            peer: peer.map(|p| Arc::new(Plan::new(p, format!("{prefix}-peer")))),
        };
        rt.block_on(sides.lib.prepare_replays());
        rt.block_on(sides.raw.prepare_replays());
        rt.block_on(sides.min.prepare_replays());
        if let Some(min2) = &sides.min2 {
            rt.block_on(min2.prepare_replays());
        }
        if let Some(peer) = &sides.peer {
            rt.block_on(peer.prepare_replays());
        }
        for scenario in [Scenario::Fresh, Scenario::Replay, Scenario::Contended] {
            if !concurrencies(scenario).contains(&tasks) {
                continue;
            }
            let group = format!("{backend}/{}/{body}B/c{tasks}", scenario.name());
            if paired_rounds() > 0 {
                batches::forget();
                paired(rt, summary, &group, &sides, scenario, tasks);
                batches::note(&group);
                continue;
            }
            let at = At {
                rt,
                summary,
                group: &group,
                scenario,
                tasks,
            };
            let mut g = c.benchmark_group(&group);
            g.throughput(Throughput::Elements(1));
            at.bench(&mut g, "idem", Side::Lib, &sides.lib);
            at.bench(&mut g, "store-stmts", Side::Store, &sides.raw);
            at.bench(&mut g, "minimal", Side::Min, &sides.min);
            if let Some(min2) = &sides.min2 {
                at.bench(&mut g, "minimal-2co", Side::Min2, min2);
            }
            if let Some(peer) = &sides.peer {
                at.bench(&mut g, "idempotent", Side::Peer, peer);
            }
            g.finish();
        }
        if tasks == 64 {
            let m = &sides.lib.mix;
            let mix = format!(
                "{}/{}/{}",
                m.executed.load(Ordering::Relaxed),
                m.replayed.load(Ordering::Relaxed),
                m.conflicts.load(Ordering::Relaxed)
            );
            summary.mix(&format!("{backend}/contended/{body}B/c64"), mix);
        }
    }
}

/// A SQL backend's sides on `store`: the library, its own statements `raw`,
/// the minimal pattern `min` builds on the store's pool, and that pattern
/// again with one checkout per statement (`two`); no peer library.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
async fn sql_sides<S, R, M, F>(
    store: S,
    body: usize,
    raw: R,
    min: impl Fn() -> F,
    two: fn(M) -> M,
) -> (Lib<S>, R, M, Option<M>, Option<NoPeer>)
where
    S: idem_core::store::Store,
    F: std::future::Future<Output = M>,
{
    let one = min().await;
    let two = two(min().await);
    (Lib::new(store, body), raw, one, Some(two), None)
}

/// The server's answer to a connection, or `None` (and a note on stderr:
/// its groups, named in lower case, are not run) when `server` at `url` is
/// unreachable.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "redis"))]
fn reached<T>(connected: Result<T, impl std::fmt::Display>, server: &str, url: &str) -> Option<T> {
    let groups = server.to_lowercase();
    connected
        .map_err(|e| {
            eprintln!("NOTE: {server} at {url} unreachable ({e}): {groups} groups NOT run")
        })
        .ok()
}

fn memory(c: &mut Criterion, rt: &Runtime, summary: &Arc<Summary>) {
    for body in common::stores::BODIES {
        bench_backend(c, rt, summary, "memory", body, |_| async move {
            (
                Lib::new(MemoryStore::new(), body),
                RawMemory::new(body),
                MinMemory::new(body),
                None,
                None::<NoPeer>,
            )
        });
    }
}

#[cfg(feature = "sqlite")]
fn sqlite(c: &mut Criterion, rt: &Runtime, summary: &Arc<Summary>) {
    use common::stores::TempDb;
    use common::stores::min::sqlite::MinSqlite;
    use common::stores::sqlite::RawSqlite;
    use idem_sqlite::SqliteStore;
    use idem_sqlite::sqlx::sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
    };

    for body in common::stores::BODIES {
        let db = TempDb::new(&format!("file-{body}"));
        let path = db.0.clone();
        bench_backend(c, rt, summary, "sqlite-file", body, |size| {
            // The settings of `SqliteStore::open`, at the bench's pool size.
            let options = SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
                .busy_timeout(idem_sqlite::DEFAULT_BUSY_TIMEOUT);
            async move {
                let pool = SqlitePoolOptions::new().max_connections(size.max(1));
                let store = SqliteStore::connect_with(pool, options)
                    .await
                    .expect("open SQLite file");
                store.migrate().await.expect("migrate");
                let (raw, pool) = (RawSqlite::new(&store, body), store.pool().clone());
                let min = move || MinSqlite::new(pool.clone(), body);
                sql_sides(store, body, raw, min, MinSqlite::two_checkouts).await
            }
        });
        bench_backend(c, rt, summary, "sqlite-memory", body, |_| async move {
            let store = SqliteStore::memory().await.expect("open SQLite memory");
            let (raw, pool) = (RawSqlite::new(&store, body), store.pool().clone());
            let min = move || MinSqlite::new(pool.clone(), body);
            sql_sides(store, body, raw, min, MinSqlite::two_checkouts).await
        });
    }
}

/// Native cost of the engine's per-call pieces (`IDEM_STORE_PROFILE=parts`):
/// best of 5 runs of 100,000 calls each.
fn parts() {
    use idem_core::adapter::fingerprint;
    use idem_core::store::Token;
    use idem_core::{FieldFilter, IdempotencyKey, RecordId, Scope};
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
    #[cfg(feature = "postgres")]
    if let Some(side) = which.strip_prefix("postgres-") {
        profile_postgres(side, scenario, rt);
        return;
    }
    #[cfg(feature = "redis")]
    if let Some(side) = which.strip_prefix("redis-") {
        profile_redis(side, scenario, rt);
        return;
    }
    #[cfg(feature = "sqlite")]
    if let Some(side) = which.strip_prefix("sqlite-") {
        profile_sqlite(side, scenario, rt);
        return;
    }
    // `raw-fresh|raw-replay`: the same loop on the raw baseline, so that
    // idem minus raw is the engine's own count.
    let took = if which.starts_with("raw-") {
        profile_loop(rt, RawMemory::new(256), scenario, 1, 20_000)
    } else {
        profile_loop(rt, Lib::new(MemoryStore::new(), 256), scenario, 1, 20_000)
    };
    println!("{which}: 20000 calls in {took:?}");
}

/// One profile loop: `calls` calls of `scenario` on `target` at `tasks`
/// tasks (the replay keys prepared first); how long the calls took.
fn profile_loop<T: Target>(
    rt: &Runtime,
    target: T,
    scenario: Scenario,
    tasks: usize,
    calls: u64,
) -> Duration {
    let plan = Arc::new(Plan::new(target, run_id()));
    rt.block_on(plan.prepare_replays());
    rt.block_on(run(&plan, scenario, tasks, calls, false))
        .elapsed
}

/// `IDEM_PROFILE_CALLS` (default `calls`) and `IDEM_PROFILE_TASKS` (default
/// 64) of the backend profile modes.
#[cfg(any(feature = "postgres", feature = "redis", feature = "sqlite"))]
fn profile_size(calls: u64) -> (u64, usize) {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse().ok());
    (
        var("IDEM_PROFILE_CALLS").unwrap_or(calls),
        var("IDEM_PROFILE_TASKS").map_or(64, |t: u64| usize::try_from(t).unwrap_or(64)),
    )
}

/// `IDEM_STORE_PROFILE=redis-fresh|redis-replay|redis-min-fresh|redis-min-replay|redis-peer-fresh|redis-peer-replay`:
/// 200,000 calls (`IDEM_PROFILE_CALLS`) at 64 tasks (`IDEM_PROFILE_TASKS`),
/// the store keeping bodies of up to `IDEM_REDIS_INLINE_LIMIT` bytes (default
/// the bench's [`INLINE_LIMIT`](common::stores::redis::INLINE_LIMIT)) inside
/// their record, through the library, the minimal hand-written pattern or
/// the `idempotent` crate on the Redis of
/// `IDEM_REDIS_URL`, then exits: one side per process, so `perf stat` on the
/// client and `INFO cpu` on the server give each side's CPU per call.
#[cfg(feature = "redis")]
fn profile_redis(side: &str, scenario: Scenario, rt: &Runtime) {
    use common::stores::redis::clean;
    use common::stores::redis_min::MinRedis;
    use common::stores::redis_peer::PeerIdempotent;
    use idem_redis::RedisStore;
    use idem_redis::redis::aio::ConnectionManager;

    let (calls, tasks) = profile_size(200_000);
    let url = redis_url();
    let conn = rt
        .block_on(async {
            ConnectionManager::new(idem_redis::redis::Client::open(url.as_str())?).await
        })
        .expect("Redis reachable");
    let prefix = format!("idem-profile-{}:", std::process::id());
    let took = if side.starts_with("min-") {
        let min = MinRedis::new(conn.clone(), &prefix, 256);
        profile_loop(rt, min, scenario, tasks, calls)
    } else if side.starts_with("peer-") {
        let peer = rt.block_on(PeerIdempotent::new(&url, &format!("{prefix}peer"), 256));
        profile_loop(rt, peer, scenario, tasks, calls)
    } else {
        let store = RedisStore::new(conn.clone())
            .with_prefix(&prefix)
            .expect("valid prefix")
            .with_inline_body_limit(
                std::env::var("IDEM_REDIS_INLINE_LIMIT")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(common::stores::redis::INLINE_LIMIT),
            );
        profile_loop(rt, Lib::new(store, 256), scenario, tasks, calls)
    };
    rt.block_on(clean(&conn, &prefix));
    println!("redis-{side}: {calls} calls at {tasks} tasks in {took:?}");
}

/// `IDEM_STORE_PROFILE=postgres-fresh|postgres-replay|postgres-min-fresh|postgres-min-replay`:
/// like [`profile_redis`], on the Postgres of `IDEM_POSTGRES_URL` (pool of
/// min(tasks, 16), schema `idem_bench`, dropped at the end).
#[cfg(feature = "postgres")]
fn profile_postgres(side: &str, scenario: Scenario, rt: &Runtime) {
    use common::stores::min::postgres::MinPostgres;
    use idem_postgres::PgStore;
    use idem_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions};

    let (calls, tasks) = profile_size(50_000);
    let options: PgConnectOptions = postgres_url().parse().expect("Postgres URL");
    let pool = PgPoolOptions::new().max_connections(u32::try_from(tasks.min(16)).unwrap_or(16));
    let store = rt
        .block_on(PgStore::connect_with(pool, options))
        .expect("Postgres reachable")
        .with_schema_name(PG_SCHEMA)
        .and_then(|s| s.with_table_name("bench_records"))
        .expect("valid names");
    rt.block_on(store.migrate())
        .expect("migrate the bench schema");
    let took = if side.starts_with("min-") {
        let min = rt.block_on(MinPostgres::new(store.pool().clone(), PG_SCHEMA, 256));
        profile_loop(rt, min, scenario, tasks, calls)
    } else {
        profile_loop(rt, Lib::new(store.clone(), 256), scenario, tasks, calls)
    };
    let drop = format!("DROP SCHEMA IF EXISTS \"{PG_SCHEMA}\" CASCADE");
    rt.block_on(
        idem_postgres::sqlx::raw_sql(idem_postgres::sqlx::AssertSqlSafe(drop))
            .execute(store.pool()),
    )
    .expect("drop the bench schema");
    println!("postgres-{side}: {calls} calls at {tasks} tasks in {took:?}");
}

/// `IDEM_STORE_PROFILE=sqlite-fresh|sqlite-replay|sqlite-min-fresh|sqlite-min-replay`:
/// like [`profile_redis`], on a temporary SQLite file opened with
/// `SqliteStore::open`'s settings and a pool of min(tasks, 16), removed at
/// the end. Everything runs in the bench's process (sqlx's worker threads
/// included), so `perf stat` on it counts the whole cost.
#[cfg(feature = "sqlite")]
fn profile_sqlite(side: &str, scenario: Scenario, rt: &Runtime) {
    use common::stores::TempDb;
    use common::stores::min::sqlite::MinSqlite;
    use idem_sqlite::SqliteStore;
    use idem_sqlite::sqlx::sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
    };

    let (calls, tasks) = profile_size(50_000);
    let db = TempDb::new("profile");
    let options = SqliteConnectOptions::new()
        .filename(&db.0)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(idem_sqlite::DEFAULT_BUSY_TIMEOUT);
    let size = u32::try_from(tasks.min(16)).unwrap_or(16);
    let pool = SqlitePoolOptions::new().max_connections(size);
    let store = rt
        .block_on(SqliteStore::connect_with(pool, options))
        .expect("open SQLite file");
    rt.block_on(store.migrate()).expect("migrate");
    let took = if side.starts_with("min-") {
        let min = rt.block_on(MinSqlite::new(store.pool().clone(), 256));
        profile_loop(rt, min, scenario, tasks, calls)
    } else {
        profile_loop(rt, Lib::new(store.clone(), 256), scenario, tasks, calls)
    };
    rt.block_on(store.close());
    println!("sqlite-{side}: {calls} calls at {tasks} tasks in {took:?}");
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
    use common::stores::min::postgres::MinPostgres;
    use common::stores::postgres::RawPostgres;
    use idem_postgres::PgStore;
    use idem_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions};

    let url = postgres_url();
    let Some(store) = reached(rt.block_on(PgStore::connect(&url)), "Postgres", &url) else {
        return;
    };
    let store = store
        .with_schema_name(PG_SCHEMA)
        .and_then(|s| s.with_table_name("bench_records"))
        .expect("valid names");
    rt.block_on(store.migrate())
        .expect("migrate the bench schema");
    for body in common::stores::BODIES {
        bench_backend(c, rt, summary, "postgres", body, |size| {
            let url = url.clone();
            async move {
                // min(tasks, 16) connections, no ping before a checkout: the
                // same pool for the library and both baselines.
                let options: PgConnectOptions = url.parse().expect("Postgres URL");
                let pool = PgPoolOptions::new().max_connections(size);
                let store = PgStore::connect_with(pool, options)
                    .await
                    .expect("connect")
                    .with_schema_name(PG_SCHEMA)
                    .and_then(|s| s.with_table_name("bench_records"))
                    .expect("valid names");
                let (raw, pool) = (RawPostgres::new(&store, body), store.pool().clone());
                let min = move || MinPostgres::new(pool.clone(), PG_SCHEMA, body);
                sql_sides(store, body, raw, min, MinPostgres::two_checkouts).await
            }
        });
    }
    let drop = format!("DROP SCHEMA IF EXISTS \"{PG_SCHEMA}\" CASCADE");
    rt.block_on(
        idem_postgres::sqlx::raw_sql(idem_postgres::sqlx::AssertSqlSafe(drop))
            .execute(store.pool()),
    )
    .expect("drop the bench schema");
}

/// The MySQL URL of the tests (`IDEM_MYSQL_URL`).
#[cfg(feature = "mysql")]
fn mysql_url() -> String {
    std::env::var("IDEM_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// MySQL / MariaDB: the library (the server's claim statement, detected),
/// its raw statements, and the minimal `INSERT IGNORE` pattern (held
/// connection and one checkout per statement), in tables of the bench's own,
/// dropped at the end.
#[cfg(feature = "mysql")]
fn mysql(c: &mut Criterion, rt: &Runtime, summary: &Arc<Summary>) {
    use common::stores::min::mysql::MinMySql;
    use common::stores::mysql::RawMySql;
    use idem_mysql::MySqlStore;
    use idem_mysql::sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};

    const TABLE: &str = "idem_bench_records";
    const MIN: &str = "idem_bench_min";
    let url = mysql_url();
    let Some(store) = reached(rt.block_on(MySqlStore::connect(&url)), "MySQL", &url) else {
        return;
    };
    let store = store.with_table_name(TABLE).expect("valid name");
    rt.block_on(store.migrate())
        .expect("migrate the bench table");
    for body in common::stores::BODIES {
        bench_backend(c, rt, summary, "mysql", body, |size| {
            let url = url.clone();
            async move {
                // min(tasks, 16) connections, no ping before a checkout: the
                // same pool for the library and both baselines.
                let options: MySqlConnectOptions = url.parse().expect("MySQL URL");
                let pool = MySqlPoolOptions::new().max_connections(size);
                let store = MySqlStore::connect_with(pool, options)
                    .await
                    .expect("connect")
                    .with_table_name(TABLE)
                    .expect("valid name");
                let (raw, pool) = (RawMySql::new(&store, body), store.pool().clone());
                let min = move || MinMySql::new(pool.clone(), MIN, body);
                sql_sides(store, body, raw, min, MinMySql::two_checkouts).await
            }
        });
    }
    for t in [TABLE, MIN] {
        let drop = format!("DROP TABLE IF EXISTS `{t}`");
        rt.block_on(
            idem_mysql::sqlx::raw_sql(idem_mysql::sqlx::AssertSqlSafe(drop)).execute(store.pool()),
        )
        .expect("drop the bench tables");
    }
}

/// The Redis URL of the tests (`IDEM_REDIS_URL`).
#[cfg(feature = "redis")]
fn redis_url() -> String {
    std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned())
}

#[cfg(feature = "redis")]
fn redis(c: &mut Criterion, rt: &Runtime, summary: &Arc<Summary>) {
    use common::stores::redis::{INLINE_LIMIT, RawRedis, clean};
    use common::stores::redis_min::MinRedis;
    use common::stores::redis_peer::PeerIdempotent;
    use idem_redis::RedisStore;
    use idem_redis::redis::aio::ConnectionManager;

    let url = redis_url();
    let connected = rt.block_on(async {
        let client = idem_redis::redis::Client::open(url.as_str())?;
        ConnectionManager::new(client).await
    });
    let Some(conn) = reached(connected, "Redis", &url) else {
        return;
    };
    // The bench's own key prefix; every key under it is deleted at the end.
    let prefix = format!("idem-bench-{}:", std::process::id());
    for body in common::stores::BODIES {
        // The store and both baselines share one multiplexed connection.
        let conn = conn.clone();
        let prefix = prefix.clone();
        bench_backend(c, rt, summary, "redis", body, |_| {
            let (conn, prefix, url) = (conn.clone(), prefix.clone(), url.clone());
            async move {
                let store = RedisStore::new(conn.clone())
                    .with_prefix(&prefix)
                    .expect("valid prefix")
                    .with_inline_body_limit(INLINE_LIMIT);
                let raw = RawRedis::new(conn.clone(), &format!("{prefix}raw:"), body);
                let min = MinRedis::new(conn, &format!("{prefix}min:"), body);
                let peer = PeerIdempotent::new(&url, &format!("{prefix}peer"), body).await;
                (Lib::new(store, body), raw, min, None, Some(peer))
            }
        });
    }
    rt.block_on(clean(&conn, &prefix));
}

/// `IDEM_BENCH_BATCHES=1` (with `IDEM_BENCH_PAIRED`): how many calls each
/// store statement carried, from the `idem_store_batch_size` histogram,
/// per group, printed after the table. A run of its own: the recorder costs
/// the library some of its speed, so its throughput is not the table's.
#[cfg(feature = "metrics")]
mod batches {
    use std::sync::{Mutex, OnceLock};

    use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

    /// Installs the recorder if asked.
    pub(super) fn install() {
        if std::env::var_os("IDEM_BENCH_BATCHES").is_none() {
            return;
        }
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        if recorder.install().is_ok() {
            let _ = SNAPSHOTTER.set(snapshotter);
        }
    }

    /// Drops what was recorded so far (histograms drain on a snapshot).
    pub(super) fn forget() {
        if let Some(s) = SNAPSHOTTER.get() {
            drop(s.snapshot());
        }
    }

    /// Notes the batch sizes recorded since [`forget`] under `group`.
    pub(super) fn note(group: &str) {
        let Some(s) = SNAPSHOTTER.get() else {
            return;
        };
        let mut cells = Vec::new();
        for (key, _, _, value) in s.snapshot().into_vec() {
            let key = key.key();
            if key.name() != "idem_store_batch_size" {
                continue;
            }
            let call = key
                .labels()
                .find(|l| l.key() == "call")
                .map_or("?", |l| l.value())
                .to_owned();
            if let DebugValue::Histogram(samples) = value {
                if samples.is_empty() {
                    continue;
                }
                let calls: f64 = samples.iter().map(|x| x.into_inner()).sum();
                let max = samples.iter().map(|x| x.into_inner()).fold(0.0, f64::max);
                #[allow(clippy::cast_precision_loss, reason = "sample counts are small")]
                let mean = calls / samples.len().max(1) as f64;
                cells.push(format!(
                    "{call}: {calls} calls in {} statements, mean {mean:.1}, max {max}",
                    samples.len()
                ));
            }
        }
        cells.sort();
        let line = format!("| {group} | {} |", cells.join("; "));
        LINES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(line);
    }

    /// Prints the notes.
    pub(super) fn print() {
        let lines = LINES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !lines.is_empty() {
            println!("\n| group | idem's statements (coalescing) |\n|---|---|");
            for line in lines.iter() {
                println!("{line}");
            }
        }
    }
}

/// Without the `metrics` feature there is nothing to read.
#[cfg(not(feature = "metrics"))]
mod batches {
    pub(super) fn install() {}
    pub(super) fn forget() {}
    pub(super) fn note(_: &str) {}
    pub(super) fn print() {}
}

fn main() {
    batches::install();
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
    #[cfg(feature = "mysql")]
    mysql(&mut c, &rt, &summary);
    #[cfg(feature = "redis")]
    redis(&mut c, &rt, &summary);
    c.final_summary();
    let table = summary.table();
    println!("\n{table}");
    batches::print();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/idem-bench-store.md");
    if let Err(e) = std::fs::write(&path, &table) {
        eprintln!("could not write {}: {e}", path.display());
    }
}
