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

#[cfg(test)]
mod tests {
    use super::*;

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
