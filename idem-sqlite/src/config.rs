//! Configuration: the defaults of a file database and the validation of
//! table names.

use std::time::Duration;

use crate::Error;

/// How long a writer waits for SQLite's write lock before giving up
/// (then the call fails with a retryable store error).
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections in the pool of a file database (readers run in parallel under
/// WAL; writers queue on SQLite's single write lock).
pub const DEFAULT_MAX_CONNECTIONS: u32 = 8;

/// The table a store uses unless told otherwise
/// ([`SqliteStore::with_table_name`](crate::SqliteStore::with_table_name)).
pub const DEFAULT_TABLE: &str = "idem_records";

/// Longest accepted table name, in bytes. SQLite itself has no practical
/// limit; this one keeps the names in `sqlite_master` (the table's and its
/// primary key's, `sqlite_autoindex_<table>_1`) readable.
pub const MAX_TABLE_NAME_LEN: usize = 64;

/// Accepts `[A-Za-z_][A-Za-z0-9_]*` up to [`MAX_TABLE_NAME_LEN`] bytes, not
/// starting with `sqlite_` (reserved by SQLite): nothing that needs quoting
/// or escaping, so the name can be spliced into the statements. SQLite
/// compares identifiers without regard to ASCII case, so `Idem` and `idem`
/// name the same table.
pub(crate) fn validate_table_name(name: &str) -> Result<String, Error> {
    let invalid = |reason| Error::InvalidIdentifier {
        what: "table",
        reason,
    };
    idem_sql::check_identifier(name, MAX_TABLE_NAME_LEN).map_err(invalid)?;
    if name
        .get(..7)
        .is_some_and(|p| p.eq_ignore_ascii_case("sqlite_"))
    {
        return Err(invalid("the sqlite_ prefix is reserved by SQLite"));
    }
    Ok(name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_validated() {
        for ok in [
            "idem_records",
            "_t",
            "T1",
            "sqlite",
            "a".repeat(64).as_str(),
        ] {
            assert_eq!(validate_table_name(ok).ok().as_deref(), Some(ok));
        }
        // The plain-identifier rule itself is `idem_sql::check_identifier`'s
        // (tested there); here, that it applies, and the reserved prefix in
        // any case.
        for bad in [
            "",
            "x\"; DROP TABLE y; --",
            "sqlite_master",
            "SQLite_x",
            "a".repeat(65).as_str(),
        ] {
            assert!(
                matches!(
                    validate_table_name(bad),
                    Err(Error::InvalidIdentifier { what: "table", .. })
                ),
                "{bad:?}"
            );
        }
    }
}
