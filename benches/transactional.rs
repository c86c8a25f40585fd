//! Postgres transactional mode (`PgIdemExt::execute_in_tx`) against the same
//! statements in a raw `BEGIN … COMMIT`, one task, same pool.
//!
//! Run with: `cargo bench --bench transactional --features postgres`
//! (`IDEM_POSTGRES_URL`, default `postgres://postgres@127.0.0.1:5432/test`;
//! schema `idem_bench_tx`, dropped at the end).
//!
//! * fresh: `BEGIN; SET LOCAL lock_timeout`, the claim, the work's one
//!   `INSERT` into an orders table, the completion, `COMMIT` (4 round trips
//!   plus the work's one);
//! * replay: `BEGIN; SET LOCAL lock_timeout`, the claim (answers the stored
//!   record), `ROLLBACK` (3 round trips).
//!
//! The raw side runs exactly those statements (the store's own claim and
//! completion, `PgStore::claim_statement`/`complete_statement`) without the
//! engine: the ratio is the engine's cost in this mode.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use criterion::{Criterion, criterion_group, criterion_main};
use idem::postgres::sqlx::{AssertSqlSafe, PgPool, Row};
use idem::postgres::{PgIdemExt, PgStore, sqlx};
use idem::{Idem, Outcome, Scope};
use tokio::runtime::Runtime;

const SCHEMA: &str = "idem_bench_tx";

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

struct Raw {
    pool: PgPool,
    claim: String,
    complete: String,
    insert: String,
}

impl Raw {
    async fn call(&self, key: &str, token: i64) -> bool {
        let mut tx = self
            .pool
            .begin_with("BEGIN; SET LOCAL lock_timeout = 5000")
            .await
            .expect("begin");
        let now = now_ms();
        let row = sqlx::query(AssertSqlSafe(self.claim.as_str()))
            .bind("acct")
            .bind("POST /orders")
            .bind(key)
            .bind([7u8; 32].as_slice())
            .bind(token)
            .bind(now)
            .bind(now + 60_000)
            .bind(now + 86_400_000)
            .fetch_one(&mut *tx)
            .await
            .expect("claim");
        let kind: String = row.get("kind");
        if kind != "claimed" {
            let body: Option<Vec<u8>> = row.get("response");
            std::hint::black_box(body);
            tx.rollback().await.expect("rollback");
            return false;
        }
        sqlx::query(AssertSqlSafe(self.insert.as_str()))
            .bind(key)
            .execute(&mut *tx)
            .await
            .expect("insert");
        sqlx::query(AssertSqlSafe(self.complete.as_str()))
            .bind("acct")
            .bind("POST /orders")
            .bind(key)
            .bind(token)
            .bind("success")
            .bind(b"ord".as_slice())
            .bind(now + 3_600_000)
            .bind(now + 86_400_000)
            .bind(None::<&str>)
            .execute(&mut *tx)
            .await
            .expect("complete");
        tx.commit().await.expect("commit");
        true
    }
}

fn bench(c: &mut Criterion) {
    let rt = Runtime::new().expect("runtime");
    let url = std::env::var("IDEM_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let store = match rt.block_on(PgStore::connect(&url)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("NOTE: Postgres at {url} unreachable ({e}): transactional bench NOT run");
            return;
        }
    };
    let store = store.with_schema_name(SCHEMA).expect("valid schema");
    rt.block_on(store.migrate()).expect("migrate");
    let insert = format!("INSERT INTO \"{SCHEMA}\".orders (note) VALUES ($1)");
    rt.block_on(
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE TABLE IF NOT EXISTS \"{SCHEMA}\".orders (id bigserial PRIMARY KEY, note text)"
        )))
        .execute(store.pool()),
    )
    .expect("orders table");
    let raw = Raw {
        pool: store.pool().clone(),
        claim: idem_postgres::statement(&store, "claim")
            .map(str::to_owned)
            .expect("the store runs it"),
        complete: idem_postgres::statement(&store, "complete")
            .map(str::to_owned)
            .expect("the store runs it"),
        insert: insert.clone(),
    };
    let idem = Idem::new(store.clone());
    let scope = Scope::new("acct", "POST /orders").expect("scope");
    let request = serde_json::json!({"sku": "A-1", "qty": 2});
    let n = AtomicU64::new(0);
    let tokens = AtomicU64::new(1);
    let lib_call = |key: String| {
        let (idem, scope, request, insert) = (&idem, &scope, &request, insert.clone());
        let note = key.clone();
        async move {
            idem.execute_in_tx(scope, key.as_str(), request, move |_attempt, conn| {
                Box::pin(async move {
                    sqlx::query(AssertSqlSafe(insert))
                        .bind(note)
                        .execute(&mut *conn)
                        .await
                        .map_or_else(
                            |e| Outcome::Transient(e.to_string()),
                            |_| Outcome::Success("ord".to_owned()),
                        )
                })
            })
            .await
            .expect("execute_in_tx")
        }
    };

    let mut g = c.benchmark_group("postgres-tx/fresh");
    g.measurement_time(Duration::from_secs(5));
    g.bench_function("idem", |b| {
        b.iter(|| {
            let key = format!("lib-fresh-{}", n.fetch_add(1, Ordering::Relaxed));
            let reply = rt.block_on(lib_call(key));
            assert!(!reply.is_replay());
        });
    });
    g.bench_function("raw", |b| {
        b.iter(|| {
            let key = format!("raw-fresh-{}", n.fetch_add(1, Ordering::Relaxed));
            let token = i64::try_from(tokens.fetch_add(1, Ordering::Relaxed)).unwrap_or(1);
            assert!(rt.block_on(raw.call(&key, token)));
        });
    });
    g.finish();

    rt.block_on(lib_call("lib-replay".to_owned()));
    rt.block_on(raw.call("raw-replay", 0));
    let mut g = c.benchmark_group("postgres-tx/replay");
    g.measurement_time(Duration::from_secs(5));
    g.bench_function("idem", |b| {
        b.iter(|| {
            let reply = rt.block_on(lib_call("lib-replay".to_owned()));
            assert!(reply.is_replay());
        });
    });
    g.bench_function("raw", |b| {
        b.iter(|| {
            let token = i64::try_from(tokens.fetch_add(1, Ordering::Relaxed)).unwrap_or(1);
            assert!(!rt.block_on(raw.call("raw-replay", token)));
        });
    });
    g.finish();

    rt.block_on(
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS \"{SCHEMA}\" CASCADE"
        )))
        .execute(store.pool()),
    )
    .expect("drop the bench schema");
}

criterion_group!(benches, bench);
criterion_main!(benches);
