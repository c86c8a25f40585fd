//! The client middleware's overhead per request: a 256-byte JSON `POST` to
//! an axum server on loopback behind `IdempotencyLayer` (`MemoryStore`), sent
//! by a bare `reqwest::Client` that writes the `Idempotency-Key` header itself
//! and by the same client behind `IdempotencyMiddleware`, in one run, for a
//! fresh key and for a replay. The response body is read in every case.
//!
//! The server is this same binary, started as a child process (so that it
//! can be pinned apart from the client): with `IDEM_BENCH_SERVER_CORE=N`
//! (default 0) and `taskset` on PATH, it runs under `taskset -c N`; pin the
//! client yourself:
//!
//! ```text
//! IDEM_BENCH_QUICK=1 taskset -c 1 cargo bench --bench client --features client,axum
//! ```
//!
//! (`IDEM_BENCH_SERVER_CORE=` with an empty value: no pinning.)
//!
//! `IDEM_BENCH_PAIRED=N` skips criterion and measures N alternating rounds
//! (bare then middleware, the order swapped every round, 300 requests each)
//! for fresh keys and for replays; it prints the median time per request of
//! each side and the median of the per-round ratios, which cancels the slow
//! drifts of a shared machine better than criterion groups run one after
//! the other.

#[allow(dead_code, reason = "each bench uses a part of the shared helpers")]
mod common;

use std::io::BufRead;
use std::process::{Child, Command, Stdio};

use axum::Router;
use axum::routing::post;
use common::http::{body_256, handler};
use criterion::{BenchmarkId, Criterion, Throughput};
use idem::client::{IdemResponseExt, IdempotencyMiddleware, IdempotentRequestExt, ReportKind};
use idem::http::{FixedOwner, IdempotencyLayer};
use idem::{Idem, IdempotencyKey, MemoryStore};
use tokio::runtime::Runtime;

const SERVE: &str = "IDEM_CLIENT_BENCH_SERVE";

/// The child: serve until killed, after printing the address.
fn serve() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let layer = IdempotencyLayer::builder(Idem::new(MemoryStore::new()))
            .owner(FixedOwner::new("bench"))
            .build()
            .expect("layer");
        let app = Router::new()
            .route("/orders", post(handler))
            .route_layer(layer);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        println!("{}", listener.local_addr().expect("addr"));
        axum::serve(listener, app).await.expect("serve");
    });
}

/// Starts the server child (pinned when asked) and reads its address.
fn start_server() -> (Child, String) {
    let exe = std::env::current_exe().expect("this binary");
    let core = std::env::var("IDEM_BENCH_SERVER_CORE").unwrap_or_else(|_| "0".to_owned());
    let mut cmd = if core.is_empty() {
        Command::new(&exe)
    } else {
        let mut c = Command::new("taskset");
        c.arg("-c").arg(&core).arg(&exe);
        c
    };
    let mut child = cmd
        .env(SERVE, "1")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the server (is taskset on PATH? IDEM_BENCH_SERVER_CORE= skips it)");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the server's address");
    println!(
        "server: pid {} on {}",
        child.id(),
        if core.is_empty() {
            "any core".to_owned()
        } else {
            format!("core {core}")
        }
    );
    (child, format!("http://{}/orders", line.trim()))
}

async fn bare(client: &reqwest::Client, url: &str, key: &str, body: &str) -> usize {
    let resp = client
        .post(url)
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(body.to_owned())
        .send()
        .await
        .expect("send");
    assert!(resp.status().is_success(), "{}", resp.status());
    resp.bytes().await.expect("body").len()
}

async fn through(
    client: &reqwest_middleware::ClientWithMiddleware,
    url: &str,
    key: Option<&IdempotencyKey>,
    body: &str,
) -> (usize, ReportKind) {
    let mut req = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(k) = key {
        req = req.idempotency_key(k.clone());
    }
    let resp = req.send().await.expect("send");
    assert!(resp.status().is_success(), "{}", resp.status());
    let kind = resp.idem_report().expect("report").kind;
    (resp.bytes().await.expect("body").len(), kind)
}

/// A bare client, and the same behind the idempotency middleware.
fn clients() -> (reqwest::Client, reqwest_middleware::ClientWithMiddleware) {
    let inner = reqwest::Client::new();
    let with = reqwest_middleware::ClientBuilder::new(inner.clone())
        .with(
            IdempotencyMiddleware::builder()
                .build()
                .expect("middleware"),
        )
        .build();
    (inner, with)
}

fn bench(c: &mut Criterion, rt: &Runtime, url: &str) {
    let (inner, with) = clients();
    let body = body_256();

    // What each path gets, checked before timing.
    let replay_key = IdempotencyKey::random();
    let (_, first) = rt.block_on(through(&with, url, Some(&replay_key), &body));
    let (_, again) = rt.block_on(through(&with, url, Some(&replay_key), &body));
    let (_, minted) = rt.block_on(through(&with, url, None, &body));
    assert_eq!(
        (first, again, minted),
        (ReportKind::Fresh, ReportKind::Replayed, ReportKind::Fresh)
    );
    let bare_replay_key = IdempotencyKey::random();
    rt.block_on(bare(&inner, url, bare_replay_key.as_str(), &body));

    let mut g = c.benchmark_group("client-loopback");
    g.throughput(Throughput::Elements(1));
    g.bench_function(BenchmarkId::new("bare-reqwest-fresh", "256B"), |b| {
        b.iter(|| {
            let k = IdempotencyKey::random();
            rt.block_on(bare(&inner, url, k.as_str(), &body))
        });
    });
    g.bench_function(BenchmarkId::new("middleware-fresh", "256B"), |b| {
        b.iter(|| rt.block_on(through(&with, url, None, &body)));
    });
    g.bench_function(BenchmarkId::new("bare-reqwest-replay", "256B"), |b| {
        b.iter(|| rt.block_on(bare(&inner, url, bare_replay_key.as_str(), &body)));
    });
    g.bench_function(BenchmarkId::new("middleware-replay", "256B"), |b| {
        b.iter(|| rt.block_on(through(&with, url, Some(&replay_key), &body)));
    });
    g.finish();
}

/// This thread's time on a CPU, in nanoseconds (Linux
/// `/proc/thread-self/schedstat`): the client's own cost, which the other
/// processes on a shared machine do not inflate the way they inflate wall
/// time. 0 where the file does not exist.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// Microseconds per request over `n` requests of `f`: wall time, and this
/// thread's CPU time (the current-thread runtime runs the client and its
/// connections on this thread).
fn per_request<F: std::future::Future<Output = ()>>(
    rt: &Runtime,
    n: u32,
    mut f: impl FnMut() -> F,
) -> (f64, f64) {
    let (t, cpu) = (std::time::Instant::now(), thread_cpu_ns());
    rt.block_on(async {
        for _ in 0..n {
            f().await;
        }
    });
    let cpu = (thread_cpu_ns() - cpu) as f64 / 1e3 / f64::from(n);
    (t.elapsed().as_secs_f64() * 1e6 / f64::from(n), cpu)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn paired(rt: &Runtime, url: &str, rounds: usize) {
    const N: u32 = 300;
    let (inner, with) = clients();
    let body = body_256();
    let (bare_key, mw_key) = (IdempotencyKey::random(), IdempotencyKey::random());
    rt.block_on(bare(&inner, url, bare_key.as_str(), &body));
    let (_, kind) = rt.block_on(through(&with, url, Some(&mw_key), &body));
    assert_eq!(kind, ReportKind::Fresh);
    let (_, kind) = rt.block_on(through(&with, url, Some(&mw_key), &body));
    assert_eq!(kind, ReportKind::Replayed);
    // Warm both paths.
    per_request(rt, N, || async {
        let _ = bare(&inner, url, bare_key.as_str(), &body).await;
    });
    per_request(rt, N, || async {
        let _ = through(&with, url, Some(&mw_key), &body).await;
    });
    for (name, replay) in [("fresh", false), ("replay", true)] {
        let (mut wall, mut cpu) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
        let (mut wall_ratio, mut cpu_ratio) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let bare_side = || {
                per_request(rt, N, || async {
                    let k = if replay {
                        bare_key.clone()
                    } else {
                        IdempotencyKey::random()
                    };
                    let _ = bare(&inner, url, k.as_str(), &body).await;
                })
            };
            let mw_side = || {
                per_request(rt, N, || async {
                    let k = replay.then(|| mw_key.clone());
                    let _ = through(&with, url, k.as_ref(), &body).await;
                })
            };
            let (b, m) = if round % 2 == 0 {
                let b = bare_side();
                (b, mw_side())
            } else {
                let m = mw_side();
                (bare_side(), m)
            };
            wall.0.push(b.0);
            wall.1.push(m.0);
            cpu.0.push(b.1);
            cpu.1.push(m.1);
            wall_ratio.push(m.0 / b.0);
            cpu_ratio.push(m.1 / b.1);
        }
        println!(
            "{name}: wall µs/request bare {:.1}, middleware {:.1}, ratio {:.3}; client CPU µs/request bare {:.1}, middleware {:.1}, ratio {:.3} (medians of {rounds} rounds of {N}; CPU ratios per round: {})",
            median(wall.0),
            median(wall.1),
            median(wall_ratio),
            median(cpu.0),
            median(cpu.1),
            median(cpu_ratio.clone()),
            cpu_ratio
                .iter()
                .map(|x| format!("{x:.3}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
}

fn main() {
    if std::env::var_os(SERVE).is_some() {
        serve();
        return;
    }
    let (mut server, url) = start_server();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let rounds: usize = std::env::var("IDEM_BENCH_PAIRED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if rounds > 0 {
        paired(&rt, &url, rounds);
    } else {
        let mut c = common::criterion();
        bench(&mut c, &rt, &url);
        c.final_summary();
    }
    let _ = server.kill();
    let _ = server.wait();
}
