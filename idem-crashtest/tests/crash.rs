//! Issue 10: three `crash-worker` processes share one store and are SIGKILLed
//! at random moments (most land while a work lingers between its side effect
//! and its completion) and restarted; the checker then reads their fsynced
//! logs (see the crate docs for the three promises). Each backend runs twice:
//! the real worker, whose logs must hold every promise and show recoveries,
//! and a broken worker that ignores the downstream key, which the checker
//! must catch. About 20 s per backend.
//!
//! Backends: a SQLite file; PostgreSQL (`IDEM_POSTGRES_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`, in a schema of its own dropped
//! at the end); a MariaDB server of the test's own (`mariadbd` on a free
//! loopback port, its own data directory, InnoDB's default durable commits),
//! SIGKILLed and restarted once mid-run; a Redis server of the test's own
//! with `appendonly yes`,
//! `appendfsync always` on a loopback port in 17300-17399, SIGKILLed and
//! restarted once mid-run. And once a Redis without persistence, restarted
//! mid-run, which the checker must catch forgetting.

use std::hash::BuildHasher;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idem_crashtest::{Report, check};
use idem_test_support::{mariadb_server, redis_server};

const WORKERS: u32 = 3;
const KEYS: u32 = 30;
const LEASE_MS: u64 = 700;

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "idem-crash-{what}-{}-{}",
            std::process::id(),
            idem_core::IdempotencyKey::random().as_str()
        ));
        std::fs::create_dir_all(&dir).expect("create a temp dir");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The workers; every child is SIGKILLed and reaped on drop.
struct Workers {
    backend: String,
    logs: PathBuf,
    broken: bool,
    children: Vec<Child>,
}

impl Workers {
    fn spawn_one(&self, worker: u32) -> Child {
        Command::new(env!("CARGO_BIN_EXE_crash-worker"))
            .env("IDEM_CRASH_BACKEND", &self.backend)
            .env("IDEM_CRASH_WORKER", worker.to_string())
            .env("IDEM_CRASH_LOG_DIR", &self.logs)
            .env("IDEM_CRASH_BROKEN", if self.broken { "1" } else { "0" })
            .env("IDEM_CRASH_KEYS", KEYS.to_string())
            .env("IDEM_CRASH_LEASE_MS", LEASE_MS.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn crash-worker")
    }

    /// SIGKILLs worker `i` (`Child::kill` sends SIGKILL) and starts it again.
    fn crash_and_restart(&mut self, i: usize) {
        let _ = self.children[i].kill();
        let _ = self.children[i].wait();
        let worker = u32::try_from(i).expect("few workers");
        self.children[i] = self.spawn_one(worker);
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs the workers on `backend` for `length`, crashing one every 80 to
/// 330 ms, calling `midway` once halfway; returns the checker's report.
fn crash_run(backend: &str, broken: bool, length: Duration, midway: &mut dyn FnMut()) -> Report {
    let logs = TempDir::new("logs");
    let mut workers = Workers {
        backend: backend.to_owned(),
        logs: logs.0.clone(),
        broken,
        children: Vec::new(),
    };
    workers.children = (0..WORKERS).map(|w| workers.spawn_one(w)).collect();
    let dice = std::collections::hash_map::RandomState::new();
    let start = Instant::now();
    let (mut n, mut midway_done) = (0u64, false);
    while start.elapsed() < length {
        n += 1;
        std::thread::park_timeout(Duration::from_millis(80 + dice.hash_one(n) % 250));
        let victim =
            usize::try_from(dice.hash_one(n + 1_000_000) % u64::from(WORKERS)).expect("small");
        workers.crash_and_restart(victim);
        if !midway_done && start.elapsed() > length / 2 {
            midway_done = true;
            midway();
        }
    }
    drop(workers);
    check(&logs.0).expect("the logs parse")
}

/// The real worker holds every promise; the broken one is caught.
fn both_variants(backend: &str, midway: &mut dyn FnMut()) {
    let good = crash_run(backend, false, Duration::from_secs(10), midway);
    assert!(
        good.violations.is_empty(),
        "{backend}: {:#?}",
        good.violations
    );
    assert!(
        good.recoveries > 0,
        "{backend}: no recovery happened: {good:?}"
    );
    assert!(good.replays > 0, "{backend}: no replay happened: {good:?}");
    let bad = crash_run(backend, true, Duration::from_secs(8), midway);
    assert!(
        bad.recoveries > 0,
        "{backend}: the broken run had no recovery to catch: {bad:?}"
    );
    assert!(
        bad.violations
            .iter()
            .any(|v| v.contains("different downstream keys")),
        "{backend}: the checker missed the broken work: {bad:?}"
    );
    eprintln!(
        "{backend}: {good:?}\n{backend} (broken): {} violations",
        bad.violations.len()
    );
}

#[test]
fn sqlite_file_survives_crashed_workers() {
    let dir = TempDir::new("sqlite");
    both_variants(
        &format!("sqlite:{}", dir.0.join("crash.db").display()),
        &mut || {},
    );
}

#[test]
fn postgres_survives_crashed_workers() {
    let url = std::env::var("IDEM_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let schema = format!("idem_crash_{}", std::process::id());
    struct DropSchema(String, String);
    impl Drop for DropSchema {
        fn drop(&mut self) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let pool = sqlx::PgPool::connect(&self.0)
                    .await
                    .expect("connect to drop the schema");
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DROP SCHEMA IF EXISTS \"{}\" CASCADE",
                    self.1
                )))
                .execute(&pool)
                .await
                .expect("drop the schema");
            });
        }
    }
    let _cleanup = DropSchema(url.clone(), schema.clone());
    both_variants(&format!("postgres:{url}#{schema}"), &mut || {});
}

/// MariaDB (the MariaDB claim statement, detected at connect), with the
/// server itself SIGKILLed and restarted once mid-run.
#[test]
fn mariadb_survives_crashed_workers_and_a_crashed_server() {
    let mut db = mariadb_server::Throwaway::start();
    let url = db.url();
    both_variants(&format!("mysql:{url}#idem_crash"), &mut || db.restart());
}

/// A `redis-server` in a directory of its own, with AOF fsynced on every
/// write (or, to show what the checker catches, no persistence at all);
/// SIGKILLed on drop.
struct AofRedis {
    port: u16,
    dir: TempDir,
    persistent: bool,
    child: Option<Child>,
}

impl AofRedis {
    /// Starts one on the first free port of `ports` (each test its own
    /// range: they run in parallel).
    fn start(persistent: bool, ports: std::ops::Range<u16>) -> Self {
        let port = ports
            .clone()
            .find(|&p| TcpListener::bind(("127.0.0.1", p)).is_ok())
            .unwrap_or_else(|| panic!("no free port in {ports:?}"));
        let mut redis = Self {
            port,
            dir: TempDir::new("redis"),
            persistent,
            child: None,
        };
        redis.restart();
        redis
    }

    /// SIGKILLs the server, if running, and reaps it.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGKILLs the server (if running) and starts it again on its AOF.
    fn restart(&mut self) {
        self.kill();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendfsync", "always", "--appendonly"])
            .arg(if self.persistent { "yes" } else { "no" })
            .arg("--dir")
            .arg(&self.dir.0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run redis-server (is Redis installed?)");
        self.child = Some(child);
        let until = Instant::now() + Duration::from_secs(10);
        while !self.answers() {
            assert!(
                Instant::now() < until,
                "redis-server on {} does not answer",
                self.port
            );
            std::thread::park_timeout(Duration::from_millis(20));
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Whether the server answers `PING`.
    fn answers(&self) -> bool {
        redis_server::cli(self.port, &["ping"]).is_some_and(|out| out.trim() == "PONG")
    }
}

impl Drop for AofRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

#[test]
fn redis_with_aof_survives_crashed_workers_and_a_crashed_server() {
    let mut redis = AofRedis::start(true, 17_300..17_350);
    let url = redis.url();
    both_variants(&format!("redis:{url}"), &mut || redis.restart());
    assert!(Path::new(&redis.dir.0).join("appendonlydir").exists());
}

/// The same real worker on a Redis without persistence, restarted mid-run:
/// the store forgets, and the checker must say so.
#[test]
fn redis_without_persistence_is_caught_forgetting() {
    let mut redis = AofRedis::start(false, 17_350..17_400);
    let url = redis.url();
    let report = crash_run(
        &format!("redis:{url}"),
        false,
        Duration::from_secs(6),
        &mut || redis.restart(),
    );
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.contains("ran twice") || v.contains("forgotten")),
        "a restart without persistence went unnoticed: {report:?}"
    );
    eprintln!("redis without persistence: {:?}", report.violations.first());
}
