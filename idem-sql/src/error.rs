//! What a driver error means, once for every SQL store: for the call
//! ([`classify`], then [`to_store_error`]) and for the connection it ran on
//! ([`leaves_connection_sound`]). A dialect says only which of its server's
//! errors are which.

use idem_core::store::StoreError;

use crate::pool::ConnectionError;

/// What a driver error is, for the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A retry may succeed (HTTP 503): the server could not be reached or
    /// refused for now.
    Unavailable,
    /// A stored row cannot be decoded (permanent until repaired).
    Corrupt,
    /// Anything else (a permanent backend failure).
    Backend,
}

/// Classifies a driver error: decoding is [`Class::Corrupt`]; the
/// connection failing (I/O, TLS, protocol, the pool timing out or closed, a
/// crashed worker) is [`Class::Unavailable`], and so is a server error that
/// `unavailable` says a retry may get past (a shutdown, a read-only server,
/// a deadlock...); the rest is [`Class::Backend`].
pub fn classify(e: &sqlx::Error, unavailable: impl FnOnce(&sqlx::Error) -> bool) -> Class {
    match e {
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::TypeNotFound { .. } => Class::Corrupt,
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => Class::Unavailable,
        sqlx::Error::Database(_) if unavailable(e) => Class::Unavailable,
        _ => Class::Backend,
    }
}

/// The [`StoreError`] of `source` (a store's error) as `class` says, on
/// behalf of `backend`.
pub fn to_store_error<E>(backend: &'static str, class: Class, source: E) -> StoreError
where
    E: std::error::Error + Send + Sync + 'static,
{
    match class {
        Class::Unavailable => StoreError::Unavailable {
            backend,
            source: Box::new(source),
        },
        Class::Corrupt => StoreError::Corrupt {
            backend,
            detail: source.to_string(),
        },
        Class::Backend => StoreError::Backend {
            backend,
            source: Box::new(source),
        },
    }
}

/// A statement guarded by the fencing token: one row changed (or matched)
/// means the token held; none means the lease is lost (or the record is
/// gone, or no longer in flight).
///
/// # Errors
///
/// [`StoreError::LeaseLost`] unless exactly one row changed.
pub fn fenced(rows: u64) -> Result<(), StoreError> {
    if rows == 1 {
        Ok(())
    } else {
        Err(StoreError::LeaseLost)
    }
}

/// Whether the connection a driver error came from is still sound (see
/// [`ConnectionError`]): a server error is an answer unless `ends_session`
/// says the server ends the session after it (a shutdown, a `KILL`, a
/// connection exception); decoding reads rows a statement already returned
/// in full; anything else may have left the connection out of step.
pub fn leaves_connection_sound(
    e: &sqlx::Error,
    ends_session: impl FnOnce(&sqlx::Error) -> bool,
) -> bool {
    match e {
        sqlx::Error::Database(_) => !ends_session(e),
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::TypeNotFound { .. } => true,
        e => e.leaves_connection_sound(),
    }
}

/// Declares a SQL backend's `Error`: the variants every SQL backend has
/// (a refused identifier, the driver's error, a table of another layout),
/// then the backend's own, and its conversion into [`idem_core::Error`]
/// (through its `From<Error> for StoreError`, which the backend writes).
///
/// With `corrupt;` first among the backend's variants it also has
/// `Corrupt { detail }` (a stored row that cannot be decoded), the
/// conversion from [`RowError`](crate::RowError), and a conversion into
/// [`StoreError`] that answers [`StoreError::Corrupt`] for it and, for the
/// rest, [`to_store_error`] with the [`Class`] the backend's function
/// `class_of(&Error) -> Class` names. The expansion names `thiserror` and
/// `BACKEND` (the backend's name) as the calling crate has them.
#[macro_export]
macro_rules! sql_error {
    (
        $(#[$meta:meta])*
        pub enum Error {
            corrupt;
            classified by $class_of:path;
            $($variants:tt)*
        }
    ) => {
        $crate::sql_error! {
            $(#[$meta])*
            pub enum Error {
                /// A stored row cannot be decoded into a record (unknown
                /// state, a fingerprint that is not 32 bytes, ...).
                /// Permanent until repaired.
                #[error("corrupted record: {detail}")]
                Corrupt {
                    /// What is wrong with it (never the key or the body).
                    detail: String,
                },
                $($variants)*
            }
        }

        impl ::core::convert::From<Error> for $crate::__private::StoreError {
            fn from(e: Error) -> Self {
                if let Error::Corrupt { detail } = e {
                    return Self::Corrupt {
                        backend: BACKEND,
                        detail,
                    };
                }
                let class = $class_of(&e);
                $crate::to_store_error(BACKEND, class, e)
            }
        }

        impl ::core::convert::From<$crate::RowError> for Error {
            fn from(e: $crate::RowError) -> Self {
                match e {
                    $crate::RowError::Sqlx(e) => Self::Sqlx(e),
                    $crate::RowError::Corrupt(detail) => Self::Corrupt { detail },
                }
            }
        }
    };
    (
        $(#[$meta:meta])*
        pub enum Error {
            $($variants:tt)*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, thiserror::Error)]
        #[non_exhaustive]
        pub enum Error {
            /// A configured name (the table's; on PostgreSQL, the schema's
            /// too) is not a plain SQL identifier. Permanent: fix the
            /// configuration.
            #[error("invalid {what} name: {reason}")]
            InvalidIdentifier {
                /// What was named: `"table"` (or `"schema"`).
                what: &'static str,
                /// Why it was refused.
                reason: &'static str,
            },
            /// The driver failed (connection, query, decoding; for SQLite,
            /// the file cannot be opened). Temporary or permanent depending
            /// on the cause (the conversion into `StoreError` classifies
            /// it).
            #[error(transparent)]
            Sqlx(#[from] $crate::__private::sqlx::Error),
            /// The table exists but was not written in the layout this build
            /// reads and writes ([`idem_sql::LAYOUT`]): a build before 0.1, a
            /// later layout, or a table of something else. Refused by
            /// `migrate`, never read. Permanent: point the store at a new
            /// table.
            #[error(transparent)]
            Layout(#[from] $crate::LayoutError),
            $($variants)*
        }

        impl ::core::convert::From<Error> for $crate::__private::CoreError {
            fn from(e: Error) -> Self {
                $crate::__private::StoreError::from(e).into()
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend's error as [`sql_error!`](crate::sql_error) declares it.
    mod backend {
        use crate::Class;

        const BACKEND: &str = "test";

        fn class_of(e: &Error) -> Class {
            match e {
                Error::Sqlx(_) => Class::Unavailable,
                _ => Class::Backend,
            }
        }

        crate::sql_error! {
            /// A backend's error.
            pub enum Error {
                corrupt;
                classified by class_of;
            }
        }
    }

    #[test]
    fn declared_errors_convert() {
        use backend::Error;
        let corrupt = StoreError::from(Error::Corrupt { detail: "x".into() });
        assert!(
            matches!(&corrupt, StoreError::Corrupt { backend: "test", detail } if detail == "x"),
            "{corrupt:?}"
        );
        let row = Error::from(crate::RowError::Corrupt("y".into()));
        assert!(matches!(&row, Error::Corrupt { detail } if detail == "y"));
        let row = Error::from(crate::RowError::Sqlx(sqlx::Error::PoolTimedOut));
        assert!(matches!(
            StoreError::from(row),
            StoreError::Unavailable { .. }
        ));
        let refused = Error::InvalidIdentifier {
            what: "table",
            reason: "too long",
        };
        assert_eq!(refused.to_string(), "invalid table name: too long");
        assert!(matches!(
            StoreError::from(refused),
            StoreError::Backend { .. }
        ));
    }

    #[test]
    fn driver_errors_are_classified() {
        let never = |_: &sqlx::Error| false;
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(classify(&io, never), Class::Unavailable);
        assert_eq!(
            classify(&sqlx::Error::PoolTimedOut, never),
            Class::Unavailable
        );
        assert_eq!(
            classify(&sqlx::Error::Decode("bad".into()), never),
            Class::Corrupt
        );
        assert_eq!(classify(&sqlx::Error::RowNotFound, never), Class::Backend);
        assert!(!leaves_connection_sound(&io, never));
        assert!(leaves_connection_sound(
            &sqlx::Error::Decode("bad".into()),
            never
        ));
        assert!(leaves_connection_sound(&sqlx::Error::RowNotFound, never));
    }
}
