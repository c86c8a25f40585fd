//! The client's typed errors: every one that follows a send carries the key.

use std::time::Duration;

use http::StatusCode;
use idem_core::{IdempotencyKey, error::KeyError};

use crate::Problem;

/// Why a send stopped while the server's answers still said "later".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopReason {
    /// The next attempt, after its wait, would start after the deadline.
    Deadline,
    /// `max_attempts` were made.
    MaxAttempts,
    /// The server asked for a wait longer than `max_retry_after`.
    RetryAfterTooLong,
    /// The last attempt got no response (connect or transport failure).
    Transport,
    /// The next attempt would start after the key could have expired on the
    /// server (`key_lifetime` minus its margin): a send then could run twice.
    KeyLifetime,
}

impl StopReason {
    /// A stable name for logs and metrics.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Deadline => "deadline",
            Self::MaxAttempts => "max_attempts",
            Self::RetryAfterTooLong => "retry_after_too_long",
            Self::Transport => "transport",
            Self::KeyLifetime => "key_lifetime",
        }
    }
}

/// Why an idempotent send did not give an answer to use.
///
/// Each variant that follows a send carries the key, so the caller can resume
/// the same intent later (the server then replays or finishes it).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server rejected the request itself (a key problem, 413,
    /// `fingerprint_mismatch`, a non-retryable server problem). Permanent:
    /// sending it again gives the same answer.
    #[error("the server rejected the request ({status}, {code})", code = problem.code.as_deref().unwrap_or("no code"))]
    Rejected {
        /// The status.
        status: StatusCode,
        /// The problem body.
        problem: Box<Problem>,
        /// The key sent.
        key: IdempotencyKey,
    },
    /// The server kept saying "later" (or could not be reached) until a limit.
    /// Temporary: resend with `key` later.
    #[error("gave up after {attempts} attempt(s): {}", reason.as_str())]
    Exhausted {
        /// The key sent on every attempt.
        key: IdempotencyKey,
        /// Attempts made.
        attempts: u32,
        /// Which limit ended the send.
        reason: StopReason,
        /// The last status, when there was a response.
        last_status: Option<StatusCode>,
        /// Time spent, waits included.
        elapsed: Duration,
    },
    /// The request's body is a stream that cannot be sent twice, and more than
    /// one attempt was allowed. Nothing was sent; build the body as bytes, or
    /// ask for a single attempt.
    #[error("the request body cannot be replayed; send bytes, or ask for a single attempt")]
    BodyNotReplayable,
    /// The key the caller gave is invalid. Nothing was sent.
    #[error("invalid idempotency key: {0}")]
    InvalidKey(#[from] KeyError),
    /// The intent is older than the server keeps keys (minus a margin): a send
    /// now could run the operation a second time. Nothing was sent.
    #[error("the intent's key may have expired on the server; nothing was sent")]
    KeyLifetimeExceeded {
        /// The intent's key.
        key: IdempotencyKey,
    },
}

impl Error {
    /// The key this error is about, when a send was attempted or refused for its age.
    #[must_use]
    pub fn key(&self) -> Option<&IdempotencyKey> {
        match self {
            Self::Rejected { key, .. }
            | Self::Exhausted { key, .. }
            | Self::KeyLifetimeExceeded { key } => Some(key),
            Self::BodyNotReplayable | Self::InvalidKey(_) => None,
        }
    }

    /// Recovers the client's error from a `reqwest_middleware::Error`.
    #[cfg(feature = "reqwest")]
    #[must_use]
    pub fn from_middleware(err: &reqwest_middleware::Error) -> Option<&Self> {
        match err {
            reqwest_middleware::Error::Middleware(e) => e.downcast_ref::<Self>(),
            reqwest_middleware::Error::Reqwest(_) => None,
        }
    }
}
