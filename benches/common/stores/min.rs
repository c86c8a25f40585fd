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

/// One SQL side of the minimal pattern, `$name` on a `$pool`: its
/// statements, and on one connection (with `two_checkouts`, one checkout per
/// statement) the insert, then the update if it won, else the read. What
/// differs by dialect comes in as expressions: whether the insert (run with
/// `$insert`) won, the update's binds, and whether a read row is done. The
/// caller's scope provides `sqlx`, `AssertSqlSafe` and `Row`.
macro_rules! min_sql {
    (
        $(#[$meta:meta])*
        $name:ident($pool:ty),
        insert: $insert:ident, won: |$inserted:ident| $won:expr,
        update: |$q:ident, $key:ident, $body:ident, $until:ident, $token:ident| $binds:expr,
        done: |$row:ident| $done:expr $(,)?
    ) => {
        $(#[$meta])*
        #[derive(Debug)]
        pub(crate) struct $name {
            pool: $pool,
            insert: String,
            update: String,
            select: String,
            fingerprint: [u8; 32],
            body: Vec<u8>,
            tokens: std::sync::atomic::AtomicI64,
            two_checkouts: bool,
        }

        impl $name {
            /// The pattern on `pool` with these statements.
            fn with_statements(
                pool: $pool,
                [insert, update, select]: [String; 3],
                body_len: usize,
            ) -> Self {
                Self {
                    pool,
                    insert,
                    update,
                    select,
                    fingerprint: [7; 32],
                    body: super::super::workload::body(body_len),
                    tokens: std::sync::atomic::AtomicI64::new(1),
                    two_checkouts: false,
                }
            }

            /// The same pattern with one checkout per statement: the
            /// connection goes back to the pool while the work would run.
            pub(crate) fn two_checkouts(mut self) -> Self {
                self.two_checkouts = true;
                self
            }

            /// On one connection (with `two_checkouts`, one checkout per
            /// statement): the insert, then the update if it won, else the
            /// read.
            async fn call(&self, key: &str, read_if_lost: bool) -> super::super::workload::Ended {
                use super::super::workload::Ended;
                use super::super::{LEASE_MS, TTL_MS, now_ms};
                let mut held = if self.two_checkouts {
                    None
                } else {
                    Some(self.pool.acquire().await.expect("acquire"))
                };
                let token = super::next_token(&self.tokens);
                let now = now_ms();
                let $inserted = on_conn!(
                    held,
                    &self.pool,
                    sqlx::query(AssertSqlSafe(self.insert.as_str()))
                        .bind(key)
                        .bind(self.fingerprint.as_slice())
                        .bind(token)
                        .bind(now + LEASE_MS),
                    $insert
                )
                .expect("insert");
                if $won {
                    let ($key, $body, $until, $token) =
                        (key, self.body.as_slice(), now + TTL_MS, token);
                    let $q = || sqlx::query(AssertSqlSafe(self.update.as_str()));
                    let done = on_conn!(held, &self.pool, $binds, execute).expect("update");
                    assert_eq!(done.rows_affected(), 1, "token lost");
                    return Ended::Executed;
                }
                assert!(read_if_lost, "a fresh key existed");
                let $row = on_conn!(
                    held,
                    &self.pool,
                    sqlx::query(AssertSqlSafe(self.select.as_str())).bind(key),
                    fetch_one
                )
                .expect("select");
                if $done {
                    std::hint::black_box($row.get::<Vec<u8>, _>("body"));
                    Ended::Replayed
                } else {
                    Ended::Conflict
                }
            }
        }

        impl super::super::workload::Target for $name {
            async fn fresh(&self, key: &str) {
                self.call(key, false).await;
            }

            async fn replay(&self, key: &str) {
                let $row = sqlx::query(AssertSqlSafe(self.select.as_str()))
                    .bind(key)
                    .fetch_one(&self.pool)
                    .await
                    .expect("select");
                assert!($done, "completed key");
                std::hint::black_box($row.get::<Vec<u8>, _>("body"));
            }

            async fn contended(&self, key: &str) -> super::super::workload::Ended {
                self.call(key, true).await
            }
        }
    };
}

#[cfg(feature = "sqlite")]
pub(crate) mod sqlite {
    use idem_sqlite::sqlx::{self, AssertSqlSafe, Row, SqlitePool};

    const CREATE: &str = "CREATE TABLE IF NOT EXISTS idem_min (
        key TEXT PRIMARY KEY, fingerprint BLOB NOT NULL, token INTEGER NOT NULL,
        done INTEGER NOT NULL DEFAULT 0, body BLOB, expires_at INTEGER NOT NULL)";
    const INSERT: &str = "INSERT INTO idem_min (key, fingerprint, token, expires_at)
        VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING RETURNING token";
    const UPDATE: &str =
        "UPDATE idem_min SET done = 1, body = ?2, expires_at = ?3 WHERE key = ?1 AND token = ?4";
    const SELECT: &str = "SELECT done, body FROM idem_min WHERE key = ?1";

    min_sql! {
        /// SQLite: the minimal table on the store's pool.
        MinSqlite(SqlitePool),
        insert: fetch_optional, won: |won| won.is_some(),
        update: |q, key, body, until, token| q().bind(key).bind(body).bind(until).bind(token),
        done: |row| row.get::<i64, _>("done") == 1,
    }

    impl MinSqlite {
        pub(crate) async fn new(pool: SqlitePool, body_len: usize) -> Self {
            sqlx::query(CREATE)
                .execute(&pool)
                .await
                .expect("create idem_min");
            Self::with_statements(pool, [INSERT, UPDATE, SELECT].map(str::to_owned), body_len)
        }
    }
}

#[cfg(feature = "postgres")]
pub(crate) mod postgres {
    use idem_postgres::sqlx::{self, AssertSqlSafe, PgPool, Row};

    min_sql! {
        /// Postgres: the minimal table (in the bench's schema) on the
        /// store's pool.
        MinPostgres(PgPool),
        insert: fetch_optional, won: |won| won.is_some(),
        update: |q, key, body, until, token| q().bind(key).bind(body).bind(until).bind(token),
        done: |row| row.get::<bool, _>("done"),
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
            let statements = [
                format!(
                    "INSERT INTO {t} (key, fingerprint, token, expires_at) VALUES ($1, $2, $3, $4)
                     ON CONFLICT DO NOTHING RETURNING token"
                ),
                format!(
                    "UPDATE {t} SET done = true, body = $2, expires_at = $3 WHERE key = $1 AND token = $4"
                ),
                format!("SELECT done, body FROM {t} WHERE key = $1"),
            ];
            Self::with_statements(pool, statements, body_len)
        }
    }
}

#[cfg(feature = "mysql")]
pub(crate) mod mysql {
    use idem_mysql::sqlx::{self, AssertSqlSafe, MySqlPool, Row};

    min_sql! {
        /// MySQL / MariaDB: the minimal table on the store's pool; the
        /// insert won when it affected a row (`INSERT IGNORE`).
        MinMySql(MySqlPool),
        insert: execute, won: |inserted| inserted.rows_affected() == 1,
        update: |q, key, body, until, token| q().bind(body).bind(until).bind(key).bind(token),
        done: |row| row.get::<bool, _>("done"),
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
            let statements = [
                format!(
                    "INSERT IGNORE INTO {t} (`key`, fingerprint, token, expires_at) VALUES (?, ?, ?, ?)"
                ),
                format!(
                    "UPDATE {t} SET done = true, body = ?, expires_at = ? WHERE `key` = ? AND token = ?"
                ),
                format!("SELECT done, body FROM {t} WHERE `key` = ?"),
            ];
            Self::with_statements(pool, statements, body_len)
        }
    }
}
