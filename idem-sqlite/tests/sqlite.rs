//! SQLite-specific behaviour on top of the conformance suite.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem_core::testkit::{Charge, Decline, Fixture};
use idem_core::{Error, Idem, Outcome, Scope};
use idem_sqlite::SqliteStore;
use idem_test_support::sql::Teardown;
use serde_json::json;
use support::FileDb;

type Out = Outcome<Charge, Decline>;

/// The indexes of `table`, by name.
async fn indexes(store: &SqliteStore, table: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ? ORDER BY 1",
    )
    .bind(table)
    .fetch_all(store.pool())
    .await
    .expect("indexes")
}

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

/// Calls `key` again, as `complete_one` did, and returns the outcome it
/// replays (asserting that it is a replay: the work, which would answer
/// "again", does not run).
async fn replay_one(idem: &Idem<SqliteStore>, scope: &Scope, key: &str) -> Charge {
    let reply = idem
        .execute(scope, key, &json!({"amount": 100}), |_| async {
            Out::Success(Charge {
                id: "again".into(),
                amount: 1,
            })
        })
        .await
        .expect("replay");
    assert!(reply.is_replay());
    reply.into_result().expect("the stored success")
}

/// A record corrupted by hand in the file is a typed 500 error on the next
/// call: never a panic and never a second execution.
#[tokio::test]
async fn hand_corrupted_records_are_typed_errors() {
    let db = FileDb::new().await;
    let idem = Idem::new(db.store.clone());
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
        // Another identity under this record's key: what two identities
        // sharing the first 16 bytes of their digest would look like.
        (
            "identity",
            "UPDATE idem_records SET key = 'someone-else' WHERE key = 'identity'",
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
    complete_one(&Idem::new(db.store.clone()), &scope, "k1").await;
    db.store.close().await;
    let reopened = SqliteStore::open(&db.path).await.unwrap();
    let charge = replay_one(&Idem::new(reopened.clone()), &scope, "k1").await;
    assert_eq!(charge.id, "ch_1");
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

/// On an up-to-date database `migrate` (which every open runs) is one read:
/// it takes no write lock, so it succeeds while another connection holds
/// the lock (it would fail with `SQLITE_BUSY` after the busy timeout if it
/// asked for it), and a read-only file opens and replays.
#[tokio::test]
async fn migrate_on_a_current_database_takes_no_write_lock() {
    use sqlx::sqlite::SqliteConnectOptions;

    let db = FileDb::new().await;
    let scope = Scope::new("acct", "POST /charges").unwrap();
    complete_one(&Idem::new(db.store.clone()), &scope, "k1").await;
    let options = || {
        SqliteConnectOptions::new()
            .filename(&db.path)
            .busy_timeout(std::time::Duration::from_millis(50))
    };
    let mut writer = db.store.pool().acquire().await.unwrap();
    sqlx::raw_sql("BEGIN IMMEDIATE")
        .execute(&mut *writer)
        .await
        .unwrap();
    let one = || sqlx::sqlite::SqlitePoolOptions::new().max_connections(1);
    let second = async {
        let store = SqliteStore::connect_with(one(), options()).await?;
        store.migrate().await?;
        Ok::<_, idem_sqlite::Error>(store)
    }
    .await;
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut *writer)
        .await
        .unwrap();
    drop(writer);
    let second = second.expect("open (and migrate) beside a writer");
    second.close().await;
    let read_only = SqliteStore::connect_with(one(), options().read_only(true))
        .await
        .expect("a read-only file opens");
    read_only.migrate().await.expect("and migrates: one read");
    let charge = replay_one(&Idem::new(read_only.clone()), &scope, "k1").await;
    assert_eq!(charge.id, "ch_1", "a replay reads only");
    read_only.close().await;
    db.teardown().await;
}

/// The table has no index but its primary key. A purge's read walks the
/// table's own B-tree from a `rowid` on, and its writes reach each row they
/// were given by `rowid`: neither scans another index nor sorts.
#[tokio::test]
async fn a_purge_walks_the_table_in_rowid_order() {
    let db = FileDb::new().await;
    assert_eq!(
        indexes(&db.store, "idem_records").await,
        ["sqlite_autoindex_idem_records_1"]
    );
    for (name, expect) in [
        ("purge_scan", "USING INTEGER PRIMARY KEY (rowid>?)"),
        ("purge_keys", "USING INTEGER PRIMARY KEY (rowid=?)"),
        ("purge_bodies", "USING INTEGER PRIMARY KEY (rowid=?)"),
    ] {
        let sql = idem_sqlite::statement(&db.store, name).expect(name);
        let plan: Vec<(i64, i64, i64, String)> =
            sqlx::query_as(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")))
                .fetch_all(db.store.pool())
                .await
                .unwrap();
        let text: Vec<_> = plan.iter().map(|r| r.3.as_str()).collect();
        assert!(
            text.iter()
                .any(|d| d.contains("idem_records") && d.contains(expect)),
            "{sql}: {text:?}"
        );
        assert!(
            !text
                .iter()
                .any(|d| d.starts_with("SCAN idem_records") || d.contains("TEMP B-TREE")),
            "{sql}: {text:?}"
        );
    }
    db.teardown().await;
}

/// A purge in batches over expired keys with live ones between them deletes
/// each expired key once and no live one; a call that reads to the table's
/// end sends the next walk back to its first row.
#[tokio::test]
async fn a_purge_takes_each_expired_key_once_and_starts_over_at_the_end() {
    use idem_core::clock::Timestamp;
    use idem_core::store::{ClaimOutcome, Completion, OutcomeKind, Store};
    use idem_core::{IdempotencyKey, RecordId};

    let db = FileDb::new().await;
    let scope = Scope::new("acct", "POST /charges").unwrap();
    let at = |ms: i64| Timestamp::from_unix_millis(1_000_000_000_000 + ms);
    let id = |i: u32| {
        RecordId::new(
            scope.clone(),
            IdempotencyKey::parse(&format!("k{i}")).unwrap(),
        )
    };
    // Keys 0, 2, 4, … expire at 1 s, the odd ones in a day.
    let store_key = async |i: u32, key_expires: i64| {
        let record = id(i);
        let claim = idem_test_support::sql::claim_request(&record, at(0));
        let won = db.store.claim(&claim).await.unwrap();
        assert!(matches!(won, ClaimOutcome::Claimed(_)), "{won:?}");
        let done = Completion::new(
            OutcomeKind::Success,
            Some(b"{}"),
            None,
            at(0),
            at(key_expires),
            at(key_expires),
        );
        db.store
            .complete(&record, claim.token, &done)
            .await
            .unwrap();
    };
    for i in 0..12 {
        store_key(i, if i % 2 == 0 { 1_000 } else { 86_400_000 }).await;
    }
    // Six expired keys, at most four a call: the second call reads to the
    // table's end.
    let mut removed = Vec::new();
    for _ in 0..2 {
        let r = db.store.purge_expired(at(2_000), 4).await.unwrap();
        removed.push((r.keys_removed, r.bodies_dropped));
    }
    assert_eq!(removed, [(4, 0), (2, 0)], "six expired keys, four a call");
    for i in 0..12 {
        let kept = db.store.fetch(&id(i), at(2_000)).await.unwrap().is_some();
        assert_eq!(kept, i % 2 == 1, "key {i}");
    }
    // So the next walk starts from the first row: once their day has
    // passed, the live keys (below where the last call stopped) go too, and
    // a call after them finds nothing.
    let day = db.store.purge_expired(at(86_400_001), 100).await.unwrap();
    assert_eq!(day.keys_removed, 6, "{day:?}");
    let after = db.store.purge_expired(at(86_400_001), 100).await.unwrap();
    assert_eq!(after.keys_removed, 0, "{after:?}");
    db.teardown().await;
}

/// What each step of a fresh key writes, counted as the WAL frames (pages)
/// its commit appends: the claim writes the table and the primary key; the
/// completion changes no indexed column, so it writes the table's page
/// alone (it wrote four pages while three indexes covered the expiries and
/// the in-flight state, and the claim wrote four; with a sweep index the
/// claim wrote three).
#[tokio::test]
async fn a_completion_writes_the_table_and_no_index() {
    use idem_core::adapter::fingerprint;
    use idem_core::clock::Timestamp;
    use idem_core::store::OutcomeKind;
    use idem_core::store::{ClaimOutcome, ClaimRequest, Completion, Store, Token};
    use idem_core::{FieldFilter, IdempotencyKey, RecordId};

    let db = FileDb::new().await;
    let pool = db.store.pool().clone();
    // `PRAGMA wal_checkpoint(mode)`: whether it was blocked, and the frames
    // in the WAL (since it was last emptied by a `TRUNCATE`).
    let checkpoint = |mode: &'static str| {
        let pool = pool.clone();
        async move {
            let (busy, log, _): (i64, i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "PRAGMA wal_checkpoint({mode})"
            )))
            .fetch_one(&pool)
            .await
            .unwrap();
            (busy, log)
        }
    };
    let frames = async || checkpoint("PASSIVE").await.1;
    let truncate = async || {
        let (busy, _) = checkpoint("TRUNCATE").await;
        assert_eq!(busy, 0, "the WAL could not be emptied");
    };
    let scope = Scope::new("acct", "POST /charges").unwrap();
    let at = |ms: i64| Timestamp::from_unix_millis(1_000_000_000_000 + ms);
    let now = at(0);
    let fp = fingerprint(scope.operation(), &json!({"amount": 1}), &FieldFilter::All).unwrap();
    // Twenty keys, each step counted on its own.
    let mut pages = Vec::new();
    for i in 0..20 {
        let id = RecordId::new(
            scope.clone(),
            IdempotencyKey::parse(&format!("k{i}")).unwrap(),
        );
        let token = Token::random();
        truncate().await;
        let claimed = db
            .store
            .claim(&ClaimRequest::new(
                &id,
                fp,
                token,
                now,
                at(30_000),
                at(86_400_000),
            ))
            .await
            .unwrap();
        assert!(matches!(claimed, ClaimOutcome::Claimed(_)));
        let claim = frames().await;
        truncate().await;
        db.store
            .complete(
                &id,
                token,
                &Completion::new(
                    OutcomeKind::Success,
                    Some(&[7; 100]),
                    None,
                    now,
                    at(3_600_000),
                    at(86_400_000),
                ),
            )
            .await
            .unwrap();
        pages.push((claim, frames().await));
    }
    // A step that splits a full page writes more: a claim's row, or a
    // completion's body growing the last row of a full page, which these
    // twenty keys (all on the table's last pages) meet at most once.
    assert!(
        pages.iter().filter(|&&(_, complete)| complete != 1).count() <= 1,
        "(claim, completion) pages per key: {pages:?}"
    );
    assert_eq!(
        pages.iter().map(|&(claim, _)| claim).min(),
        Some(2),
        "(claim, completion) pages per key: {pages:?}"
    );
    db.teardown().await;
}

/// A table that exists without this layout's mark (as a build before 0.1
/// made it) is refused by `migrate` with a typed error and left as it was;
/// the table this build makes carries the mark in the text that created it,
/// and is accepted again.
#[tokio::test]
async fn migrate_refuses_a_table_of_another_layout() {
    let path = std::env::temp_dir().join(format!(
        "idem-test-{}.db",
        idem_core::IdempotencyKey::random()
    ));
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal);
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await
        .unwrap();
    sqlx::raw_sql(
        "CREATE TABLE idem_records (owner TEXT NOT NULL, operation TEXT NOT NULL, key TEXT NOT NULL,
             fingerprint BLOB NOT NULL, PRIMARY KEY (owner, operation, key));
         INSERT INTO idem_records VALUES ('o', 'op', 'k', x'01');",
    )
    .execute(&pool)
    .await
    .expect("a table of a build before 0.1");
    let store = SqliteStore::new(pool.clone());
    match store.migrate().await {
        Err(idem_sqlite::Error::Layout(e)) => {
            assert_eq!(e.table, "idem_records");
            assert!(e.to_string().contains("before 0.1"), "{e}");
        }
        other => panic!("expected Error::Layout, got {other:?}"),
    }
    let columns: i64 = sqlx::query_scalar("SELECT count(*) FROM pragma_table_info('idem_records')")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(columns, 4, "left as it was");
    // A store that was never migrated finds out at its first call.
    idem_test_support::sql::assert_calls_refused_on_another_layout(&store).await;

    let made = SqliteStore::new(pool.clone())
        .with_table_name("idem_new")
        .unwrap();
    made.migrate().await.expect("migrate");
    let created: String = sqlx::query_scalar(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'idem_new'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(created.contains(idem_sql::LAYOUT), "{created}");
    made.migrate().await.expect("accepted again");
    pool.close().await;
    idem_test_support::remove_sqlite(&path);
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
            .admin()
            .inspect(&scope, "k", true)
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        Idem::new(b.store())
            .admin()
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

/// Two stores on one file with different tables never see each other's
/// records: the same key completes once in each, a purge of one leaves the
/// other, and each table has its own primary key.
#[tokio::test]
async fn stores_with_different_tables_in_one_file_are_separate() {
    let db = FileDb::new().await;
    let other = db
        .store
        .clone()
        .with_table_name("other_idem")
        .expect("a valid name");
    other.migrate().await.expect("migrate the second table");
    assert_eq!(
        (db.store.table_name(), other.table_name()),
        ("idem_records", "other_idem")
    );
    let scope = Scope::new("acct", "POST /charges").unwrap();
    complete_one(&Idem::new(db.store.clone()), &scope, "k").await;
    assert!(
        Idem::new(other.clone())
            .admin()
            .inspect(&scope, "k", true)
            .await
            .unwrap()
            .is_none(),
        "the second table does not see the first one's record"
    );
    let runs = Arc::new(AtomicUsize::new(0));
    let r = Arc::clone(&runs);
    let reply = Idem::new(other.clone())
        .execute(&scope, "k", &json!({"amount": 100}), |_| async move {
            r.fetch_add(1, Ordering::SeqCst);
            Out::Success(Charge {
                id: "ch_other".into(),
                amount: 100,
            })
        })
        .await
        .expect("a new operation in the second table");
    assert!(!reply.is_replay());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        replay_one(&Idem::new(db.store.clone()), &scope, "k")
            .await
            .id,
        "ch_1"
    );
    assert_eq!(
        replay_one(&Idem::new(other.clone()), &scope, "k").await.id,
        "ch_other"
    );
    let counts = Idem::new(other.clone())
        .admin()
        .count_states()
        .await
        .unwrap();
    assert_eq!(counts.completed, 1, "{counts:?}");
    assert_eq!(
        indexes(&db.store, "other_idem").await,
        ["sqlite_autoindex_other_idem_1"]
    );
    db.teardown().await;
}

/// A table name is a plain identifier or the call fails, before any SQL
/// runs; `migration_sql` is the shipped migration for the store's table.
#[tokio::test]
async fn table_names_are_validated_and_rendered_into_the_migration() {
    let store = SqliteStore::memory().await.unwrap();
    for bad in ["", "a-b", "x\"; DROP TABLE idem_records; --", "sqlite_x"] {
        let err = store
            .clone()
            .with_table_name(bad)
            .expect_err("an invalid name");
        assert!(
            matches!(
                err,
                idem_sqlite::Error::InvalidIdentifier { what: "table", .. }
            ),
            "{bad:?}: {err:?}"
        );
    }
    let named = store.with_table_name("t_2").unwrap();
    let sql = named.migration_sql();
    assert!(sql.contains("CREATE TABLE IF NOT EXISTS \"t_2\""), "{sql}");
    assert!(!sql.contains("CREATE INDEX"), "{sql}");
    assert!(!sql.contains("idem_records") && !sql.contains('{'), "{sql}");
    assert!(idem_sqlite::MIGRATION.contains("{table}"));
}

/// `connect` takes a URL and does not migrate (a call before `migrate`
/// fails on the missing table); an in-memory URL keeps its one database
/// across calls.
#[tokio::test]
async fn connect_opens_a_url_without_migrating() {
    let scope = Scope::new("acct", "POST /charges").unwrap();
    let memory = SqliteStore::connect("sqlite::memory:").await.unwrap();
    let err = Idem::new(memory.clone())
        .admin()
        .inspect(&scope, "k", true)
        .await
        .expect_err("no table before migrate");
    assert!(format!("{err:?}").contains("no such table"), "{err:?}");
    memory.migrate().await.unwrap();
    complete_one(&Idem::new(memory.clone()), &scope, "k").await;
    assert_eq!(replay_one(&Idem::new(memory), &scope, "k").await.id, "ch_1");

    let path = support::temp_path();
    let url = format!("sqlite://{}", path.display());
    assert!(
        SqliteStore::connect(&url).await.is_err(),
        "without mode=rwc a missing file is not created"
    );
    let file = SqliteStore::connect(&format!("{url}?mode=rwc"))
        .await
        .unwrap();
    file.migrate().await.unwrap();
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(file.pool())
        .await
        .unwrap();
    assert_eq!(mode, "wal");
    FileDb { store: file, path }.teardown().await;
}
