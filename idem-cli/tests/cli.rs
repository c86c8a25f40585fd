//! The `idem` binary end to end, against a real SQLite file, Postgres,
//! MySQL/MariaDB, Redis
//! and a throwaway Redis Cluster: a **child process** claims keys, saves a
//! resource id, says so on stdout and hangs; the test SIGKILLs it, then runs
//! the real `idem` binary (`stuck`, `inspect`, `release`, `delete`, `stats`,
//! `purge`, `migrate`, parsing `--json`), and the next attempt in the test
//! runs as a recovery with the killed process's saved resource id, once.
//!
//! The child is this test binary itself, started again with
//! `IDEM_CLI_TEST_CHILD` set (hence `harness = false`: `main` decides). It
//! claims two kinds of keys: one under a one-hour lease on the system clock
//! (stuck only in the sense that its holder is dead: `stuck` lists it only
//! with `--within-secs`, and it takes a `release`), and others whose lease
//! ended long ago, claimed through a clock two hours behind with a
//! one-minute lease, so `stuck` lists them at once, with no sleep.
//!
//! Every store call of the tool is bounded by `--timeout`: each backend
//! also holds its writes (a SQLite write transaction, a Postgres table lock,
//! MySQL row locks (`SELECT … FOR UPDATE`),
//! `CLIENT PAUSE WRITE` on the cluster) and checks that `release` stops with
//! exit code 5, and a silent server (a listening socket that never answers)
//! does the same for connecting.
//!
//! `cargo test -p idem-cli --test cli [NAME…]` runs the tests whose name
//! contains one of the NAMEs (all by default), in parallel.

#[path = "support/cluster.rs"]
mod cluster;

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitCode, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::clock::{Clock, SystemClock, Timestamp};
// One sqlx for every SQL backend (each store crate re-exports it).
use idem_core::store::{AdminStore, Store};
use idem_core::{Error, Idem, IdempotencyKey, Outcome, Policy, RecordId, Scope, TakeoverReason};
use idem_postgres::sqlx;
use serde_json::{Value, json};

/// Set in the child's environment: its instructions, as JSON.
const CHILD_ENV: &str = "IDEM_CLI_TEST_CHILD";
const OPERATION: &str = "POST /charges";
const RESOURCE_ID: &str = "ch_1";

type Test = (&'static str, fn());

fn main() -> ExitCode {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        return child::main(&spec);
    }
    let tests: [Test; 8] = [
        ("sqlite_human_output", sqlite_human_output),
        ("sqlite_killed_process", sqlite_killed_process),
        ("postgres_killed_process", postgres_killed_process),
        ("mysql_killed_process", mysql_killed_process),
        ("redis_killed_process", redis_killed_process),
        ("cluster_killed_process", cluster_killed_process),
        ("silent_server_times_out", silent_server_times_out),
        ("postgres_replica_read_only", postgres_replica_read_only),
    ];
    // Positional arguments filter by name; libtest's flags are accepted and
    // ignored (with the value of those that take one).
    let mut filters: Vec<String> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if [
            "--test-threads",
            "--skip",
            "--color",
            "--format",
            "--logfile",
            "-Z",
        ]
        .contains(&a.as_str())
        {
            args.next();
        } else if a == "--list" {
            for (name, _) in &tests {
                println!("{name}: test");
            }
            return ExitCode::SUCCESS;
        } else if !a.starts_with('-') {
            filters.push(a);
        }
    }
    let chosen: Vec<Test> = tests
        .into_iter()
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .collect();
    println!("\nrunning {} tests", chosen.len());
    let running: Vec<_> = chosen
        .into_iter()
        .map(|(name, test)| (name, std::thread::spawn(test)))
        .collect();
    let mut failed = Vec::new();
    for (name, handle) in running {
        let ok = handle.join().is_ok();
        println!("test {name} ... {}", if ok { "ok" } else { "FAILED" });
        if !ok {
            failed.push(name);
        }
    }
    cluster::stop();
    if failed.is_empty() {
        println!("\ntest result: ok");
        ExitCode::SUCCESS
    } else {
        println!("\ntest result: FAILED: {failed:?}");
        ExitCode::FAILURE
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Where the child and the tool find the store.
#[derive(Debug, Clone)]
enum Backend {
    Sqlite { path: String },
    Postgres { url: String, schema: String },
    MySql { url: String, table: String },
    Redis { url: String, prefix: String },
    Cluster { nodes: Vec<String>, prefix: String },
}

impl Backend {
    fn to_json(&self) -> Value {
        match self {
            Self::Sqlite { path } => json!({"sqlite": path}),
            Self::Postgres { url, schema } => json!({"postgres": url, "schema": schema}),
            Self::MySql { url, table } => json!({"mysql": url, "table": table}),
            Self::Redis { url, prefix } => json!({"redis": url, "prefix": prefix}),
            Self::Cluster { nodes, prefix } => json!({"cluster": nodes, "prefix": prefix}),
        }
    }

    /// The tool's flags for this store.
    fn cli_args(&self) -> Vec<String> {
        let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        match self {
            Self::Sqlite { path } => s(&["--url", &format!("sqlite://{path}")]),
            Self::Postgres { url, schema } => s(&["--url", url, "--schema", schema]),
            Self::MySql { url, table } => s(&["--url", url, "--table", table]),
            Self::Redis { url, prefix } => s(&["--url", url, "--prefix", prefix]),
            Self::Cluster { nodes, prefix } => {
                let list: Vec<&str> = nodes
                    .iter()
                    .map(|n| n.trim_start_matches("redis://").trim_end_matches('/'))
                    .collect();
                s(&[
                    "--url",
                    &format!("redis+cluster://{}", list.join(",")),
                    "--prefix",
                    prefix,
                ])
            }
        }
    }
}

/// The child process: opens the store, claims the keys, saves a resource id for each,
/// prints `READY <key>` per key, then hangs until it is killed.
mod child {
    use super::*;

    /// A clock `behind` the system clock.
    #[derive(Debug)]
    struct Behind(Duration);

    impl Clock for Behind {
        fn now(&self) -> Timestamp {
            let ms = i64::try_from(self.0.as_millis()).unwrap_or(i64::MAX);
            Timestamp::from_unix_millis(SystemClock.now().as_unix_millis() - ms)
        }
    }

    pub(super) fn main(spec: &str) -> ExitCode {
        let spec: Value = serde_json::from_str(spec).expect("child spec");
        match runtime().block_on(open(&spec)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("child: {e}");
                ExitCode::from(3)
            }
        }
    }

    async fn open(spec: &Value) -> Result<(), String> {
        let b = &spec["backend"];
        let name = |field: &str| b[field].as_str().unwrap_or_default();
        if let Some(path) = b["sqlite"].as_str() {
            let store = idem_sqlite::SqliteStore::open(path).await;
            hold_within(store, Ok::<_, std::convert::Infallible>, spec).await
        } else if let Some(url) = b["postgres"].as_str() {
            let store = idem_postgres::PgStore::connect(url).await;
            hold_within(store, |s| s.with_schema_name(name("schema")), spec).await
        } else if let Some(url) = b["mysql"].as_str() {
            let store = idem_mysql::MySqlStore::connect(url).await;
            hold_within(store, |s| s.with_table_name(name("table")), spec).await
        } else if let Some(url) = b["redis"].as_str() {
            let store = idem_redis::RedisStore::connect(url).await;
            hold_within(store, |s| s.with_prefix(name("prefix")), spec).await
        } else if let Some(nodes) = b["cluster"].as_array() {
            let nodes: Vec<&str> = nodes.iter().filter_map(Value::as_str).collect();
            let store = idem_redis::RedisStore::connect_cluster(nodes).await;
            hold_within(store, |s| s.with_prefix(name("prefix")), spec).await
        } else {
            Err(format!("unknown backend {b}"))
        }
    }

    /// The store `opened`, put in the test's own place (a schema, a table,
    /// a prefix) by `within`, holding the keys of `spec`.
    async fn hold_within<S, E, F>(
        opened: Result<S, E>,
        within: impl FnOnce(S) -> Result<S, F>,
        spec: &Value,
    ) -> Result<(), String>
    where
        S: Store,
        E: std::fmt::Display,
        F: std::fmt::Display,
    {
        let store = within(opened.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
        hold(store, spec).await
    }

    async fn hold<S: Store>(store: S, spec: &Value) -> Result<(), String> {
        let store = Arc::new(store);
        let policy = |lease| {
            Policy::builder()
                .lease(lease)
                .build()
                .expect("valid policy")
        };
        // One hour on the system clock: alive as far as anyone can tell.
        let live = Idem::new(Arc::clone(&store)).with_policy(policy(Duration::from_secs(3600)));
        // A minute on a clock two hours behind: a lease that ended long ago.
        let ended = Idem::new(Arc::clone(&store))
            .with_policy(policy(Duration::from_secs(60)))
            .with_clock(Behind(Duration::from_secs(7200)));
        let scope = Scope::new(spec["owner"].as_str().unwrap_or_default(), OPERATION)
            .map_err(|e| e.to_string())?;
        let mut jobs = Vec::new();
        jobs.push((
            live,
            spec["long_key"].as_str().unwrap_or_default().to_owned(),
        ));
        for k in spec["ended_keys"].as_array().into_iter().flatten() {
            jobs.push((ended.clone(), k.as_str().unwrap_or_default().to_owned()));
        }
        let (ready_tx, mut ready_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let mut tasks = tokio::task::JoinSet::new();
        for (idem, key) in jobs {
            let (scope, ready, name) = (scope.clone(), ready_tx.clone(), key.clone());
            tasks.spawn(async move {
                idem.execute(
                    &scope,
                    key.as_str(),
                    &json!({"amount": 5}),
                    |a| async move {
                        if let Err(e) = a.save_resource_id(RESOURCE_ID).await {
                            return Outcome::<String, String>::Failure(e.to_string());
                        }
                        let _ = ready.send(name);
                        std::future::pending().await
                    },
                )
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
            });
        }
        drop(ready_tx);
        loop {
            tokio::select! {
                Some(key) = ready_rx.recv() => println!("READY {key}"),
                Some(done) = tasks.join_next() => {
                    return Err(format!("an attempt ended: {done:?}"));
                }
            }
        }
    }
}

/// The child, SIGKILLed (and reaped) on drop.
struct Holder(Child);

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the child and waits until it holds every key.
fn spawn_holder(backend: &Backend, owner: &str, long_key: &str, ended: &[String]) -> Holder {
    let spec = json!({
        "backend": backend.to_json(),
        "owner": owner,
        "long_key": long_key,
        "ended_keys": ended,
    });
    let mut child = Command::new(std::env::current_exe().expect("this binary"))
        .env(CHILD_ENV, spec.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the child");
    let stdout = child.stdout.take().expect("piped stdout");
    let holder = Holder(child);
    let mut waiting: Vec<String> = ended.to_vec();
    waiting.push(long_key.to_owned());
    // Lines arrive through a thread, so a child that hangs before holding
    // its keys fails the test after a minute instead of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    while !waiting.is_empty() {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => {
                let line = line.expect("child stdout");
                if let Some(key) = line.strip_prefix("READY ") {
                    waiting.retain(|k| k != key);
                }
            }
            Err(e) => panic!("the child did not hold {waiting:?}: {e}"),
        }
    }
    holder
}

/// Runs `idem <store args> <args> --json` with no standard input; the exit
/// code and the one JSON document it printed.
fn idem(store: &[String], args: &[impl AsRef<str>]) -> (i32, Value) {
    let args: Vec<&str> = args.iter().map(AsRef::as_ref).chain(["--json"]).collect();
    let (code, stdout, stderr) = idem_text(store, &args);
    let doc = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {stdout:?}; stderr: {stderr}"));
    (code, doc)
}

/// The arguments of `cmd` on the record `key` of `owner` (and the test's
/// operation), then `extra`.
fn record_args(cmd: &str, owner: &str, key: &str, extra: &[&str]) -> Vec<String> {
    [
        cmd,
        "--owner",
        owner,
        "--operation",
        OPERATION,
        "--key",
        key,
    ]
    .iter()
    .chain(extra)
    .map(|s| (*s).to_owned())
    .collect()
}

fn keys_of(doc: &Value) -> Vec<String> {
    doc["records"]
        .as_array()
        .unwrap_or_else(|| panic!("records in {doc}"))
        .iter()
        .map(|r| r["key"].as_str().expect("key").to_owned())
        .collect()
}

/// A connection to the SQL server at `url`, once `statements` ran on it.
async fn holding<C>(url: &str, statements: &[&str]) -> C
where
    C: sqlx::Connection,
    for<'e> &'e mut C: sqlx::Executor<'e, Database = C::Database>,
{
    let mut conn = C::connect(url).await.expect("connect");
    run_sql(&mut conn, statements).await;
    conn
}

/// Runs `statements` on `conn`, in order.
async fn run_sql<C>(conn: &mut C, statements: &[&str])
where
    C: sqlx::Connection,
    for<'e> &'e mut C: sqlx::Executor<'e, Database = C::Database>,
{
    for sql in statements {
        sqlx::raw_sql(sqlx::AssertSqlSafe((*sql).to_owned()))
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}

/// Holds the store's writes for a moment (so a write waits), where the test
/// can do that without touching a shared server.
enum WriteHold {
    Sqlite(idem_sqlite::sqlx::SqliteConnection),
    Postgres(idem_postgres::sqlx::PgConnection),
    MySql(idem_mysql::sqlx::MySqlConnection),
    Cluster(Vec<u16>),
}

async fn hold_writes(backend: &Backend) -> Option<WriteHold> {
    match backend {
        Backend::Sqlite { path } => {
            let conn = holding(&format!("sqlite://{path}"), &["BEGIN IMMEDIATE"]).await;
            Some(WriteHold::Sqlite(conn))
        }
        Backend::Postgres { url, schema } => {
            let lock = format!(
                "LOCK TABLE \"{schema}\".\"{}\" IN EXCLUSIVE MODE",
                idem_postgres::DEFAULT_TABLE
            );
            Some(WriteHold::Postgres(holding(url, &["BEGIN", &lock]).await))
        }
        Backend::MySql { url, table } => {
            // Every row of the test's own table, locked until ROLLBACK.
            let lock = format!("SELECT `key` FROM `{table}` FOR UPDATE");
            Some(WriteHold::MySql(holding(url, &["BEGIN", &lock]).await))
        }
        // The shared server is never paused.
        Backend::Redis { .. } => None,
        Backend::Cluster { .. } => {
            let ports = cluster::get().ports.clone();
            for &p in &ports {
                let out = cluster::cli(p, &["client", "pause", "5000", "write"]);
                assert_eq!(out.as_deref().map(str::trim), Some("OK"), "CLIENT PAUSE");
            }
            Some(WriteHold::Cluster(ports))
        }
    }
}

async fn let_go(hold: WriteHold) {
    match hold {
        WriteHold::Sqlite(mut conn) => run_sql(&mut conn, &["ROLLBACK"]).await,
        WriteHold::Postgres(mut conn) => run_sql(&mut conn, &["ROLLBACK"]).await,
        WriteHold::MySql(mut conn) => run_sql(&mut conn, &["ROLLBACK"]).await,
        WriteHold::Cluster(ports) => {
            for p in ports {
                let _ = cluster::cli(p, &["client", "unpause"]);
            }
        }
    }
}

/// [`killed_process`] with a random owner and one record whose lease
/// ended, nothing checked after the kill.
async fn killed_process_one_ended<S: AdminStore>(store: S, backend: Backend) {
    let ended = vec![IdempotencyKey::random().as_str().to_owned()];
    killed_process(store, backend, owner(), ended, || ()).await;
}

/// Runs `sql` on `pool`, dropping the test's own table or schema.
async fn drop_on<DB: sqlx::Database>(pool: &sqlx::Pool<DB>, sql: String)
where
    for<'p> &'p sqlx::Pool<DB>: sqlx::Executor<'p, Database = DB>,
{
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// The whole operator story on one store, after a real process was killed
/// holding `1 + ended.len()` records in flight.
async fn killed_process<S: AdminStore>(
    store: S,
    backend: Backend,
    owner: String,
    ended: Vec<String>,
    after_kill: impl FnOnce(),
) {
    let scope = Scope::new(owner.as_str(), OPERATION).expect("scope");
    let long_key = IdempotencyKey::random().as_str().to_owned();
    let args = backend.cli_args();
    let call = |v: &[&str]| idem(&args, v);
    let call_rec =
        |cmd: &str, key: &str, extra: &[&str]| idem(&args, &record_args(cmd, &owner, key, extra));
    let text_rec = |cmd: &str, key: &str| {
        let (code, out, err) = idem_text(&args, &record_args(cmd, &owner, key, &[]));
        assert_eq!(code, 0, "{cmd}: {err}");
        out
    };

    // A real process claims, saves a resource id, and is SIGKILLed.
    let mut holder = spawn_holder(&backend, &owner, &long_key, &ended);
    holder.0.kill().expect("SIGKILL");
    let status = holder.0.wait().expect("reap");
    assert_eq!(status.signal(), Some(9), "killed by SIGKILL: {status}");
    after_kill();

    // Nothing but the dead process's records is in this store (own file,
    // schema or prefix): the counts are exact, and on a cluster they are
    // the sum over every primary.
    let n = ended.len() as u64;
    let (code, doc) = call(&["stats"]);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(
        (
            doc["in_flight"].as_u64(),
            doc["stuck"].as_u64(),
            doc["completed"].as_u64()
        ),
        (Some(n + 1), Some(n), Some(0)),
        "{doc}"
    );

    // `stuck` lists every record whose lease ended (from every primary),
    // not the one under a live-looking lease...
    let (code, doc) = call(&["stuck", "--all"]);
    assert_eq!(code, 0, "{doc}");
    let mut listed = keys_of(&doc);
    listed.sort();
    let mut expected = ended.clone();
    expected.sort();
    assert_eq!(listed, expected, "{doc}");
    for r in doc["records"].as_array().expect("records") {
        assert_eq!(r["state"], "in_flight", "{r}");
        assert_eq!(r["attempt"], 1, "{r}");
        assert_eq!(r["resource_id"], RESOURCE_ID, "{r}");
        assert_eq!(r["owner"], owner.as_str(), "{r}");
    }
    // ...which shows up when asked for leases ending within two hours.
    let (code, doc) = call(&["stuck", "--all", "--within-secs", "7200"]);
    assert_eq!(code, 0, "{doc}");
    let listed = keys_of(&doc);
    assert_eq!(listed.len(), ended.len() + 1, "{doc}");
    assert!(listed.contains(&long_key), "{doc}");
    // In text, a lease reads right both ways: `ends in` a time to come,
    // `ended … ago` a time gone, beside it in RFC 3339.
    let (code, out, err) = idem_text(&args, &["stuck", "--all", "--within-secs", "7200"]);
    assert_eq!(code, 0, "{err}");
    for r in doc["records"].as_array().expect("records") {
        let key = r["key"].as_str().expect("key");
        let line = line_of(&out, &format!("{owner}\t{OPERATION}\t{key}\t"));
        let at = rfc3339_by_date(r["lease_until_ms"].as_i64().expect("lease_until_ms"));
        let lease = line.split('\t').nth(4).expect("a lease field");
        if key == long_key {
            assert!(lease.starts_with("lease ends in 59m "), "{line}");
        } else {
            assert!(
                lease.starts_with("lease ended 1h 59m ago") || lease.starts_with("lease ended 2h"),
                "{line}"
            );
        }
        assert!(lease.ends_with(&format!(" ({at})")), "{line} at {at}");
    }
    for (key, ends) in [(&long_key, true), (&ended[0], false)] {
        let (_, doc) = call_rec("inspect", key, &[]);
        let at = rfc3339_by_date(doc["lease_until_ms"].as_i64().expect("lease_until_ms"));
        let out = text_rec("inspect", key);
        let line = line_of(&out, "lease until ");
        assert!(
            line.starts_with(&format!("lease until {at} (")),
            "{line} at {at}"
        );
        if ends {
            assert!(line.contains(" (ends in 59m "), "{line}");
        } else {
            assert!(
                line.contains(" (ended ") && line.ends_with(" ago)"),
                "{line}"
            );
        }
    }

    // Pages of one walk to the same set.
    let mut walked = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10_000 {
        let mut v = vec!["stuck", "--limit", "1"];
        if let Some(c) = &cursor {
            v.extend(["--cursor", c.as_str()]);
        }
        let (code, doc) = call(&v);
        assert_eq!(code, 0, "{doc}");
        walked.extend(keys_of(&doc));
        cursor = doc["next"].as_str().map(str::to_owned);
        if cursor.is_none() {
            break;
        }
    }
    walked.sort();
    walked.dedup();
    assert_eq!(walked, expected);

    // The client is stuck on 409 for the long lease.
    let runs = Arc::new(AtomicUsize::new(0));
    let idem_engine = Idem::new(store);
    let retry = |key: String| {
        let (idem_engine, scope, runs) = (idem_engine.clone(), scope.clone(), Arc::clone(&runs));
        async move {
            idem_engine
                .execute(
                    &scope,
                    key.as_str(),
                    &json!({"amount": 5}),
                    |a| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        assert_eq!(a.recovery_reason(), Some(TakeoverReason::LeaseExpired));
                        assert_eq!(a.previous_resource_id(), Some(RESOURCE_ID));
                        Outcome::<String, String>::Success(RESOURCE_ID.to_owned())
                    },
                )
                .await
        }
    };
    assert!(
        matches!(retry(long_key.clone()).await, Err(Error::InFlight { .. })),
        "the long lease looks alive"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    let (code, doc) = call_rec("inspect", &long_key, &[]);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(doc["state"], "in_flight");
    assert_eq!(doc["attempt"], 1);
    assert_eq!(doc["lease_expired"], false);
    assert_eq!(doc["resource_id"], RESOURCE_ID);
    assert!(doc.get("body").is_none(), "no body unless asked: {doc}");

    // A store that does not answer in time: exit code 5, typed, per call.
    if let Some(hold) = hold_writes(&backend).await {
        let (code, doc) = call_rec("release", &long_key, &["--yes", "--timeout", "300ms"]);
        let_go(hold).await;
        assert_eq!((code, doc["error"].as_str()), (5, Some("timeout")), "{doc}");
        assert!(
            doc["message"]
                .as_str()
                .is_some_and(|m| m.contains("300 ms")),
            "{doc}"
        );
    }

    // Destructive commands need --yes without a terminal: refused.
    let (code, doc) = call_rec("release", &long_key, &[]);
    assert_eq!((code, doc["error"].as_str()), (4, Some("refused")), "{doc}");
    let (code, doc) = call_rec("release", &long_key, &["--yes"]);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(
        (doc["released"].as_bool(), doc["attempt"].as_u64()),
        (Some(true), Some(1))
    );

    // Released: `stuck` lists it now, without --within-secs.
    let (code, doc) = call(&["stuck", "--all"]);
    assert_eq!(code, 0, "{doc}");
    assert!(keys_of(&doc).contains(&long_key), "{doc}");
    let (code, doc) = call_rec("inspect", &long_key, &[]);
    assert_eq!(
        (code, doc["lease_expired"].as_bool()),
        (0, Some(true)),
        "{doc}"
    );

    // The next attempt runs as a recovery with the dead process's
    // saved resource id: the work runs once after the kill, and only once.
    let reply = retry(long_key.clone()).await.expect("recovery");
    assert!(!reply.is_replay());
    assert_eq!(reply.attempt(), 2);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let again = retry(long_key.clone()).await.expect("replay");
    assert!(again.is_replay());
    assert_eq!(runs.load(Ordering::SeqCst), 1, "a replay runs nothing");
    let (code, doc) = call_rec("inspect", &long_key, &["--body"]);
    assert_eq!(
        (code, doc["state"].as_str()),
        (0, Some("completed")),
        "{doc}"
    );
    assert_eq!(doc["attempt"], 2);
    assert!(
        doc["body"]
            .as_str()
            .is_some_and(|b| b.contains(RESOURCE_ID)),
        "{doc}"
    );
    // Releasing a completed record is refused.
    let (code, doc) = call_rec("release", &long_key, &["--yes"]);
    assert_eq!((code, doc["error"].as_str()), (4, Some("refused")), "{doc}");

    // Delete refuses a record in flight, deletes the completed one.
    let (code, doc) = call_rec("delete", &ended[0], &["--yes"]);
    assert_eq!((code, doc["error"].as_str()), (4, Some("refused")), "{doc}");
    let (code, doc) = call_rec("delete", &long_key, &["--yes"]);
    assert_eq!((code, doc["deleted"].as_bool()), (0, Some(true)), "{doc}");
    let (code, doc) = call_rec("inspect", &long_key, &[]);
    assert_eq!(
        (code, doc["error"].as_str()),
        (3, Some("not_found")),
        "{doc}"
    );
    let (code, doc) = call_rec("release", &long_key, &["--yes"]);
    assert_eq!(code, 3, "{doc}");

    // The records whose lease ended need no release: their next attempt
    // recovers, once each.
    for (i, key) in ended.iter().enumerate() {
        let reply = retry(key.clone()).await.expect("recovery");
        assert_eq!((reply.is_replay(), reply.attempt()), (false, 2));
        assert_eq!(runs.load(Ordering::SeqCst), 2 + i);
    }
    let (code, doc) = call(&["stats"]);
    assert_eq!(code, 0, "{doc}");
    assert_eq!(
        (
            doc["in_flight"].as_u64(),
            doc["stuck"].as_u64(),
            doc["completed"].as_u64()
        ),
        (Some(0), Some(0), Some(n)),
        "{doc}"
    );
    let (code, doc) = call(&["stuck", "--all"]);
    assert_eq!((code, keys_of(&doc).len()), (0, 0), "{doc}");

    let (code, doc) = call(&["purge", "--yes"]);
    assert_eq!(code, 0, "{doc}");
    let (code, doc) = call(&["migrate"]);
    assert_eq!(code, 0, "{doc}");
    // Bad usage is exit code 2: a bad key, a bad timeout.
    let (code, doc) = call_rec("inspect", "bad\u{7f}key", &[]);
    assert_eq!((code, doc["error"].as_str()), (2, Some("usage")), "{doc}");
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(&args)
        .args(["stats", "--timeout", "0s"])
        .stdin(Stdio::null())
        .output()
        .expect("run idem");
    assert_eq!(out.status.code(), Some(2));
}

fn sqlite_killed_process() {
    runtime().block_on(async {
        let path = std::env::temp_dir().join(format!("idem-cli-{}.db", IdempotencyKey::random()));
        let store = idem_sqlite::SqliteStore::open(&path).await.expect("open");
        let backend = Backend::Sqlite {
            path: path.display().to_string(),
        };
        killed_process_one_ended(store.clone(), backend).await;
        store.close().await;
        idem_test_support::remove_sqlite(&path);
    });
}

/// A server the tests use: its name, and the variable naming its URL.
struct Server {
    name: &'static str,
    env: &'static str,
    default_url: &'static str,
}

const POSTGRES: Server = Server {
    name: "Postgres",
    env: "IDEM_POSTGRES_URL",
    default_url: "postgres://postgres@127.0.0.1:5432/test",
};
const MYSQL: Server = Server {
    name: "MySQL/MariaDB",
    env: "IDEM_MYSQL_URL",
    default_url: "mysql://root@127.0.0.1:3306/test",
};
const REDIS: Server = Server {
    name: "Redis",
    env: "IDEM_REDIS_URL",
    default_url: "redis://127.0.0.1:6379/",
};

impl Server {
    /// Its URL: the variable's, else the default.
    fn url(&self) -> String {
        std::env::var(self.env).unwrap_or_else(|_| self.default_url.to_owned())
    }

    /// What connecting to it at `url` gave, or a panic saying to start it
    /// or set its variable.
    fn reached<S>(&self, url: &str, connected: Result<S, impl std::fmt::Display>) -> S {
        connected.unwrap_or_else(|e| {
            panic!(
                "cannot reach {} at {url} ({e}): start it or set {}",
                self.name, self.env
            )
        })
    }
}

fn owner() -> String {
    format!("tenant-{}", IdempotencyKey::random())
}

fn mysql_killed_process() {
    runtime().block_on(async {
        let url = MYSQL.url();
        let table = format!("idem_cli_{}", IdempotencyKey::random().as_str());
        let store = MYSQL
            .reached(&url, idem_mysql::MySqlStore::connect(&url).await)
            .with_table_name(&table)
            .expect("table name");
        // The tool creates the table (`migrate`), as an operator would.
        let args = ["--url", url.as_str(), "--table", table.as_str()].map(str::to_owned);
        let (code, doc) = idem(&args, &["migrate"]);
        assert_eq!(code, 0, "{doc}");
        assert_eq!(
            (doc["migrated"].as_bool(), doc["backend"].as_str()),
            (Some(true), Some("mysql")),
            "{doc}"
        );
        let backend = Backend::MySql {
            url: url.clone(),
            table: table.clone(),
        };
        killed_process_one_ended(store.clone(), backend).await;
        drop_on(store.pool(), format!("DROP TABLE `{table}`")).await;
    });
}

fn postgres_killed_process() {
    runtime().block_on(async {
        let url = POSTGRES.url();
        let schema = format!(
            "idem_cli_{}",
            IdempotencyKey::random().as_str().to_lowercase()
        );
        let store = POSTGRES
            .reached(&url, idem_postgres::PgStore::connect(&url).await)
            .with_schema_name(&schema)
            .expect("schema name");
        store.migrate().await.expect("migrate");
        let backend = Backend::Postgres {
            url: url.clone(),
            schema: schema.clone(),
        };
        killed_process_one_ended(store.clone(), backend).await;
        drop_on(store.pool(), format!("DROP SCHEMA \"{schema}\" CASCADE")).await;
    });
}

/// Deletes every key under `prefix` on one server.
async fn delete_prefix(url: &str, prefix: &str) {
    let client = idem_redis::redis::Client::open(url).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    idem_test_support::redis_admin::unlink_each(&mut conn, prefix).await;
}

fn redis_killed_process() {
    runtime().block_on(async {
        let url = REDIS.url();
        let prefix = format!("idemcli:{}:", IdempotencyKey::random().as_str());
        let store = REDIS
            .reached(&url, idem_redis::RedisStore::connect(&url).await)
            .with_prefix(&prefix)
            .expect("prefix");
        let backend = Backend::Redis {
            url: url.clone(),
            prefix: prefix.clone(),
        };
        killed_process_one_ended(store, backend).await;
        delete_prefix(&url, &prefix).await;
    });
}

/// CRC16/XMODEM, Redis Cluster's key hash.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The slot of a record: its keys' hash tag is the hex digest of its id.
fn slot_of(owner: &str, key: &str) -> u16 {
    let id = RecordId::new(
        Scope::new(owner, OPERATION).expect("scope"),
        IdempotencyKey::parse(key).expect("key"),
    );
    let tag: String = id.digest().iter().map(|b| format!("{b:02x}")).collect();
    crc16(tag.as_bytes()) % 16384
}

fn cluster_killed_process() {
    let c = cluster::get();
    runtime().block_on(async {
        let prefix = format!("idemcli:{}:", IdempotencyKey::random().as_str());
        let nodes = c.node_urls();
        let store = idem_redis::RedisStore::connect_cluster(&nodes)
            .await
            .expect("connect to the cluster")
            .with_prefix(&prefix)
            .expect("prefix");
        let backend = Backend::Cluster {
            nodes: nodes.clone(),
            prefix: prefix.clone(),
        };
        // Two records per primary's slot range (`--cluster create` gives
        // three primaries equal ranges in order; checked by counting the
        // keys each node holds once the child is dead).
        let owner = owner();
        let mut per_range = [0_u8; 3];
        let mut ended = Vec::new();
        while per_range.iter().any(|&n| n < 2) {
            let key = IdempotencyKey::random().as_str().to_owned();
            let range = match slot_of(&owner, &key) {
                0..=5460 => 0,
                5461..=10922 => 1,
                _ => 2,
            };
            if per_range[range] < 2 {
                per_range[range] += 1;
                ended.push(key);
            }
        }
        let (pattern, ports) = (format!("{prefix}*:r"), c.ports.clone());
        killed_process(store, backend, owner, ended, move || {
            for &p in &ports {
                let out = cluster::cli(p, &["--scan", "--pattern", &pattern]).unwrap_or_default();
                assert!(
                    out.lines().count() >= 2,
                    "primary {p} holds {} of the records",
                    out.lines().count()
                );
            }
        })
        .await;
        for url in &nodes {
            delete_prefix(url, &prefix).await;
        }
    });
}

/// Connecting to a server that never answers stops at `--timeout` with exit
/// code 5, on every network backend.
fn silent_server_times_out() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = silent.local_addr().expect("addr").port();
    for url in [
        format!("postgres://postgres@127.0.0.1:{port}/test"),
        format!("mysql://root@127.0.0.1:{port}/test"),
        format!("redis://127.0.0.1:{port}/"),
        format!("redis+cluster://127.0.0.1:{port}"),
    ] {
        let args = vec!["--url".to_owned(), url.clone()];
        let (code, doc) = idem(&args, &["stats", "--timeout", "300ms"]);
        assert_eq!(
            (code, doc["error"].as_str()),
            (5, Some("timeout")),
            "{url}: {doc}"
        );
    }
    drop(silent);
}

/// `ms` as RFC 3339 UTC to the millisecond, written by `date -u` (an oracle
/// independent of the tool's formatter).
fn rfc3339_by_date(ms: i64) -> String {
    let out = Command::new("date")
        .args(["-u", "-d", &format!("@{}", ms.div_euclid(1000))])
        .arg("+%Y-%m-%dT%H:%M:%S")
        .output()
        .expect("run date");
    assert!(out.status.success(), "date: {out:?}");
    format!(
        "{}.{:03}Z",
        String::from_utf8_lossy(&out.stdout).trim(),
        ms.rem_euclid(1000)
    )
}

/// The one line of `out` that starts with `prefix`.
fn line_of<'a>(out: &'a str, prefix: &str) -> &'a str {
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with(prefix)).collect();
    match lines[..] {
        [line] => line,
        _ => panic!("one line starting with {prefix:?} in {out}"),
    }
}

/// Runs `idem <store args> <args>` (human output) with no standard input:
/// the exit code, stdout and stderr.
fn idem_text(store: &[String], args: &[impl AsRef<str>]) -> (i32, String, String) {
    let out: Output = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(store)
        .args(args.iter().map(AsRef::as_ref))
        .stdin(Stdio::null())
        .output()
        .expect("run idem");
    (
        out.status.code().expect("exit code"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The default (human) output of `inspect`, `stats` and `purge`, and a
/// destructive command refused without a terminal or `--yes`.
fn sqlite_human_output() {
    runtime().block_on(async {
        let path = std::env::temp_dir().join(format!("idem-cli-{}.db", IdempotencyKey::random()));
        let store = idem_sqlite::SqliteStore::open(&path).await.expect("open");
        let owner = owner();
        let scope = idem_core::Scope::new(owner.as_str(), OPERATION).expect("scope");
        let reply = idem_core::Idem::new(store.clone())
            .execute(&scope, "human-1", &json!({"amount": 7}), |_| async {
                idem_core::Outcome::<String, String>::Success("ch_7".to_owned())
            })
            .await
            .expect("execute");
        assert!(reply.is_stored());
        let args = Backend::Sqlite {
            path: path.display().to_string(),
        }
        .cli_args();
        let inspect = record_args("inspect", &owner, "human-1", &[]);
        let (code, out, err) = idem_text(&args, &inspect);
        assert_eq!(code, 0, "inspect: {err}");
        let want_record = format!("record      {owner} / {OPERATION} / human-1");
        for line in [
            want_record.as_str(),
            "state       completed (attempt 1)",
            "outcome     success",
            "resource id -",
        ] {
            assert!(out.lines().any(|l| l == line), "{line:?} in {out}");
        }
        assert!(
            out.lines()
                .any(|l| l.starts_with("body        ") && l.ends_with(" bytes")),
            "body size in {out}"
        );

        let (code, out, err) = idem_text(&args, &["stats"]);
        assert_eq!(code, 0, "stats: {err}");
        assert!(out.lines().any(|l| l == "completed 1"), "{out}");
        assert!(out.lines().any(|l| l == "in_flight 0"), "{out}");

        // No terminal and no --yes: refused (exit 4), nothing deleted.
        let delete = record_args("delete", &owner, "human-1", &[]);
        let (code, _, err) = idem_text(&args, &delete);
        assert_eq!(code, 4, "delete without --yes: {err}");
        assert!(err.contains("not confirmed"), "{err}");
        let (code, out, _) = idem_text(&args, &inspect);
        assert_eq!(code, 0);
        assert!(out.contains("state       completed"), "{out}");

        let (code, out, err) = idem_text(&args, &["purge", "--yes"]);
        assert_eq!(code, 0, "purge: {err}");
        assert_eq!(out.trim(), "0 key(s) removed, 0 body(ies) dropped");

        // Times in RFC 3339 UTC, with how far they are beside them.
        let (_, doc) = idem(&args, &inspect);
        let (code, out, err) = idem_text(&args, &inspect);
        assert_eq!(code, 0, "inspect: {err}");
        let key_until = rfc3339_by_date(doc["key_expires_at_ms"].as_i64().expect("key expiry"));
        let body_until = rfc3339_by_date(
            doc["response_expires_at_ms"]
                .as_i64()
                .expect("body expiry"),
        );
        assert_eq!(
            line_of(&out, "key until "),
            format!("key until   {key_until} (in 29d 23h)")
        );
        assert_eq!(
            line_of(&out, "body until "),
            format!("body until  {body_until} (in 23h 59m)")
        );
        assert!(
            line_of(&out, "lease until ").ends_with("Z (not held: completed)"),
            "a completed record's lease is history: {out}"
        );
        // A body that is not an HTTP response: its text, as before.
        let with_body = record_args("inspect", &owner, "human-1", &["--body"]);
        let (code, out, err) = idem_text(&args, &with_body);
        assert_eq!((code, out.lines().last()), (0, Some("ch_7")), "{err}");

        // A stored HTTP response: its status, headers and body, decoded.
        let engine = idem_core::Idem::new(store.clone());
        for (key, response) in [
            (
                "human-http",
                idem_core::HttpResponse::new(201, vec![], br#"{"id":"ch_8"}"#.to_vec())
                    .with_header("content-type", "application/json")
                    .with_header("x-raw", b"\xff\xfe".to_vec()),
            ),
            (
                "human-bin",
                idem_core::HttpResponse::new(200, vec![], b"\x00\x01ab".to_vec()),
            ),
        ] {
            engine
                .execute(&scope, key, &json!({"amount": 8}), |_| async move {
                    idem_core::Outcome::<_, idem_core::HttpResponse>::Success(response)
                })
                .await
                .expect("execute");
        }
        let http = |key: &str| record_args("inspect", &owner, key, &["--body"]);
        let run_text = |v: Vec<String>| {
            let (code, out, err) = idem_text(&args, &v);
            assert_eq!(code, 0, "{err}");
            out
        };
        let out = run_text(http("human-http"));
        let decoded = out
            .split_once("\nstatus ")
            .map(|(_, tail)| format!("status {tail}"))
            .unwrap_or_else(|| panic!("a status line in {out}"));
        assert_eq!(
            decoded,
            "status      201\n\
             header      content-type: application/json\n\
             header      x-raw: 0xfffe\n\
             content     13 bytes, text\n\
             {\"id\":\"ch_8\"}\n"
        );
        let out = run_text(http("human-bin"));
        assert!(
            out.ends_with(
                "status      200\n\
                 content     4 bytes, binary\n\
                 00000000  00 01 61 62                                       |..ab|\n"
            ),
            "{out}"
        );
        let (code, doc) = idem(&args, &http("human-http"));
        assert_eq!(code, 0, "{doc}");
        assert_eq!(
            doc["response"],
            json!({
                "status": 201,
                "headers": [
                    {"name": "content-type", "value": "application/json"},
                    {"name": "x-raw", "value": {"hex": "fffe"}},
                ],
                "body": "{\"id\":\"ch_8\"}",
            }),
            "{doc}"
        );

        // A bare file path names a SQLite store too.
        let (code, out, err) = idem_text(&["--url".to_owned(), path.display().to_string()], &["stats"]);
        assert_eq!((code, line_of(&out, "completed ")), (0, "completed 3"), "{err}");

        // A store that cannot be opened: its error chain, each cause once.
        let missing = std::env::temp_dir()
            .join(format!("idem-cli-{}", IdempotencyKey::random()))
            .join("missing.db");
        let missing = vec!["--url".to_owned(), format!("sqlite://{}", missing.display())];
        let (code, _, err) = idem_text(&missing, &["stats"]);
        assert_eq!(code, 1, "{err}");
        assert_eq!(
            err.trim(),
            "idem: cannot open the sqlite store: error returned from database: (code: 14) unable to open database file"
        );
        let (code, doc) = idem(&missing, &["stats"]);
        assert_eq!((code, doc["error"].as_str()), (1, Some("store_error")), "{doc}");
        assert_eq!(
            doc["message"]
                .as_str()
                .map(|m| m.matches("unable to open database file").count()),
            Some(1),
            "{doc}"
        );

        store.close().await;
        idem_test_support::remove_sqlite(&path);
    });
}

/// `--read-only` reads a Postgres standby (a read replica): `stats` and
/// `stuck` answer from it, where without the flag the standby is refused
/// (`idem::connect` refuses a server in recovery); and `release`, `delete`,
/// `purge` and `migrate` are refused with exit code 2 before anything is
/// opened. A throwaway primary and streaming standby of its own.
fn postgres_replica_read_only() {
    use idem_test_support::sql::pg_cluster::{Cluster, Mode};
    runtime().block_on(async {
        let cluster = Cluster::start(Mode::Asynchronous).await;
        let primary = idem_postgres::PgStore::connect(&cluster.primary.url())
            .await
            .expect("primary");
        primary.migrate().await.expect("migrate on the primary");
        let owner = owner();
        let scope = Scope::new(owner.as_str(), OPERATION).expect("scope");
        let reply = Idem::new(primary.clone())
            .execute(&scope, "replica-1", &json!({"amount": 1}), |_| async {
                Outcome::<String, String>::Success("ch_r".to_owned())
            })
            .await
            .expect("execute on the primary");
        assert!(reply.is_stored());
        cluster.wait_streaming(false).await;
        let standby = vec!["--url".to_owned(), cluster.standby.url()];

        let (code, doc) = idem(&standby, &["--read-only", "stats"]);
        assert_eq!(code, 0, "stats on the replica: {doc}");
        assert!(doc.to_string().contains("completed"), "{doc}");
        let (code, doc) = idem(&standby, &["--read-only", "stuck"]);
        assert_eq!(code, 0, "stuck on the replica: {doc}");
        let (code, out, err) = idem_text(&standby, &["stats"]);
        assert_ne!(code, 0, "a standby without --read-only is refused: {out}");
        assert!(
            format!("{out}{err}").contains("standby"),
            "says why: {out} {err}"
        );
        for write in ["release", "delete", "purge", "migrate"] {
            let command = if matches!(write, "release" | "delete") {
                record_args(write, &owner, "replica-1", &[])
            } else {
                vec![write.to_owned()]
            };
            let args: Vec<&str> = std::iter::once("--read-only")
                .chain(command.iter().map(String::as_str))
                .collect();
            let (code, out, err) = idem_text(&standby, &args);
            assert_eq!(code, 2, "{command:?} refused: {out} {err}");
            assert!(format!("{out}{err}").contains("--read-only"), "{out} {err}");
        }
        primary.close().await;
    });
}
