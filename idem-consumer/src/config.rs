//! The consumer and its builder.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use idem_core::adapter::{PermanentFailurePolicy, ScopeSetting, ScopeSettingError};
use idem_core::error::ScopeError;
use idem_core::store::Store;
use idem_core::{Idem, Scope};

use crate::backoff::Backoff;

/// What a permanent failure of the work does to the message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConsumerPermanentFailure {
    /// Acknowledge it (the failure stays stored and is replayed to every
    /// redelivery), after calling the `on_permanent_failure` hook. The
    /// default: a redelivery cannot fix it.
    #[default]
    Acknowledge,
    /// Send it to the dead letter ([`DeadLetterReason::PermanentFailure`](crate::DeadLetterReason::PermanentFailure)),
    /// on the first run and on every replay of the stored failure, so a
    /// dead-lettering that failed is tried again.
    DeadLetter,
}

/// What the record's fingerprint covers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FingerprintMode {
    /// The payload: its canonical JSON (strict: a member named twice is
    /// [`DeadLetterReason::InvalidMessage`](crate::DeadLetterReason::InvalidMessage))
    /// when it parses as JSON, else the SHA-256 of its bytes. The same id
    /// with another payload is a producer bug and goes to the dead letter.
    #[default]
    Payload,
    /// Nothing: the message id alone decides (for producers that re-encode
    /// a message when they resend it).
    Ignore,
}

/// The permanent-failure policy, with its hook told the message id and the
/// error.
pub(crate) type FailurePolicy =
    PermanentFailurePolicy<ConsumerPermanentFailure, dyn Fn(&str, &dyn fmt::Debug) + Send + Sync>;

/// Why [`ConsumerBuilder::build`] refused a configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerConfigError {
    /// No owner was set ([`ConsumerBuilder::owner`]): the consumer group that
    /// processes each message once.
    #[error("the consumer needs an owner (the consumer group): call .owner(..)")]
    MissingOwner,
    /// No operation was set ([`ConsumerBuilder::operation`]): the handler's name.
    #[error("the consumer needs an operation (the handler's name): call .operation(..)")]
    MissingOperation,
    /// The owner or the operation breaks the scope rules.
    #[error(transparent)]
    InvalidScope(#[from] ScopeError),
    /// The backoff's base is zero or above its cap.
    #[error("retry backoff: the base must be above zero and at most the cap")]
    InvalidBackoff,
}

/// Builds a [`Consumer`]: [`Consumer::builder`].
pub struct ConsumerBuilder<S: Store> {
    idem: Idem<S>,
    scope: ScopeSetting,
    backoff: Backoff,
    permanent: FailurePolicy,
    fingerprint: FingerprintMode,
}

impl<S: Store> fmt::Debug for ConsumerBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsumerBuilder")
            .field("scope", &self.scope)
            .field("backoff", &self.backoff)
            .field("permanent", &self.permanent.policy())
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

impl<S: Store> ConsumerBuilder<S> {
    /// The consumer group (`"billing-service"`): the record's owner. Two
    /// groups consuming one stream each process a message once.
    #[must_use]
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.scope.set_owner(owner);
        self
    }

    /// The handler (`"charge-on-order-created"`): the record's operation.
    #[must_use]
    pub fn operation(mut self, operation: impl Into<String>) -> Self {
        self.scope.set_operation(operation);
        self
    }

    /// The delay before redelivering a transient failure or a message that
    /// met an unavailable store: `base · 2^(n−1)` for the `n`th delivery,
    /// capped at `cap`, with full jitter. Default 1 s and 5 min.
    #[must_use]
    pub fn retry_backoff(mut self, base: Duration, cap: Duration) -> Self {
        self.backoff.base = base;
        self.backoff.cap = cap;
        self
    }

    /// Whether the backoff is jittered (uniform in `[0, delay]`); default
    /// `true`. Off gives the exact exponential delay, for tests and for
    /// brokers that jitter themselves.
    #[must_use]
    pub fn retry_jitter(mut self, on: bool) -> Self {
        self.backoff.jitter = on;
        self
    }

    /// What a permanent failure does to the message (default: acknowledge).
    #[must_use]
    pub fn permanent_failure(mut self, p: ConsumerPermanentFailure) -> Self {
        self.permanent.set_policy(p);
        self
    }

    /// What the fingerprint covers (default: the payload).
    #[must_use]
    pub fn fingerprint(mut self, mode: FingerprintMode) -> Self {
        self.fingerprint = mode;
        self
    }

    /// Called once with the message id and the error when the work fails
    /// permanently (not on replays of that failure).
    #[must_use]
    pub fn on_permanent_failure(
        mut self,
        hook: impl Fn(&str, &dyn fmt::Debug) + Send + Sync + 'static,
    ) -> Self {
        self.permanent.set_hook(Arc::new(hook));
        self
    }

    /// The consumer.
    ///
    /// # Errors
    ///
    /// [`ConsumerConfigError`] for a missing or invalid owner or operation, or a
    /// backoff whose base is zero or above its cap.
    pub fn build(self) -> Result<Consumer<S>, ConsumerConfigError> {
        let scope = self.scope.build(|| None).map_err(|e| match e {
            ScopeSettingError::MissingOwner => ConsumerConfigError::MissingOwner,
            ScopeSettingError::MissingOperation => ConsumerConfigError::MissingOperation,
            ScopeSettingError::Invalid { source, .. } => ConsumerConfigError::InvalidScope(source),
        })?;
        if self.backoff.base.is_zero() || self.backoff.base > self.backoff.cap {
            return Err(ConsumerConfigError::InvalidBackoff);
        }
        Ok(Consumer {
            inner: Arc::new(Inner {
                idem: self.idem,
                scope,
                backoff: self.backoff,
                permanent: self.permanent,
                fingerprint: self.fingerprint,
            }),
        })
    }
}

/// Processes messages at most once per consumer group: the broker-neutral
/// core every adapter calls ([`Consumer::process`]). Cheap to clone.
pub struct Consumer<S: Store> {
    pub(crate) inner: Arc<Inner<S>>,
}

pub(crate) struct Inner<S: Store> {
    pub(crate) idem: Idem<S>,
    pub(crate) scope: Scope,
    pub(crate) backoff: Backoff,
    pub(crate) permanent: FailurePolicy,
    pub(crate) fingerprint: FingerprintMode,
}

impl<S: Store> Clone for Consumer<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S: Store> fmt::Debug for Consumer<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("scope", &self.inner.scope)
            .field("backoff", &self.inner.backoff)
            .field("permanent", &self.inner.permanent.policy())
            .field("fingerprint", &self.inner.fingerprint)
            .finish_non_exhaustive()
    }
}

impl<S: Store> Consumer<S> {
    /// A builder on `idem`, whose [`Policy`](idem_core::Policy) gives the
    /// lease (set it above the longest work, and above the broker's ack
    /// wait) and the retention (set `key_ttl` above the broker's whole
    /// redelivery window).
    #[must_use]
    pub fn builder(idem: Idem<S>) -> ConsumerBuilder<S> {
        ConsumerBuilder {
            idem,
            scope: ScopeSetting::default(),
            backoff: Backoff::default(),
            permanent: FailurePolicy::default(),
            fingerprint: FingerprintMode::default(),
        }
    }

    /// The engine.
    #[must_use]
    pub fn idem(&self) -> &Idem<S> {
        &self.inner.idem
    }

    /// The records' scope: (consumer group, handler).
    #[must_use]
    pub fn scope(&self) -> &Scope {
        &self.inner.scope
    }

    /// The retry delay for the `delivery`th delivery (1 = first), as
    /// configured ([`ConsumerBuilder::retry_backoff`]).
    #[must_use]
    pub fn backoff(&self, delivery: u32) -> Duration {
        self.inner.backoff.delay(delivery)
    }
}
