//! The minimal patterns a user would hand-write for the same job, per
//! backend: the baseline that shows what the design costs (the
//! `store`-statement baselines next to it show only what the engine costs).
//!
//! * memory: a `HashMap` from key to `None` (in flight) or the body;
//! * SQLite and Postgres: a table keyed by one text column; fresh =
//!   `INSERT … ON CONFLICT DO NOTHING RETURNING` then `UPDATE` on one checked-out
//!   connection; replay = one `SELECT` by key; a contended call inserts and,
//!   when it loses, reads. The second variant (`two_checkouts`) gives the
//!   connection back to the pool between the insert and the update, as a
//!   hand-written version must when its work may run for seconds and should
//!   not hold a connection meanwhile (idem's design): one checkout per
//!   statement, so the two variants side by side price that promise alone;
//! * MySQL / MariaDB: the same table (binary key); fresh = `INSERT IGNORE`
//!   (one row affected: won) then `UPDATE`; replay = one `SELECT`; with
//!   `two_checkouts` as above;
//! * Redis: see `redis_min.rs`.
//!
//! No fingerprint check, no lease takeover, no expiry handling beyond a
//! stored deadline: exactly what the library adds on top is what the ratio
//! shows.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};

use super::workload::{Ended, Target, body};

/// Memory: a map behind a mutex.
#[derive(Debug)]
pub(crate) struct MinMemory {
    map: Mutex<HashMap<String, Option<Vec<u8>>>>,
    body: Vec<u8>,
}

impl MinMemory {
    pub(crate) fn new(body_len: usize) -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            body: body(body_len),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Option<Vec<u8>>>> {
        self.map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `Ok(())` if claimed, else the standing body (`None` in flight).
    fn claim(&self, key: &str) -> Result<(), Option<Vec<u8>>> {
        let mut map = self.lock();
        if let Some(v) = map.get(key) {
            return Err(v.clone());
        }
        map.insert(key.to_owned(), None);
        Ok(())
    }

    fn complete(&self, key: &str) {
        if let Some(v) = self.lock().get_mut(key) {
            *v = Some(self.body.clone());
        }
    }
}

impl Target for MinMemory {
    async fn fresh(&self, key: &str) {
        self.claim(key).expect("fresh key");
        self.complete(key);
    }

    async fn replay(&self, key: &str) {
        let body = self.lock().get(key).cloned().flatten();
        std::hint::black_box(body.expect("stored body"));
    }

    async fn contended(&self, key: &str) -> Ended {
        match self.claim(key) {
            Ok(()) => {
                self.complete(key);
                Ended::Executed
            }
            Err(Some(body)) => {
                std::hint::black_box(body);
                Ended::Replayed
            }
            Err(None) => Ended::Conflict,
        }
    }
}

/// Runs a query on the held connection, or (with `two_checkouts`, when
/// `held` is `None`) on a fresh checkout from `pool` for this statement only.
/// One macro for every SQL side: their drivers' executor types differ.
macro_rules! on_conn {
    ($held:expr, $pool:expr, $query:expr, $method:ident) => {
        match $held.as_mut() {
            Some(conn) => $query.$method(&mut **conn).await,
            None => $query.$method($pool).await,
        }
    };
}

/// A token per claim, as a hand-written fencing check would use.
fn next_token(tokens: &AtomicI64) -> i64 {
    tokens.fetch_add(1, Ordering::Relaxed)
}

#[cfg(feature = "sqlite")]
pub(crate) mod sqlite {
    use std::sync::atomic::AtomicI64;

    use idem_sqlite::sqlx::{self, Row, SqlitePool};

    use super::super::workload::{Ended, Target, body};
    use super::super::{LEASE_MS, TTL_MS, now_ms};
    use super::next_token;

    const CREATE: &str = "CREATE TABLE IF NOT EXISTS idem_min (
        key TEXT PRIMARY KEY, fingerprint BLOB NOT NULL, token INTEGER NOT NULL,
        done INTEGER NOT NULL DEFAULT 0, body BLOB, expires_at INTEGER NOT NULL)";
    const INSERT: &str = "INSERT INTO idem_min (key, fingerprint, token, expires_at)
        VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING RETURNING token";
    const UPDATE: &str =
        "UPDATE idem_min SET done = 1, body = ?2, expires_at = ?3 WHERE key = ?1 AND token = ?4";
    const SELECT: &str = "SELECT done, body FROM idem_min WHERE key = ?1";

    /// SQLite: the minimal table on the store's pool.
    #[derive(Debug)]
    pub(crate) struct MinSqlite {
        pool: SqlitePool,
        fingerprint: [u8; 32],
        body: Vec<u8>,
        tokens: AtomicI64,
        two_checkouts: bool,
    }

    impl MinSqlite {
        pub(crate) async fn new(pool: SqlitePool, body_len: usize) -> Self {
            sqlx::query(CREATE)
                .execute(&pool)
                .await
                .expect("create idem_min");
            Self {
                pool,
                fingerprint: [7; 32],
                body: body(body_len),
                tokens: AtomicI64::new(1),
                two_checkouts: false,
            }
        }

        /// The same pattern with one checkout per statement: the connection
        /// goes back to the pool while the work would run.
        pub(crate) fn two_checkouts(mut self) -> Self {
            self.two_checkouts = true;
            self
        }

        /// On one connection (with `two_checkouts`, one checkout per
        /// statement): the insert, then the update if it won, else the read.
        async fn call(&self, key: &str, read_if_lost: bool) -> Ended {
            let mut held = if self.two_checkouts {
                None
            } else {
                Some(self.pool.acquire().await.expect("acquire"))
            };
            let token = next_token(&self.tokens);
            let now = now_ms();
            let won = on_conn!(
                held,
                &self.pool,
                sqlx::query(INSERT)
                    .bind(key)
                    .bind(self.fingerprint.as_slice())
                    .bind(token)
                    .bind(now + LEASE_MS),
                fetch_optional
            )
            .expect("insert");
            if won.is_some() {
                let done = on_conn!(
                    held,
                    &self.pool,
                    sqlx::query(UPDATE)
                        .bind(key)
                        .bind(self.body.as_slice())
                        .bind(now + TTL_MS)
                        .bind(token),
                    execute
                )
                .expect("update");
                assert_eq!(done.rows_affected(), 1, "token lost");
                return Ended::Executed;
            }
            assert!(read_if_lost, "a fresh key existed");
            let row = on_conn!(held, &self.pool, sqlx::query(SELECT).bind(key), fetch_one)
                .expect("select");
            if row.get::<i64, _>("done") == 1 {
                std::hint::black_box(row.get::<Vec<u8>, _>("body"));
                Ended::Replayed
            } else {
                Ended::Conflict
            }
        }
    }

    impl Target for MinSqlite {
        async fn fresh(&self, key: &str) {
            self.call(key, false).await;
        }

        async fn replay(&self, key: &str) {
            let row = sqlx::query(SELECT)
                .bind(key)
                .fetch_one(&self.pool)
                .await
                .expect("select");
            assert_eq!(row.get::<i64, _>("done"), 1, "completed key");
            std::hint::black_box(row.get::<Vec<u8>, _>("body"));
        }

        async fn contended(&self, key: &str) -> Ended {
            self.call(key, true).await
        }
    }
}

#[cfg(feature = "postgres")]
pub(crate) mod postgres {
    use std::sync::atomic::AtomicI64;

    use idem_postgres::sqlx::{self, AssertSqlSafe, PgPool, Row};

    use super::super::workload::{Ended, Target, body};
    use super::super::{LEASE_MS, TTL_MS, now_ms};
    use super::next_token;

    /// Postgres: the minimal table (in the bench's schema) on the store's
    /// pool.
    #[derive(Debug)]
    pub(crate) struct MinPostgres {
        pool: PgPool,
        insert: String,
        update: String,
        select: String,
        fingerprint: [u8; 32],
        body: Vec<u8>,
        tokens: AtomicI64,
        two_checkouts: bool,
    }

    impl MinPostgres {
        /// The table `"{schema}".idem_min`, created if missing.
        pub(crate) async fn new(pool: PgPool, schema: &str, body_len: usize) -> Self {
            let t = format!("\"{schema}\".idem_min");
            sqlx::raw_sql(AssertSqlSafe(format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                    key text PRIMARY KEY, fingerprint bytea NOT NULL, token bigint NOT NULL,
                    done boolean NOT NULL DEFAULT false, body bytea, expires_at bigint NOT NULL)"
            )))
            .execute(&pool)
            .await
            .expect("create idem_min");
            Self {
                pool,
                insert: format!(
                    "INSERT INTO {t} (key, fingerprint, token, expires_at) VALUES ($1, $2, $3, $4)
                     ON CONFLICT DO NOTHING RETURNING token"
                ),
                update: format!(
                    "UPDATE {t} SET done = true, body = $2, expires_at = $3 WHERE key = $1 AND token = $4"
                ),
                select: format!("SELECT done, body FROM {t} WHERE key = $1"),
                fingerprint: [7; 32],
                body: body(body_len),
                tokens: AtomicI64::new(1),
                two_checkouts: false,
            }
        }

        /// The same pattern with one checkout per statement: the connection
        /// goes back to the pool while the work would run.
        pub(crate) fn two_checkouts(mut self) -> Self {
            self.two_checkouts = true;
            self
        }

        /// On one connection (with `two_checkouts`, one checkout per
        /// statement): the insert, then the update if it won, else the read.
        async fn call(&self, key: &str, read_if_lost: bool) -> Ended {
            let mut held = if self.two_checkouts {
                None
            } else {
                Some(self.pool.acquire().await.expect("acquire"))
            };
            let token = next_token(&self.tokens);
            let now = now_ms();
            let won = on_conn!(
                held,
                &self.pool,
                sqlx::query(AssertSqlSafe(self.insert.as_str()))
                    .bind(key)
                    .bind(self.fingerprint.as_slice())
                    .bind(token)
                    .bind(now + LEASE_MS),
                fetch_optional
            )
            .expect("insert");
            if won.is_some() {
                let done = on_conn!(
                    held,
                    &self.pool,
                    sqlx::query(AssertSqlSafe(self.update.as_str()))
                        .bind(key)
                        .bind(self.body.as_slice())
                        .bind(now + TTL_MS)
                        .bind(token),
                    execute
                )
                .expect("update");
                assert_eq!(done.rows_affected(), 1, "token lost");
                return Ended::Executed;
            }
            assert!(read_if_lost, "a fresh key existed");
            let row = on_conn!(
                held,
                &self.pool,
                sqlx::query(AssertSqlSafe(self.select.as_str())).bind(key),
                fetch_one
            )
            .expect("select");
            if row.get::<bool, _>("done") {
                std::hint::black_box(row.get::<Vec<u8>, _>("body"));
                Ended::Replayed
            } else {
                Ended::Conflict
            }
        }
    }

    impl Target for MinPostgres {
        async fn fresh(&self, key: &str) {
            self.call(key, false).await;
        }

        async fn replay(&self, key: &str) {
            let row = sqlx::query(AssertSqlSafe(self.select.as_str()))
                .bind(key)
                .fetch_one(&self.pool)
                .await
                .expect("select");
            assert!(row.get::<bool, _>("done"), "completed key");
            std::hint::black_box(row.get::<Vec<u8>, _>("body"));
        }

        async fn contended(&self, key: &str) -> Ended {
            self.call(key, true).await
        }
    }
}

#[cfg(feature = "mysql")]
pub(crate) mod mysql {
    use std::sync::atomic::AtomicI64;

    use idem_mysql::sqlx::{self, AssertSqlSafe, MySqlPool, Row};

    use super::super::workload::{Ended, Target, body};
    use super::super::{LEASE_MS, TTL_MS, now_ms};
    use super::next_token;

    /// MySQL / MariaDB: the minimal table on the store's pool.
    #[derive(Debug)]
    pub(crate) struct MinMySql {
        pool: MySqlPool,
        insert: String,
        update: String,
        select: String,
        fingerprint: [u8; 32],
        body: Vec<u8>,
        tokens: AtomicI64,
        two_checkouts: bool,
    }

    impl MinMySql {
        /// The table `table`, created if missing.
        pub(crate) async fn new(pool: MySqlPool, table: &str, body_len: usize) -> Self {
            let t = format!("`{table}`");
            sqlx::raw_sql(AssertSqlSafe(format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                    `key` VARBINARY(255) PRIMARY KEY, fingerprint VARBINARY(32) NOT NULL,
                    token BIGINT NOT NULL, done BOOLEAN NOT NULL DEFAULT false, body LONGBLOB,
                    expires_at BIGINT NOT NULL) ENGINE = InnoDB"
            )))
            .execute(&pool)
            .await
            .expect("create the minimal table");
            Self {
                pool,
                insert: format!(
                    "INSERT IGNORE INTO {t} (`key`, fingerprint, token, expires_at) VALUES (?, ?, ?, ?)"
                ),
                update: format!(
                    "UPDATE {t} SET done = true, body = ?, expires_at = ? WHERE `key` = ? AND token = ?"
                ),
                select: format!("SELECT done, body FROM {t} WHERE `key` = ?"),
                fingerprint: [7; 32],
                body: body(body_len),
                tokens: AtomicI64::new(1),
                two_checkouts: false,
            }
        }

        /// The same pattern with one checkout per statement.
        pub(crate) fn two_checkouts(mut self) -> Self {
            self.two_checkouts = true;
            self
        }

        /// On one connection (with `two_checkouts`, one checkout per
        /// statement): the insert, then the update if it won, else the read.
        async fn call(&self, key: &str, read_if_lost: bool) -> Ended {
            let mut held = if self.two_checkouts {
                None
            } else {
                Some(self.pool.acquire().await.expect("acquire"))
            };
            let token = next_token(&self.tokens);
            let now = now_ms();
            let inserted = on_conn!(
                held,
                &self.pool,
                sqlx::query(AssertSqlSafe(self.insert.as_str()))
                    .bind(key)
                    .bind(self.fingerprint.as_slice())
                    .bind(token)
                    .bind(now + LEASE_MS),
                execute
            )
            .expect("insert");
            if inserted.rows_affected() == 1 {
                let done = on_conn!(
                    held,
                    &self.pool,
                    sqlx::query(AssertSqlSafe(self.update.as_str()))
                        .bind(self.body.as_slice())
                        .bind(now + TTL_MS)
                        .bind(key)
                        .bind(token),
                    execute
                )
                .expect("update");
                assert_eq!(done.rows_affected(), 1, "token lost");
                return Ended::Executed;
            }
            assert!(read_if_lost, "a fresh key existed");
            let row = on_conn!(
                held,
                &self.pool,
                sqlx::query(AssertSqlSafe(self.select.as_str())).bind(key),
                fetch_one
            )
            .expect("select");
            if row.get::<bool, _>("done") {
                std::hint::black_box(row.get::<Vec<u8>, _>("body"));
                Ended::Replayed
            } else {
                Ended::Conflict
            }
        }
    }

    impl Target for MinMySql {
        async fn fresh(&self, key: &str) {
            self.call(key, false).await;
        }

        async fn replay(&self, key: &str) {
            let row = sqlx::query(AssertSqlSafe(self.select.as_str()))
                .bind(key)
                .fetch_one(&self.pool)
                .await
                .expect("select");
            assert!(row.get::<bool, _>("done"), "completed key");
            std::hint::black_box(row.get::<Vec<u8>, _>("body"));
        }

        async fn contended(&self, key: &str) -> Ended {
            self.call(key, true).await
        }
    }
}
