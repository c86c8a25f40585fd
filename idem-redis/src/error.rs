//! Errors: building a store, and the one mapping from Redis errors to
//! [`StoreError`].

use idem_core::store::StoreError;
use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::config::PrefixError;

/// The backend name carried by every [`StoreError`] this crate returns.
pub(crate) const BACKEND: &str = "redis";

/// Why a [`RedisStore`](crate::RedisStore) could not be built. Converts into
/// [`StoreError`] and [`idem_core::Error`], so `?` works in a `main`
/// returning either.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The key prefix was refused.
    #[error(transparent)]
    Prefix(#[from] PrefixError),
    /// Redis refused the URL or could not be reached.
    #[error("cannot connect to redis")]
    Connect(#[from] RedisError),
}

impl From<Error> for StoreError {
    fn from(e: Error) -> Self {
        match e {
            Error::Connect(e) => store_error(e),
            prefix @ Error::Prefix(_) => StoreError::Backend {
                backend: BACKEND,
                source: Box::new(prefix),
            },
        }
    }
}

impl From<Error> for idem_core::Error {
    fn from(e: Error) -> Self {
        StoreError::from(e).into()
    }
}

/// The one place that decides what a Redis failure means to the engine.
///
/// * lost, refused or timed-out connections, a cluster that is down, moving
///   or has no node for the slot, a server still loading its data or a
///   primary turned replica: [`StoreError::Unavailable`] (temporary);
/// * `WRONGTYPE` (a key of ours holding another type: written by hand, by
///   something else, or by a build before 0.1): [`StoreError::Corrupt`];
/// * anything else: [`StoreError::Backend`].
pub(crate) fn store_error(e: RedisError) -> StoreError {
    let unavailable = e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_cluster_error()
        || matches!(
            e.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                        | ServerErrorKind::TryAgain
                )
        );
    if unavailable {
        return StoreError::Unavailable {
            backend: BACKEND,
            source: Box::new(e),
        };
    }
    if e.code() == Some("WRONGTYPE") {
        return corrupt(format!("{WRONG_TYPE} ({e})"));
    }
    if e.code() == Some("IDEMCORRUPT") {
        return corrupt(format!("a script refused the record ({e})"));
    }
    StoreError::Backend {
        backend: BACKEND,
        source: Box::new(e),
    }
}

/// A `WRONGTYPE` reply's [`StoreError::Corrupt`] detail: a key of the record
/// holds another type. Nothing but this layout is read (a record written by
/// a build before 0.1 is such a key): the record is refused, never guessed.
const WRONG_TYPE: &str = "a key of the record holds another type: written by hand, by \
     something else, or by a build of idem before 0.1, whose layout is not read; delete \
     the key or let it expire";

/// A record that cannot be decoded.
pub(crate) fn corrupt(detail: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        backend: BACKEND,
        detail: detail.into(),
    }
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    #[test]
    fn connection_failures_are_unavailable_and_the_rest_backend() {
        for kind in [
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::TimedOut,
            io::ErrorKind::ConnectionRefused,
        ] {
            let e = store_error(RedisError::from(io::Error::from(kind)));
            assert!(
                matches!(
                    e,
                    StoreError::Unavailable {
                        backend: "redis",
                        ..
                    }
                ),
                "{kind:?}: {e:?}"
            );
        }
        for kind in [
            ServerErrorKind::ClusterDown,
            ServerErrorKind::TryAgain,
            ServerErrorKind::BusyLoading,
        ] {
            let e = store_error(RedisError::from((ErrorKind::Server(kind), "test")));
            assert!(
                matches!(e, StoreError::Unavailable { .. }),
                "{kind:?}: {e:?}"
            );
        }
        let e = store_error(RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "ERR oops",
        )));
        assert!(
            matches!(
                e,
                StoreError::Backend {
                    backend: "redis",
                    ..
                }
            ),
            "{e:?}"
        );
        let e = store_error(RedisError::from((ErrorKind::UnexpectedReturnType, "odd")));
        assert!(matches!(e, StoreError::Backend { .. }), "{e:?}");
    }
}
