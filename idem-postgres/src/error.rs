//! This backend's errors, and the one place that maps them onto
//! [`idem_core::store::StoreError`].

use idem_core::store::StoreError;
use idem_sql::Class;

/// The backend's name in [`StoreError`]s.
pub(crate) const BACKEND: &str = "postgres";

idem_sql::sql_error! {
    /// An error of the PostgreSQL backend.
    pub enum Error {
        corrupt;
        classified by class_of;
        /// The server is a standby in recovery (read-only): the store was
        /// pointed at a replica, or at a host that is being demoted or not yet
        /// promoted. At start ([`PgStore::connect`](crate::PgStore::connect),
        /// [`PgStore::migrate`](crate::PgStore::migrate),
        /// [`PgStore::check_replication`](crate::PgStore::check_replication)) it
        /// is permanent: fix the URL. Met by a call after a connection failed
        /// (during a failover) it is temporary, and the call answers
        /// [`StoreError::Unavailable`] (503): no write is attempted.
        #[error(
            "the PostgreSQL server is a standby in recovery (read-only): point the store at the primary"
        )]
        Standby,
        /// The store was built with
        /// [`PgStore::require_synchronous_replication`](crate::PgStore::require_synchronous_replication)
        /// and the server's commits do not wait for any standby. At start it is
        /// permanent until the deployment is fixed; met by a call after a
        /// connection failed (a failover to a server without a synchronous
        /// standby) it is [`StoreError::Unavailable`] (503), and every write is
        /// refused until a check passes again.
        #[error(
            "commits are not synchronous to any standby (synchronous_commit = {synchronous_commit}, \
             synchronous_standby_names = {synchronous_standby_names:?}) and the store requires \
             synchronous replication"
        )]
        NotSynchronous {
            /// `synchronous_commit` as the server reported it.
            synchronous_commit: String,
            /// `synchronous_standby_names` as the server reported it.
            synchronous_standby_names: String,
        },
        /// A write did not finish within
        /// [`PgStore::with_call_timeout`](crate::PgStore::with_call_timeout):
        /// typically a commit waiting for a synchronous standby that does not
        /// answer. Temporary ([`StoreError::Unavailable`], 503); the write was
        /// not reported stored, and may still commit once a standby confirms it.
        #[error("the call did not finish within {after:?} (a commit waiting for a standby?)")]
        Timeout {
            /// The configured bound.
            after: std::time::Duration,
        },
        /// The claim kept losing races with concurrent writers on the same
        /// record and gave up after a bounded number of tries. Temporary.
        #[error("the claim lost {tries} races in a row on one record")]
        ClaimContention {
            /// How many times the statement was run.
            tries: u32,
        },
    }
}

/// SQLSTATEs that mean "the server or the connection went away, or the call
/// timed out": the call may succeed if retried.
fn is_unavailable_state(code: &str) -> bool {
    code.starts_with("08") // connection exception
        || matches!(
            code,
            "57P01" // admin_shutdown (pg_terminate_backend, fast shutdown)
                | "57P02" // crash_shutdown
                | "57P03" // cannot_connect_now
                | "53300" // too_many_connections
                | "55P03" // lock_not_available (lock_timeout)
                | "57014" // query_canceled (statement_timeout)
                | "40001" // serialization_failure
                | "40P01" // deadlock_detected
                | "25006" // read_only_sql_transaction: a write reached a standby
                          // (a switchover under way, or a demoted primary)
        )
}

/// Whether a store error may mean that the server behind the pool changed
/// (a lost connection, a server shutting down or refusing connections, a
/// standby, or the replication check itself refusing): the store checks the
/// server again before its next call. Lock and statement timeouts,
/// serialization failures and deadlocks do not.
pub(crate) fn may_have_switched(e: &StoreError) -> bool {
    let StoreError::Unavailable { source, .. } = e else {
        return false;
    };
    match source.downcast_ref::<Error>() {
        Some(Error::Standby | Error::NotSynchronous { .. }) => true,
        Some(Error::Sqlx(sqlx::Error::Database(db))) => db.code().as_deref().is_some_and(|c| {
            c.starts_with("08") || matches!(c, "57P01" | "57P02" | "57P03" | "25006")
        }),
        Some(Error::Sqlx(
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed,
        )) => true,
        _ => false,
    }
}

/// Whether a database error is the `lock_timeout` expiring.
pub(crate) fn is_lock_timeout(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("55P03"))
}

/// What an error is, for the engine.
fn class_of(e: &Error) -> Class {
    match e {
        Error::Corrupt { .. } | Error::InvalidIdentifier { .. } | Error::Layout(_) => {
            Class::Backend
        }
        Error::Sqlx(s) => idem_sql::classify(
            s,
            |s| matches!(s, sqlx::Error::Database(db) if db.code().as_deref().is_some_and(is_unavailable_state)),
        ),
        Error::ClaimContention { .. }
        | Error::Standby
        | Error::NotSynchronous { .. }
        | Error::Timeout { .. } => Class::Unavailable,
    }
}

/// A driver error as a [`StoreError`].
#[cfg(test)]
fn store_error(e: sqlx::Error) -> StoreError {
    Error::Sqlx(e).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_classifies_driver_errors() {
        // The driver's own errors are classified by `idem_sql::classify`,
        // a corrupt row by `idem_sql::sql_error!` (tested there); here, this
        // backend's.
        assert!(is_unavailable_state("08006"));
        assert!(is_unavailable_state("57P01"));
        assert!(is_unavailable_state("25006"));
        assert!(matches!(
            StoreError::from(Error::Standby),
            StoreError::Unavailable { .. }
        ));
        let lost = Error::NotSynchronous {
            synchronous_commit: "on".into(),
            synchronous_standby_names: String::new(),
        };
        let lost = StoreError::from(lost);
        assert!(matches!(lost, StoreError::Unavailable { .. }));
        assert!(may_have_switched(&lost));
        assert!(may_have_switched(&store_error(sqlx::Error::PoolTimedOut)));
        let reset = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(may_have_switched(&store_error(reset)));
        let contention = StoreError::from(Error::ClaimContention { tries: 8 });
        assert!(!may_have_switched(&contention));
        assert!(!may_have_switched(&StoreError::LeaseLost));
        assert!(!is_unavailable_state("23505"));
    }
}
