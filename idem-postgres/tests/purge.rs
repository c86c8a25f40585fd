//! The purge and the stuck listing walk the sweep index, never the table,
//! and page through exactly the rows they must.

mod support;

use idem_core::clock::ManualClock;
use idem_postgres::sqlx::{self, Executor};
use idem_test_support::sql::Dialect;
use idem_test_support::sql::{engine, with_fixture};
use support::{Pg, PgFixture, count_rows};

/// The purge walks the sweep index, never the table.
/// The record key the store gives `(o, op, <key>)` (`idem_sql::record_key`:
/// the first 16 bytes of the SHA-256 of the tagged, length-prefixed
/// identity), computed in SQL for seeded rows, so that a listing's cursor,
/// which the store derives from the identity, finds them in key order.
fn record_key_sql(key: &str) -> String {
    format!(
        "substring(sha256('idem-record-v1'::bytea || '\\x00'::bytea \
         || int8send(1) || 'o'::bytea || int8send(2) || 'op'::bytea \
         || int8send(octet_length({key})::bigint) || convert_to({key}, 'UTF8')) for 16)"
    )
}

/// Seeds 20,000 rows of `(o, op)`, keys `k1` to `k20000` (`i` from 1 to
/// 20,000): `columns` are each row's values from `state` to
/// `key_expires_at`; then files each at `sweep_at` and analyzes the table.
async fn seed(fx: &PgFixture, columns: &str, sweep_at: &str) {
    let t = fx.table.clone();
    fx.store
        .pool()
        .execute(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {t} (id, owner, operation, key, fingerprint, state, token, attempt, lease_until,
                              outcome, response, response_expires_at, key_expires_at, sweep_at)
             SELECT {id}, 'o', 'op', 'k' || i, sha256(i::text::bytea), {columns}, 0
             FROM generate_series(1, 20000) AS i;
             UPDATE {t} SET sweep_at = {sweep_at};
             ANALYZE {t};",
            id = record_key_sql("'k' || i"),
        )))
        .await
        .expect("seed");
}

/// The plan of `sql` (`EXPLAIN`).
async fn explain(fx: &PgFixture, sql: &str) -> String {
    let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN {sql}")))
        .fetch_all(fx.store.pool())
        .await
        .expect("explain");
    plan.join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_uses_the_sweep_index() {
    with_fixture(Pg.open(2).await, |fx| async move {
        let now: i64 = 1_000_000_000_000;
        // 20,000 live rows with bodies, 50 expired keys, 50 expired bodies,
        // filed where a purge files them: at the next expiry.
        seed(
            &fx,
            &format!(
                "'completed', i, 1, 0, 'success', '\\x00'::bytea,
                 CASE WHEN i % 400 = 1 THEN {now} - 1 ELSE {now} + i END,
                 CASE WHEN i % 400 = 0 THEN {now} - 1 ELSE {now} + 100000 + i END"
            ),
            "LEAST(response_expires_at, key_expires_at)",
        )
        .await;
        let sql = idem_postgres::statement(&fx.store, "purge")
            .expect("purge")
            .replace("$1", &now.to_string())
            .replace("$2", "100");
        let plan = explain(&fx, &sql).await;
        println!("{plan}");
        let p = fx.store.table_name();
        assert!(
            plan.contains(&format!("{p}_sweep_idx")),
            "the purge must walk the sweep index:\n{plan}"
        );
        assert!(!plan.contains("Seq Scan"), "no sequential scan:\n{plan}");
        assert_eq!(
            plan.matches("Tid Scan").count(),
            2,
            "the batch is then reached by ctid:\n{plan}"
        );
        let clock = ManualClock::new(idem_core::clock::Timestamp::from_unix_millis(now));
        let idem = engine(&fx.store, &clock);
        let report = idem.admin().purge_expired(30).await.expect("purge");
        assert_eq!(report.keys_removed, 50);
        assert_eq!(report.bodies_dropped, 50);
        assert_eq!(count_rows(&fx, "idem_records").await, 20_000 - 50);
    })
    .await;
}

/// The operator listing walks the sweep index (an in-flight record sits at
/// its lease end), never the table, and pages through exactly the stuck
/// rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stuck_listing_uses_the_sweep_index() {
    with_fixture(Pg.open(2).await, |fx| async move {
        let now: i64 = 1_000_000_000_000;
        // 20,000 completed rows, 30 stuck in flight, 30 in flight under a
        // live lease. In flight: at the lease end; completed: where a purge
        // filed them.
        seed(
            &fx,
            &format!(
                "CASE WHEN i <= 60 THEN 'in_flight' ELSE 'completed' END, i, 1,
                 CASE WHEN i <= 30 THEN {now} - i ELSE {now} + 60000 END,
                 CASE WHEN i <= 60 THEN NULL ELSE 'success' END, NULL, NULL, {now} + 100000"
            ),
            "CASE WHEN state = 'in_flight' THEN lease_until ELSE key_expires_at END",
        )
        .await;
        let sql = idem_postgres::statement(&fx.store, "list_in_flight")
            .expect("list_in_flight")
            .replace("$1", &now.to_string())
            .replace("$2", &now.to_string())
            .replace("$3", "8");
        let plan = explain(&fx, &sql).await;
        let p = fx.store.table_name();
        assert!(
            plan.contains(&format!("{p}_sweep_idx")),
            "listing must use its index:\n{plan}"
        );
        assert!(!plan.contains("Seq Scan"), "no sequential scan:\n{plan}");
        let clock = ManualClock::new(idem_core::clock::Timestamp::from_unix_millis(now));
        let idem = engine(&fx.store, &clock);
        let (mut seen, mut cursor) = (Vec::new(), None);
        loop {
            let page = idem
                .admin()
                .list_stuck(std::time::Duration::ZERO, cursor.as_ref(), 7)
                .await
                .expect("list");
            assert!(page.records.len() <= 7);
            seen.extend(
                page.records
                    .into_iter()
                    .map(|r| r.id.key().as_str().to_owned()),
            );
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        let want: Vec<String> = (1..=30).rev().map(|i| format!("k{i}")).collect();
        assert_eq!(seen, want, "oldest lease first, each once");
    })
    .await;
}
