//! SQLite-specific behaviour on top of the conformance suite.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem_core::testkit::{Charge, Decline, Fixture};
use idem_core::{Error, Idem, Outcome, Scope};
use idem_sqlite::SqliteStore;
use serde_json::json;
use support::FileDb;

type Out = Outcome<Charge, Decline>;

async fn complete_one(idem: &Idem<SqliteStore>, scope: &Scope, key: &str) {
    idem.execute(scope, key, &json!({"amount": 100}), |a| async move {
        a.set_resource_id("ch_1");
        Out::Success(Charge {
            id: "ch_1".into(),
            amount: 100,
        })
    })
    .await
    .expect("first call");
}

/// A record corrupted by hand in the file is a typed 500 error on the next
/// call: never a panic and never a second execution.
#[tokio::test]
async fn hand_corrupted_records_are_typed_errors() {
    let db = FileDb::new().await;
    let idem = Idem::new(db.store());
    let scope = Scope::new("acct", "POST /charges").unwrap();
    let corruptions = [
        (
            "fp",
            "UPDATE idem_records SET fingerprint = x'0102' WHERE key = 'fp'",
        ),
        (
            "state",
            "UPDATE idem_records SET state = 'exploded' WHERE key = 'state'",
        ),
        (
            "outcome",
            "UPDATE idem_records SET outcome = 'maybe' WHERE key = 'outcome'",
        ),
        (
            "body",
            "UPDATE idem_records SET response = x'00ff7b' WHERE key = 'body'",
        ),
        (
            "attempt",
            "UPDATE idem_records SET attempt = 'many' WHERE key = 'attempt'",
        ),
        (
            "lease",
            "UPDATE idem_records SET lease_until = 'soon' WHERE key = 'lease'",
        ),
    ];
    let runs = Arc::new(AtomicUsize::new(0));
    for (key, sql) in corruptions {
        complete_one(&idem, &scope, key).await;
        sqlx::query(sql).execute(db.store.pool()).await.unwrap();
        let r = Arc::clone(&runs);
        let err = idem
            .execute(&scope, key, &json!({"amount": 100}), |_| async move {
                r.fetch_add(1, Ordering::SeqCst);
                Out::Success(Charge {
                    id: "again".into(),
                    amount: 100,
                })
            })
            .await
            .expect_err(key);
        assert!(matches!(err, Error::CorruptRecord { .. }), "{key}: {err:?}");
        assert_eq!(err.http_status(), 500, "{key}");
        assert!(err.to_string().contains("corrupted"), "{key}: {err}");
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "corruption must never re-run the work"
    );
    db.teardown().await;
}

/// Records survive closing and reopening the file: a retry after a restart
/// replays instead of running again.
#[tokio::test]
async fn records_survive_reopening_the_file() {
    let db = FileDb::new().await;
    let scope = Scope::new("acct", "POST /charges").unwrap();
    complete_one(&Idem::new(db.store()), &scope, "k1").await;
    db.store.pool().close().await;
    let reopened = SqliteStore::open(&db.path).await.unwrap();
    let reply = Idem::new(reopened.clone())
        .execute(&scope, "k1", &json!({"amount": 100}), |_| async {
            Out::Success(Charge {
                id: "again".into(),
                amount: 1,
            })
        })
        .await
        .unwrap();
    assert!(reply.is_replay());
    assert_eq!(reply.into_result().unwrap().id, "ch_1");
    let db = FileDb {
        store: reopened,
        path: db.path,
    };
    db.teardown().await;
}

/// The migration is idempotent, and the WAL journal is on for files.
#[tokio::test]
async fn migration_is_idempotent_and_wal_is_on() {
    let db = FileDb::new().await;
    db.store.migrate().await.unwrap();
    db.store.migrate().await.unwrap();
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(db.store.pool())
        .await
        .unwrap();
    assert_eq!(mode, "wal");
    let timeout: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
        .fetch_one(db.store.pool())
        .await
        .unwrap();
    assert_eq!(timeout, 5000);
    db.teardown().await;
}

/// The purge statements reach rows through the expiry indexes, not a scan.
#[tokio::test]
async fn purges_use_the_expiry_indexes() {
    let db = FileDb::new().await;
    for (sql, index) in [
        (
            "SELECT rowid FROM idem_records WHERE key_expires_at <= 1 LIMIT 10",
            "idem_records_key_expiry",
        ),
        (
            "SELECT rowid FROM idem_records WHERE response IS NOT NULL AND response_expires_at <= 1 LIMIT 10",
            "idem_records_response_expiry",
        ),
    ] {
        let plan: Vec<(i64, i64, i64, String)> =
            sqlx::query_as(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")))
                .fetch_all(db.store.pool())
                .await
                .unwrap();
        let text: Vec<_> = plan.iter().map(|r| r.3.as_str()).collect();
        assert!(text.iter().any(|d| d.contains(index)), "{sql}: {text:?}");
        assert!(
            !text.iter().any(|d| d.starts_with("SCAN")),
            "{sql}: {text:?}"
        );
    }
    db.teardown().await;
}

/// Two in-memory stores are separate databases.
#[tokio::test]
async fn memory_stores_are_private() {
    let scope = Scope::new("acct", "POST /charges").unwrap();
    let a = support::memory().await;
    let b = support::memory().await;
    complete_one(&Idem::new(a.store()), &scope, "k").await;
    assert!(
        Idem::new(a.store())
            .inspect(&scope, "k", true)
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        Idem::new(b.store())
            .inspect(&scope, "k", true)
            .await
            .unwrap()
            .is_none()
    );
    a.teardown().await;
    b.teardown().await;
}

/// A store whose file cannot be opened is a typed store error, and not a
/// retryable one: a missing directory is a configuration fault (500), not an
/// outage (503).
#[tokio::test]
async fn unopenable_file_is_a_typed_error() {
    let err = SqliteStore::open("/nonexistent-dir/idem.db")
        .await
        .expect_err("no such dir");
    let err = Error::from(err);
    assert!(matches!(err, Error::Store(_)), "{err:?}");
    assert_eq!(err.http_status(), 500);
    assert!(!err.is_retryable());
}
