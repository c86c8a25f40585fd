//! The inbound dedup people write by hand (issue 19's peer study: the same
//! few lines in every application repository), the baseline of
//! `benches/consumer.rs` and `benches/webhook.rs`:
//!
//! * SQLite and Postgres: a `(provider, event_id)` table, primary key on
//!   both; `INSERT … ON CONFLICT DO NOTHING`, and the work runs when a row
//!   was inserted;
//! * Redis: `SET <prefix>dedup:<provider>:<event_id> 1 NX EX 600`, and the
//!   work runs when it answered `OK`.
//!
//! One round trip per event, fresh or duplicate, on the same pool or
//! connection as the idem store it is compared with. What it does not do is
//! what idem's extra round trip and bytes buy: no lease (a crash between the
//! insert and the work loses the event for good; one before the insert runs
//! it twice), no stored outcome, no transient failure released for the
//! sender's retry, no payload check, no expiry on the SQL tables.

#[cfg(feature = "postgres")]
use idem_postgres::PgStore;
#[cfg(feature = "redis")]
use idem_redis::redis::{self, aio::ConnectionManager};
#[cfg(feature = "sqlite")]
use idem_sqlite::SqliteStore;

/// The hand-written dedup on one backend.
#[derive(Debug)]
pub(crate) enum Dedup {
    /// The table in the SQLite store's database, on its pool.
    #[cfg(feature = "sqlite")]
    Sqlite(idem_sqlite::sqlx::SqlitePool),
    /// The table in the Postgres store's schema, on its pool (and the
    /// insert statement).
    #[cfg(feature = "postgres")]
    Postgres(idem_postgres::sqlx::PgPool, String),
    /// Keys under the bench's prefix, on the store's connection.
    #[cfg(feature = "redis")]
    Redis(ConnectionManager, String),
}

#[cfg(feature = "sqlite")]
const SQLITE_TABLE: &str = "CREATE TABLE IF NOT EXISTS inbound_dedup \
    (provider TEXT NOT NULL, event_id TEXT NOT NULL, PRIMARY KEY (provider, event_id))";
#[cfg(feature = "sqlite")]
const SQLITE_INSERT: &str =
    "INSERT INTO inbound_dedup (provider, event_id) VALUES (?1, ?2) ON CONFLICT DO NOTHING";

impl Dedup {
    /// The table next to `store`'s, on its pool.
    #[cfg(feature = "sqlite")]
    pub(crate) async fn sqlite(store: &SqliteStore) -> Self {
        let pool = store.pool().clone();
        idem_sqlite::sqlx::query(SQLITE_TABLE)
            .execute(&pool)
            .await
            .expect("create the dedup table");
        Self::Sqlite(pool)
    }

    /// The table in `store`'s schema, on its pool.
    #[cfg(feature = "postgres")]
    pub(crate) async fn postgres(store: &PgStore) -> Self {
        use idem_postgres::sqlx::{self, AssertSqlSafe};
        let schema = store.schema_name();
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE IF NOT EXISTS \"{schema}\".inbound_dedup \
             (provider TEXT NOT NULL, event_id TEXT NOT NULL, PRIMARY KEY (provider, event_id))"
        )))
        .execute(store.pool())
        .await
        .expect("create the dedup table");
        let insert = format!(
            "INSERT INTO \"{schema}\".inbound_dedup (provider, event_id) VALUES ($1, $2) \
             ON CONFLICT DO NOTHING"
        );
        Self::Postgres(store.pool().clone(), insert)
    }

    /// Keys under `prefix`, on `conn`.
    #[cfg(feature = "redis")]
    pub(crate) fn redis(conn: ConnectionManager, prefix: &str) -> Self {
        Self::Redis(conn, format!("{prefix}dedup:"))
    }

    /// Records `(provider, event_id)`; `true` the first time, when the work
    /// is to run.
    pub(crate) async fn first_time(&self, provider: &str, event_id: &str) -> bool {
        match self {
            #[cfg(feature = "sqlite")]
            Self::Sqlite(pool) => {
                idem_sqlite::sqlx::query(SQLITE_INSERT)
                    .bind(provider)
                    .bind(event_id)
                    .execute(pool)
                    .await
                    .expect("dedup insert")
                    .rows_affected()
                    == 1
            }
            #[cfg(feature = "postgres")]
            Self::Postgres(pool, insert) => {
                idem_postgres::sqlx::query(idem_postgres::sqlx::AssertSqlSafe(insert.as_str()))
                    .bind(provider)
                    .bind(event_id)
                    .execute(pool)
                    .await
                    .expect("dedup insert")
                    .rows_affected()
                    == 1
            }
            #[cfg(feature = "redis")]
            Self::Redis(conn, prefix) => {
                let mut conn = conn.clone();
                let set: Option<String> = redis::cmd("SET")
                    .arg(format!("{prefix}{provider}:{event_id}"))
                    .arg(1)
                    .arg("NX")
                    .arg("EX")
                    .arg(600)
                    .query_async(&mut conn)
                    .await
                    .expect("SET NX");
                set.is_some()
            }
        }
    }
}

/// A bench run once per backend by [`each_backend`]: the idem store and the
/// hand-written dedup on the same database, pool or connection.
pub(crate) trait OnBackend {
    fn on<S: idem::store::Store>(
        c: &mut criterion::Criterion,
        rt: &tokio::runtime::Runtime,
        backend: &str,
        store: S,
        dedup: Dedup,
    );
}

/// The `main` of a bench of [`OnBackend`]: `B` on each backend, under `tag`.
pub(crate) fn main<B: OnBackend>(tag: &str) {
    // One thread drives the calls, the drivers of the Redis connection and
    // (webhook) the detached handler: one delivery at a time, no hand-off
    // between runtime threads (on a loaded machine each hand-off can cost a
    // scheduler slice, which would tax the side with more round trips
    // twice). sqlx's SQLite connections keep their own threads.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let mut c = super::criterion();
    each_backend::<B>(&mut c, &rt, tag);
    c.final_summary();
}

/// One sample: the time `deliver` takes (every delivery of the sample), the
/// work having run `ran` more times by `runs`' count when it is done.
pub(crate) fn sample(
    rt: &tokio::runtime::Runtime,
    runs: &std::sync::atomic::AtomicU64,
    ran: u64,
    deliver: impl std::future::Future<Output = ()>,
) -> std::time::Duration {
    use std::sync::atomic::Ordering;
    rt.block_on(async {
        let before = runs.load(Ordering::Relaxed);
        let start = std::time::Instant::now();
        deliver.await;
        let took = start.elapsed();
        assert_eq!(
            runs.load(Ordering::Relaxed) - before,
            ran,
            "runs of the work"
        );
        took
    })
}

/// Runs `B` on each backend the features enable, each in a namespace of
/// its own removed afterwards: a SQLite file (`SqliteStore::open`, deleted),
/// Postgres (`IDEM_POSTGRES_URL`, schema `idem_bench_<tag>_<pid>`, dropped)
/// and Redis (`IDEM_REDIS_URL`, prefix `idem-bench-<tag>-<pid>:`, its keys
/// deleted). An unreachable server is reported and skipped.
fn each_backend<B: OnBackend>(
    c: &mut criterion::Criterion,
    rt: &tokio::runtime::Runtime,
    tag: &str,
) {
    let _ = (&c, rt, tag);
    #[cfg(feature = "sqlite")]
    {
        let db = super::stores::TempDb::new(tag);
        let (store, dedup) = rt.block_on(async {
            let store = SqliteStore::open(&db.0).await.expect("open SQLite file");
            let dedup = Dedup::sqlite(&store).await;
            (store, dedup)
        });
        B::on(c, rt, "sqlite-file", store, dedup);
    }
    #[cfg(feature = "postgres")]
    {
        use idem_postgres::sqlx::{self, AssertSqlSafe};
        let url = std::env::var("IDEM_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let schema = format!("idem_bench_{tag}_{}", std::process::id());
        match rt.block_on(PgStore::connect(&url)) {
            Ok(store) => {
                let store = store.with_schema_name(&schema).expect("schema name");
                let dedup = rt.block_on(async {
                    store.migrate().await.expect("migrate the bench schema");
                    Dedup::postgres(&store).await
                });
                B::on(c, rt, "postgres", store.clone(), dedup);
                rt.block_on(
                    sqlx::query(AssertSqlSafe(format!("DROP SCHEMA \"{schema}\" CASCADE")))
                        .execute(store.pool()),
                )
                .expect("drop the bench schema");
            }
            Err(e) => eprintln!("NOTE: Postgres at {url} unreachable ({e}): postgres NOT run"),
        }
    }
    #[cfg(feature = "redis")]
    {
        let url = std::env::var("IDEM_REDIS_URL")
            .unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned());
        let conn = rt.block_on(async {
            let client = redis::Client::open(url.as_str())?;
            ConnectionManager::new(client).await
        });
        match conn {
            Ok(conn) => {
                let prefix = format!("idem-bench-{tag}-{}:", std::process::id());
                // The store and the hand-written keys share one multiplexed
                // connection.
                let store = idem_redis::RedisStore::new(conn.clone())
                    .with_prefix(&prefix)
                    .expect("valid prefix");
                B::on(c, rt, "redis", store, Dedup::redis(conn.clone(), &prefix));
                rt.block_on(super::stores::redis::clean(&conn, &prefix));
            }
            Err(e) => eprintln!("NOTE: Redis at {url} unreachable ({e}): redis NOT run"),
        }
    }
}
