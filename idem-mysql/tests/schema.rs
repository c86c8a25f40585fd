//! The table as the migration builds it: byte-exact identities, values only
//! through bind parameters, validated names, corrupted rows as typed errors,
//! and a migration that can run again, from several instances at once.

mod support;

use idem_core::clock::{Clock, ManualClock};
use idem_core::store::{Store, StoreError};
use idem_core::{Error, IdempotencyKey, RecordId, Scope};
use idem_mysql::sqlx::{self, Executor, Row};
use idem_mysql::{MySqlStore, Server};
use support::MyFixture;
use support::scenario::{Counter, Out, count_rows, engine, request, scope, with_fixture};

/// Keys, owners and operations compare byte for byte: case and trailing
/// spaces make other records (a `_bin` collation with `PAD SPACE`, as
/// MariaDB's `utf8mb4_bin`, would merge `a` and `a `). Both claim paths.
async fn identities_are_byte_exact(server: Server) {
    with_fixture(MyFixture::new(4).await, move |fx| async move {
        let store = fx.store.clone().with_server(server);
        let clock = ManualClock::starting_now();
        let idem = engine(&store, &clock);
        let owner = format!("acct-{}", IdempotencyKey::random());
        let pairs: [(String, &str, &str); 6] = [
            (owner.clone(), "POST /orders", "order-A"),
            (owner.clone(), "POST /orders", "order-a"),
            (format!("{owner} "), "POST /orders", "order-A"),
            (owner.clone(), "POST /orders ", "order-A"),
            (owner.clone(), "post /orders", "order-A"),
            (owner.to_uppercase(), "POST /orders", "order-A"),
        ];
        for (i, (o, op, k)) in pairs.iter().enumerate() {
            let scope = Scope::new(o.clone(), *op).expect("scope");
            let r = idem
                .execute(&scope, *k, &request(), |_| async move {
                    Out::Success(format!("r{i}"))
                })
                .await
                .expect("execute");
            assert!(!r.is_replay(), "{i}: {o:?} {op:?} {k:?} is a record of its own");
        }
        for (i, (o, op, k)) in pairs.iter().enumerate() {
            let scope = Scope::new(o.clone(), *op).expect("scope");
            let r = idem
                .execute(&scope, *k, &request(), |_| async {
                    Out::Success("again".into())
                })
                .await
                .expect("replay");
            assert!(r.is_replay());
            assert_eq!(r.into_result(), Ok(format!("r{i}")), "{o:?} {op:?} {k:?}");
        }
        assert_eq!(count_rows(&fx, &fx.table).await, 6);
        // The columns are binary, whatever the server's default collation.
        let types: Vec<(String, String)> = sqlx::query_as(
            "SELECT CAST(COLUMN_NAME AS CHAR), CAST(DATA_TYPE AS CHAR) FROM information_schema.COLUMNS
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?
               AND COLUMN_NAME IN ('owner', 'operation', 'key', 'fingerprint', 'response')
             ORDER BY COLUMN_NAME",
        )
        .bind(&fx.table)
        .fetch_all(fx.store.pool())
        .await
        .expect("columns");
        let types: Vec<(&str, &str)> = types.iter().map(|(c, t)| (c.as_str(), t.as_str())).collect();
        assert_eq!(
            types,
            [
                ("fingerprint", "varbinary"),
                ("key", "varbinary"),
                ("operation", "varbinary"),
                ("owner", "varbinary"),
                ("response", "longblob"),
            ]
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identities_are_byte_exact_mariadb() {
    identities_are_byte_exact(Server::MariaDb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identities_are_byte_exact_mysql_path() {
    identities_are_byte_exact(Server::MySql).await;
}

/// A body of every byte value, and a large one (3 MiB, under a policy
/// that stores up to 8 MiB), come back byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_bodies_round_trip() {
    with_fixture(MyFixture::new(2).await, |fx| async move {
        let clock = ManualClock::starting_now();
        let policy = idem_core::Policy::builder()
            .max_response_bytes(8 << 20)
            .build()
            .expect("policy");
        let idem = idem_core::Idem::new(fx.store.clone())
            .with_clock(clock.clone())
            .with_policy(policy);
        let scope = scope();
        let all: Vec<u8> = (0..=255u8).cycle().take(3 * 1024 * 1024).collect();
        for (k, body) in [
            ("all-bytes", (0..=255u8).collect::<Vec<u8>>()),
            ("3mib", all),
        ] {
            let b = body.clone();
            idem.execute(&scope, k, &request(), move |_| async move {
                idem_core::Outcome::<Vec<u8>, String>::Success(b)
            })
            .await
            .expect("execute");
            let again = idem
                .execute(&scope, k, &request(), |_| async {
                    idem_core::Outcome::<Vec<u8>, String>::Success(Vec::new())
                })
                .await
                .expect("replay");
            assert!(again.is_replay());
            assert_eq!(again.into_result(), Ok(body), "{k}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_values_go_through_bind_parameters_only() {
    with_fixture(MyFixture::new(4).await, |fx| async move {
        let clock = ManualClock::starting_now();
        let idem = engine(&fx.store, &clock);
        let owner = "o'; DROP TABLE idem_records; -- `x`";
        let operation = "POST /\"x\"; SELECT SLEEP(10); \\";
        let scope = Scope::new(owner, operation).expect("scope");
        let long_key: String = (0..255)
            .map(|i| ['\'', ';', '"', '\\', 'a', '%', '_', '`'][i % 8])
            .collect();
        let long_key = format!("k{}z", &long_key[2..]);
        assert_eq!(long_key.len(), 255);
        let first = idem
            .execute(&scope, long_key.as_str(), &request(), |_| async {
                Out::Success("one".into())
            })
            .await
            .expect("hostile values are data");
        assert!(!first.is_replay());
        let again = idem
            .execute(&scope, long_key.as_str(), &request(), |_| async {
                Out::Success("two".into())
            })
            .await
            .expect("replay");
        assert_eq!(again.into_result(), Ok("one".to_owned()));
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT owner, operation, `key` FROM {}",
            fx.quoted()
        )))
        .fetch_one(fx.store.pool())
        .await
        .expect("the table is still there, with one row");
        assert_eq!(row.get::<Vec<u8>, _>("owner"), owner.as_bytes());
        assert_eq!(row.get::<Vec<u8>, _>("operation"), operation.as_bytes());
        assert_eq!(row.get::<Vec<u8>, _>("key"), long_key.as_bytes());
        // A LIKE-ish neighbour owner never sees it.
        let other = Scope::new("o'; DROP TABLE idem_records; -- `%`", operation).expect("scope");
        let mine = idem
            .execute(&other, long_key.as_str(), &request(), |_| async {
                Out::Success("other".into())
            })
            .await
            .expect("other owner");
        assert!(!mine.is_replay());
        let too_long = "k".repeat(256);
        let err = idem
            .execute(&scope, too_long.as_str(), &request(), |_| async {
                Out::Success("x".into())
            })
            .await
            .expect_err("256 characters");
        assert_eq!(err.http_status(), 400);
        // The longest parts a scope accepts fit the primary key.
        let widest = Scope::new("o".repeat(1024), "p".repeat(1024)).expect("scope");
        idem.execute(&widest, "k".repeat(255).as_str(), &request(), |_| async {
            Out::Success("wide".into())
        })
        .await
        .expect("1024 + 1024 + 255 bytes fit the key");
        assert_eq!(count_rows(&fx, &fx.table).await, 3);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_names_are_validated_and_configurable() {
    let fx = MyFixture::new(2).await;
    let store = fx.store.clone();
    for bad in ["", "1x", "a-b", "x`; DROP TABLE y; --", &"t".repeat(49)] {
        assert!(
            matches!(
                store.clone().with_table_name(bad),
                Err(idem_mysql::Error::InvalidIdentifier { what: "table", .. })
            ),
            "{bad:?}"
        );
    }
    // A second table next to the first: separate records.
    let other_name = support::unique("idem_other");
    let other = store.clone().with_table_name(&other_name).expect("name");
    assert_eq!(other.table_name(), other_name);
    assert!(other.migration_sql().contains(&format!("`{other_name}`")));
    other.migrate().await.expect("migrate");
    let clock = ManualClock::starting_now();
    let (a, b) = (engine(&store, &clock), engine(&other, &clock));
    let scope = scope();
    for idem in [&a, &b] {
        let r = idem
            .execute(&scope, "same-key", &request(), |_| async {
                Out::Success("x".into())
            })
            .await
            .expect("execute");
        assert!(!r.is_replay(), "each table has its own record");
    }
    fx.drop_tables(&[&other_name]).await;
}

/// `migrate` runs again without harm, and 8 instances migrating at once
/// (serialized by the named lock) all succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_is_idempotent_and_concurrent_starts_are_safe() {
    let fx = MyFixture::new(8).await;
    let name = support::unique("idem_mig");
    let store = fx.store.clone().with_table_name(&name).expect("name");
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let s = store.clone();
            tokio::spawn(async move { s.migrate().await })
        })
        .collect();
    for t in tasks {
        t.await.expect("join").expect("concurrent migrate");
    }
    store.migrate().await.expect("again");
    let clock = ManualClock::starting_now();
    let r = engine(&store, &clock)
        .execute(&scope(), "k", &request(), |_| async {
            Out::Success("x".into())
        })
        .await
        .expect("the table works");
    assert!(!r.is_replay());
    fx.drop_tables(&[&name]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_rows_are_typed_errors_not_panics() {
    with_fixture(MyFixture::new(2).await, |fx| async move {
        let clock = ManualClock::starting_now();
        let idem = engine(&fx.store, &clock);
        let scope = scope();
        for k in ["state", "fingerprint", "outcome", "attempt"] {
            idem.execute(&scope, k, &request(), |_| async {
                Out::Success("x".into())
            })
            .await
            .expect("call");
        }
        let t = fx.quoted();
        let checks: Vec<String> = sqlx::query_scalar(
            "SELECT CAST(CONSTRAINT_NAME AS CHAR) FROM information_schema.TABLE_CONSTRAINTS
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND CONSTRAINT_TYPE = 'CHECK'",
        )
        .bind(&fx.table)
        .fetch_all(fx.store.pool())
        .await
        .expect("checks");
        assert_eq!(checks.len(), 3, "{checks:?}");
        for c in checks {
            fx.store
                .pool()
                .execute(sqlx::AssertSqlSafe(format!(
                    "ALTER TABLE {t} DROP CONSTRAINT `{c}`"
                )))
                .await
                .expect("drop check");
        }
        for (k, set) in [
            ("state", "state = 'exploded'"),
            ("fingerprint", "fingerprint = X'0102'"),
            ("outcome", "outcome = 'maybe'"),
            ("attempt", "attempt = -1"),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "UPDATE {t} SET {set} WHERE `key` = ?"
            )))
            .bind(k)
            .execute(fx.store.pool())
            .await
            .expect("corrupt");
            let id = RecordId::new(scope.clone(), IdempotencyKey::parse(k).expect("key"));
            let fetched = fx.store.fetch(&id, clock.now()).await;
            assert!(
                matches!(fetched, Err(StoreError::Corrupt { .. })),
                "{k}: {fetched:?}"
            );
            for server in [Server::MariaDb, Server::MySql] {
                let idem = engine(&fx.store.clone().with_server(server), &clock);
                let runs = Counter::default();
                let r = runs.clone();
                let err = idem
                    .execute(&scope, k, &request(), move |_| async move {
                        r.hit();
                        Out::Success("no".into())
                    })
                    .await
                    .expect_err("corrupt");
                assert!(matches!(err, Error::CorruptRecord { .. }), "{k}: {err:?}");
                assert_eq!(err.http_status(), 500);
                assert_eq!(
                    runs.get(),
                    0,
                    "{k}: the work does not run over a corrupted record"
                );
            }
        }
    })
    .await;
}

/// The version string decides the flavour; this server is MariaDB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_is_detected() {
    let store = MySqlStore::connect(&support::url())
        .await
        .unwrap_or_else(|e| support::unreachable(&e));
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(store.pool())
        .await
        .expect("version");
    assert_eq!(
        store.server(),
        Some(Server::from_version(&version)),
        "{version}"
    );
    let url = support::url().replacen("mysql://", "mariadb://", 1);
    let again = MySqlStore::connect(&url).await.expect("mariadb:// URLs");
    assert_eq!(again.server(), store.server());
    store.pool().close().await;
    again.pool().close().await;
}
