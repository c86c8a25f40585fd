//! The webhook layer and its builder, validated once at
//! [`WebhookLayerBuilder::build`]: the provider, the endpoint (the owner of every
//! record) and a retention that covers the provider's redeliveries.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode};
use idem_core::Idem;
use idem_core::Scope;
use idem_core::adapter::{ScopeSetting, ScopeSettingError};
use idem_core::store::Store;
use idem_core::wire::header;
use tower_layer::Layer;

use super::config::{
    DuplicateAnswer, FailurePolicy, WebhookConfigError, WebhookMode, WebhookPermanentFailure,
};
use super::delivery::Delivery;
use super::provider::{EventId, Provider};
use super::service::WebhookService;
use crate::config::Config;
use crate::headers::Class;
use crate::layer::IdempotencyLayer;
use crate::state::Shared;

/// The webhook receiver, a tower layer for the route of one provider's
/// deliveries. It *replaces* [`IdempotencyLayer`](crate::IdempotencyLayer)
/// on that route (never stack them). Cheap to clone.
///
/// It is the idempotency layer in [`WebhookMode`], under its own name so
/// that it has its own [`builder`](Self::builder): the same shared state,
/// service, executor and shutdown.
///
/// See the [module docs](super) for the pipeline and the behaviour table.
pub struct WebhookLayer<S> {
    layer: IdempotencyLayer<S, WebhookMode>,
}

impl<S> Clone for WebhookLayer<S> {
    fn clone(&self) -> Self {
        Self {
            layer: self.layer.clone(),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for WebhookLayer<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = &self.layer.shared.mode;
        f.debug_struct("WebhookLayer")
            .field("idem", self.layer.idem())
            .field("provider", &mode.provider)
            .field("scope", &mode.scope)
            .finish_non_exhaustive()
    }
}

impl<S: Store> WebhookLayer<S> {
    /// Starts from an engine: its `Policy` gives the lease, the TTLs and the
    /// in-flight mode (a short `InFlightMode::Wait`, below the provider's
    /// timeout, turns most in-flight duplicates into plain duplicates).
    pub fn builder(idem: Idem<S>) -> WebhookLayerBuilder<S> {
        WebhookLayerBuilder {
            idem,
            provider: None,
            scope: ScopeSetting::default(),
            event_id: None,
            tolerance: Duration::from_secs(300),
            cfg: webhook_config(),
            duplicate: DuplicateAnswer::Ack,
            permanent: FailurePolicy::default(),
            fingerprint_body: false,
            fallback_body_hash: false,
            allow_short_retention: false,
        }
    }
}

impl<S> WebhookLayer<S> {
    /// The engine deliveries run through.
    pub fn idem(&self) -> &Idem<S> {
        self.layer.idem()
    }

    /// The scope of every record: `(endpoint, operation)`.
    pub fn scope(&self) -> &Scope {
        &self.layer.shared.mode.scope
    }

    /// Stops accepting deliveries: from now on they get 503 `shutting_down`,
    /// and the provider redelivers later.
    pub fn close(&self) {
        self.layer.close();
    }

    /// [`close`](Self::close), then waits for every running handler to
    /// finish and store its outcome.
    pub async fn shutdown(&self)
    where
        S: Send + Sync,
    {
        self.layer.shutdown().await;
    }
}

/// Builds a [`WebhookLayer`]; see [`WebhookLayer::builder`].
pub struct WebhookLayerBuilder<S> {
    idem: Idem<S>,
    provider: Option<Provider>,
    /// The endpoint (the owner) and the operation.
    scope: ScopeSetting,
    event_id: Option<EventId>,
    tolerance: Duration,
    /// The layer configuration the receiver runs on, with the webhook's
    /// defaults ([`webhook_config`]); `max_body`, `in_flight_status` and
    /// `classify` set it.
    cfg: Config,
    duplicate: DuplicateAnswer,
    permanent: FailurePolicy,
    fingerprint_body: bool,
    fallback_body_hash: bool,
    allow_short_retention: bool,
}

impl<S: fmt::Debug> fmt::Debug for WebhookLayerBuilder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookLayerBuilder")
            .field("idem", &self.idem)
            .field("provider", &self.provider)
            .field("endpoint", &self.scope.owner())
            .finish_non_exhaustive()
    }
}

impl<S: Store> WebhookLayerBuilder<S> {
    setters! {
        /// The sender (required).
        pub fn provider(p: Provider) => provider = Some(p);
    }

    /// The owner of every record (required), e.g.
    /// `"stripe/acct_1/billing"`: one key space per endpoint, from
    /// configuration, never from the request.
    #[must_use]
    pub fn endpoint(mut self, owner: impl Into<String>) -> Self {
        self.scope.set_owner(owner);
        self
    }

    /// The operation of every record (default `webhook <provider>`).
    #[must_use]
    pub fn operation(mut self, op: impl Into<String>) -> Self {
        self.scope.set_operation(op);
        self
    }

    setters! {
        /// Where the event id comes from (default: the provider's).
        pub fn event_id(e: EventId) => event_id = Some(e);

        /// How far a signed timestamp may be from the engine's clock, either way
        /// (default 300 s).
        pub fn tolerance(d: Duration) => tolerance;

        /// The body limit (default 2 MiB), checked before verifying; keep it
        /// ≤ the route's `DefaultBodyLimit`.
        pub fn max_body(bytes: usize) => cfg.max_request_body;

        /// What a duplicate of a finished delivery gets (default
        /// [`DuplicateAnswer::Ack`]).
        pub fn duplicate(a: DuplicateAnswer) => duplicate;

        /// The status of a duplicate that arrives while the first delivery
        /// runs (default 503, with `Retry-After` the lease left, as Standard
        /// Webhooks tells senders to honour); 409 or 429 also build. Never 410,
        /// which disables the endpoint.
        pub fn in_flight_status(s: StatusCode) => cfg.in_flight_status = Some(s);
    }

    /// What a permanent failure is answered with (default
    /// [`WebhookPermanentFailure::Acknowledge`]).
    #[must_use]
    pub fn permanent_failure(mut self, p: WebhookPermanentFailure) -> Self {
        self.permanent.set_policy(p);
        self
    }

    /// Called once per permanent failure, when it is stored (not on its
    /// duplicates).
    #[must_use]
    pub fn on_permanent_failure(
        mut self,
        f: impl Fn(&Delivery, &http::response::Parts) + Send + Sync + 'static,
    ) -> Self {
        self.permanent.set_hook(Arc::new(f));
        self
    }

    setters! {
        /// Whether the body is fingerprinted (default `false`): providers
        /// re-sign each attempt and may re-serialise the payload, and a 422 on a
        /// real redelivery would have them retry for days. `true` compares
        /// canonical JSON (other bodies by their bytes): the same id with
        /// another body is then 422 `fingerprint_mismatch`.
        pub fn fingerprint_body(on: bool) => fingerprint_body;

        /// Whether a verified delivery without an event id is keyed on the
        /// SHA-256 of its body (default `false`: 400 `missing_event_id`). Only
        /// the body counts: a timestamp would make every re-signed retry a new
        /// key.
        pub fn fallback_body_hash(on: bool) => fallback_body_hash;
    }

    /// Builds even when the engine's `key_ttl` is shorter than the
    /// provider's redelivery window (a redelivery after `key_ttl` runs
    /// again). The tolerance must still fit in `key_ttl`.
    #[must_use]
    pub fn allow_short_retention(mut self) -> Self {
        self.allow_short_retention = true;
        self
    }

    setters! {
        /// Replaces the default classifier: 2xx success; 4xx other than 408,
        /// 425 and 429 a permanent failure; everything else (5xx, 408, 425,
        /// 429, 1xx, 3xx) transient, released for the provider's next attempt.
        /// A [`Class`] response extension still wins.
        pub fn classify(
            f: impl Fn(&http::response::Parts) -> Class + Send + Sync + 'static,
        ) => cfg.classify = Some(Arc::new(f));
    }

    /// Validates the settings and builds the layer.
    ///
    /// # Errors
    ///
    /// [`WebhookConfigError`]: no provider or endpoint, an endpoint or operation a
    /// record scope cannot hold, a zero body limit, an in-flight status
    /// other than 409, 429 or 503, a `key_ttl` shorter than the provider's
    /// redelivery window (unless [`allow_short_retention`](Self::allow_short_retention))
    /// or than the tolerance.
    pub fn build(self) -> Result<WebhookLayer<S>, WebhookConfigError> {
        let provider = self.provider.ok_or(WebhookConfigError::MissingProvider)?;
        let default_operation = || Some(format!("webhook {}", provider.name()));
        let scope = self.scope.build(default_operation).map_err(|e| match e {
            // The operation has a default: only the endpoint can be missing.
            ScopeSettingError::MissingOwner | ScopeSettingError::MissingOperation => {
                WebhookConfigError::MissingEndpoint
            }
            ScopeSettingError::Invalid {
                owner,
                operation,
                source,
            } => WebhookConfigError::InvalidScope {
                owner,
                operation,
                source,
            },
        })?;
        if self.cfg.max_request_body == 0 {
            return Err(WebhookConfigError::ZeroBodyLimit);
        }
        if let Some(s) = self.cfg.in_flight_status
            && ![409, 429, 503].contains(&s.as_u16())
        {
            return Err(WebhookConfigError::InFlightStatus(s));
        }
        let key_ttl = self.idem.policy().key_ttl();
        if key_ttl < self.tolerance {
            return Err(WebhookConfigError::ToleranceExceedsRetention {
                tolerance: self.tolerance,
                key_ttl,
            });
        }
        if key_ttl < provider.min_retention() && !self.allow_short_retention {
            return Err(WebhookConfigError::RetentionTooShort {
                provider: provider.name().to_owned(),
                key_ttl,
                window: provider.min_retention(),
            });
        }
        let event_id = self.event_id.unwrap_or_else(|| provider.event_id.clone());
        let mode = WebhookMode {
            provider,
            scope,
            event_id,
            tolerance: self.tolerance,
            duplicate: self.duplicate,
            permanent: self.permanent,
            fingerprint_body: self.fingerprint_body,
            fallback_body_hash: self.fallback_body_hash,
        };
        Ok(WebhookLayer {
            layer: IdempotencyLayer {
                shared: Shared::new(self.idem, self.cfg, mode, None),
            },
        })
    }
}

/// The layer configuration of a webhook receiver before its builder's
/// settings: `POST` only, the webhook classification, the one replay
/// marker, 503 for an in-flight duplicate, and the layer's defaults (the
/// 2 MiB body limit, detached handlers, lease renewal).
fn webhook_config() -> Config {
    let marker = HeaderName::from_static(header::IDEMPOTENT_REPLAYED);
    Config {
        methods: vec![Method::POST],
        classify: Some(Arc::new(|p: &http::response::Parts| class(p.status))),
        replayed_names: vec![marker.as_str().to_owned()],
        replayed_headers: vec![marker],
        in_flight_status: Some(StatusCode::SERVICE_UNAVAILABLE),
        ..Config::default()
    }
}

/// The webhook classification of a status.
fn class(status: StatusCode) -> Class {
    match status.as_u16() {
        200..=299 => Class::Success,
        408 | 425 | 429 => Class::Transient,
        400..=499 => Class::Failure,
        _ => Class::Transient,
    }
}

impl<Svc, S> Layer<Svc> for WebhookLayer<S> {
    type Service = WebhookService<Svc, S>;

    fn layer(&self, inner: Svc) -> Self::Service {
        self.layer.layer(inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::webhook::Secret;
    use idem_core::MemoryStore;

    fn stripe() -> Provider {
        Provider::stripe([Secret::new("whsec_x")])
    }

    #[test]
    fn build_refuses_what_cannot_work() {
        let idem = Idem::new(MemoryStore::new());
        let b = || WebhookLayer::builder(idem.clone());
        assert_eq!(
            b().endpoint("e").build().err(),
            Some(WebhookConfigError::MissingProvider)
        );
        assert_eq!(
            b().provider(stripe()).build().err(),
            Some(WebhookConfigError::MissingEndpoint)
        );
        assert!(matches!(
            b().provider(stripe()).endpoint("").build(),
            Err(WebhookConfigError::InvalidScope { .. })
        ));
        assert!(matches!(
            b().provider(stripe()).endpoint("e\n").build(),
            Err(WebhookConfigError::InvalidScope { .. })
        ));
        assert_eq!(
            b().provider(stripe())
                .endpoint("e")
                .in_flight_status(StatusCode::GONE)
                .build()
                .err(),
            Some(WebhookConfigError::InFlightStatus(StatusCode::GONE))
        );
        assert_eq!(
            b().provider(stripe())
                .endpoint("e")
                .max_body(0)
                .build()
                .err(),
            Some(WebhookConfigError::ZeroBodyLimit)
        );
        let layer = b()
            .provider(stripe())
            .endpoint("stripe/acct_1")
            .in_flight_status(StatusCode::CONFLICT)
            .build()
            .expect("layer");
        assert_eq!(layer.scope().owner(), "stripe/acct_1");
        assert_eq!(layer.scope().operation(), "webhook stripe");
    }

    #[test]
    fn webhook_classification() {
        for (s, c) in [
            (200, Class::Success),
            (204, Class::Success),
            (400, Class::Failure),
            (401, Class::Failure),
            (404, Class::Failure),
            (422, Class::Failure),
            (408, Class::Transient),
            (425, Class::Transient),
            (429, Class::Transient),
            (500, Class::Transient),
            (503, Class::Transient),
            (302, Class::Transient),
        ] {
            assert_eq!(class(StatusCode::from_u16(s).expect("status")), c, "{s}");
        }
    }
}
