//! The contract's settings, with their defaults.

use std::time::Duration;

use crate::FieldFilter;

/// What a duplicate gets while the first attempt is still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InFlightMode {
    /// Answer at once with [`Error::InFlight`](crate::Error::InFlight) (409 +
    /// `Retry-After`). No connection or lock is held while the client backs off.
    Reject,
    /// Wait up to `timeout` for the first attempt to finish, polling the
    /// store every `poll`, then replay; 409 if it is still running.
    Wait {
        /// How long to wait in total.
        timeout: Duration,
        /// How often to look again (one store round trip each).
        poll: Duration,
    },
}

/// Every number of the contract, checked when built.
///
/// | setting | default |
/// |---|---|
/// | `response_ttl` | 24 h |
/// | `key_ttl` | 30 days (must be ≥ `response_ttl`) |
/// | `lease` | 60 s |
/// | `in_flight` | [`InFlightMode::Reject`] |
/// | `max_response_bytes` | 1 MiB |
/// | `fields` | [`FieldFilter::All`] |
/// | `store_retries` | 3 tries, 50 ms apart, for the completion write |
/// | `completion_backlog` | 1024 completions kept and written again in the background when that write still fails |
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use idem_core::{InFlightMode, Policy};
///
/// let policy = Policy::builder()
///     .response_ttl(Duration::from_secs(3600))
///     .key_ttl(Duration::from_secs(7 * 86400))
///     .in_flight(InFlightMode::Wait { timeout: Duration::from_secs(5), poll: Duration::from_millis(50) })
///     .build()
///     .unwrap();
/// assert_eq!(policy.lease(), Duration::from_secs(60));
///
/// // key_ttl shorter than response_ttl is refused at construction.
/// assert!(Policy::builder().key_ttl(Duration::from_secs(1)).build().is_err());
/// ```
#[derive(Debug, Clone)]
pub struct Policy {
    response_ttl: Duration,
    key_ttl: Duration,
    lease: Duration,
    in_flight: InFlightMode,
    max_response_bytes: usize,
    fields: FieldFilter,
    store_retries: u32,
    store_retry_backoff: Duration,
    completion_backlog: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            response_ttl: Duration::from_secs(24 * 3600),
            key_ttl: Duration::from_secs(30 * 86400),
            lease: Duration::from_secs(60),
            in_flight: InFlightMode::Reject,
            max_response_bytes: 1 << 20,
            fields: FieldFilter::All,
            store_retries: 3,
            store_retry_backoff: Duration::from_millis(50),
            completion_backlog: 1024,
        }
    }
}

/// An impossible [`Policy`], refused by [`PolicyBuilder::build`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// A duration is under its minimum (1 ms for TTLs, the lease and the
    /// wait mode's timeout and poll).
    #[error("invalid idem policy: {setting} must be at least 1 ms")]
    TooShort {
        /// Which setting (`response_ttl`, `key_ttl`, `lease`, `wait timeout`, `wait poll`).
        setting: &'static str,
    },
    /// A duration is above [`Policy::MAX_DURATION`].
    #[error("invalid idem policy: {setting} must be at most {} days", Policy::MAX_DURATION.as_secs() / 86_400)]
    TooLong {
        /// Which setting.
        setting: &'static str,
    },
    /// `key_ttl < response_ttl` (the key must outlive the body).
    #[error(
        "invalid idem policy: key_ttl must be at least response_ttl (the key outlives the body)"
    )]
    KeyTtlBelowResponseTtl,
    /// `lease >= key_ttl`.
    #[error("invalid idem policy: lease must be shorter than key_ttl")]
    LeaseNotBelowKeyTtl,
    /// `max_response_bytes` is zero or above 256 MiB.
    #[error(
        "invalid idem policy: max_response_bytes must be between 1 byte and 256 MiB, not {bytes}"
    )]
    ResponseLimit {
        /// The value given.
        bytes: usize,
    },
    /// `store_retries` is zero.
    #[error("invalid idem policy: store_retries must be at least 1")]
    NoStoreTries,
    /// A field filter pointer is not an RFC 6901 JSON pointer, or has an
    /// array-index-like token that is not canonical (`01`, `+1`).
    #[error("invalid idem policy: field pointer `{pointer}` {reason}")]
    InvalidPointer {
        /// The pointer as given.
        pointer: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// The getters of [`Policy`]: each answers its setting.
macro_rules! getters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty;)*) => {$(
        $(#[$doc])*
        #[must_use]
        pub fn $name(&self) -> $ty {
            self.$name
        }
    )*};
}

/// The plain setters of [`PolicyBuilder`]: each sets its setting.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident($arg:ident: $ty:ty);)*) => {$(
        $(#[$doc])*
        #[must_use]
        pub fn $name(mut self, $arg: $ty) -> Self {
            self.0.$name = $arg;
            self
        }
    )*};
}

impl Policy {
    /// The longest duration any setting accepts: 100 years (of 365 days).
    /// Longer ones are refused by [`PolicyBuilder::build`], so no deadline
    /// arithmetic can overflow.
    pub const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 86_400);

    /// A builder starting from the defaults.
    #[must_use]
    pub fn builder() -> PolicyBuilder {
        PolicyBuilder(Self::default())
    }

    getters! {
        /// How long the stored response (the body) is replayed.
        response_ttl: Duration;
        /// How long the key (fingerprint, outcome, resource id) is remembered.
        key_ttl: Duration;
        /// The lease a claim takes.
        lease: Duration;
        /// What duplicates get while the first attempt runs.
        in_flight: InFlightMode;
        /// The largest encoded response that is stored.
        max_response_bytes: usize;
        /// How many times the completion (or release) write is tried.
        store_retries: u32;
        /// The pause between those tries.
        store_retry_backoff: Duration;
        /// How many completions whose write still failed after
        /// [`store_retries`](Self::store_retries) are kept and written again in
        /// the background (see [`Idem::drain_completions`](crate::Idem::drain_completions)).
        completion_backlog: usize;
    }
    /// Which request fields count toward the fingerprint.
    #[must_use]
    pub fn fields(&self) -> &FieldFilter {
        &self.fields
    }
}

/// Builds a [`Policy`]; see its defaults table.
#[derive(Debug, Clone)]
pub struct PolicyBuilder(Policy);

impl PolicyBuilder {
    setters! {
        /// How long a completed outcome is replayed (default 24 h); after it,
        /// retries get [`Error::ResponseExpired`](crate::Error::ResponseExpired)
        /// with the resource id.
        response_ttl(d: Duration);
        /// How long the key is remembered at all (default 30 days, at least
        /// `response_ttl`); after it, the same key is a new operation.
        key_ttl(d: Duration);
        /// How long an attempt holds the record before a duplicate may take it
        /// over as a recovery (default 60 s; long work extends it with
        /// [`Attempt::extend_lease`](crate::Attempt::extend_lease)).
        lease(d: Duration);
        /// What a duplicate of a running attempt gets: a 409 at once (default)
        /// or a bounded wait for the first attempt's outcome.
        in_flight(mode: InFlightMode);
        /// The largest encoded outcome that is stored (default 1 MiB); a larger
        /// one completes the record without a body, so retries get
        /// [`Error::ResponseNotStored`](crate::Error::ResponseNotStored), never a
        /// second run.
        max_response_bytes(n: usize);
        /// Which request fields the fingerprint covers (default: all).
        fields(filter: FieldFilter);
        /// How many completions whose write still fails after the store retries
        /// are kept and written again in the background, under their fencing
        /// token, until stored, fenced off by a newer attempt, or their lease
        /// ends (default 1024 per engine and its clones; 0 keeps none: such a
        /// completion is left to lease expiry and recovery). A database that
        /// fails over while a completion is pending then gets it within
        /// seconds of the promotion, and the client's retry replays it instead
        /// of running the work again. See
        /// [`Idem::drain_completions`](crate::Idem::drain_completions).
        completion_backlog(n: usize);
    }
    /// How many times (≥ 1) a token-guarded write (completion, release) is
    /// tried when the store is unavailable, and the pause between tries
    /// (default 3 tries, 50 ms apart).
    #[must_use]
    pub fn store_retries(mut self, tries: u32, backoff: Duration) -> Self {
        self.0.store_retries = tries;
        self.0.store_retry_backoff = backoff;
        self
    }

    /// Checks and returns the policy.
    ///
    /// # Errors
    ///
    /// [`PolicyError`] when a TTL, the lease, or the wait mode's timeout or
    /// poll is under a millisecond; any duration (the store retry pause
    /// included) is above [`Policy::MAX_DURATION`]; `key_ttl < response_ttl`;
    /// the lease is not shorter than `key_ttl`; the response limit is zero or
    /// above 256 MiB; `store_retries` is zero; or a field pointer is not a
    /// JSON pointer or has a non-canonical array index (see [`FieldFilter`]).
    pub fn build(self) -> Result<Policy, PolicyError> {
        let p = self.0;
        let mut durations = vec![
            ("response_ttl", p.response_ttl, true),
            ("key_ttl", p.key_ttl, true),
            ("lease", p.lease, true),
            ("store_retry_backoff", p.store_retry_backoff, false),
        ];
        if let InFlightMode::Wait { timeout, poll } = p.in_flight {
            durations.push(("wait timeout", timeout, true));
            durations.push(("wait poll", poll, true));
        }
        for (setting, d, positive) in durations {
            if positive && d < Duration::from_millis(1) {
                return Err(PolicyError::TooShort { setting });
            }
            if d > Policy::MAX_DURATION {
                return Err(PolicyError::TooLong { setting });
            }
        }
        if p.key_ttl < p.response_ttl {
            return Err(PolicyError::KeyTtlBelowResponseTtl);
        }
        if p.lease >= p.key_ttl {
            return Err(PolicyError::LeaseNotBelowKeyTtl);
        }
        if p.max_response_bytes == 0 || p.max_response_bytes > 256 << 20 {
            return Err(PolicyError::ResponseLimit {
                bytes: p.max_response_bytes,
            });
        }
        if p.store_retries == 0 {
            return Err(PolicyError::NoStoreTries);
        }
        p.fields
            .validate()
            .map_err(|(pointer, reason)| PolicyError::InvalidPointer { pointer, reason })?;
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_published_ones() {
        let p = Policy::default();
        assert_eq!(p.response_ttl(), Duration::from_secs(86_400));
        assert_eq!(p.key_ttl(), Duration::from_secs(30 * 86_400));
        assert_eq!(p.lease(), Duration::from_secs(60));
        assert_eq!(p.in_flight(), InFlightMode::Reject);
        assert_eq!(p.max_response_bytes(), 1 << 20);
        assert!(Policy::builder().build().is_ok());
    }

    #[test]
    fn impossible_policies_are_refused_with_typed_errors() {
        let s = Duration::from_secs;
        let waiting =
            |timeout, poll| Policy::builder().in_flight(InFlightMode::Wait { timeout, poll });
        let short = |setting| PolicyError::TooShort { setting };
        let long = |setting| PolicyError::TooLong { setting };
        let cases: Vec<(PolicyBuilder, PolicyError)> = vec![
            (
                Policy::builder()
                    .response_ttl(s(10))
                    .key_ttl(s(5))
                    .lease(s(1)),
                PolicyError::KeyTtlBelowResponseTtl,
            ),
            (Policy::builder().lease(Duration::ZERO), short("lease")),
            (
                Policy::builder()
                    .response_ttl(s(10))
                    .key_ttl(s(10))
                    .lease(s(10)),
                PolicyError::LeaseNotBelowKeyTtl,
            ),
            (waiting(Duration::ZERO, s(1)), short("wait timeout")),
            (waiting(s(1), Duration::ZERO), short("wait poll")),
            (waiting(Duration::MAX, s(1)), long("wait timeout")),
            (waiting(s(1), Duration::MAX), long("wait poll")),
            (Policy::builder().key_ttl(Duration::MAX), long("key_ttl")),
            (
                Policy::builder()
                    .response_ttl(Duration::MAX)
                    .key_ttl(Duration::MAX),
                long("response_ttl"),
            ),
            (Policy::builder().lease(Duration::MAX), long("lease")),
            (
                Policy::builder().store_retries(3, Duration::MAX),
                long("store_retry_backoff"),
            ),
            (
                Policy::builder().max_response_bytes(0),
                PolicyError::ResponseLimit { bytes: 0 },
            ),
            (
                Policy::builder().store_retries(0, s(1)),
                PolicyError::NoStoreTries,
            ),
            (
                Policy::builder().fields(FieldFilter::ignore(["client_ts"])),
                PolicyError::InvalidPointer {
                    pointer: "client_ts".into(),
                    reason: "must be empty or start with `/`",
                },
            ),
        ];
        for (builder, expected) in cases {
            assert_eq!(builder.build().expect_err("refused"), expected);
        }
    }

    #[test]
    fn the_longest_durations_build() {
        let max = Policy::MAX_DURATION;
        let p = Policy::builder()
            .response_ttl(max - Duration::from_secs(1))
            .key_ttl(max)
            .lease(max - Duration::from_secs(1))
            .in_flight(InFlightMode::Wait {
                timeout: max,
                poll: max,
            })
            .store_retries(1, max)
            .build();
        assert!(p.is_ok(), "{p:?}");
    }
}
