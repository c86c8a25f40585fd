//! The table as the migration builds it: the SQL suite's values and
//! corrupted rows (`idem_test_support::sql::schema`), then validated names,
//! completions as HOT updates, the layout's mark (a table of another layout
//! refused and left alone), and a migrate again that neither rebuilds nor
//! waits for writers.

mod support;

use std::time::Duration;

use idem_core::clock::ManualClock;
use idem_postgres::PgStore;
use idem_postgres::sqlx::{self, Executor, Row};
use idem_test_support::sql::{Dialect, ServerDialect};
use idem_test_support::sql::{Out, engine, request, scope, with_fixture};
use support::{Pg, PgFixture, count_rows};

idem_test_support::sql_suite!(crate::support::Pg; @values);
idem_test_support::sql_suite!(crate::support::Pg; corrupted_rows_are_typed_errors_not_panics);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_and_schema_names_are_validated_and_configurable() {
    let fx = Pg.open(2).await;
    with_fixture(fx, |fx| async move {
        for bad in ["x; DROP TABLE y", "a\"b", "", "1t", "pg_x", "t-1"] {
            assert!(
                matches!(
                    fx.store.clone().with_table_name(bad),
                    Err(idem_postgres::Error::InvalidIdentifier { .. })
                ),
                "{bad:?}"
            );
            assert!(fx.store.clone().with_schema_name(bad).is_err(), "{bad:?}");
        }
        // `connect` builds its own pool; eight instances migrating at once
        // are serialized by the advisory lock, and migrating again is a no-op.
        let custom = PgStore::connect(&support::url())
            .await
            .expect("connect")
            .with_schema_name(&fx.name)
            .expect("schema")
            .with_table_name("Payments_Idem")
            .expect("valid");
        let migrations: Vec<_> = (0..8)
            .map(|_| {
                let s = custom.clone();
                tokio::spawn(async move { s.migrate().await })
            })
            .collect();
        for m in migrations {
            m.await.expect("join").expect("concurrent migrate");
        }
        custom.migrate().await.expect("migrate is idempotent");
        let clock = ManualClock::starting_now();
        let idem = engine(&custom, &clock);
        idem.execute(&scope(), "k", &request(), |_| async {
            Out::Success("x".into())
        })
        .await
        .expect("call");
        assert_eq!(count_rows(&fx, "Payments_Idem").await, 1);
        assert_eq!(count_rows(&fx, "idem_records").await, 0);
        assert!(
            custom
                .migration_sql()
                .contains("\"Payments_Idem_sweep_idx\"")
        );
        custom.close().await;
    })
    .await;
}

/// `(n_tup_upd, n_tup_hot_upd)` of the fixture's table, as seen after this
/// backend's own pending counters are flushed (the store runs on its pool
/// of one connection, so every statement of the test ran on it).
async fn update_counts(fx: &PgFixture) -> (i64, i64) {
    let pool = fx.store.pool();
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(pool)
        .await
        .expect("flush");
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = '{}'::regclass",
        fx.table.clone()
    )))
    .fetch_one(pool)
    .await
    .expect("stats");
    (row.get(0), row.get(1))
}

/// A completion changes no indexed column, so Postgres updates the row in
/// place (HOT): no new index entry per completion. A scripted run of 300
/// fresh keys on one connection: one update each, nearly all HOT (a
/// completion misses only when its page filled up since the claim).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_are_hot_updates() {
    with_fixture(Pg.fixture_over_pool(1, true).await, |fx| async move {
        let clock = ManualClock::starting_now();
        let idem = engine(&fx.store, &clock);
        let scope = scope();
        let (upd0, hot0) = update_counts(&fx).await;
        for i in 0..300 {
            idem.execute(&scope, format!("k{i}").as_str(), &request(), |_| async {
                Out::Success("a 256-byte body would do the same".into())
            })
            .await
            .expect("fresh");
        }
        let (upd, hot) = update_counts(&fx).await;
        let (upd, hot) = (upd - upd0, hot - hot0);
        println!("300 fresh keys: {upd} updates, {hot} HOT");
        assert_eq!(upd, 300, "one update (the completion) per fresh key");
        assert!(
            hot >= 285,
            "at least 95 % of completions HOT: {hot} of {upd}"
        );
    })
    .await;
}

/// A table that exists without this layout's mark (here as a build before
/// 0.1 made it: the old columns, the old indexes, no comment) is refused by
/// `migrate` with a typed error and left exactly as it was: no column, index
/// or comment added, its rows never read. The shipped file refuses it too,
/// for a migration tool of your own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_refuses_a_table_of_another_layout() {
    let fx = Pg.fixture_over_pool(2, false).await;
    with_fixture(fx, |fx| async move {
        let t = fx.table.clone();
        fx.store
            .pool()
            .execute(sqlx::AssertSqlSafe(format!(
                "CREATE SCHEMA IF NOT EXISTS \"{schema}\";
                 CREATE TABLE {t} (owner text NOT NULL, operation text NOT NULL, key text NOT NULL,
                     fingerprint bytea NOT NULL, state text NOT NULL, token bigint NOT NULL,
                     attempt integer NOT NULL, lease_until bigint NOT NULL, resource_id text,
                     outcome text, response bytea, response_expires_at bigint,
                     key_expires_at bigint NOT NULL, PRIMARY KEY (owner, operation, key));
                 CREATE INDEX old_key_expires_idx ON {t} (key_expires_at);
                 INSERT INTO {t} VALUES ('o', 'op', 'k', sha256('1'), 'completed', 1, 1, 0,
                     NULL, 'success', '\\x01', 1, 9000000000000);",
                schema = fx.name,
            )))
            .await
            .expect("a table of a build before 0.1");
        let refused = fx.store.migrate().await;
        match &refused {
            Err(idem_postgres::Error::Layout(e)) => {
                assert_eq!(e.found, None, "{e}");
                assert!(e.to_string().contains("before 0.1"), "{e}");
            }
            other => panic!("expected Error::Layout, got {other:?}"),
        }
        // A store that was never migrated finds out at its first call.
        idem_test_support::sql::assert_calls_refused_on_another_layout(&fx.store).await;
        let mine = fx.store.migration_sql();
        let by_file = fx.store.pool().execute(sqlx::AssertSqlSafe(mine)).await;
        assert!(
            by_file
                .as_ref()
                .is_err_and(|e| e.to_string().contains("not in idem layout 1")),
            "{by_file:?}"
        );
        let columns: Vec<String> = sqlx::query_scalar(
            "SELECT column_name::text FROM information_schema.columns \
             WHERE table_schema = $1 AND column_name = 'sweep_at'",
        )
        .bind(&fx.name)
        .fetch_all(fx.store.pool())
        .await
        .expect("columns");
        assert!(columns.is_empty(), "no column added: {columns:?}");
        let indexes: Vec<String> = sqlx::query_scalar(
            "SELECT indexname::text FROM pg_indexes WHERE schemaname = $1 ORDER BY 1",
        )
        .bind(&fx.name)
        .fetch_all(fx.store.pool())
        .await
        .expect("indexes");
        assert_eq!(indexes, ["idem_records_pkey", "old_key_expires_idx"]);
        let comment: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT obj_description('{t}'::regclass, 'pg_class')"
        )))
        .fetch_one(fx.store.pool())
        .await
        .expect("comment");
        assert_eq!(comment, None, "never marked");
        assert_eq!(
            count_rows(&fx, fx.store.table_name()).await,
            1,
            "its row is left alone"
        );
    })
    .await;
}

/// A table this build made carries its layout's mark, and `migrate` accepts
/// it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_marks_its_table_and_accepts_it_again() {
    let fx = Pg.fixture_over_pool(2, false).await;
    with_fixture(fx, |fx| async move {
        fx.store.migrate().await.expect("migrate");
        let t = fx.table.clone();
        let comment: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT obj_description('{t}'::regclass, 'pg_class')"
        )))
        .fetch_one(fx.store.pool())
        .await
        .expect("comment");
        assert_eq!(comment.as_deref(), Some(idem_sql::LAYOUT));
        fx.store.migrate().await.expect("migrate again");
    })
    .await;
}

/// `migrate` runs at every start, while other instances write: on a table it
/// has already brought up to date it builds nothing and takes no lock that
/// waits for a writer. A transaction holding an uncommitted insert (the
/// `ROW EXCLUSIVE` lock every write takes) stays open across it. Before this
/// held, `CREATE INDEX IF NOT EXISTS` waited for the writer even when the
/// index was there; the layout's `COMMENT ON TABLE` must not wait either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_again_neither_rebuilds_nor_waits_for_writers() {
    let fx = Pg.open(2).await;
    with_fixture(fx, |fx| async move {
        let t = fx.table.clone();
        let oids = |pool: sqlx::PgPool, schema: String| async move {
            sqlx::query_as::<_, (String, sqlx::postgres::types::Oid)>(
                "SELECT c.relname::text, c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relkind = 'i' ORDER BY 1",
            )
            .bind(schema)
            .fetch_all(&pool)
            .await
            .expect("indexes")
        };
        let before = oids(fx.store.pool().clone(), fx.name.clone()).await;
        let mut writer = fx.store.pool().acquire().await.expect("connection");
        writer
            .execute(sqlx::AssertSqlSafe(format!(
                "BEGIN; INSERT INTO {t} (id, owner, operation, key, fingerprint, state, token, attempt, lease_until, key_expires_at, sweep_at) \
                 VALUES (substring(sha256('held') for 16), 'o', 'op', 'held', sha256('x'), 'in_flight', 1, 1, 1, 1, 1)"
            )))
            .await
            .expect("an open write");
        let again = tokio::time::timeout(Duration::from_secs(20), fx.store.migrate()).await;
        writer.execute("ROLLBACK").await.expect("rollback");
        again
            .expect("migrate must not wait for the open writer")
            .expect("migrate");
        let after = oids(fx.store.pool().clone(), fx.name.clone()).await;
        assert_eq!(before, after, "the same indexes, none rebuilt");
        assert_eq!(
            after.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ["idem_records_pkey", "idem_records_sweep_idx"]
        );
    })
    .await;
}

/// The table has no CHECK constraint: Postgres rebuilds a table's
/// constraint expressions from their stored text for every statement that
/// writes a row (8% of the server's CPU for a fresh key, measured), and the
/// store checks every value it reads (the corrupted-rows scenario above,
/// with nothing to drop first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_table_has_no_check_constraint() {
    with_fixture(Pg.open(2).await, |fx| async move {
        let checks: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_constraint WHERE conrelid = to_regclass($1) AND contype = 'c'",
        )
        .bind(&fx.table)
        .fetch_one(fx.store.pool())
        .await
        .expect("pg_constraint");
        assert_eq!(checks, 0);
    })
    .await;
}
