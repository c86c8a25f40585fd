//! The shipped migration and [`PgStore::migrate`].

use sqlx::Connection;

use crate::config::TableName;
use crate::error::Error;
use crate::store::PgStore;

/// The SQL that creates the record table and its indexes, as shipped in
/// `migrations/0001_idem.sql`.
///
/// It holds three placeholders: `{schema}` and `{table}` (quoted names) and
/// `{prefix}` (the bare table name, used for index and constraint names).
/// [`PgStore::migrate`] fills them in and runs it; to apply it with your own
/// migration tool, use [`PgStore::migration_sql`] for the filled-in text.
/// Every statement is idempotent (`IF NOT EXISTS`).
pub const MIGRATION: &str = include_str!("../migrations/0001_idem.sql");

/// Serializes concurrent `migrate()` calls (two instances starting at once
/// would otherwise race on `CREATE TABLE IF NOT EXISTS`). An arbitrary
/// constant: the bytes of "idem-pg1".
const MIGRATE_LOCK: i64 = 0x6964_656d_2d70_6731;

pub(crate) fn render(name: &TableName) -> String {
    MIGRATION
        .replace("{schema}", &format!("\"{}\"", name.schema))
        .replace("{table}", &format!("\"{}\"", name.table))
        .replace("{prefix}", &name.table)
}

impl PgStore {
    /// The migration for this store's schema and table, placeholders filled
    /// in, for applying with your own tool.
    #[must_use]
    pub fn migration_sql(&self) -> String {
        render(self.name())
    }

    /// Creates the schema (if missing), the table and its indexes, in one
    /// transaction. Idempotent: safe to call at every start, from every
    /// instance at once (an advisory lock serializes them). It never touches
    /// sqlx's `_sqlx_migrations` table, so it does not interfere with your
    /// application's own migrations.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlx`] when the server refuses (e.g. no `CREATE` privilege).
    pub async fn migrate(&self) -> Result<(), Error> {
        let mut conn = self.pool().acquire().await?;
        let mut tx = conn.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(MIGRATE_LOCK)
            .execute(&mut *tx)
            .await?;
        // Several statements in one simple-protocol query; the text is the
        // shipped file with validated identifiers spliced in.
        sqlx::raw_sql(sqlx::AssertSqlSafe(self.migration_sql()))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_fills_every_placeholder() {
        let sql = render(&TableName {
            schema: "s1".into(),
            table: "t1".into(),
        });
        assert!(!sql.contains('{'), "{sql}");
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS \"s1\".\"t1\""));
        assert!(sql.contains("\"t1_key_expires_idx\""));
    }
}
