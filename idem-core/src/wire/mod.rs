//! The wire vocabulary: the names of the contract's answers, whatever the
//! protocol carries them. One home for what a server adapter writes and a
//! client reads back:
//!
//! * [`ProblemCode`]: the stable code of every answer an adapter gives on
//!   its own (`in_flight`, `fingerprint_mismatch`, ...), and the problem
//!   document ([`Problem`], RFC 9457) a JSON answer carries it in;
//! * the key field's syntax and its codec ([`parse_key_field`], [`quote`],
//!   [`unquote`]);
//! * the field names ([`header`]) and the default request-body limit;
//! * the rounding of a wait into whole seconds ([`retry_after_secs`]).
//!
//! The HTTP rendering (status codes, `type` URIs, the response's headers) is
//! idem-http's; an adapter on another protocol maps the same codes to its
//! own status vocabulary.

mod code;
mod key;
mod problem;

use std::time::Duration;

pub use code::ProblemCode;
pub use key::{KeyHeaderError, KeySyntax, parse_key_field, quote, unquote};
pub use problem::{MAX_PROBLEM_BYTES, Problem};

/// The field names of the contract, lowercase (as HTTP/2 and gRPC metadata
/// write them).
pub mod header {
    /// The request's key (draft-ietf-httpapi-idempotency-key-header).
    pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
    /// `true` on an answer replayed from the store.
    pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
    /// The older spelling of [`IDEMPOTENT_REPLAYED`], written and read beside it.
    pub const X_IDEMPOTENT_REPLAYED: &str = "x-idempotent-replayed";
    /// The replay markers a server writes and a client reads by default.
    pub const REPLAY_MARKERS: &[&str] = &[IDEMPOTENT_REPLAYED, X_IDEMPOTENT_REPLAYED];
    /// Whole seconds to wait before sending the same request again (RFC 9110 §10.2.3).
    pub const RETRY_AFTER: &str = "retry-after";
    /// The same wait in milliseconds (a client-side convention some servers send).
    pub const RETRY_AFTER_MS: &str = "retry-after-ms";
}

/// The largest request body an adapter reads (to fingerprint it) and a
/// client collects (to send it again) by default: 2 MiB.
pub const DEFAULT_MAX_REQUEST_BODY: usize = 2 * 1024 * 1024;

/// A wait as whole seconds for `Retry-After`: rounded up, at least 1 (a
/// lease with 200 ms left is "1", never "0", which would ask for an
/// immediate retry).
///
/// ```
/// use std::time::Duration;
/// use idem_core::wire::retry_after_secs;
///
/// assert_eq!(retry_after_secs(Duration::from_millis(200)), 1);
/// assert_eq!(retry_after_secs(Duration::from_millis(2001)), 3);
/// assert_eq!(retry_after_secs(Duration::ZERO), 1);
/// ```
#[must_use]
pub fn retry_after_secs(wait: Duration) -> u64 {
    u64::try_from(wait.as_millis().div_ceil(1000))
        .unwrap_or(u64::MAX)
        .max(1)
}
