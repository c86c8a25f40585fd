//! This backend's errors, and the one place that maps them onto
//! [`idem_core::store::StoreError`].

use idem_sql::Class;
use sqlx::mysql::MySqlDatabaseError;

/// The backend's name in [`StoreError`](idem_core::store::StoreError)s.
pub(crate) const BACKEND: &str = "mysql";

idem_sql::sql_error! {
    /// An error of the MySQL / MariaDB backend.
    pub enum Error {
        corrupt;
        classified by class_of;
        /// The claim kept losing races with concurrent writers on the same
        /// record (deadlocks, duplicate keys, a record changed between the
        /// read and the takeover) and gave up after a bounded number of
        /// tries. Temporary.
        #[error("the claim lost {tries} races in a row on one record")]
        ClaimContention {
            /// How many times the claim was run.
            tries: u32,
        },
    }
}

/// Server error numbers.
pub(crate) mod code {
    /// `ER_DUP_ENTRY`: a unique key already holds the value.
    pub(crate) const DUP_ENTRY: u16 = 1062;
    /// `ER_LOCK_WAIT_TIMEOUT`: `innodb_lock_wait_timeout` expired (only the
    /// statement is rolled back).
    pub(crate) const LOCK_WAIT_TIMEOUT: u16 = 1205;
    /// `ER_LOCK_DEADLOCK`: InnoDB chose this transaction as the deadlock
    /// victim and rolled all of it back.
    pub(crate) const DEADLOCK: u16 = 1213;
}

/// Error numbers that mean "the server or the connection went away, the
/// call was interrupted or timed out, or it lost a lock": the call may
/// succeed if retried.
fn is_unavailable_number(n: u16) -> bool {
    matches!(
        n,
        code::LOCK_WAIT_TIMEOUT
            | code::DEADLOCK
            | 1040 // ER_CON_COUNT_ERROR: too many connections
            | 1047 // ER_UNKNOWN_COM_ERROR: a Galera node outside the primary component
            | 1290 // ER_OPTION_PREVENTS_STATEMENT: `read_only` (a replica, or a demoted primary)
            | 1792 // ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION
            | 1053 // ER_SERVER_SHUTDOWN
            | 1203 // ER_TOO_MANY_USER_CONNECTIONS
            | 1317 // ER_QUERY_INTERRUPTED (KILL QUERY)
            | 1927 // ER_CONNECTION_KILLED (MariaDB: KILL)
            | 1969 // ER_STATEMENT_TIMEOUT (MariaDB max_statement_time)
            | 3024 // ER_QUERY_TIMEOUT (MySQL max_execution_time)
            | 4031 // ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8.0.24+)
    )
}

/// The server's error number of a driver error, if it is one.
pub(crate) fn number(e: &sqlx::Error) -> Option<u16> {
    match e {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(MySqlDatabaseError::number),
        _ => None,
    }
}

fn is_unavailable_database(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = e else {
        return false;
    };
    number(e).is_some_and(is_unavailable_number)
        || db
            .code()
            .is_some_and(|state| state.starts_with("08") || state == "40001")
}

/// What an error is, for the engine.
fn class_of(e: &Error) -> Class {
    match e {
        Error::Sqlx(s) => idem_sql::classify(s, is_unavailable_database),
        Error::ClaimContention { .. } => Class::Unavailable,
        _ => Class::Backend,
    }
}

#[cfg(test)]
mod tests {
    use idem_core::store::StoreError;

    use super::*;

    #[test]
    fn mapping_classifies_driver_errors() {
        // The driver's own errors are classified by `idem_sql::classify`,
        // a corrupt row by `idem_sql::sql_error!` (tested there); here, this
        // backend's.
        assert!(matches!(
            StoreError::from(Error::ClaimContention { tries: 8 }),
            StoreError::Unavailable { .. }
        ));
        assert!(is_unavailable_number(1213));
        assert!(is_unavailable_number(1927));
        // A read-only server or a Galera node cut off from its quorum: the
        // same call succeeds against the new primary after a failover.
        assert!(is_unavailable_number(1290));
        assert!(is_unavailable_number(1792));
        assert!(is_unavailable_number(1047));
        assert!(!is_unavailable_number(1062));
        assert!(!is_unavailable_number(1146)); // no such table
    }
}
