//! The `idem` binary end to end, against a real SQLite file, Postgres and
//! Redis: a record left in flight by a crashed attempt is listed by `stuck`,
//! released by `release`, and the next attempt runs as a recovery.

use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::store::TakeoverReason;
use idem_core::{AdminStore, Error, Idem, IdempotencyKey, Outcome, Policy, Scope};
use serde_json::Value;

/// Runs `idem <store args> <args> --json` with no standard input.
fn idem(store: &[String], args: &[&str]) -> (i32, Value) {
    let out: Output = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(store)
        .args(args)
        .arg("--json")
        .stdin(Stdio::null())
        .output()
        .expect("run idem");
    let code = out.status.code().expect("exit code");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let doc = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {stdout:?}; stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (code, doc)
}

fn policy(lease: Duration) -> Policy {
    Policy::builder()
        .lease(lease)
        .build()
        .expect("valid policy")
}

/// Starts an attempt that checkpoints `ch_1` and then hangs, and drops it
/// (as a killed process would): the record stays in flight until its lease
/// ends.
async fn crash_in_flight<S: AdminStore>(
    idem: &Idem<S>,
    scope: &Scope,
    key: &str,
    runs: &Arc<AtomicUsize>,
) {
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (idem2, scope2, key2, runs2) = (
        idem.clone(),
        scope.clone(),
        key.to_owned(),
        Arc::clone(runs),
    );
    let task = tokio::spawn(async move {
        idem2
            .execute(
                &scope2,
                key2.as_str(),
                &serde_json::json!({"amount": 5}),
                |a| async move {
                    runs2.fetch_add(1, Ordering::SeqCst);
                    a.save_resource_id("ch_1").await.expect("checkpoint");
                    let _ = started_tx.send(());
                    std::future::pending::<Outcome<String, String>>().await
                },
            )
            .await
    });
    started_rx.await.expect("attempt started");
    task.abort();
    let _ = task.await;
}

fn keys_of(doc: &Value) -> Vec<String> {
    doc["records"]
        .as_array()
        .expect("records")
        .iter()
        .map(|r| r["key"].as_str().expect("key").to_owned())
        .collect()
}

/// The whole operator story on one store.
async fn stuck_release_recover<S: AdminStore + Clone>(store: S, args: Vec<String>) {
    let scope = Scope::new(
        format!("tenant-{}", IdempotencyKey::random()),
        "POST /charges",
    )
    .expect("scope");
    let owner = scope.owner().to_owned();
    let (long_key, short_key) = (IdempotencyKey::random(), IdempotencyKey::random());
    let (long_key, short_key) = (long_key.as_str(), short_key.as_str());
    let runs = Arc::new(AtomicUsize::new(0));
    let long = Idem::new(store.clone()).with_policy(policy(Duration::from_secs(3600)));
    let short = Idem::new(store.clone()).with_policy(policy(Duration::from_millis(200)));
    crash_in_flight(&long, &scope, long_key, &runs).await;
    crash_in_flight(&short, &scope, short_key, &runs).await;
    tokio::time::sleep(Duration::from_millis(300)).await; // the short lease ends for real
    let rec = |key: &str| -> Vec<String> {
        [
            "--owner",
            &owner,
            "--operation",
            "POST /charges",
            "--key",
            key,
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
    };
    let with = |cmd: &str, extra: Vec<String>| -> Vec<String> {
        std::iter::once(cmd.to_owned()).chain(extra).collect()
    };
    let call = |v: Vec<String>| {
        let refs: Vec<&str> = v.iter().map(String::as_str).collect();
        idem(&args, &refs)
    };

    // `stuck` lists the crashed attempt whose lease ended, not the long lease...
    let (code, doc) = call(vec!["stuck".into(), "--all".into()]);
    assert_eq!(code, 0, "{doc}");
    let listed = keys_of(&doc);
    assert!(listed.contains(&short_key.to_owned()), "{doc}");
    assert!(!listed.contains(&long_key.to_owned()), "{doc}");
    // ...unless asked for leases ending within two hours.
    let (code, doc) = call(vec![
        "stuck".into(),
        "--all".into(),
        "--within-secs".into(),
        "7200".into(),
    ]);
    assert_eq!(code, 0, "{doc}");
    let listed = keys_of(&doc);
    assert!(
        listed.contains(&short_key.to_owned()) && listed.contains(&long_key.to_owned()),
        "{doc}"
    );

    // The client is stuck on 409.
    let retry = |runs: Arc<AtomicUsize>| {
        let (long, scope) = (long.clone(), scope.clone());
        async move {
            long.execute(
                &scope,
                long_key,
                &serde_json::json!({"amount": 5}),
                |a| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    assert_eq!(a.recovery_reason(), Some(TakeoverReason::LeaseExpired));
                    assert_eq!(a.previous_resource_id(), Some("ch_1"));
                    Outcome::<String, String>::Success("ch_1".to_owned())
                },
            )
            .await
        }
    };
    assert!(matches!(
        retry(Arc::clone(&runs)).await,
        Err(Error::InFlight { .. })
    ));

    let (code, doc) = call(with("inspect", rec(long_key)));
    assert_eq!(code, 0, "{doc}");
    assert_eq!(doc["state"], "in_flight");
    assert_eq!(doc["attempt"], 1);
    assert_eq!(doc["lease_expired"], false);
    assert_eq!(doc["resource_id"], "ch_1");

    // Destructive commands need --yes without a terminal: refused, nothing changes.
    let (code, doc) = call(with("release", rec(long_key)));
    assert_eq!((code, doc["error"].as_str()), (4, Some("refused")), "{doc}");
    let mut release = with("release", rec(long_key));
    release.push("--yes".into());
    let (code, doc) = call(release.clone());
    assert_eq!(code, 0, "{doc}");
    assert_eq!(doc["released"], true);

    // The next attempt runs as a recovery, once.
    let reply = retry(Arc::clone(&runs)).await.expect("recovery");
    assert!(!reply.is_replay());
    assert_eq!(reply.attempt(), 2);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "two crashed attempts and one recovery"
    );
    let (code, doc) = call(with("inspect", rec(long_key)));
    assert_eq!(
        (code, doc["state"].as_str()),
        (0, Some("completed")),
        "{doc}"
    );
    // Releasing again is refused: the record completed.
    let (code, doc) = call(release);
    assert_eq!(code, 4, "{doc}");

    // Delete refuses the in-flight record, deletes the completed one.
    let mut delete = with("delete", rec(short_key));
    delete.push("--yes".into());
    let (code, doc) = call(delete);
    assert_eq!(code, 4, "{doc}");
    let mut delete = with("delete", rec(long_key));
    delete.push("--yes".into());
    let (code, doc) = call(delete);
    assert_eq!((code, doc["deleted"].as_bool()), (0, Some(true)), "{doc}");
    let (code, doc) = call(with("inspect", rec(long_key)));
    assert_eq!(
        (code, doc["error"].as_str()),
        (3, Some("not_found")),
        "{doc}"
    );

    let (code, doc) = call(vec!["stats".into()]);
    assert_eq!(code, 0, "{doc}");
    assert!(doc["stuck"].as_u64().expect("stuck") >= 1, "{doc}");
    let c = store
        .count_states(idem_core::Timestamp::from_unix_millis(i64::MAX / 4))
        .await
        .expect("count");
    assert_eq!(c.completed, 0);
    let (code, doc) = call(vec!["purge".into(), "--yes".into()]);
    assert_eq!(code, 0, "{doc}");
    let (code, doc) = call(vec!["migrate".into()]);
    assert_eq!(code, 0, "{doc}");
    // Bad usage is exit code 2, a bad key too.
    let (code, _) = call(with("inspect", rec("bad\u{7f}key")));
    assert_eq!(code, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_stuck_release_recover() {
    let path = std::env::temp_dir().join(format!("idem-cli-{}.db", IdempotencyKey::random()));
    let store = idem_sqlite::SqliteStore::open(&path).await.expect("open");
    let url = format!("sqlite://{}", path.display());
    stuck_release_recover(store.clone(), vec!["--url".into(), url]).await;
    store.pool().close().await;
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.clone().into_os_string();
        p.push(suffix);
        let _ = std::fs::remove_file(p);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stuck_release_recover() {
    let url = std::env::var("IDEM_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let schema = format!(
        "idem_cli_{}",
        IdempotencyKey::random().as_str().to_lowercase()
    );
    let store = idem_postgres::PgStore::connect(&url)
        .await
        .unwrap_or_else(|e| {
            panic!("cannot reach Postgres at {url} ({e}): start it or set IDEM_POSTGRES_URL")
        })
        .with_schema_name(&schema)
        .expect("schema name");
    store.migrate().await.expect("migrate");
    stuck_release_recover(
        store.clone(),
        vec!["--url".into(), url, "--schema".into(), schema.clone()],
    )
    .await;
    idem_postgres::sqlx::query(idem_postgres::sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA \"{schema}\" CASCADE"
    )))
    .execute(store.pool())
    .await
    .expect("drop schema");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stuck_release_recover() {
    use idem_redis::redis::AsyncCommands;
    let url =
        std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned());
    let prefix = format!("idemcli:{}:", IdempotencyKey::random().as_str());
    let store = idem_redis::RedisStore::connect(&url)
        .await
        .unwrap_or_else(|e| {
            panic!("cannot reach Redis at {url} ({e}): start it or set IDEM_REDIS_URL")
        })
        .with_prefix(&prefix)
        .expect("prefix");
    stuck_release_recover(
        store,
        vec![
            "--url".into(),
            url.clone(),
            "--prefix".into(),
            prefix.clone(),
        ],
    )
    .await;
    let client = idem_redis::redis::Client::open(url.as_str()).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let keys: Vec<String> = conn.keys(format!("{prefix}*")).await.expect("KEYS");
    for k in keys {
        let _: i64 = conn.del(&k).await.expect("DEL");
    }
}
