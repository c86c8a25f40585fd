//! The shipped migration, rendered for a table name.

use crate::sql::TableName;

/// The SQL that creates the record table and its index in layout 1, the
/// layout frozen for 0.1, as shipped in `migrations/0001_idem.sql`. It marks
/// the table with [`idem_sql::LAYOUT`] (its comment).
///
/// It holds three placeholders: `{schema}` and `{table}` (quoted names) and
/// `{prefix}` (the bare table name, used for index and constraint names).
/// [`PgStore::migrate`](crate::PgStore::migrate) fills them in and runs it; to apply it with your own
/// migration tool, use [`PgStore::migration_sql`](crate::PgStore::migration_sql) for the filled-in text.
/// Every statement is idempotent (`IF NOT EXISTS`).
pub const MIGRATION: &str = include_str!("../migrations/0001_idem.sql");

/// Serializes concurrent `migrate()` calls (two instances starting at once
/// would otherwise race on `CREATE TABLE IF NOT EXISTS`). An arbitrary
/// constant: the bytes of "idem-pg1".
pub(crate) const MIGRATE_LOCK: i64 = 0x6964_656d_2d70_6731;

pub(crate) fn render(name: &TableName) -> String {
    MIGRATION
        .replace("{schema}", &format!("\"{}\"", name.schema))
        .replace("{table}", &format!("\"{}\"", name.table))
        .replace("{prefix}", &name.table)
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
        assert!(sql.contains("\"t1_sweep_idx\""));
        assert!(sql.contains(idem_sql::LAYOUT));
    }
}
