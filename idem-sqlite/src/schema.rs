//! The shipped migration, rendered for a table name.

/// The schema for your own migration tool: `migrations/0001_idem.sql`
/// followed by `migrations/0002_sweep.sql`, to run **once** on a new
/// database (a database made by 0001 alone needs 0002 once).
///
/// It holds two placeholders: `{table}` (the quoted table name) and
/// `{prefix}` (the bare table name, used for index names).
/// [`SqliteStore::migration_sql`](crate::SqliteStore::migration_sql) gives
/// the text with both filled in for a store's table;
/// [`SqliteStore::migrate`](crate::SqliteStore::migrate) runs it for you, at
/// every start, each part only when the table lacks it.
pub const MIGRATION: &str = concat!(
    include_str!("../migrations/0001_idem.sql"),
    "\n",
    include_str!("../migrations/0002_sweep.sql")
);

/// The first version's DDL (idempotent).
const MIGRATION_0001: &str = include_str!("../migrations/0001_idem.sql");

/// The upgrade to the sweep index (once, on a table without `sweep_at`).
const MIGRATION_0002: &str = include_str!("../migrations/0002_sweep.sql");

/// The two parts of the migration for `table` (a validated identifier):
/// 0001 (idempotent) and 0002 (to run once).
pub(crate) fn render_parts(table: &str) -> [String; 2] {
    [MIGRATION_0001, MIGRATION_0002].map(|sql| render(sql, table))
}

/// [`MIGRATION`] for `table`.
pub(crate) fn render_all(table: &str) -> String {
    render(MIGRATION, table)
}

fn render(sql: &str, table: &str) -> String {
    sql.replace("{table}", &format!("\"{table}\""))
        .replace("{prefix}", table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_fills_every_placeholder() {
        let sql = render_all("t1");
        assert!(!sql.contains('{'), "{sql}");
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS \"t1\""));
        assert!(sql.contains("\"t1_sweep\""));
        assert!(!sql.contains("idem_records_"), "{sql}");
    }
}
