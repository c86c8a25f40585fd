//! The webhook layer and its builder, validated once at
//! [`Builder::build`]: the provider, the endpoint (the owner of every
//! record) and a retention that covers the provider's redeliveries.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode};
use idem_core::Idem;
use idem_core::Scope;
use idem_core::store::Store;
use idem_core::wire::{DEFAULT_MAX_REQUEST_BODY, header};
use tokio_util::task::TaskTracker;
use tower_layer::Layer;

use super::delivery::Delivery;
use super::provider::{EventId, Provider};
use super::service::WebhookService;
use crate::config::{Classifier, Config};
use crate::headers::Class;
use crate::layer::{ConfigError, Shared};

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
pub enum PermanentFailure {
    /// `200` with an empty body (the default): days of redeliveries cannot
    /// fix it, and a provider that sees failures disables the endpoint. The
    /// hook and the metric report it.
    #[default]
    Acknowledge,
    /// The handler's own response.
    PassThrough,
}

pub(crate) type FailureHook = Arc<dyn Fn(&Delivery, &http::response::Parts) + Send + Sync>;

/// The webhook settings beyond the shared [`Config`].
pub(crate) struct Hook {
    pub(crate) provider: Provider,
    pub(crate) scope: Scope,
    pub(crate) event_id: EventId,
    pub(crate) tolerance: Duration,
    pub(crate) duplicate: DuplicateAnswer,
    pub(crate) permanent: PermanentFailure,
    pub(crate) on_permanent: Option<FailureHook>,
    pub(crate) fingerprint_body: bool,
    pub(crate) fallback_body_hash: bool,
}

/// The webhook receiver, a tower layer for the route of one provider's
/// deliveries. It *replaces* [`IdempotencyLayer`](crate::IdempotencyLayer)
/// on that route (never stack them). Cheap to clone.
///
/// See the [module docs](super) for the pipeline and the behaviour table.
pub struct WebhookLayer<S> {
    pub(crate) shared: Arc<Shared<S, ()>>,
    pub(crate) hook: Arc<Hook>,
}

impl<S> Clone for WebhookLayer<S> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
            hook: Arc::clone(&self.hook),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for WebhookLayer<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookLayer")
            .field("idem", &self.shared.idem)
            .field("provider", &self.hook.provider)
            .field("scope", &self.hook.scope)
            .finish_non_exhaustive()
    }
}

impl<S: Store> WebhookLayer<S> {
    /// Starts from an engine: its `Policy` gives the lease, the TTLs and the
    /// in-flight mode (a short `InFlightMode::Wait`, below the provider's
    /// timeout, turns most in-flight duplicates into plain duplicates).
    pub fn builder(idem: Idem<S>) -> Builder<S> {
        Builder {
            idem,
            provider: None,
            endpoint: None,
            operation: None,
            event_id: None,
            tolerance: Duration::from_secs(300),
            max_body: DEFAULT_MAX_REQUEST_BODY,
            duplicate: DuplicateAnswer::Ack,
            in_flight_status: StatusCode::SERVICE_UNAVAILABLE,
            permanent: PermanentFailure::Acknowledge,
            on_permanent: None,
            fingerprint_body: false,
            fallback_body_hash: false,
            allow_short_retention: false,
            classify: None,
        }
    }
}

impl<S> WebhookLayer<S> {
    /// The engine deliveries run through.
    pub fn idem(&self) -> &Idem<S> {
        &self.shared.idem
    }

    /// The scope of every record: `(endpoint, operation)`.
    pub fn scope(&self) -> &Scope {
        &self.hook.scope
    }

    /// Stops accepting deliveries: from now on they get 503 `shutting_down`,
    /// and the provider redelivers later.
    pub fn close(&self) {
        self.shared.close();
    }

    /// [`close`](Self::close), then waits for every running handler to
    /// finish and store its outcome.
    pub async fn shutdown(&self)
    where
        S: Send + Sync,
    {
        self.shared.close();
        self.shared.tracker.wait().await;
    }
}

/// Builds a [`WebhookLayer`]; see [`WebhookLayer::builder`].
pub struct Builder<S> {
    idem: Idem<S>,
    provider: Option<Provider>,
    endpoint: Option<String>,
    operation: Option<String>,
    event_id: Option<EventId>,
    tolerance: Duration,
    max_body: usize,
    duplicate: DuplicateAnswer,
    in_flight_status: StatusCode,
    permanent: PermanentFailure,
    on_permanent: Option<FailureHook>,
    fingerprint_body: bool,
    fallback_body_hash: bool,
    allow_short_retention: bool,
    classify: Option<Classifier>,
}

impl<S: fmt::Debug> fmt::Debug for Builder<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("idem", &self.idem)
            .field("provider", &self.provider)
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl<S: Store> Builder<S> {
    /// The sender (required).
    #[must_use]
    pub fn provider(mut self, p: Provider) -> Self {
        self.provider = Some(p);
        self
    }

    /// The owner of every record (required), e.g.
    /// `"stripe/acct_1/billing"`: one key space per endpoint, from
    /// configuration, never from the request.
    #[must_use]
    pub fn endpoint(mut self, owner: impl Into<String>) -> Self {
        self.endpoint = Some(owner.into());
        self
    }

    /// The operation of every record (default `webhook <provider>`).
    #[must_use]
    pub fn operation(mut self, op: impl Into<String>) -> Self {
        self.operation = Some(op.into());
        self
    }

    /// Where the event id comes from (default: the provider's).
    #[must_use]
    pub fn event_id(mut self, e: EventId) -> Self {
        self.event_id = Some(e);
        self
    }

    /// How far a signed timestamp may be from the engine's clock, either way
    /// (default 300 s).
    #[must_use]
    pub fn tolerance(mut self, d: Duration) -> Self {
        self.tolerance = d;
        self
    }

    /// The body limit (default 2 MiB), checked before verifying; keep it
    /// ≤ the route's `DefaultBodyLimit`.
    #[must_use]
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// What a duplicate of a finished delivery gets (default
    /// [`DuplicateAnswer::Ack`]).
    #[must_use]
    pub fn duplicate(mut self, a: DuplicateAnswer) -> Self {
        self.duplicate = a;
        self
    }

    /// The status of a duplicate that arrives while the first delivery
    /// runs (default 503, with `Retry-After` the lease left, as Standard
    /// Webhooks tells senders to honour); 409 or 429 also build. Never 410,
    /// which disables the endpoint.
    #[must_use]
    pub fn in_flight_status(mut self, s: StatusCode) -> Self {
        self.in_flight_status = s;
        self
    }

    /// What a permanent failure is answered with (default
    /// [`PermanentFailure::Acknowledge`]).
    #[must_use]
    pub fn permanent_failure(mut self, p: PermanentFailure) -> Self {
        self.permanent = p;
        self
    }

    /// Called once per permanent failure, when it is stored (not on its
    /// duplicates).
    #[must_use]
    pub fn on_permanent_failure(
        mut self,
        f: impl Fn(&Delivery, &http::response::Parts) + Send + Sync + 'static,
    ) -> Self {
        self.on_permanent = Some(Arc::new(f));
        self
    }

    /// Whether the body is fingerprinted (default `false`): providers
    /// re-sign each attempt and may re-serialise the payload, and a 422 on a
    /// real redelivery would have them retry for days. `true` compares
    /// canonical JSON (other bodies by their bytes): the same id with
    /// another body is then 422 `fingerprint_mismatch`.
    #[must_use]
    pub fn fingerprint_body(mut self, on: bool) -> Self {
        self.fingerprint_body = on;
        self
    }

    /// Whether a verified delivery without an event id is keyed on the
    /// SHA-256 of its body (default `false`: 400 `missing_event_id`). Only
    /// the body counts: a timestamp would make every re-signed retry a new
    /// key.
    #[must_use]
    pub fn fallback_body_hash(mut self, on: bool) -> Self {
        self.fallback_body_hash = on;
        self
    }

    /// Builds even when the engine's `key_ttl` is shorter than the
    /// provider's redelivery window (a redelivery after `key_ttl` runs
    /// again). The tolerance must still fit in `key_ttl`.
    #[must_use]
    pub fn allow_short_retention(mut self) -> Self {
        self.allow_short_retention = true;
        self
    }

    /// Replaces the default classifier: 2xx success; 4xx other than 408,
    /// 425 and 429 a permanent failure; everything else (5xx, 408, 425,
    /// 429, 1xx, 3xx) transient, released for the provider's next attempt.
    /// A [`Class`] response extension still wins.
    #[must_use]
    pub fn classify(
        mut self,
        f: impl Fn(&http::response::Parts) -> Class + Send + Sync + 'static,
    ) -> Self {
        self.classify = Some(Arc::new(f));
        self
    }

    /// Validates the settings and builds the layer.
    ///
    /// # Errors
    ///
    /// [`ConfigError`]: no provider or endpoint, an endpoint or operation a
    /// record scope cannot hold, a zero body limit, an in-flight status
    /// other than 409, 429 or 503, a `key_ttl` shorter than the provider's
    /// redelivery window (unless [`allow_short_retention`](Self::allow_short_retention))
    /// or than the tolerance.
    pub fn build(self) -> Result<WebhookLayer<S>, ConfigError> {
        let provider = self.provider.ok_or(ConfigError::MissingProvider)?;
        let endpoint = self.endpoint.ok_or(ConfigError::MissingEndpoint)?;
        let operation = self
            .operation
            .unwrap_or_else(|| format!("webhook {}", provider.name()));
        let scope = Scope::new(endpoint.as_str(), operation.as_str()).map_err(|source| {
            ConfigError::InvalidScope {
                owner: endpoint.clone(),
                operation: operation.clone(),
                source,
            }
        })?;
        if self.max_body == 0 {
            return Err(ConfigError::ZeroRequestBodyLimit);
        }
        if ![409, 429, 503].contains(&self.in_flight_status.as_u16()) {
            return Err(ConfigError::InFlightStatus(self.in_flight_status));
        }
        let key_ttl = self.idem.policy().key_ttl();
        if key_ttl < self.tolerance {
            return Err(ConfigError::ToleranceExceedsRetention {
                tolerance: self.tolerance,
                key_ttl,
            });
        }
        if key_ttl < provider.min_retention() && !self.allow_short_retention {
            return Err(ConfigError::RetentionTooShort {
                provider: provider.name().to_owned(),
                key_ttl,
                window: provider.min_retention(),
            });
        }
        let marker = HeaderName::from_static(header::IDEMPOTENT_REPLAYED);
        let cfg = Config {
            methods: vec![Method::POST],
            max_request_body: self.max_body,
            classify: Some(
                self.classify
                    .unwrap_or_else(|| Arc::new(|p: &http::response::Parts| class(p.status))),
            ),
            replayed_names: vec![marker.as_str().to_owned()],
            replayed_headers: vec![marker],
            in_flight_status: Some(self.in_flight_status),
            ..Config::default()
        };
        let event_id = self.event_id.unwrap_or_else(|| provider.event_id.clone());
        Ok(WebhookLayer {
            shared: Arc::new(Shared {
                idem: self.idem,
                cfg,
                owner: (),
                tracker: TaskTracker::new(),
                closed: Arc::new(AtomicBool::new(false)),
            }),
            hook: Arc::new(Hook {
                provider,
                scope,
                event_id,
                tolerance: self.tolerance,
                duplicate: self.duplicate,
                permanent: self.permanent,
                on_permanent: self.on_permanent,
                fingerprint_body: self.fingerprint_body,
                fallback_body_hash: self.fallback_body_hash,
            }),
        })
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
        WebhookService::new(inner, self.clone())
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
            Some(ConfigError::MissingProvider)
        );
        assert_eq!(
            b().provider(stripe()).build().err(),
            Some(ConfigError::MissingEndpoint)
        );
        assert!(matches!(
            b().provider(stripe()).endpoint("").build(),
            Err(ConfigError::InvalidScope { .. })
        ));
        assert!(matches!(
            b().provider(stripe()).endpoint("e\n").build(),
            Err(ConfigError::InvalidScope { .. })
        ));
        assert_eq!(
            b().provider(stripe())
                .endpoint("e")
                .in_flight_status(StatusCode::GONE)
                .build()
                .err(),
            Some(ConfigError::InFlightStatus(StatusCode::GONE))
        );
        assert_eq!(
            b().provider(stripe())
                .endpoint("e")
                .max_body(0)
                .build()
                .err(),
            Some(ConfigError::ZeroRequestBodyLimit)
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
