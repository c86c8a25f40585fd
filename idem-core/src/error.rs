//! The rejections and failures `Idem::execute` can return, with their HTTP mapping.

use std::time::Duration;

use crate::fingerprint::RequestError;
use crate::key::KeyError;
use crate::scope::ScopeError;
use crate::store::StoreError;

/// Whole seconds for a `Retry-After` header: rounded up, at least 1.
pub(crate) fn retry_after_secs(d: Duration) -> u64 {
    u64::try_from(d.as_millis().div_ceil(1000))
        .unwrap_or(u64::MAX)
        .max(1)
}

/// How long to wait after a lost lease or an unavailable store.
pub(crate) const RETRY_SOON: Duration = Duration::from_secs(1);

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

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
            Self::InvalidKey(_) | Self::InvalidScope(_) | Self::InvalidRequest(_) => {
                ErrorKind::BadRequest
            }
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

    /// A short, stable code for this error (`missing_key`, `invalid_key`,
    /// `in_flight`, ...), used as the problem type and safe to log or match
    /// on. A key that is absent ([`KeyError::Missing`]) is `missing_key`, as
    /// the HTTP adapter answers it; any other bad key is `invalid_key`.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidKey(KeyError::Missing) => "missing_key",
            Self::InvalidKey(_) => "invalid_key",
            Self::InvalidScope(_) => "invalid_scope",
            Self::InvalidRequest(_) => "invalid_request",
            Self::FingerprintMismatch => "fingerprint_mismatch",
            Self::InFlight { .. } => "in_flight",
            Self::ResponseExpired { .. } => "response_expired",
            Self::ResponseNotStored { .. } => "response_not_stored",
            Self::LeaseLost { .. } => "lease_lost",
            Self::Store(e) if e.is_retryable() => "store_unavailable",
            Self::Store(_) => "store_error",
            Self::CorruptRecord { .. } => "corrupt_record",
        }
    }

    /// An RFC 9457 `application/problem+json` body for this error, with the
    /// resource id and retry delay as extension members where they apply.
    /// Store and corruption details are not included (they stay in logs).
    ///
    /// ```
    /// use idem_core::Error;
    ///
    /// let e = Error::ResponseExpired { resource_id: Some("ch_1".into()) };
    /// let body: serde_json::Value = serde_json::from_str(&e.problem_json()).unwrap();
    /// assert_eq!(body["status"], 409);
    /// assert_eq!(body["resource_id"], "ch_1");
    /// assert_eq!(body["type"], "urn:idem:problem:response_expired");
    /// ```
    #[must_use]
    pub fn problem_json(&self) -> String {
        let detail = match self.kind() {
            ErrorKind::Unavailable | ErrorKind::Internal => self.code().replace('_', " "),
            _ => self.to_string(),
        };
        let mut body = serde_json::json!({
            "type": format!("urn:idem:problem:{}", self.code()),
            "title": self.code().replace('_', " "),
            "status": self.http_status(),
            "detail": detail,
        });
        if let Some(rid) = self.resource_id() {
            body["resource_id"] = rid.into();
        }
        if let Some(d) = self.retry_after() {
            body["retry_after"] = retry_after_secs(d).into();
        }
        body.to_string()
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
            (Error::InvalidKey(KeyError::Missing), 400, None),
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
            let body: serde_json::Value = serde_json::from_str(&e.problem_json()).unwrap();
            assert_eq!(body["status"], status);
        }
    }

    #[test]
    fn a_missing_key_is_missing_key_not_invalid_key() {
        let missing = Error::InvalidKey(KeyError::Missing);
        assert_eq!(missing.code(), "missing_key");
        let body: serde_json::Value = serde_json::from_str(&missing.problem_json()).unwrap();
        assert_eq!(body["type"], "urn:idem:problem:missing_key");
        assert_eq!(body["status"], 400);
        let from_header = crate::IdempotencyKey::from_header(None).map_err(Error::from);
        assert_eq!(from_header.map_err(|e| e.code()), Err("missing_key"));
        for other in [KeyError::Empty, KeyError::TooLong { len: 300 }] {
            assert_eq!(Error::InvalidKey(other).code(), "invalid_key");
        }
    }

    #[test]
    fn problem_json_never_leaks_store_details() {
        let e = Error::Store(StoreError::Backend {
            backend: "pg",
            source: "password=hunter2".into(),
        });
        assert!(!e.problem_json().contains("hunter2"));
        let e = Error::CorruptRecord {
            detail: "secret-key-xyz".into(),
        };
        assert!(!e.problem_json().contains("secret"));
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
