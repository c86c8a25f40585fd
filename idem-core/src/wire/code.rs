//! The problem codes: the one vocabulary of the answers an adapter gives on
//! its own (the HTTP adapter's problem documents, and whatever the next
//! protocol renders them as).

use std::fmt;

use crate::Error;

/// The stable code of every answer an adapter gives besides the work's own:
/// one closed set, whatever the protocol. idem-http sends it as the `code`
/// member of a problem document (with its HTTP status and `type` URI), a
/// client reads it back with [`ProblemCode::parse`], and an adapter on
/// another protocol maps the same codes to its own status vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProblemCode {
    /// 400: no key on a route that requires one.
    MissingKey,
    /// 400: the key field is malformed or refused by the key validator.
    InvalidKey,
    /// 422: the key was used with a different request.
    FingerprintMismatch,
    /// 409: a request with this key is outstanding.
    InFlight,
    /// 409: done, the stored response expired.
    ResponseExpired,
    /// 409: done, the response was not stored.
    ResponseNotStored,
    /// 409: a newer attempt took the record over.
    LeaseLost,
    /// 413: the request body is over the limit.
    RequestTooLarge,
    /// 400: the request body failed while being read.
    RequestBodyUnreadable,
    /// 414: the path is too long to name the operation (idem-http's
    /// `OperationSource::Path`).
    PathTooLong,
    /// 500 (configurable): the owner cannot be determined.
    OwnerUnavailable,
    /// 500: the operation cannot be named as configured.
    OperationUnavailable,
    /// 503: the store is unavailable; nothing ran.
    StoreUnavailable,
    /// 503: the layer is shutting down.
    ShuttingDown,
    /// 500: a stored record cannot be read.
    CorruptRecord,
    /// 500: the handler panicked.
    HandlerPanicked,
    /// 500: the handler's response body failed.
    ResponseBodyFailed,
    /// 400: the request cannot be fingerprinted (a JSON body naming a
    /// member twice).
    InvalidRequest,
    /// 500: the store refused the call (not retried).
    StoreError,
    /// 400 (webhook receiver): the signature headers are missing or cannot
    /// be parsed, or the verified body cannot be read for its event id.
    MalformedWebhook,
    /// 400 (webhook receiver): the delivery is verified but carries no
    /// event id.
    MissingEventId,
    /// 401 (webhook receiver): no signature matches any secret.
    InvalidSignature,
    /// 401 (webhook receiver): the signed timestamp is outside the
    /// tolerance.
    StaleWebhook,
}

impl ProblemCode {
    /// Every code, in the README's table order.
    pub const ALL: &'static [Self] = &[
        Self::MissingKey,
        Self::InvalidKey,
        Self::FingerprintMismatch,
        Self::InFlight,
        Self::ResponseExpired,
        Self::ResponseNotStored,
        Self::LeaseLost,
        Self::RequestTooLarge,
        Self::RequestBodyUnreadable,
        Self::PathTooLong,
        Self::OwnerUnavailable,
        Self::OperationUnavailable,
        Self::StoreUnavailable,
        Self::ShuttingDown,
        Self::CorruptRecord,
        Self::HandlerPanicked,
        Self::ResponseBodyFailed,
        Self::InvalidRequest,
        Self::StoreError,
        Self::MalformedWebhook,
        Self::MissingEventId,
        Self::InvalidSignature,
        Self::StaleWebhook,
    ];

    /// The code as sent in the `code` member (`missing_key`, ...).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::MissingKey => "missing_key",
            Self::InvalidKey => "invalid_key",
            Self::FingerprintMismatch => "fingerprint_mismatch",
            Self::InFlight => "in_flight",
            Self::ResponseExpired => "response_expired",
            Self::ResponseNotStored => "response_not_stored",
            Self::LeaseLost => "lease_lost",
            Self::RequestTooLarge => "request_too_large",
            Self::RequestBodyUnreadable => "request_body_unreadable",
            Self::PathTooLong => "path_too_long",
            Self::OwnerUnavailable => "owner_unavailable",
            Self::OperationUnavailable => "operation_unavailable",
            Self::StoreUnavailable => "store_unavailable",
            Self::ShuttingDown => "shutting_down",
            Self::CorruptRecord => "corrupt_record",
            Self::HandlerPanicked => "handler_panicked",
            Self::ResponseBodyFailed => "response_body_failed",
            Self::InvalidRequest => "invalid_request",
            Self::StoreError => "store_error",
            Self::MalformedWebhook => "malformed_webhook",
            Self::MissingEventId => "missing_event_id",
            Self::InvalidSignature => "invalid_signature",
            Self::StaleWebhook => "stale_webhook",
        }
    }

    /// A short summary (an HTTP problem's `title`).
    #[must_use]
    pub const fn title(self) -> &'static str {
        match self {
            Self::MissingKey => "Idempotency-Key is missing",
            Self::InvalidKey => "Idempotency-Key is invalid",
            Self::FingerprintMismatch => "Idempotency-Key is already used",
            Self::InFlight => "A request is outstanding for this Idempotency-Key",
            Self::ResponseExpired | Self::ResponseNotStored => "This request was already processed",
            Self::LeaseLost => "A newer attempt took over this Idempotency-Key",
            Self::RequestTooLarge => "Request body too large for idempotency",
            Self::RequestBodyUnreadable => "Request body could not be read",
            Self::PathTooLong => "Request path too long for idempotency",
            Self::OwnerUnavailable => "Caller identity unavailable",
            Self::OperationUnavailable => "Operation name unavailable",
            Self::StoreUnavailable => "Idempotency store unavailable",
            Self::ShuttingDown => "Server is shutting down",
            Self::CorruptRecord => "Idempotency record unreadable",
            Self::HandlerPanicked => "The operation failed unexpectedly",
            Self::ResponseBodyFailed => "The response could not be completed",
            Self::InvalidRequest => "Request cannot be fingerprinted",
            Self::StoreError => "Idempotency store error",
            Self::MalformedWebhook => "Webhook signature headers are malformed",
            Self::MissingEventId => "Webhook event id is missing",
            Self::InvalidSignature => "Webhook signature is invalid",
            Self::StaleWebhook => "Webhook timestamp is outside the tolerance",
        }
    }

    /// The code a code's text names: the inverse of [`ProblemCode::as_str`];
    /// `None` for text no code has (another server's own code).
    ///
    /// ```
    /// use idem_core::wire::ProblemCode;
    ///
    /// assert_eq!(ProblemCode::parse("in_flight"), Some(ProblemCode::InFlight));
    /// assert_eq!(ProblemCode::parse("idempotency_key_in_use"), None);
    /// ```
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|c| c.as_str() == text)
    }

    /// The code of an engine error. An adapter parses keys and builds
    /// scopes itself, so core's key and scope errors do not reach it from
    /// the engine; they map to the nearest code all the same.
    #[must_use]
    pub fn of_error(e: &Error) -> Self {
        match e {
            Error::InvalidKey(_) => Self::InvalidKey,
            Error::InvalidScope(_) | Error::InvalidRequest(_) => Self::InvalidRequest,
            Error::FingerprintMismatch => Self::FingerprintMismatch,
            Error::InFlight { .. } => Self::InFlight,
            Error::ResponseExpired { .. } => Self::ResponseExpired,
            Error::ResponseNotStored { .. } => Self::ResponseNotStored,
            Error::LeaseLost { .. } => Self::LeaseLost,
            Error::Store(s) if s.is_retryable() => Self::StoreUnavailable,
            Error::CorruptRecord { .. } => Self::CorruptRecord,
            // An operator's cursor never reaches an adapter; kept where it
            // always mapped.
            Error::Store(_) | Error::InvalidCursor => Self::StoreError,
        }
    }
}

impl fmt::Display for ProblemCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_snake_case_and_parse_back() {
        let mut seen: Vec<&str> = ProblemCode::ALL.iter().map(|c| c.as_str()).collect();
        assert!(
            seen.iter()
                .all(|c| c.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
        );
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), ProblemCode::ALL.len());
        for code in ProblemCode::ALL {
            assert_eq!(ProblemCode::parse(code.as_str()), Some(*code));
            assert_eq!(code.to_string(), code.as_str());
        }
        assert_eq!(ProblemCode::parse("In_Flight"), None);
        assert_eq!(ProblemCode::parse(""), None);
    }
}
