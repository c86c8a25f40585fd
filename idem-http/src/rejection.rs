//! Everything the layer answers on its own, with its status, code and
//! `Retry-After`.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use idem_core::Error;

use crate::problem::Problem;
use idem_core::wire::KeyHeaderError;
use idem_core::wire::{ProblemCode, retry_after_secs};

/// Everything the layer answers on its own (rendered as
/// `application/problem+json`). The handler never ran for any of them,
/// except [`Rejection::HandlerPanicked`], [`Rejection::ResponseBodyFailed`]
/// and a [`Error::LeaseLost`] after the work.
#[derive(Debug)]
#[non_exhaustive]
pub enum Rejection {
    /// No key on a route that requires one (400 `missing_key`).
    MissingKey,
    /// The key field is malformed, or the layer's key validator refused
    /// the key (400 `invalid_key`).
    InvalidKey {
        /// Why.
        reason: KeyHeaderError,
        /// The received value (after unquoting when possible; lossy UTF-8).
        received: Option<String>,
        /// The key validator's own words, sent as the problem's `detail`
        /// ([`KeyHeaderError::RejectedByValidator`] only).
        message: Option<Cow<'static, str>>,
    },
    /// The owner cannot be determined (500 `owner_unavailable` by default):
    /// the owner source found none (the auth layer is missing or placed
    /// inside this one) or named one a record scope cannot hold (empty,
    /// over 1,024 bytes, a control character).
    OwnerUnavailable,
    /// The operation cannot be named as configured (500
    /// `operation_unavailable`): `OperationSource::MatchedPath` on a request
    /// that did not come through axum's router, or an
    /// [`OperationSource::Fn`](crate::OperationSource::Fn) name a record
    /// scope cannot hold.
    OperationUnavailable,
    /// The request path is too long to name the operation under
    /// [`OperationSource::Path`](crate::OperationSource::Path) (414
    /// `path_too_long`).
    PathTooLong {
        /// The longest operation name, in bytes (method, space and path).
        limit: usize,
    },
    /// The request body is over the limit (413 `request_too_large`).
    RequestTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The request body failed while being read (400 `request_body_unreadable`).
    RequestBodyUnreadable,
    /// The handler's response body failed while being read (500
    /// `response_body_failed`); the key was released.
    ResponseBodyFailed,
    /// The handler panicked (500 `handler_panicked`); the record stays in
    /// flight and the next attempt after the lease is a recovery.
    HandlerPanicked {
        /// The lease left.
        retry_after: Duration,
    },
    /// The layer is shutting down (503 `shutting_down`).
    ShuttingDown,
    /// The engine's answer: 422, the 409s, 503, 500.
    Engine(Error),
    /// Webhook receiver: the signature headers are missing or unparsable,
    /// or the verified body cannot be read for its event id (400
    /// `malformed_webhook`). Nothing was claimed.
    MalformedWebhook {
        /// Why, in words that never quote the secret, a signature or the body.
        reason: Cow<'static, str>,
    },
    /// Webhook receiver: no signature matches any configured secret (401
    /// `invalid_signature`). Nothing was claimed.
    InvalidSignature,
    /// Webhook receiver: the signed timestamp is further than the tolerance
    /// from now (401 `stale_webhook`). Nothing was claimed.
    StaleWebhook {
        /// The tolerance, either way.
        tolerance: Duration,
    },
    /// Webhook receiver: the delivery is verified but has no event id (400
    /// `missing_event_id`). Nothing was claimed.
    MissingEventId,
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail())
    }
}

impl std::error::Error for Rejection {}

impl From<Error> for Rejection {
    fn from(e: Error) -> Self {
        Self::Engine(e)
    }
}

impl Rejection {
    /// The stable problem code.
    #[must_use]
    pub fn code(&self) -> ProblemCode {
        match self {
            Self::MissingKey => ProblemCode::MissingKey,
            Self::InvalidKey { .. } => ProblemCode::InvalidKey,
            Self::OwnerUnavailable => ProblemCode::OwnerUnavailable,
            Self::OperationUnavailable => ProblemCode::OperationUnavailable,
            Self::PathTooLong { .. } => ProblemCode::PathTooLong,
            Self::RequestTooLarge { .. } => ProblemCode::RequestTooLarge,
            Self::RequestBodyUnreadable => ProblemCode::RequestBodyUnreadable,
            Self::ResponseBodyFailed => ProblemCode::ResponseBodyFailed,
            Self::HandlerPanicked { .. } => ProblemCode::HandlerPanicked,
            Self::ShuttingDown => ProblemCode::ShuttingDown,
            Self::Engine(e) => ProblemCode::of_error(e),
            Self::MalformedWebhook { .. } => ProblemCode::MalformedWebhook,
            Self::InvalidSignature => ProblemCode::InvalidSignature,
            Self::StaleWebhook { .. } => ProblemCode::StaleWebhook,
            Self::MissingEventId => ProblemCode::MissingEventId,
        }
    }

    /// The HTTP status (for `owner_unavailable`, the default 500; the layer
    /// may be configured otherwise).
    #[must_use]
    pub fn status(&self) -> http::StatusCode {
        let s = match self {
            Self::MissingKey
            | Self::InvalidKey { .. }
            | Self::RequestBodyUnreadable
            | Self::MalformedWebhook { .. }
            | Self::MissingEventId => 400,
            Self::InvalidSignature | Self::StaleWebhook { .. } => 401,
            Self::RequestTooLarge { .. } => 413,
            Self::PathTooLong { .. } => 414,
            Self::OwnerUnavailable
            | Self::OperationUnavailable
            | Self::ResponseBodyFailed
            | Self::HandlerPanicked { .. } => 500,
            Self::ShuttingDown => 503,
            Self::Engine(e) => e.http_status(),
        };
        http::StatusCode::from_u16(s).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// The `Retry-After` to send, when the same request may succeed later.
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::ResponseBodyFailed | Self::ShuttingDown => Some(Duration::from_secs(1)),
            Self::HandlerPanicked { retry_after } => Some(*retry_after),
            Self::Engine(e) => e.retry_after(),
            _ => None,
        }
    }

    /// Whether the same request may succeed later, unchanged.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        self.retry_after().is_some()
    }

    fn detail(&self) -> String {
        match self {
            Self::MissingKey => {
                "this operation requires an Idempotency-Key header; send one key per intent"
                    .to_owned()
            }
            Self::InvalidKey {
                reason,
                message: Some(m),
                ..
            } => format!("invalid Idempotency-Key ({reason}): {m}"),
            Self::InvalidKey { reason, .. } => {
                format!("invalid Idempotency-Key ({reason}): {}", reason.describe())
            }
            Self::OwnerUnavailable => "the caller's identity could not be determined".to_owned(),
            Self::OperationUnavailable => {
                "the server could not name the operation of this request".to_owned()
            }
            Self::PathTooLong { limit } => {
                format!("the method and path are longer than {limit} bytes")
            }
            Self::RequestTooLarge { limit } => {
                format!("the request body is larger than {limit} bytes")
            }
            Self::RequestBodyUnreadable => "the request body could not be read".to_owned(),
            Self::ResponseBodyFailed => {
                "the response failed while being produced; the request may be retried".to_owned()
            }
            Self::HandlerPanicked { .. } => {
                "the operation failed unexpectedly; retry after Retry-After".to_owned()
            }
            Self::ShuttingDown => "the server is shutting down; retry shortly".to_owned(),
            Self::Engine(Error::InFlight { .. }) => {
                "a request with this Idempotency-Key is being processed; retry after Retry-After"
                    .to_owned()
            }
            Self::Engine(e @ (Error::Store(_) | Error::CorruptRecord { .. })) => {
                // Store and corruption details stay in logs.
                ProblemCode::of_error(e).title().to_owned()
            }
            Self::Engine(e) => e.to_string(),
            Self::MalformedWebhook { reason } => format!("malformed webhook: {reason}"),
            Self::InvalidSignature => "no webhook signature matches a configured secret".to_owned(),
            Self::StaleWebhook { tolerance } => format!(
                "the webhook timestamp is more than {} s from the server's time",
                tolerance.as_secs()
            ),
            Self::MissingEventId => "the webhook carries no event id".to_owned(),
        }
    }

    /// The problem to render. `key` is the received key, when there was one.
    #[must_use]
    pub(crate) fn problem(&self, key: Option<&str>) -> Problem {
        let retry_after = self.retry_after().map(retry_after_secs);
        let idempotency_key = match self {
            Self::InvalidKey { received, .. } => received.clone(),
            Self::MissingKey => None,
            _ => key.map(str::to_owned),
        };
        Problem {
            code: self.code(),
            status: self.status().as_u16(),
            detail: self.detail(),
            retryable: retry_after.is_some(),
            retry_after,
            idempotency_key,
            resource_id: match self {
                Self::Engine(e) => e.resource_id().map(str::to_owned),
                _ => None,
            },
            limit: match self {
                Self::RequestTooLarge { limit } | Self::PathTooLong { limit } => Some(*limit),
                _ => None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::ProblemTypes;

    #[test]
    fn rejection_table() {
        let s = Duration::from_secs(3);
        let store = idem_core::store::StoreError::Unavailable {
            backend: "x",
            source: "secret-detail".into(),
        };
        let cases: Vec<(Rejection, u16, &str, Option<u64>)> = vec![
            (Rejection::MissingKey, 400, "missing_key", None),
            (
                Rejection::InvalidKey {
                    reason: KeyHeaderError::List,
                    received: Some("a, b".into()),
                    message: None,
                },
                400,
                "invalid_key",
                None,
            ),
            (
                Rejection::Engine(Error::FingerprintMismatch),
                422,
                "fingerprint_mismatch",
                None,
            ),
            (
                Rejection::Engine(Error::InFlight { retry_after: s }),
                409,
                "in_flight",
                Some(3),
            ),
            (
                Rejection::Engine(Error::ResponseExpired {
                    resource_id: Some("r".into()),
                }),
                409,
                "response_expired",
                None,
            ),
            (
                Rejection::Engine(Error::ResponseNotStored { resource_id: None }),
                409,
                "response_not_stored",
                None,
            ),
            (
                Rejection::Engine(Error::LeaseLost { retry_after: s }),
                409,
                "lease_lost",
                Some(3),
            ),
            (
                Rejection::RequestTooLarge { limit: 10 },
                413,
                "request_too_large",
                None,
            ),
            (
                Rejection::RequestBodyUnreadable,
                400,
                "request_body_unreadable",
                None,
            ),
            (Rejection::OwnerUnavailable, 500, "owner_unavailable", None),
            (
                Rejection::OperationUnavailable,
                500,
                "operation_unavailable",
                None,
            ),
            (
                Rejection::PathTooLong { limit: 1024 },
                414,
                "path_too_long",
                None,
            ),
            (
                Rejection::Engine(Error::Store(store)),
                503,
                "store_unavailable",
                Some(1),
            ),
            (Rejection::ShuttingDown, 503, "shutting_down", Some(1)),
            (
                Rejection::Engine(Error::CorruptRecord {
                    detail: "secret-detail".into(),
                }),
                500,
                "corrupt_record",
                None,
            ),
            (
                Rejection::HandlerPanicked { retry_after: s },
                500,
                "handler_panicked",
                Some(3),
            ),
            (
                Rejection::ResponseBodyFailed,
                500,
                "response_body_failed",
                Some(1),
            ),
            (
                Rejection::MalformedWebhook {
                    reason: "no webhook-signature header".into(),
                },
                400,
                "malformed_webhook",
                None,
            ),
            (Rejection::MissingEventId, 400, "missing_event_id", None),
            (Rejection::InvalidSignature, 401, "invalid_signature", None),
            (
                Rejection::StaleWebhook { tolerance: s },
                401,
                "stale_webhook",
                None,
            ),
        ];
        for (r, status, code, retry) in cases {
            assert_eq!(r.status().as_u16(), status, "{code}");
            assert_eq!(r.code().as_str(), code);
            let p = r.problem(Some("k"));
            assert_eq!(p.retry_after, retry, "{code}");
            assert_eq!(p.retryable, retry.is_some(), "{code}");
            let rendered = p.render(&ProblemTypes::Draft, None);
            let text = String::from_utf8(rendered.body).unwrap();
            assert!(!text.contains("secret-detail"), "{code}: {text}");
            let body: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(body["status"], status);
            assert_eq!(body["code"], code);
            assert_eq!(body["title"], r.code().title());
            assert_eq!(
                rendered.headers.iter().any(|(n, _)| *n == "retry-after"),
                retry.is_some()
            );
        }
    }
}

#[cfg(test)]
mod validator_message {
    use super::*;

    /// A key validator's reason is the problem's `detail`.
    #[test]
    fn the_validator_reason_is_the_detail() {
        let r = Rejection::InvalidKey {
            reason: KeyHeaderError::RejectedByValidator,
            received: Some("short".into()),
            message: Some("keys are at least 16 characters".into()),
        };
        assert_eq!(
            r.problem(None).detail,
            "invalid Idempotency-Key (rejected_by_validator): keys are at least 16 characters"
        );
    }
}

#[cfg(all(test, feature = "openapi"))]
mod openapi_sync {
    use super::*;

    /// Every code a `Rejection` can carry is published in the OpenAPI
    /// components the layer generates.
    #[test]
    fn every_rejection_code_is_in_the_openapi_components() {
        let layer =
            crate::IdempotencyLayer::builder(idem_core::Idem::new(idem_core::MemoryStore::new()))
                .owner(crate::FixedOwner::new("t"))
                .build()
                .expect("layer");
        let doc = crate::openapi::components(&layer);
        let codes =
            &doc["components"]["schemas"]["IdempotencyProblem"]["properties"]["code"]["enum"];
        let s = Duration::from_secs(1);
        let all = [
            Rejection::MissingKey,
            Rejection::InvalidKey {
                reason: KeyHeaderError::Empty,
                received: None,
                message: None,
            },
            Rejection::OwnerUnavailable,
            Rejection::OperationUnavailable,
            Rejection::PathTooLong { limit: 1 },
            Rejection::RequestTooLarge { limit: 1 },
            Rejection::RequestBodyUnreadable,
            Rejection::ResponseBodyFailed,
            Rejection::HandlerPanicked { retry_after: s },
            Rejection::ShuttingDown,
            Rejection::Engine(Error::FingerprintMismatch),
            Rejection::Engine(Error::InFlight { retry_after: s }),
            Rejection::Engine(Error::ResponseExpired { resource_id: None }),
            Rejection::Engine(Error::ResponseNotStored { resource_id: None }),
            Rejection::Engine(Error::LeaseLost { retry_after: s }),
            Rejection::Engine(Error::Store(idem_core::store::StoreError::Unavailable {
                backend: "x",
                source: "x".into(),
            })),
            Rejection::Engine(Error::CorruptRecord {
                detail: String::new(),
            }),
            Rejection::Engine(Error::InvalidRequest(
                idem_core::error::RequestError::TooDeep,
            )),
            Rejection::Engine(Error::Store(idem_core::store::StoreError::Backend {
                backend: "x",
                source: "x".into(),
            })),
            Rejection::MalformedWebhook { reason: "".into() },
            Rejection::MissingEventId,
            Rejection::InvalidSignature,
            Rejection::StaleWebhook { tolerance: s },
        ];
        for r in &all {
            assert!(
                codes
                    .as_array()
                    .expect("enum")
                    .iter()
                    .any(|c| c == r.code().as_str()),
                "{} missing from the OpenAPI components",
                r.code()
            );
        }
        assert_eq!(codes.as_array().map(Vec::len), Some(all.len()));
        assert_eq!(all.len(), crate::ProblemCode::ALL.len());
    }
}
