//! The table as the migration builds it, on both claim paths: the SQL
//! suite's byte-exact identities, bodies of any bytes, values only through
//! bind parameters and corrupted rows as typed errors
//! (`idem_test_support::sql::schema`); then validated names, the server's
//! detection, and a migration that can run again, from several instances at
//! once.

mod support;

use idem_core::clock::ManualClock;
use idem_mysql::sqlx;
use idem_mysql::{MySqlStore, Server};
use idem_test_support::sql::{Out, engine, request, scope};
use support::Dialect;

mod mariadb {
    idem_test_support::sql_suite!(crate::support::MySql::MARIADB; @values);
    idem_test_support::sql_suite!(crate::support::MySql::MARIADB;
        corrupted_rows_are_typed_errors_not_panics,
    );
}

mod mysql_path {
    idem_test_support::sql_suite!(crate::support::MySql::MYSQL_PATH; @values);
    idem_test_support::sql_suite!(crate::support::MySql::MYSQL_PATH;
        corrupted_rows_are_typed_errors_not_panics,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_names_are_validated_and_configurable() {
    let fx = support::MySql::DETECTED.open(2).await;
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
    fx.teardown_with(&[&other_name]).await;
}

/// `migrate` runs again without harm, and 8 instances migrating at once
/// (serialized by the named lock) all succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_is_idempotent_and_concurrent_starts_are_safe() {
    let fx = support::MySql::DETECTED.open(8).await;
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
    fx.teardown_with(&[&name]).await;
}

/// A table that exists without this layout's mark (as a build before 0.1
/// made it: no comment) is refused by `migrate` with a typed error and left
/// as it was; the table this build makes carries the mark, and is accepted
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_refuses_a_table_of_another_layout() {
    let fx = support::MySql::DETECTED.open(2).await;
    let name = support::unique("idem_old");
    let store = fx.store.clone().with_table_name(&name).expect("name");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE `{name}` (owner VARBINARY(1024) NOT NULL, operation VARBINARY(1024) NOT NULL, \
         `key` VARBINARY(255) NOT NULL, fingerprint VARBINARY(32) NOT NULL, \
         PRIMARY KEY (owner, operation, `key`)) ENGINE = InnoDB"
    )))
    .execute(store.pool())
    .await
    .expect("a table of a build before 0.1");
    match store.migrate().await {
        Err(idem_mysql::Error::Layout(e)) => {
            assert_eq!(e.found, None, "{e}");
            assert!(e.to_string().contains("before 0.1"), "{e}");
        }
        other => panic!("expected Error::Layout, got {other:?}"),
    }
    let columns: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
    )
    .bind(&name)
    .fetch_one(store.pool())
    .await
    .expect("columns");
    assert_eq!(columns, 4, "left as it was");
    // A store that was never migrated finds out at its first call.
    idem_test_support::sql::assert_calls_refused_on_another_layout(&store).await;

    let fresh = support::unique("idem_new");
    let made = fx.store.clone().with_table_name(&fresh).expect("name");
    made.migrate().await.expect("migrate");
    let comment: String = sqlx::query_scalar(
        "SELECT CAST(TABLE_COMMENT AS CHAR) FROM information_schema.TABLES \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
    )
    .bind(&fresh)
    .fetch_one(made.pool())
    .await
    .expect("comment");
    assert_eq!(comment, idem_sql::LAYOUT);
    made.migrate().await.expect("accepted again");
    fx.teardown_with(&[&name, &fresh]).await;
}

/// The version string decides the flavour; this server is MariaDB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_is_detected() {
    let store = MySqlStore::connect(&support::MYSQL.url())
        .await
        .unwrap_or_else(|e| support::MYSQL.unreachable(&e));
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(store.pool())
        .await
        .expect("version");
    assert_eq!(
        store.server(),
        Some(Server::from_version(&version)),
        "{version}"
    );
    let url = support::MYSQL.url().replacen("mysql://", "mariadb://", 1);
    let again = MySqlStore::connect(&url).await.expect("mariadb:// URLs");
    assert_eq!(again.server(), store.server());
    store.pool().close().await;
    again.pool().close().await;
}
