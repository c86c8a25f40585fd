//! The raw baseline of `MySqlStore`: the same claim and completion
//! statements through the same pool, without the engine.
//!
//! The statements are the store's own for the bench's table
//! (`idem_mysql::statements`), per server: on MariaDB the one-statement
//! `INSERT … ON DUPLICATE KEY UPDATE … RETURNING` (a replay is one round
//! trip, a fresh key two: claim, complete); on MySQL the plain `INSERT`,
//! then a `SELECT` when the key exists.

use idem_mysql::sqlx::{self, AssertSqlSafe, MySqlPool, Row};
use idem_mysql::{MySqlStore, Server};

use super::workload::{OPERATION, OWNER, RawParts, Statements, record_key, standing, text};
use super::{LEASE_MS, TTL_MS, now_ms};

/// The statements of `MySqlStore` on its own pool.
#[derive(Debug)]
pub(crate) struct RawMySql {
    raw: RawParts<MySqlPool>,
    server: Server,
    claim: String,
    insert: String,
    read: String,
    complete: String,
}

impl RawMySql {
    pub(crate) fn new(store: &MySqlStore, body_len: usize) -> Self {
        Self {
            raw: RawParts::new(store.pool().clone(), body_len),
            server: store.server().expect("detected by connect or migrate"),
            claim: text(idem_mysql::statement(store, "claim_returning")),
            insert: text(idem_mysql::statement(store, "insert")),
            read: text(idem_mysql::statement(store, "read")),
            complete: text(idem_mysql::statement(store, "complete")),
        }
    }
}

fn duplicate(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.kind() == sqlx::error::ErrorKind::UniqueViolation)
}

impl Statements for RawMySql {
    /// `Ok(token)` if claimed, else the standing record's body (`None` while
    /// it is in flight). A lost race (no row) is run again, as the store does.
    async fn claim(&self, key: &str) -> Result<i64, Option<Vec<u8>>> {
        loop {
            let token = self.raw.token() + (i64::from(std::process::id()) << 32);
            let now = now_ms();
            let bind = |sql: &str| {
                sqlx::query(AssertSqlSafe(sql.to_owned()))
                    .bind(record_key(key))
                    .bind(OWNER)
                    .bind(OPERATION)
                    .bind(key.to_owned())
                    .bind(self.raw.fingerprint.to_vec())
                    .bind(token)
                    .bind(now + LEASE_MS)
                    .bind(now + TTL_MS)
                    .bind(now + LEASE_MS)
                    .bind(now + LEASE_MS)
            };
            let row = match self.server {
                Server::MariaDb => bind(&self.claim)
                    .bind(now)
                    .fetch_one(&self.raw.pool)
                    .await
                    .expect("claim"),
                _ => match bind(&self.insert).execute(&self.raw.pool).await {
                    Ok(_) => return Ok(token),
                    Err(e) if duplicate(&e) => {
                        let row = sqlx::query(AssertSqlSafe(self.read.as_str()))
                            .bind(now)
                            .bind(record_key(key))
                            .fetch_optional(&self.raw.pool)
                            .await
                            .expect("read");
                        let Some(row) = row else { continue };
                        row
                    }
                    Err(e) => panic!("claim: {e}"),
                },
            };
            if row.get::<i64, _>("token") == token {
                return Ok(token);
            }
            return standing!(row);
        }
    }

    async fn complete(&self, key: &str, token: i64) {
        let now = now_ms();
        let done = sqlx::query(AssertSqlSafe(self.complete.as_str()))
            .bind("success")
            .bind(self.raw.body.as_slice())
            .bind(now + TTL_MS)
            .bind(now + TTL_MS)
            .bind(None::<&str>)
            .bind(record_key(key))
            .bind(token)
            .execute(&self.raw.pool)
            .await
            .expect("complete");
        assert_eq!(done.rows_affected(), 1, "lease lost");
    }
}
