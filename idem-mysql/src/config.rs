//! Configuration: defaults, the server flavour, and the validation of table
//! names.

use std::time::Duration;

use crate::error::Error;

/// The table a store uses unless
/// [`MySqlStore::with_table_name`](crate::MySqlStore::with_table_name) says
/// otherwise.
pub const DEFAULT_TABLE: &str = "idem_records";
/// Longest accepted table name. MySQL keeps 64 characters of an identifier
/// and names a table's unnamed `CHECK` constraints `<table>_chk_<n>` in a
/// schema-wide namespace, so the name leaves room for that suffix.
pub const MAX_TABLE_NAME_LEN: usize = 48;
/// The default lock wait of the transactional mode (whole seconds on the
/// server: `innodb_lock_wait_timeout` has no finer unit).
pub const DEFAULT_TX_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// Which server the store talks to, which decides the claim statement.
///
/// Detected at construction from `SELECT VERSION()` (MariaDB reports
/// `…-MariaDB…`); override it with
/// [`MySqlStore::with_server`](crate::MySqlStore::with_server).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Server {
    /// MariaDB 10.5 or later: the claim is one `INSERT … ON DUPLICATE KEY
    /// UPDATE … RETURNING` (insert or read in one round trip).
    MariaDb,
    /// MySQL 8.0 or later (and anything else speaking its protocol): no
    /// `RETURNING`, so the claim is a plain `INSERT`, followed by a
    /// `SELECT` when the key exists.
    MySql,
}

impl Server {
    /// The flavour of a server from its `VERSION()` string.
    #[must_use]
    pub fn from_version(version: &str) -> Self {
        if version.to_ascii_lowercase().contains("mariadb") {
            Self::MariaDb
        } else {
            Self::MySql
        }
    }
}

/// Accepts `[A-Za-z_][A-Za-z0-9_]*` up to `max` bytes: no quoting tricks,
/// no `;`, nothing that needs escaping. The name is used quoted with
/// backticks, and table names are case-sensitive on most servers (as given).
pub(crate) fn validate_identifier(
    what: &'static str,
    name: &str,
    max: usize,
) -> Result<String, Error> {
    idem_sql::check_identifier(name, max)
        .map_err(|reason| Error::InvalidIdentifier { what, reason })?;
    Ok(name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_validated() {
        for ok in ["idem_records", "_t", "T1", "a".repeat(48).as_str()] {
            assert!(
                validate_identifier("table", ok, MAX_TABLE_NAME_LEN).is_ok(),
                "{ok}"
            );
        }
        // The plain-identifier rule itself is `idem_sql::check_identifier`'s
        // (tested there); here, that it applies.
        for bad in ["", "x`; DROP TABLE y; --", "a".repeat(49).as_str()] {
            assert!(
                matches!(
                    validate_identifier("table", bad, MAX_TABLE_NAME_LEN),
                    Err(Error::InvalidIdentifier { what: "table", .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn server_flavour_from_version() {
        assert_eq!(
            Server::from_version("10.11.19-MariaDB-0+deb12u1"),
            Server::MariaDb
        );
        assert_eq!(
            Server::from_version("5.5.5-10.6.12-MariaDB"),
            Server::MariaDb
        );
        assert_eq!(Server::from_version("8.0.36"), Server::MySql);
        assert_eq!(Server::from_version("8.4.0-commercial"), Server::MySql);
    }
}
