//! The shipped migration, rendered for a table name.

/// The schema for your own migration tool: `migrations/0001_idem.sql`, the
/// table in layout 1, the layout frozen for 0.1 (the comment
/// on the table's first line, [`idem_sql::LAYOUT`], is its mark).
///
/// It holds one placeholder, `{table}` (the quoted table name).
/// [`SqliteStore::migration_sql`](crate::SqliteStore::migration_sql) gives
/// the text with it filled in for a store's table;
/// [`SqliteStore::migrate`](crate::SqliteStore::migrate) runs it for you, at
/// every start, when the table does not exist yet.
pub const MIGRATION: &str = include_str!("../migrations/0001_idem.sql");

/// [`MIGRATION`] for `table` (a validated identifier).
pub(crate) fn render(table: &str) -> String {
    MIGRATION.replace("{table}", &format!("\"{table}\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_fills_every_placeholder() {
        let sql = render("t1");
        assert!(!sql.contains('{'), "{sql}");
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS \"t1\""));
        assert!(!sql.contains("CREATE INDEX"), "{sql}");
        assert!(!sql.contains("idem_records_"), "{sql}");
        assert!(sql.contains(idem_sql::LAYOUT));
    }
}
