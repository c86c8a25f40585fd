//! Configuration: defaults and the validation of table and schema names.

use std::time::Duration;

use crate::error::Error;

/// The schema a store uses unless
/// [`PgStore::with_schema_name`](crate::PgStore::with_schema_name) says
/// otherwise.
pub const DEFAULT_SCHEMA: &str = "public";
/// The table a store uses unless
/// [`PgStore::with_table_name`](crate::PgStore::with_table_name) says
/// otherwise.
pub const DEFAULT_TABLE: &str = "idem_records";
/// Longest accepted table name: Postgres keeps 63 bytes of an identifier,
/// and index and constraint names append up to 23 bytes to the table name.
pub const MAX_TABLE_NAME_LEN: usize = 40;
/// Longest accepted schema name (Postgres' identifier limit).
pub const MAX_SCHEMA_NAME_LEN: usize = 63;
/// The default `lock_timeout` of the transactional mode.
pub const DEFAULT_TX_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// Accepts `[A-Za-z_][A-Za-z0-9_]*` up to `max` bytes: no quoting tricks,
/// no `;`, nothing that needs escaping. The name is used quoted (so its case
/// is kept as given).
pub(crate) fn validate_identifier(
    what: &'static str,
    name: &str,
    max: usize,
) -> Result<String, Error> {
    let invalid = |reason| Error::InvalidIdentifier { what, reason };
    idem_sql::check_identifier(name, max).map_err(invalid)?;
    if name.starts_with("pg_") {
        return Err(invalid("the pg_ prefix is reserved by PostgreSQL"));
    }
    Ok(name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_validated() {
        for ok in ["idem_records", "_t", "T1", "a".repeat(40).as_str()] {
            assert!(
                validate_identifier("table", ok, MAX_TABLE_NAME_LEN).is_ok(),
                "{ok}"
            );
        }
        // The plain-identifier rule itself is `idem_sql::check_identifier`'s
        // (tested there); here, that it applies, and the reserved prefix.
        for bad in [
            "",
            "x\"; DROP TABLE y; --",
            "pg_catalog",
            "a".repeat(41).as_str(),
        ] {
            assert!(
                matches!(
                    validate_identifier("table", bad, MAX_TABLE_NAME_LEN),
                    Err(Error::InvalidIdentifier { what: "table", .. })
                ),
                "{bad:?}"
            );
        }
    }
}
