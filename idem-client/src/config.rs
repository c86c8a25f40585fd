//! The one builder for both front-ends.

use std::{sync::Arc, time::Duration};

use http::{HeaderName, Method};
use idem_core::wire::header;

use crate::{
    KeyEncoding,
    policy::{AttemptView, Decision, RetryPolicy},
};

/// A setting [`IdempotencyClientBuilder::build`] refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClientConfigError {
    /// `max_attempts(0)`: a send needs at least one attempt.
    #[error("max_attempts must be at least 1")]
    NoAttempts,
    /// `backoff(initial, max)` with `initial > max`, or a zero `max`.
    #[error("backoff needs 0 < max and initial <= max")]
    Backoff,
    /// A zero deadline: nothing could be sent.
    #[error("the deadline must be more than zero")]
    Deadline,
    /// No methods: the middleware would do nothing.
    #[error("at least one method must be idempotency-keyed")]
    NoMethods,
}

/// The settings shared by the front-ends (built by [`IdempotencyClientBuilder`]).
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) policy: RetryPolicy,
    pub(crate) methods: Vec<Method>,
    pub(crate) key_header: HeaderName,
    pub(crate) key_syntax: KeyEncoding,
    pub(crate) attempt_timeout: Option<Duration>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            policy: RetryPolicy::default(),
            methods: vec![Method::POST, Method::PATCH],
            key_header: HeaderName::from_static(header::IDEMPOTENCY_KEY),
            key_syntax: KeyEncoding::Structured,
            attempt_timeout: None,
        }
    }
}

/// Configures the client. Every setting has a default; see each method.
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct IdempotencyClientBuilder {
    pub(crate) config: Config,
}

impl IdempotencyClientBuilder {
    /// The methods that get a key and retries. Default `POST` and `PATCH` (as
    /// `idem-http`); others pass through untouched.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.config.methods = methods.into_iter().collect();
        self
    }

    /// The key's header. Default `Idempotency-Key`.
    pub fn key_header(mut self, name: HeaderName) -> Self {
        self.config.key_header = name;
        self
    }

    /// How the key is written. Default [`KeyEncoding::Structured`] (an sf-string, as the IETF draft asks).
    pub fn key_syntax(mut self, syntax: KeyEncoding) -> Self {
        self.config.key_syntax = syntax;
        self
    }

    /// Attempts per send, the first included. Default 6.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.config.policy.max_attempts = n;
        self
    }

    /// Full-jitter backoff when the server names no delay: the n-th retry
    /// waits `uniform(0, min(max, initial·2^n))`. Default 200 ms, 10 s.
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.config.policy.backoff_initial = initial;
        self.config.policy.backoff_max = max;
        self
    }

    /// The whole send's limit, waits included: no attempt starts after it.
    /// Default 60 s.
    pub fn deadline(mut self, d: Duration) -> Self {
        self.config.policy.deadline = d;
        self
    }

    /// A limit per attempt; one that passes counts as an ambiguous transport
    /// failure (retried with the same key, which is safe). Default `None`
    /// (the HTTP client's own timeouts).
    pub fn attempt_timeout(mut self, d: Option<Duration>) -> Self {
        self.config.attempt_timeout = d;
        self
    }

    /// The longest `Retry-After` honoured; a longer one stops the send at once.
    /// Default 60 s.
    pub fn max_retry_after(mut self, d: Duration) -> Self {
        self.config.policy.max_retry_after = d;
        self
    }

    /// How long the server keeps keys (`idem-http`'s `key_ttl`, 30 days by
    /// default), when known. A key older than this minus 1 % (at least a
    /// minute) is never sent: the server may have forgotten it and would run
    /// the operation again. Default `None` (unknown: no limit).
    pub fn key_lifetime(mut self, d: Option<Duration>) -> Self {
        self.config.policy.key_lifetime = d;
        self
    }

    /// Retry a 409 that names neither a problem code nor `Retry-After` (what
    /// Stripe answers a concurrent duplicate). Default `false`.
    pub fn retry_conflicts(mut self, on: bool) -> Self {
        self.config.policy.retry_conflicts = on;
        self
    }

    /// The headers whose `true` marks a replayed answer. Default
    /// `Idempotent-Replayed` and `X-Idempotent-Replayed`.
    pub fn replayed_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.config.policy.replayed_headers = names.into_iter().collect();
        self
    }

    /// A hook that sees every answer first; `Some` overrides the table (not
    /// the body and key-lifetime checks made before sending, and never the
    /// attempt cap, deadline or lifetime that bound a retry).
    pub fn classify(
        mut self,
        f: impl Fn(&AttemptView<'_>) -> Option<Decision> + Send + Sync + 'static,
    ) -> Self {
        self.config.policy.classify = Some(Arc::new(f));
        self
    }

    /// Checks the settings.
    pub(crate) fn checked(self) -> Result<Config, ClientConfigError> {
        let c = self.config;
        if c.policy.max_attempts == 0 {
            return Err(ClientConfigError::NoAttempts);
        }
        if c.policy.backoff_max.is_zero() || c.policy.backoff_initial > c.policy.backoff_max {
            return Err(ClientConfigError::Backoff);
        }
        if c.policy.deadline.is_zero() {
            return Err(ClientConfigError::Deadline);
        }
        if c.methods.is_empty() {
            return Err(ClientConfigError::NoMethods);
        }
        Ok(c)
    }

    /// The decision core these settings describe, for a front-end of your own.
    ///
    /// # Errors
    ///
    /// [`ClientConfigError`] for a setting that cannot work.
    pub fn build_policy(self) -> Result<RetryPolicy, ClientConfigError> {
        self.checked().map(|c| c.policy)
    }
}
