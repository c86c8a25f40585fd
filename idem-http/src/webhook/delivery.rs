//! What the handler (and the permanent-failure hook) learns about a
//! delivery: [`WebhookDelivery`] in the request's extensions, next to
//! [`IdemAttempt`](crate::IdemAttempt) (recovery, downstream keys).

use std::borrow::Cow;
use std::sync::Arc;

use idem_core::IdempotencyKey;
use idem_core::clock::Timestamp;

/// A verified delivery.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub(crate) provider: Cow<'static, str>,
    pub(crate) endpoint: Arc<str>,
    pub(crate) event_id: String,
    pub(crate) key: IdempotencyKey,
    pub(crate) timestamp: Option<Timestamp>,
}

impl Delivery {
    /// The provider's event id, as sent (for a body-hash key, the hash).
    #[must_use]
    pub fn event_id(&self) -> &str {
        &self.event_id
    }

    /// The record's key: the event id when it passes the key rules, else
    /// `IdempotencyKey::derive(provider, id)`.
    #[must_use]
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// The provider's name.
    #[must_use]
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// The configured endpoint (the record's owner).
    #[must_use]
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The signed timestamp, when the scheme has one (not GitHub).
    #[must_use]
    pub fn timestamp(&self) -> Option<Timestamp> {
        self.timestamp
    }
}

/// The verified delivery, in the request's extensions (and, with feature
/// `axum`, an extractor). The attempt (`is_recovery`, `downstream_key`) is
/// the [`IdemAttempt`](crate::IdemAttempt) beside it.
#[derive(Debug, Clone)]
pub struct WebhookDelivery(pub Delivery);
