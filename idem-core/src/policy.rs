//! The contract's settings, with their defaults.

use std::time::Duration;

use crate::fingerprint::FieldFilter;

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
        }
    }
}

/// An impossible [`Policy`], refused by [`PolicyBuilder::build`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
#[error("invalid idem policy: {0}")]
pub struct PolicyError(String);

impl Policy {
    /// A builder starting from the defaults.
    #[must_use]
    pub fn builder() -> PolicyBuilder {
        PolicyBuilder(Self::default())
    }

    /// How long the stored response (the body) is replayed.
    #[must_use]
    pub fn response_ttl(&self) -> Duration {
        self.response_ttl
    }
    /// How long the key (fingerprint, outcome, resource id) is remembered.
    #[must_use]
    pub fn key_ttl(&self) -> Duration {
        self.key_ttl
    }
    /// The lease a claim takes.
    #[must_use]
    pub fn lease(&self) -> Duration {
        self.lease
    }
    /// What duplicates get while the first attempt runs.
    #[must_use]
    pub fn in_flight(&self) -> InFlightMode {
        self.in_flight
    }
    /// The largest encoded response that is stored.
    #[must_use]
    pub fn max_response_bytes(&self) -> usize {
        self.max_response_bytes
    }
    /// Which request fields count toward the fingerprint.
    #[must_use]
    pub fn fields(&self) -> &FieldFilter {
        &self.fields
    }
    /// How many times the completion (or release) write is tried.
    #[must_use]
    pub fn store_retries(&self) -> u32 {
        self.store_retries
    }
    /// The pause between those tries.
    #[must_use]
    pub fn store_retry_backoff(&self) -> Duration {
        self.store_retry_backoff
    }
}

/// Builds a [`Policy`]; see its defaults table.
#[derive(Debug, Clone)]
pub struct PolicyBuilder(Policy);

impl PolicyBuilder {
    /// Sets `response_ttl`.
    #[must_use]
    pub fn response_ttl(mut self, d: Duration) -> Self {
        self.0.response_ttl = d;
        self
    }
    /// Sets `key_ttl`.
    #[must_use]
    pub fn key_ttl(mut self, d: Duration) -> Self {
        self.0.key_ttl = d;
        self
    }
    /// Sets the lease.
    #[must_use]
    pub fn lease(mut self, d: Duration) -> Self {
        self.0.lease = d;
        self
    }
    /// Sets the in-flight mode.
    #[must_use]
    pub fn in_flight(mut self, mode: InFlightMode) -> Self {
        self.0.in_flight = mode;
        self
    }
    /// Sets the largest stored response, in bytes.
    #[must_use]
    pub fn max_response_bytes(mut self, n: usize) -> Self {
        self.0.max_response_bytes = n;
        self
    }
    /// Sets the fingerprint's field filter.
    #[must_use]
    pub fn fields(mut self, filter: FieldFilter) -> Self {
        self.0.fields = filter;
        self
    }
    /// Sets how many times (≥ 1) the completion write is tried, and the pause.
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
    /// [`PolicyError`] when a TTL or the lease is under a millisecond,
    /// `key_ttl < response_ttl`, the lease is not shorter than `key_ttl`,
    /// the wait mode's timeout or poll is zero, the response limit is zero or
    /// above 256 MiB, `store_retries` is zero, or a field pointer is not a
    /// JSON pointer.
    pub fn build(self) -> Result<Policy, PolicyError> {
        let p = self.0;
        let ms = Duration::from_millis(1);
        let err = |m: &str| Err(PolicyError(m.to_owned()));
        if p.response_ttl < ms || p.key_ttl < ms || p.lease < ms {
            return err("response_ttl, key_ttl and lease must each be at least 1 ms");
        }
        if p.key_ttl < p.response_ttl {
            return err("key_ttl must be at least response_ttl (the key outlives the body)");
        }
        if p.lease >= p.key_ttl {
            return err("lease must be shorter than key_ttl");
        }
        if let InFlightMode::Wait { timeout, poll } = p.in_flight
            && (timeout.is_zero() || poll.is_zero())
        {
            return err("wait mode needs a non-zero timeout and poll interval");
        }
        if p.max_response_bytes == 0 || p.max_response_bytes > 256 << 20 {
            return err("max_response_bytes must be between 1 byte and 256 MiB");
        }
        if p.store_retries == 0 {
            return err("store_retries must be at least 1");
        }
        p.fields.validate().map_err(PolicyError)?;
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
    fn impossible_policies_are_refused() {
        let s = Duration::from_secs;
        assert!(
            Policy::builder()
                .response_ttl(s(10))
                .key_ttl(s(5))
                .build()
                .is_err()
        );
        assert!(Policy::builder().lease(Duration::ZERO).build().is_err());
        assert!(
            Policy::builder()
                .response_ttl(s(10))
                .key_ttl(s(10))
                .lease(s(10))
                .build()
                .is_err()
        );
        assert!(
            Policy::builder()
                .in_flight(InFlightMode::Wait {
                    timeout: Duration::ZERO,
                    poll: s(1)
                })
                .build()
                .is_err()
        );
        assert!(Policy::builder().max_response_bytes(0).build().is_err());
        assert!(Policy::builder().store_retries(0, s(1)).build().is_err());
        assert!(
            Policy::builder()
                .fields(FieldFilter::ignore(["client_ts"]))
                .build()
                .is_err()
        );
    }
}
