//! The transactional inbox on Postgres, MariaDB and SQLite: the claim, the
//! work's own write and the stored outcome commit together, so a
//! redelivered message's effect is applied once, and a transient failure
//! leaves neither the record nor the write behind.

use idem_test_support::fixtures as support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem_consumer::{Cause, Consumer, DeadLetterReason, Disposition};
use idem_core::testkit::Fixture;
use idem_core::{Idem, IdempotencyKey, Outcome};
use idem_postgres::sqlx::{self, Executor, Row};

type Out = Outcome<String, String>;

/// The scenario on the fixture `$fixture` (a SQL backend), whose
/// statements take their parameter as `$param`.
macro_rules! inbox_scenario {
    ($name:ident, $fixture:path, $param:literal) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let fx = $fixture().await;
            let store = fx.store();
            let ledger = format!(
                "ledger_{}",
                IdempotencyKey::random().as_str().to_ascii_lowercase()
            );
            store
                .pool()
                .execute(sqlx::AssertSqlSafe(format!(
                    "CREATE TABLE {ledger} (message TEXT NOT NULL)"
                )))
                .await
                .expect("ledger");
            let consumer = Consumer::builder(Idem::new(store.clone()))
                .owner("inbox-test")
                .operation("ledger")
                .build()
                .expect("consumer");
            let runs = Arc::new(AtomicUsize::new(0));
            let deliver = |id: &'static str, payload: &'static str, out: Out| {
                let (consumer, runs, ledger) = (&consumer, Arc::clone(&runs), ledger.clone());
                async move {
                    consumer
                        .process_in_tx(id, payload.as_bytes(), move |_, conn| {
                            Box::pin(async move {
                                runs.fetch_add(1, Ordering::SeqCst);
                                sqlx::query(sqlx::AssertSqlSafe(format!(
                                    concat!("INSERT INTO {ledger} (message) VALUES (", $param, ")"),
                                    ledger = ledger
                                )))
                                .bind(id)
                                .execute(&mut *conn)
                                .await
                                .expect("insert");
                                out
                            })
                        })
                        .await
                }
            };
            let rows = || {
                let (pool, ledger) = (store.pool().clone(), ledger.clone());
                async move {
                    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "SELECT count(*) AS n FROM {ledger}"
                    )))
                    .fetch_one(&pool)
                    .await
                    .expect("count");
                    row.get::<i64, _>("n")
                }
            };
            let ok = || Out::Success("done".to_owned());

            // m1: runs and commits; its redelivery replays without running.
            let first = deliver("m1", r#"{"n":1}"#, ok()).await;
            assert_eq!(
                (first.disposition, first.cause),
                (Disposition::Ack, Cause::Succeeded)
            );
            let again = deliver("m1", r#"{"n":1}"#, ok()).await;
            assert_eq!(
                (again.disposition, again.cause),
                (Disposition::Ack, Cause::Replayed)
            );
            assert_eq!((runs.load(Ordering::SeqCst), rows().await), (1, 1));

            // m2: a transient failure rolls back the claim and the write; the next
            // delivery runs it again and commits once.
            let failed = deliver("m2", r#"{"n":2}"#, Out::Transient("busy".to_owned())).await;
            assert!(
                matches!(failed.disposition, Disposition::Retry { .. }),
                "{failed:?}"
            );
            assert_eq!((runs.load(Ordering::SeqCst), rows().await), (2, 1));
            let retried = deliver("m2", r#"{"n":2}"#, ok()).await;
            assert_eq!(retried.disposition, Disposition::Ack);
            assert_eq!((runs.load(Ordering::SeqCst), rows().await), (3, 2));

            // The same id with another payload is dead-lettered, and nothing runs.
            let other = deliver("m1", r#"{"n":9}"#, ok()).await;
            assert_eq!(
                other.disposition,
                Disposition::DeadLetter {
                    reason: DeadLetterReason::FingerprintMismatch
                }
            );
            assert_eq!((runs.load(Ordering::SeqCst), rows().await), (3, 2));

            store
                .pool()
                .execute(sqlx::AssertSqlSafe(format!("DROP TABLE {ledger}")))
                .await
                .expect("drop ledger");
            fx.teardown().await;
        }
    };
}

inbox_scenario!(
    the_inbox_commits_the_effect_once_and_rolls_back_a_transient_failure,
    support::postgres,
    "$1"
);
inbox_scenario!(
    the_inbox_on_mariadb_commits_the_effect_once_and_rolls_back_a_transient_failure,
    support::mysql,
    "?"
);
inbox_scenario!(
    the_inbox_on_sqlite_commits_the_effect_once_and_rolls_back_a_transient_failure,
    support::sqlite_file,
    "?"
);
