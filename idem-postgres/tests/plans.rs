//! The plans Postgres keeps for the store's statements. A prepared statement
//! gets a generic plan after five runs, and keeps it while the table grows:
//! a plan that is right for the table a new deployment starts with must not
//! scan the table it has a minute later. The batches keep plans that look
//! each record up by its key; the purge and the listing keep none.

mod support;

use idem_postgres::sqlx::{self, Connection, Executor, PgConnection};
use idem_test_support::sql::{Dialect, with_fixture};
use support::Pg;

/// A connection of its own with the store's statement `name` prepared on
/// it as `s`; with `generic`, every run of it uses the generic plan (the
/// one Postgres keeps after five runs).
async fn prepared(store: &idem_postgres::PgStore, name: &str, generic: bool) -> PgConnection {
    let sql = idem_postgres::statement(store, name).expect("the statement");
    let mut conn = PgConnection::connect_with(&support::options())
        .await
        .expect("connect");
    if generic {
        conn.execute("SET plan_cache_mode = force_generic_plan")
            .await
            .expect("set");
    }
    conn.execute(sqlx::AssertSqlSafe(format!("PREPARE s AS {sql}")))
        .await
        .expect("prepare");
    conn
}

/// The plan of `EXPLAIN {run}` on `conn`, which it then closes.
async fn explain(mut conn: PgConnection, run: &str) -> String {
    let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN {run}")))
        .fetch_all(&mut conn)
        .await
        .expect("explain");
    conn.close().await.expect("close");
    let plan = plan.join("\n");
    println!("{plan}");
    plan
}

/// The generic plan of the store's batch `name` (which has `params`
/// parameters), made on the fixture's new, empty table, reaches each record
/// through the primary key, matching it to the batch's row `alias`, and
/// never scans the table.
async fn looks_each_record_up_by_its_key(name: &'static str, params: usize, alias: &'static str) {
    with_fixture(Pg.open(2).await, |fx| async move {
        let conn = prepared(&fx.store, name, true).await;
        let nulls = vec!["NULL"; params].join(", ");
        let plan = explain(conn, &format!("EXECUTE s({nulls})")).await;
        let p = fx.store.table_name();
        assert!(
            plan.contains(&format!("Index Scan using {p}_pkey"))
                && plan.contains(&format!("(id = {alias}.id)")),
            "each record of the batch is looked up by its key:\n{plan}"
        );
        assert!(!plan.contains("Seq Scan"), "no scan of the table:\n{plan}");
    })
    .await;
}

/// The claim batch reads each claimed record through the primary key, one
/// lookup per claim, even in the plan made on a new, empty table: a join
/// the planner may choose freely is a hash of the whole table there (the
/// cheapest plan for a table of no rows), kept as the table grows, and at
/// 40,000 records it cost 10–15 ms a batch instead of 0.5 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_batch_looks_each_record_up_by_its_key_in_the_plan_it_keeps() {
    looks_each_record_up_by_its_key("claim_batch", 10, "req").await;
}

/// The completion batch reaches each record through the primary key in the
/// plan made on a new, empty table (without its `LIMIT`, that plan scanned
/// the table for every batch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_batch_looks_each_record_up_by_its_key_in_the_plan_it_keeps() {
    looks_each_record_up_by_its_key("complete_batch", 8, "c").await;
}

/// The plan the claim batch keeps is the one Postgres uses for small
/// batches too: after the five runs it plans for their parameters, a run of
/// three claims uses the generic plan (without the `LIMIT`, Postgres found
/// a plan for three rows cheaper than one guessed for ten, and planned
/// every batch again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_claim_batch_uses_the_kept_plan() {
    with_fixture(Pg.open(2).await, |fx| async move {
        let mut conn = prepared(&fx.store, "claim_batch", false).await;
        // Three claims a run, the same three keys each time (the first run
        // claims them, the others read them), then the plan of a seventh.
        let run = "EXECUTE s('{o,o,o}', '{op,op,op}', '{a,b,c}',
                    ARRAY[sha256('a'), sha256('b'), sha256('c')],
                    '{1,2,3}', '{5,5,5}', '{9,9,9}', '{99,99,99}',
                    ARRAY[substring(sha256('a') for 16), substring(sha256('b') for 16),
                          substring(sha256('c') for 16)],
                    3)";
        for _ in 0..6 {
            conn.execute(run).await.expect("run");
        }
        let plan = explain(conn, run).await;
        // A plan for these parameters counts the arrays (three rows); the
        // generic plan guesses ten.
        let arrays = plan
            .lines()
            .find(|l| l.contains("Function Scan on r"))
            .expect("the arrays' scan");
        assert!(
            arrays.contains(" rows=10 "),
            "the plan kept for any batch, not one made for these three:\n{plan}"
        );
    })
    .await;
}

/// The purge and the operator's listing keep no plan: they run rarely, and
/// the plans Postgres would keep, made on a small table, read the whole
/// table (the purge reaches the rows it writes by a sequential scan, the
/// listing sorts the table), at any size after. They are planned at every
/// run, so none is left prepared on the connection after six runs of each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_purge_and_the_listing_are_planned_at_every_run() {
    use idem_core::clock::{ManualClock, Timestamp};
    use idem_postgres::PgStore;
    use idem_postgres::sqlx::postgres::PgPoolOptions;

    with_fixture(Pg.open(2).await, |fx| async move {
        // A store over a pool of one connection, on the fixture's table, so
        // that every statement it runs is prepared (or not) on that session.
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect_with(support::options())
            .await
            .expect("connect");
        let store = PgStore::new(pool.clone())
            .with_schema_name(&fx.name)
            .and_then(|s| s.with_table_name(fx.store.table_name()))
            .expect("names");
        let clock = ManualClock::new(Timestamp::from_unix_millis(1_000_000_000_000));
        let idem = idem_test_support::sql::engine(&store, &clock);
        for _ in 0..6 {
            idem.admin().purge_expired(10).await.expect("purge");
            idem.admin()
                .list_stuck(std::time::Duration::ZERO, None, 5)
                .await
                .expect("list");
        }
        let kept: Vec<String> = sqlx::query_scalar("SELECT statement FROM pg_prepared_statements")
            .fetch_all(&pool)
            .await
            .expect("prepared statements");
        let purge = idem_postgres::statement(&store, "purge").expect("purge");
        let listing = idem_postgres::statement(&store, "list_in_flight").expect("listing");
        assert!(
            !kept.iter().any(|s| s == purge || s == listing),
            "a purge or a listing left prepared: {kept:#?}"
        );
        pool.close().await;
    })
    .await;
}
