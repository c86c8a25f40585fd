//! The purge walks the sweep index in bounded batches: `EXPLAIN` shows
//! every purge statement (and the stuck listing) as a range of `sweep_idx`,
//! never a full scan, and a purge removes at most its limit per call.

mod support;

use std::time::Duration;

use idem_core::adapter::fingerprint;
use idem_core::clock::{Clock, ManualClock};
use idem_core::store::OutcomeKind;
use idem_core::store::{ClaimRequest, Completion, Store, Token};
use idem_core::{FieldFilter, IdempotencyKey, RecordId};
use idem_mysql::sqlx::{self, Executor, Row};
use idem_mysql::statement;
use idem_test_support::sql::{LEASE, request, scope, with_fixture};
use support::{Dialect, MyFixture, count_rows};

/// The plan of `sql` with `binds` (Unix ms and limits) spliced in as
/// literals: (access type, key used, extra) per table row.
async fn plan(fx: &MyFixture, sql: &str, binds: &[i64]) -> Vec<(String, Option<String>, String)> {
    let mut text = String::new();
    let mut binds = binds.iter();
    for part in sql.split('?') {
        text.push_str(part);
        if let Some(b) = binds.next() {
            text.push_str(&b.to_string());
        }
    }
    assert!(binds.next().is_none(), "more binds than placeholders");
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN {text}")))
        .fetch_all(fx.store.pool())
        .await
        .expect("explain");
    rows.iter()
        .map(|r| {
            let s = |c: &str| -> Option<String> {
                r.try_get::<Option<String>, _>(c)
                    .ok()
                    .flatten()
                    .or_else(|| {
                        r.try_get::<Option<Vec<u8>>, _>(c)
                            .ok()
                            .flatten()
                            .map(|b| String::from_utf8_lossy(&b).into_owned())
                    })
            };
            (
                s("type").unwrap_or_default(),
                s("key"),
                s("Extra").unwrap_or_default(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_uses_the_sweep_index() {
    with_fixture(support::MySql::DETECTED.open(2).await, |fx| async move {
        // 5,000 records spread over 5,000 seconds of sweep times, so that
        // "due up to now" is a small range of the index.
        fx.store
            .pool()
            .execute(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {t} (id, owner, operation, `key`, fingerprint, state, token, attempt,
                                  lease_until, outcome, response, response_expires_at, key_expires_at, sweep_at)
                 WITH RECURSIVE d (i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM d WHERE i < 99),
                      seq (n) AS (SELECT a.i * 100 + b.i + 1 FROM d a CROSS JOIN d b WHERE a.i < 50)
                 SELECT UNHEX(LEFT(SHA2(CONCAT('k', n), 256), 32)), 'o', 'op', CONCAT('k', n),
                        REPEAT('x', 32), 'completed', n, 1,
                        n * 1000, 'success', 'body', n * 1000 + 500, n * 1000 + 900, n * 1000
                 FROM seq",
                t = fx.table
            )))
            .await
            .expect("fill");
        fx.store
            .pool()
            .execute(sqlx::AssertSqlSafe(format!("ANALYZE TABLE {}", fx.table)))
            .await
            .expect("analyze");
        let now = 20_000; // 20 records due
        let s = &fx.store;
        for (name, sql, binds) in [
            ("purge_delete", statement(s, "purge_delete").expect("purge_delete"), vec![now, now, now, 100]),
            ("purge_drop_bodies", statement(s, "purge_drop_bodies").expect("purge_drop_bodies"), vec![now, now, now, 100]),
            ("purge_refile", statement(s, "purge_refile").expect("purge_refile"), vec![now, now, now, 100]),
            ("list_in_flight", statement(s, "list_in_flight").expect("list_in_flight"), vec![now, now, now, 100]),
        ] {
            let p = plan(&fx, sql, &binds).await;
            println!("{name}: {p:?}");
            assert_eq!(p.len(), 1, "{name}: {p:?}");
            let (access, key, extra) = &p[0];
            assert_eq!(key.as_deref(), Some("sweep_idx"), "{name}: {p:?}");
            assert_eq!(access, "range", "{name} walks a range of the index: {p:?}");
            assert!(!extra.contains("filesort"), "{name} needs no sort: {p:?}");
        }
        // And it does what it says, in bounded batches: at 20 s, records
        // 1..=19 have expired keys (n s + 900 ms <= 20 s); record 20 is due
        // (sweep at 20 s) with a live key and body, so it is re-filed.
        let report = fx
            .store
            .purge_expired(idem_core::clock::Timestamp::from_unix_millis(now), 7)
            .await
            .expect("purge");
        assert_eq!(report.keys_removed, 7);
        let mut removed = 7;
        loop {
            let r = fx
                .store
                .purge_expired(idem_core::clock::Timestamp::from_unix_millis(now), 7)
                .await
                .expect("purge");
            assert!(r.keys_removed <= 7);
            if r.keys_removed == 0 {
                break;
            }
            removed += r.keys_removed;
        }
        assert_eq!(removed, 19);
        assert_eq!(count_rows(&fx, &fx.name).await, 5000 - 19);
    })
    .await;
}

/// A completed record keeps its body until `response_ttl`, its key until
/// `key_ttl`: the purge drops the body first (the record stays), then the
/// key, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_drops_bodies_then_keys() {
    with_fixture(support::MySql::DETECTED.open(2).await, |fx| async move {
        let clock = ManualClock::starting_now();
        let scope = scope();
        let fp = fingerprint(scope.operation(), &request(), &FieldFilter::All).expect("fp");
        let now = clock.now();
        let mut ids = Vec::new();
        for _ in 0..5 {
            let id = RecordId::new(scope.clone(), IdempotencyKey::random());
            let token = Token::random();
            fx.store
                .claim(&ClaimRequest::new(
                    &id,
                    fp,
                    token,
                    now,
                    now.plus(LEASE),
                    now.plus(Duration::from_secs(86_400)),
                ))
                .await
                .expect("claim");
            let done = Completion::new(
                OutcomeKind::Success,
                Some(b"body"),
                Some("res"),
                now,
                now.plus(Duration::from_secs(3600)),
                now.plus(Duration::from_secs(86_400)),
            );
            fx.store
                .complete(&id, token, &done)
                .await
                .expect("complete");
            ids.push(id);
        }
        // Before the lease ends nothing is due.
        let r = fx.store.purge_expired(now, 100).await.expect("purge");
        assert_eq!((r.keys_removed, r.bodies_dropped), (0, 0));
        // After the body's TTL: bodies go, keys stay.
        let later = now.plus(Duration::from_secs(3601));
        let r = fx.store.purge_expired(later, 3).await.expect("purge");
        assert_eq!((r.keys_removed, r.bodies_dropped), (0, 3));
        let r = fx.store.purge_expired(later, 3).await.expect("purge");
        assert_eq!((r.keys_removed, r.bodies_dropped), (0, 2));
        let r = fx.store.purge_expired(later, 3).await.expect("purge");
        assert_eq!((r.keys_removed, r.bodies_dropped), (0, 0));
        let rec = fx
            .store
            .fetch(&ids[0], later)
            .await
            .expect("fetch")
            .expect("key kept");
        assert!(rec.response.is_none());
        assert_eq!(rec.resource_id.as_deref(), Some("res"));
        // After the key's TTL: the records go.
        let end = now.plus(Duration::from_secs(86_401));
        let r = fx.store.purge_expired(end, 100).await.expect("purge");
        assert_eq!((r.keys_removed, r.bodies_dropped), (5, 0));
        assert_eq!(count_rows(&fx, &fx.name).await, 0);
    })
    .await;
}
