//! The shipped migration, rendered for a table name.

use crate::sql::TableName;

/// The SQL that creates the record table and its index in layout 1, the
/// layout frozen for 0.1, as shipped in `migrations/0001_idem.sql`: one
/// `CREATE TABLE IF NOT EXISTS` statement, whose table comment is
/// [`idem_sql::LAYOUT`].
///
/// It holds one placeholder, `{table}` (the backtick-quoted table name).
/// [`MySqlStore::migrate`](crate::MySqlStore::migrate) fills it in and runs
/// it; to apply it with your own migration tool, use
/// [`MySqlStore::migration_sql`](crate::MySqlStore::migration_sql) for the
/// filled-in text.
pub const MIGRATION: &str = include_str!("../migrations/0001_idem.sql");

/// The named lock (`GET_LOCK`) that serializes concurrent `migrate()` calls:
/// MySQL's DDL is not transactional, so two instances starting at once are
/// kept apart by a server-wide lock instead.
pub(crate) const MIGRATE_LOCK: &str = "idem-mysql-migrate";

pub(crate) fn render(name: &TableName) -> String {
    MIGRATION.replace("{table}", &name.quoted())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_fills_every_placeholder() {
        let sql = render(&TableName { table: "t1".into() });
        assert!(!sql.contains('{'), "{sql}");
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS `t1`"));
    }
}
