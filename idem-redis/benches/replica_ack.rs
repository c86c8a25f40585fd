//! What [`RedisStore::with_replica_ack`] costs: `Idem::execute` on a fresh
//! key (claim + complete, each followed by `WAIT 1`) and on a replay (no
//! `WAIT`), with and without the option, on a standalone primary with one
//! replica started by the bench on loopback ports 17200-17299 and SIGKILLed
//! at the end (no server is shared, nothing is left behind).
//!
//! Run with `cargo bench -p idem-redis --bench replica_ack` (a short run:
//! 20 samples of 2 s per function); figures are in the crate README.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use idem_core::{Idem, IdempotencyKey, Outcome, Scope};
use idem_redis::RedisStore;
use tokio::runtime::Runtime;

/// A standalone primary and its replica (`--replicaof`) on free loopback
/// ports of 17200-17299, owned by the bench: both SIGKILLed and their
/// directory removed on drop, or by a watchdog shell if the bench dies first.
/// (Self-contained on purpose: the tests' `ReplicatedPair` does the same with
/// more, but bench code does not reach into test code.)
struct ReplicatedPair {
    primary: u16,
    pids: Vec<u32>,
    dir: PathBuf,
}

impl ReplicatedPair {
    /// Starts both and waits until the replica is in sync and the primary
    /// counts it online (`WAIT` only counts replicas it sees online).
    fn start() -> Self {
        let ports: Vec<u16> = (17_200..17_300)
            .filter(|&p| TcpListener::bind(("127.0.0.1", p)).is_ok())
            .take(2)
            .collect();
        assert_eq!(ports.len(), 2, "two free loopback ports in 17200-17299");
        let (primary, replica) = (ports[0], ports[1]);
        let dir = std::env::temp_dir().join(format!(
            "idem-redis-bench-pair-{}-{}",
            std::process::id(),
            IdempotencyKey::random().as_str()
        ));
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        watchdog(&ports, &dir);
        let mut pair = Self {
            primary,
            pids: Vec::new(),
            dir,
        };
        let primary_pid = start_server(primary, &pair.dir, &["--repl-diskless-sync-delay", "0"]);
        pair.pids.push(primary_pid);
        let replica_pid = start_server(
            replica,
            &pair.dir,
            &["--replicaof", "127.0.0.1", &primary.to_string()],
        );
        pair.pids.push(replica_pid);
        wait_for("the replica to sync", || {
            cli(replica, &["info", "replication"])
                .is_some_and(|i| i.contains("master_link_status:up"))
        });
        wait_for("the primary to see its replica online", || {
            cli(primary, &["info", "replication"])
                .is_some_and(|i| i.contains("connected_slaves:1") && i.contains("state=online"))
        });
        pair
    }

    /// The primary's URL.
    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.primary)
    }
}

impl Drop for ReplicatedPair {
    fn drop(&mut self) {
        for pid in &self.pids {
            let _ = Command::new("kill")
                .args(["-9", &pid.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts a daemonized `redis-server` on `port` without persistence, waits
/// until it answers `PING`, and returns its pid.
fn start_server(port: u16, dir: &Path, extra: &[&str]) -> u32 {
    let status = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "yes"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join(format!("{port}.log")))
        .arg("--pidfile")
        .arg(dir.join(format!("{port}.pid")))
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("cannot run redis-server (is Redis on PATH?): {e}"));
    assert!(status.success(), "redis-server on {port} failed: {status}");
    wait_for("redis-server to answer", || {
        cli(port, &["ping"]).is_some_and(|out| out.trim() == "PONG")
    });
    std::fs::read_to_string(dir.join(format!("{port}.pid")))
        .ok()
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pid file for the server on {port}"))
}

/// Runs `redis-cli -p port args...`; `None` if it could not connect.
fn cli(port: u16, args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run redis-cli (is Redis on PATH?): {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.success() && !text.starts_with("Could not connect")).then_some(text)
}

/// Polls `f` every 25 ms until it holds, for at most 60 s (a loaded machine
/// can be slow to start and sync servers).
fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until {
        if f() {
            return;
        }
        std::thread::park_timeout(Duration::from_millis(25));
    }
    panic!("timed out waiting for {what}");
}

/// A detached shell that waits for this process to end, then shuts the
/// servers on `ports` down and removes `dir`.
fn watchdog(ports: &[u16], dir: &Path) {
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 0.2; done; \
         for p in {ports}; do redis-cli -h 127.0.0.1 -p $p shutdown nosave >/dev/null 2>&1; done; \
         rm -rf '{dir}'",
        pid = std::process::id(),
        ports = ports.join(" "),
        dir = dir.display(),
    );
    let status = Command::new("sh")
        .args(["-c", &format!("( {script} ) >/dev/null 2>&1 &")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("spawn the watchdog shell");
    assert!(status.success(), "the watchdog shell failed: {status}");
}

type Engine = Arc<Idem<RedisStore>>;

async fn fresh(idem: &Engine, scope: &Scope) {
    let key = IdempotencyKey::random();
    let reply = idem
        .execute(scope, key, &1, |_| async {
            Outcome::<String, String>::Success("x".repeat(256))
        })
        .await
        .expect("fresh");
    assert!(reply.is_stored());
}

async fn replay(idem: &Engine, scope: &Scope, key: &IdempotencyKey) {
    let reply = idem
        .execute(scope, key.clone(), &1, |_| async {
            Outcome::<String, String>::Success(String::new())
        })
        .await
        .expect("replay");
    assert!(reply.is_replay());
}

fn bench(c: &mut Criterion) {
    let pair = ReplicatedPair::start();
    let rt = Runtime::new().expect("runtime");
    let scope = Scope::new("bench", "POST /charges").expect("scope");
    // Every store's connection gets a 10 s response timeout (redis-rs's
    // default is 500 ms), so a slow acknowledgement is answered by `WAIT`'s
    // own timeout, not cut by the client: the same configuration for both
    // columns.
    let connect = |ack: Option<Duration>| {
        let url = pair.url();
        rt.block_on(async move {
            let config = idem_redis::redis::aio::ConnectionManagerConfig::new()
                .set_response_timeout(Some(Duration::from_secs(10)));
            let manager = idem_redis::redis::Client::open(url.as_str())
                .expect("url")
                .get_connection_manager_with_config(config)
                .await
                .expect("connect");
            let store = RedisStore::from_manager(manager)
                .with_prefix("idem-bench-ack:")
                .expect("prefix");
            let store = match ack {
                Some(timeout) => store.with_replica_ack(1, timeout),
                None => store,
            };
            Arc::new(Idem::new(store))
        })
    };
    let engines: Vec<(&str, Engine)> = vec![
        ("no-wait", connect(None)),
        ("wait-1-replica", connect(Some(Duration::from_secs(1)))),
    ];
    // Warm up before timing: the first acknowledged writes on a replica that
    // has just synchronised (and the scripts' first load) can take longer
    // than the 1 s acknowledgement, so a store with a generous timeout makes
    // them first, then each engine makes a few of its own.
    let warm = connect(Some(Duration::from_secs(30)));
    rt.block_on(async {
        for _ in 0..8 {
            fresh(&warm, &scope).await;
        }
        for (_, idem) in &engines {
            for _ in 0..8 {
                fresh(idem, &scope).await;
            }
        }
    });

    let mut group = c.benchmark_group("replica-ack/fresh");
    for (name, idem) in &engines {
        group.bench_function(*name, |b| b.to_async(&rt).iter(|| fresh(idem, &scope)));
    }
    group.finish();

    let mut group = c.benchmark_group("replica-ack/replay");
    for (name, idem) in &engines {
        let keys: Vec<IdempotencyKey> = (0..256).map(|_| IdempotencyKey::random()).collect();
        rt.block_on(async {
            for key in &keys {
                idem.execute(&scope, key.clone(), &1, |_| async {
                    Outcome::<String, String>::Success("x".repeat(256))
                })
                .await
                .expect("seed");
            }
        });
        let mut i = 0;
        group.bench_function(*name, |b| {
            b.to_async(&rt).iter(|| {
                i = (i + 1) % keys.len();
                replay(idem, &scope, &keys[i])
            });
        });
    }
    group.finish();

    // 8 tasks share the store's one multiplexed connection: Redis holds a
    // client's later commands while its WAIT blocks, so the WAITs of the
    // tasks queue behind one another.
    let mut group = c.benchmark_group("replica-ack/fresh-8-tasks");
    for (name, idem) in &engines {
        group.bench_function(*name, |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    let tasks: Vec<_> = (0..8)
                        .map(|t| {
                            let (idem, scope) = (Arc::clone(idem), scope.clone());
                            tokio::spawn(async move {
                                for _ in (t..iters).step_by(8) {
                                    fresh(&idem, &scope).await;
                                }
                            })
                        })
                        .collect();
                    for task in tasks {
                        task.await.expect("task");
                    }
                    start.elapsed()
                })
            });
        });
    }
    group.finish();
    drop(pair);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
