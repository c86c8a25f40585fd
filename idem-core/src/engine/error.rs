//! The rejections and failures `Idem::execute` can return, each with its
//! class, HTTP status and retry advice (the HTTP rendering itself is the
//! adapter's).

use std::time::Duration;

use crate::error::{KeyError, RequestError, ScopeError};
use crate::store::StoreError;
use crate::wire::ProblemCode;

/// How long to wait after a lost lease or an unavailable store.
pub(crate) const RETRY_SOON: Duration = Duration::from_secs(1);

/// Everything `execute` can refuse or fail with. Every variant says whether a
/// retry can help ([`Error::is_retryable`]) and what HTTP status it maps to.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The idempotency key is invalid (400). Permanent: fix the key.
    #[error(transparent)]
    InvalidKey(#[from] KeyError),
    /// The owner or operation is invalid (400). Permanent.
    #[error(transparent)]
    InvalidScope(#[from] ScopeError),
    /// The request cannot be fingerprinted (400). Permanent.
    #[error(transparent)]
    InvalidRequest(#[from] RequestError),
    /// A listing cursor that the store did not write (400): an operator's
    /// input, mistyped or from another backend. Permanent.
    #[error("the cursor is not one this store wrote")]
    InvalidCursor,
    /// The key was used with another request (422). Permanent: the stored
    /// record is untouched and the work did not run.
    #[error("this idempotency key was already used with a different request")]
    FingerprintMismatch,
    /// The first attempt is still running (409 + `Retry-After`). Temporary.
    #[error("a request with this idempotency key is still in progress")]
    InFlight {
        /// How long until the first attempt's lease ends (at least 1 s).
        retry_after: Duration,
    },
    /// The operation is done but its response was dropped after
    /// `response_ttl`; the key is still known (409). Permanent.
    #[error("this request was already processed; its response is no longer stored")]
    ResponseExpired {
        /// The resource the first attempt created, if it recorded one.
        resource_id: Option<String>,
    },
    /// The operation is done but its response was not stored because it was
    /// larger than `max_response_bytes` or could not be encoded (409).
    /// Permanent: raise the limit for future keys.
    #[error(
        "this request was already processed, but its response was not stored (larger than max_response_bytes, or not encodable)"
    )]
    ResponseNotStored {
        /// The resource the first attempt created, if it recorded one.
        resource_id: Option<String>,
    },
    /// This attempt's lease was taken over by a newer attempt, so it can no
    /// longer complete, save a resource id or release (409 + `Retry-After`). Temporary:
    /// the newer attempt's outcome will be replayed.
    #[error("the lease on this idempotency key was taken over by a newer attempt")]
    LeaseLost {
        /// When to ask again.
        retry_after: Duration,
    },
    /// The store failed. [`StoreError::Unavailable`] (unreachable, timed
    /// out, contended) is temporary: 503 + `Retry-After`. Any other store
    /// error ([`StoreError::Backend`]) is not: 500, not retried.
    #[error("idempotency store failure")]
    Store(#[source] StoreError),
    /// A stored record cannot be decoded (500). Permanent until repaired;
    /// the work is not run.
    #[error("stored idempotency record is corrupted: {detail}")]
    CorruptRecord {
        /// What is wrong (never the body or the key).
        detail: String,
    },
}

/// The class of an [`Error`], for callers that map errors themselves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Key, scope or request invalid (400).
    BadRequest,
    /// Same key, other request (422).
    Mismatch,
    /// Conflict with another attempt or an already-finished operation (409).
    Conflict,
    /// The store is down or failing (503).
    Unavailable,
    /// Corrupted data (500).
    Internal,
}

impl Error {
    /// The class of this error.
    #[must_use]
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::InvalidKey(_)
            | Self::InvalidScope(_)
            | Self::InvalidRequest(_)
            | Self::InvalidCursor => ErrorKind::BadRequest,
            Self::FingerprintMismatch => ErrorKind::Mismatch,
            Self::InFlight { .. }
            | Self::ResponseExpired { .. }
            | Self::ResponseNotStored { .. }
            | Self::LeaseLost { .. } => ErrorKind::Conflict,
            Self::Store(e) if e.is_retryable() => ErrorKind::Unavailable,
            Self::Store(_) | Self::CorruptRecord { .. } => ErrorKind::Internal,
        }
    }

    /// The HTTP status an adapter should answer with.
    ///
    /// ```
    /// use idem_core::Error;
    /// use std::time::Duration;
    ///
    /// let e = Error::InFlight { retry_after: Duration::from_secs(3) };
    /// assert_eq!(e.http_status(), 409);
    /// assert_eq!(e.retry_after(), Some(Duration::from_secs(3)));
    /// assert_eq!(Error::FingerprintMismatch.http_status(), 422);
    /// ```
    #[must_use]
    pub fn http_status(&self) -> u16 {
        match self.kind() {
            ErrorKind::BadRequest => 400,
            ErrorKind::Mismatch => 422,
            ErrorKind::Conflict => 409,
            ErrorKind::Unavailable => 503,
            ErrorKind::Internal => 500,
        }
    }

    /// The `Retry-After` to send, where one applies (in flight, lease lost,
    /// store unavailable).
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::InFlight { retry_after } | Self::LeaseLost { retry_after } => Some(*retry_after),
            Self::Store(e) if e.is_retryable() => Some(RETRY_SOON),
            _ => None,
        }
    }

    /// Whether the same request may succeed if sent again later.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        self.retry_after().is_some()
    }

    /// A short, stable code for this error (`invalid_key`, `in_flight`, ...),
    /// safe to log, match on or use as a metrics label.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            // Finer than the wire's code (`invalid_request`, `store_error`):
            // neither reaches an adapter.
            Self::InvalidScope(_) => "invalid_scope",
            Self::InvalidCursor => "invalid_cursor",
            e => ProblemCode::of_error(e).as_str(),
        }
    }

    /// The resource id carried by "already done" conflicts.
    #[must_use]
    pub fn resource_id(&self) -> Option<&str> {
        match self {
            Self::ResponseExpired { resource_id } | Self::ResponseNotStored { resource_id } => {
                resource_id.as_deref()
            }
            _ => None,
        }
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::LeaseLost => Self::LeaseLost {
                retry_after: RETRY_SOON,
            },
            StoreError::InvalidCursor => Self::InvalidCursor,
            StoreError::Corrupt { backend, detail } => Self::CorruptRecord {
                detail: format!("{backend}: {detail}"),
            },
            other => Self::Store(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rejection_maps_to_its_status() {
        let s = Duration::from_secs(2);
        let cases: Vec<(Error, u16, Option<Duration>)> = vec![
            (Error::InvalidKey(KeyError::Empty), 400, None),
            (Error::InvalidCursor, 400, None),
            (Error::FingerprintMismatch, 422, None),
            (Error::InFlight { retry_after: s }, 409, Some(s)),
            (Error::ResponseExpired { resource_id: None }, 409, None),
            (Error::ResponseNotStored { resource_id: None }, 409, None),
            (Error::LeaseLost { retry_after: s }, 409, Some(s)),
            (
                Error::Store(StoreError::Unavailable {
                    backend: "x",
                    source: "down".into(),
                }),
                503,
                Some(Duration::from_secs(1)),
            ),
            (
                Error::Store(StoreError::Backend {
                    backend: "x",
                    source: "relation does not exist".into(),
                }),
                500,
                None,
            ),
            (
                Error::CorruptRecord {
                    detail: "bad".into(),
                },
                500,
                None,
            ),
        ];
        for (e, status, retry) in cases {
            assert_eq!(e.http_status(), status, "{e:?}");
            assert_eq!(e.retry_after(), retry, "{e:?}");
            assert_eq!(e.is_retryable(), retry.is_some(), "{e:?}");
        }
    }

    #[test]
    fn a_bad_cursor_is_the_callers_input_not_a_store_failure() {
        let e = Error::from(StoreError::from(crate::store::CursorError));
        assert!(matches!(e, Error::InvalidCursor), "{e:?}");
        assert_eq!(e.http_status(), 400);
        assert_eq!(e.code(), "invalid_cursor");
        assert!(!e.is_retryable());
    }

    #[test]
    fn store_errors_map_to_engine_errors() {
        assert!(matches!(
            Error::from(StoreError::LeaseLost),
            Error::LeaseLost { .. }
        ));
        assert!(matches!(
            Error::from(StoreError::Corrupt {
                backend: "x",
                detail: "d".into()
            }),
            Error::CorruptRecord { .. }
        ));
    }
}
