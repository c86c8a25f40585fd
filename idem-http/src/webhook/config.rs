//! What a webhook receiver is configured with beyond the layer's shared
//! [`Config`](crate::config::Config) (set through its builder in
//! `layer.rs`, read by its mode in `service.rs`): the provider, the scope,
//! and how duplicates and permanent failures are answered.

use std::fmt;
use std::time::Duration;

use http::StatusCode;
use idem_core::Scope;
use idem_core::adapter::PermanentFailurePolicy;
use idem_core::error::ScopeError;

use super::delivery::Delivery;
use super::provider::{EventId, Provider};

/// A configuration [`WebhookLayerBuilder::build`](super::WebhookLayerBuilder::build) refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WebhookConfigError {
    /// No [`provider`](super::WebhookLayerBuilder::provider).
    #[error("invalid webhook layer configuration: no provider")]
    MissingProvider,
    /// [`max_body`](super::WebhookLayerBuilder::max_body) is 0: no delivery could
    /// be verified.
    #[error("invalid webhook layer configuration: max_body is 0")]
    ZeroBodyLimit,
    /// No [`endpoint`](super::WebhookLayerBuilder::endpoint).
    #[error("invalid webhook layer configuration: no endpoint")]
    MissingEndpoint,
    /// The endpoint and operation are not a scope a
    /// record can hold (empty, over 1,024 bytes, a control character).
    #[error(
        "invalid webhook layer configuration: endpoint {owner:?}, operation {operation:?}: {source}"
    )]
    InvalidScope {
        /// The endpoint.
        owner: String,
        /// The operation.
        operation: String,
        /// Why a scope refuses it.
        #[source]
        source: ScopeError,
    },
    /// The in-flight status is not 409, 429 or 503.
    #[error("invalid webhook layer configuration: in-flight status {0} (409, 429 or 503)")]
    InFlightStatus(StatusCode),
    /// The engine's `key_ttl` is shorter than the
    /// provider's redelivery window, so a late redelivery would run again
    /// (see `allow_short_retention`).
    #[error(
        "invalid webhook layer configuration: key_ttl {key_ttl:?} is shorter than {provider}'s redelivery window {window:?}"
    )]
    RetentionTooShort {
        /// The provider.
        provider: String,
        /// The engine's `key_ttl`.
        key_ttl: Duration,
        /// The provider's window.
        window: Duration,
    },
    /// The engine's `key_ttl` is shorter than the
    /// timestamp tolerance, so a captured request could run twice.
    #[error(
        "invalid webhook layer configuration: key_ttl {key_ttl:?} is shorter than the tolerance {tolerance:?}"
    )]
    ToleranceExceedsRetention {
        /// The timestamp tolerance.
        tolerance: Duration,
        /// The engine's `key_ttl`.
        key_ttl: Duration,
    },
}

/// What a duplicate of a delivery that finished gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum DuplicateAnswer {
    /// `200`, an empty body and `Idempotent-Replayed: true` (the default):
    /// providers read only the status.
    #[default]
    Ack,
    /// The stored response with `Idempotent-Replayed: true` (a permanent
    /// failure acknowledged with 200 stays 200).
    Replay,
}

/// What a handler's permanent failure (a 4xx other than 408, 425 and 429)
/// is answered with. Either way it is stored, so its redeliveries are
/// duplicates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum WebhookPermanentFailure {
    /// `200` with an empty body (the default): days of redeliveries cannot
    /// fix it, and a provider that sees failures disables the endpoint. The
    /// hook and the metric report it.
    #[default]
    Acknowledge,
    /// The handler's own response.
    PassThrough,
}

/// The permanent-failure policy, with its hook told the delivery and the
/// handler's response head.
pub(crate) type FailurePolicy = PermanentFailurePolicy<
    WebhookPermanentFailure,
    dyn Fn(&Delivery, &http::response::Parts) + Send + Sync,
>;

/// The webhook receiver's mode of the idempotency service: the provider's
/// event id is the key, the configured endpoint the owner, and the answers
/// are the ones a provider understands (see the [module docs](super)). It
/// is the third parameter of [`WebhookService`](super::WebhookService);
/// only [`WebhookLayer::builder`](super::WebhookLayer::builder) makes one.
pub struct WebhookMode {
    pub(crate) provider: Provider,
    pub(crate) scope: Scope,
    pub(crate) event_id: EventId,
    pub(crate) tolerance: Duration,
    pub(crate) duplicate: DuplicateAnswer,
    pub(crate) permanent: FailurePolicy,
    pub(crate) fingerprint_body: bool,
    pub(crate) fallback_body_hash: bool,
}

impl fmt::Debug for WebhookMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookMode")
            .field("provider", &self.provider)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}
