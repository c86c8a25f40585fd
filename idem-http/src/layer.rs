//! The layer and its builder: the one way to configure it, validated once
//! at [`Builder::build`]. The layer wraps each handler in an
//! [`IdempotencyService`] (`service.rs`, where a request goes next).

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::{HeaderName, Method, StatusCode};
use idem_core::error::ScopeError;
use idem_core::store::Store;
use idem_core::{Idem, IdempotencyKey, Scope};
use tokio_util::task::TaskTracker;
use tower_layer::Layer;

use crate::config::{Config, KeyNamespace, KeyRequirement, OperationSource};
use crate::envelope::FingerprintSpec;
use crate::headers::{Class, HeaderPolicy};
use crate::owner::{NoOwner, OwnerSource};
use crate::problem::ProblemTypes;
use crate::service::IdempotencyService;
use idem_core::wire::KeySyntax;

/// A configuration [`Builder::build`] refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// [`Builder::methods`] is empty: the layer would cover nothing.
    #[error("invalid idempotency layer configuration: no method is covered")]
    NoMethods,
    /// [`Builder::max_request_body`] is 0: no body could be fingerprinted.
    #[error("invalid idempotency layer configuration: max_request_body is 0")]
    ZeroRequestBodyLimit,
    /// A [`Builder::replayed_headers`] name is the key header: a replay
    /// would overwrite the client's key.
    #[error(
        "invalid idempotency layer configuration: the replay header {0} is also the key header"
    )]
    ReplayHeaderIsKeyHeader(HeaderName),
    /// An [`OperationSource::Route`] or [`OperationSource::Fixed`] name that
    /// a record scope cannot hold (empty, over 1,024 bytes with the method,
    /// a control character).
    #[error("invalid idempotency layer configuration: operation {name:?}: {source}")]
    InvalidOperation {
        /// The operation as it would be stored.
        name: String,
        /// Why a scope refuses it.
        #[source]
        source: ScopeError,
    },
    /// Webhook receiver: no [`provider`](crate::webhook::Builder::provider).
    #[cfg(feature = "webhook")]
    #[cfg_attr(docsrs, doc(cfg(feature = "webhook")))]
    #[error("invalid webhook layer configuration: no provider")]
    MissingProvider,
    /// Webhook receiver: no [`endpoint`](crate::webhook::Builder::endpoint).
    #[cfg(feature = "webhook")]
    #[cfg_attr(docsrs, doc(cfg(feature = "webhook")))]
    #[error("invalid webhook layer configuration: no endpoint")]
    MissingEndpoint,
    /// Webhook receiver: the endpoint and operation are not a scope a
    /// record can hold (empty, over 1,024 bytes, a control character).
    #[cfg(feature = "webhook")]
    #[cfg_attr(docsrs, doc(cfg(feature = "webhook")))]
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
    /// Webhook receiver: the in-flight status is not 409, 429 or 503.
    #[cfg(feature = "webhook")]
    #[cfg_attr(docsrs, doc(cfg(feature = "webhook")))]
    #[error("invalid webhook layer configuration: in-flight status {0} (409, 429 or 503)")]
    InFlightStatus(StatusCode),
    /// Webhook receiver: the engine's `key_ttl` is shorter than the
    /// provider's redelivery window, so a late redelivery would run again
    /// (see `allow_short_retention`).
    #[cfg(feature = "webhook")]
    #[cfg_attr(docsrs, doc(cfg(feature = "webhook")))]
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
    /// Webhook receiver: the engine's `key_ttl` is shorter than the
    /// timestamp tolerance, so a captured request could run twice.
    #[cfg(feature = "webhook")]
    #[cfg_attr(docsrs, doc(cfg(feature = "webhook")))]
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

pub(crate) struct Shared<S, O> {
    pub(crate) idem: Idem<S>,
    pub(crate) cfg: Config,
    pub(crate) owner: O,
    pub(crate) tracker: TaskTracker,
    pub(crate) closed: Arc<AtomicBool>,
}

/// The tower layer. Cheap to clone (everything behind one `Arc`); clones
/// share the shutdown state and the tracker of detached handlers.
///
/// Configured only through its [`Builder`]. Per-route settings:
/// `layer.to_builder().fingerprint(spec).build()?` is a layer with those
/// settings changed that still shares the engine, the owner source, the
/// shutdown state and the tracker with the original, so one
/// [`shutdown`](Self::shutdown) stops them all.
pub struct IdempotencyLayer<S, O> {
    pub(crate) shared: Arc<Shared<S, O>>,
}

impl<S, O> Clone for IdempotencyLayer<S, O> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, O: fmt::Debug> fmt::Debug for IdempotencyLayer<S, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("idem", &self.shared.idem)
            .field("owner", &self.shared.owner)
            .field("methods", &self.shared.cfg.methods)
            .finish_non_exhaustive()
    }
}

impl<S: Store> IdempotencyLayer<S, NoOwner> {
    /// Starts from an engine: its `Policy` supplies the response and key
    /// TTLs, the lease, the in-flight mode and `max_response_bytes`; the
    /// layer adds only HTTP concerns.
    pub fn builder(idem: Idem<S>) -> Builder<S, NoOwner> {
        Builder {
            idem,
            owner: NoOwner,
            cfg: Config::default(),
            link: None,
        }
    }
}

impl<S, O> IdempotencyLayer<S, O> {
    /// The engine the layer runs requests through.
    pub fn idem(&self) -> &Idem<S> {
        &self.shared.idem
    }

    /// Stops accepting keyed requests: from now on they get 503
    /// `shutting_down` (uncovered requests still pass).
    pub fn close(&self) {
        self.shared.close();
    }

    /// [`close`](Self::close), then waits for every detached handler to
    /// finish and store its outcome. Call it after the server stopped
    /// accepting connections (`axum::serve(..).with_graceful_shutdown(..)`).
    pub async fn shutdown(&self)
    where
        S: Send + Sync,
        O: Send + Sync,
    {
        self.shared.close();
        self.shared.tracker.wait().await;
    }
}

impl<S, O> Shared<S, O> {
    /// New requests get 503 `shutting_down`; no more handlers are tracked.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.tracker.close();
    }
}

/// Builds an [`IdempotencyLayer`]; see [`IdempotencyLayer::builder`].
pub struct Builder<S, O> {
    idem: Idem<S>,
    owner: O,
    cfg: Config,
    /// The shutdown state of the layer this builder came from
    /// ([`IdempotencyLayer::to_builder`]).
    link: Option<(TaskTracker, Arc<AtomicBool>)>,
}

impl<S: fmt::Debug, O: fmt::Debug> fmt::Debug for Builder<S, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("idem", &self.idem)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

impl<S: Store, O> Builder<S, O> {
    /// Who owns every record (required: `build` exists only once an owner
    /// source is set): an [`ExtensionOwner`](crate::ExtensionOwner), a
    /// closure over the request head, or a [`FixedOwner`](crate::FixedOwner).
    pub fn owner<O2: OwnerSource>(self, owner: O2) -> Builder<S, O2> {
        Builder {
            idem: self.idem,
            owner,
            cfg: self.cfg,
            link: self.link,
        }
    }

    /// The status when the owner is unavailable (default 500; some APIs
    /// prefer 401).
    #[must_use]
    pub fn missing_owner_status(mut self, status: StatusCode) -> Self {
        self.cfg.missing_owner_status = status;
        self
    }

    /// The covered methods (default POST, PATCH). Others pass untouched.
    #[must_use]
    pub fn methods(mut self, m: impl IntoIterator<Item = Method>) -> Self {
        self.cfg.methods = m.into_iter().collect();
        self
    }

    /// Whether covered requests need a key (default required).
    #[must_use]
    pub fn key(mut self, r: KeyRequirement) -> Self {
        self.cfg.key = r;
        self
    }

    /// The key syntax (default lenient: sf-string or bare).
    #[must_use]
    pub fn key_syntax(mut self, s: KeySyntax) -> Self {
        self.cfg.key_syntax = s;
        self
    }

    /// The key header (default `Idempotency-Key`).
    #[must_use]
    pub fn key_header(mut self, name: HeaderName) -> Self {
        self.cfg.key_header = name;
        self
    }

    /// An extra key rule, e.g. a minimum length; a refusal is 400
    /// `invalid_key` with reason `rejected_by_validator`, and the `Err`
    /// reason is the problem's `detail`.
    #[must_use]
    pub fn key_validator(
        mut self,
        f: impl Fn(&IdempotencyKey) -> Result<(), Cow<'static, str>> + Send + Sync + 'static,
    ) -> Self {
        self.cfg.key_validator = Some(Arc::new(f));
        self
    }

    /// Where the operation comes from (default [`OperationSource::Path`],
    /// in every build; axum apps name their routes with
    /// `OperationSource::MatchedPath`).
    #[must_use]
    pub fn operation(mut self, o: OperationSource) -> Self {
        self.cfg.operation = o;
        self
    }

    /// Which records share a key space (default per route).
    #[must_use]
    pub fn key_namespace(mut self, n: KeyNamespace) -> Self {
        self.cfg.namespace = n;
        self
    }

    /// What makes two requests the same.
    #[must_use]
    pub fn fingerprint(mut self, f: FingerprintSpec) -> Self {
        self.cfg.fingerprint = f;
        self
    }

    /// The request body limit (default 2 MiB); keep it ≤ the route's
    /// `DefaultBodyLimit`.
    #[must_use]
    pub fn max_request_body(mut self, bytes: usize) -> Self {
        self.cfg.max_request_body = bytes;
        self
    }

    /// Replaces the default classifier (a [`Class`] response extension
    /// still wins).
    #[must_use]
    pub fn classify(
        mut self,
        f: impl Fn(&http::response::Parts) -> Class + Send + Sync + 'static,
    ) -> Self {
        self.cfg.classify = Some(Arc::new(f));
        self
    }

    /// Which response headers are stored (default: all but `Set-Cookie`,
    /// trace and request ids, `Server-Timing`, `Age`).
    #[must_use]
    pub fn stored_headers(mut self, p: HeaderPolicy) -> Self {
        self.cfg.stored_headers = p;
        self
    }

    /// The headers set to `true` on a replay (default `Idempotent-Replayed`
    /// and `X-Idempotent-Replayed`).
    #[must_use]
    pub fn replayed_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.cfg.replayed_headers = names.into_iter().collect();
        self
    }

    /// How problem `type` URIs are formed (default the draft's anchors).
    #[must_use]
    pub fn problem_types(mut self, t: ProblemTypes) -> Self {
        self.cfg.problem_types = t;
        self
    }

    /// Adds `Link: <url>; rel="describedby"` to every problem.
    #[must_use]
    pub fn docs_url(mut self, url: impl Into<String>) -> Self {
        self.cfg.docs_url = Some(url.into());
        self
    }

    /// Whether handlers run in a spawned, tracked task (default `true`): a
    /// client disconnect or an outer timeout then cannot cut an operation in
    /// half. Needs a tokio runtime. Either way a panicking handler is
    /// answered with 500 `handler_panicked` and its record is left in flight
    /// for recovery after the lease; `false` runs the handler inside the
    /// request's own future, so a disconnect drops it mid-work (a crash,
    /// recovered the same way).
    #[must_use]
    pub fn detached(mut self, on: bool) -> Self {
        self.cfg.detached = on;
        self
    }

    /// Renews the lease every `lease / 3` while a handler runs, up to
    /// `ceiling` (default 5 min); `None` turns it off.
    #[must_use]
    pub fn auto_renew_lease(mut self, ceiling: Option<Duration>) -> Self {
        self.cfg.auto_renew = ceiling;
        self
    }
}

impl<S: Store, O: OwnerSource> Builder<S, O> {
    /// Validates the settings and builds the layer.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] for an empty method list, a zero body limit, a
    /// replay header that is also the key header, or a route or fixed
    /// operation name a record scope cannot hold.
    pub fn build(mut self) -> Result<IdempotencyLayer<S, O>, ConfigError> {
        if self.cfg.methods.is_empty() {
            return Err(ConfigError::NoMethods);
        }
        if self.cfg.max_request_body == 0 {
            return Err(ConfigError::ZeroRequestBodyLimit);
        }
        if let Some(h) = self
            .cfg
            .replayed_headers
            .iter()
            .find(|h| **h == self.cfg.key_header)
        {
            return Err(ConfigError::ReplayHeaderIsKeyHeader(h.clone()));
        }
        check_operation(&self.cfg)?;
        self.cfg.replayed_names = self
            .cfg
            .replayed_headers
            .iter()
            .map(|h| h.as_str().to_owned())
            .collect();
        let (tracker, closed) = self
            .link
            .unwrap_or_else(|| (TaskTracker::new(), Arc::new(AtomicBool::new(false))));
        Ok(IdempotencyLayer {
            shared: Arc::new(Shared {
                idem: self.idem,
                cfg: self.cfg,
                owner: self.owner,
                tracker,
                closed,
            }),
        })
    }
}

impl<S: Store, O: OwnerSource> IdempotencyLayer<S, O> {
    /// A builder holding this layer's engine, owner source and settings;
    /// the layer it builds shares this layer's shutdown state and tracker.
    #[must_use]
    pub fn to_builder(&self) -> Builder<S, O> {
        Builder {
            idem: self.shared.idem.clone(),
            owner: self.shared.owner.clone(),
            cfg: self.shared.cfg.clone(),
            link: Some((self.shared.tracker.clone(), Arc::clone(&self.shared.closed))),
        }
    }
}

/// A `Route` or `Fixed` name is known at build time: refuse it there rather
/// than answer every request with 500 `operation_unavailable`. A route is
/// checked with each covered method.
fn check_operation(cfg: &Config) -> Result<(), ConfigError> {
    let names: Vec<String> = match (&cfg.namespace, &cfg.operation) {
        (KeyNamespace::PerOwner, _) => return Ok(()),
        (_, OperationSource::Route(t)) => cfg.methods.iter().map(|m| format!("{m} {t}")).collect(),
        (_, OperationSource::Fixed(n)) => vec![n.clone().into_owned()],
        _ => return Ok(()),
    };
    for name in names {
        if let Err(source) = Scope::new("owner", name.as_str()) {
            return Err(ConfigError::InvalidOperation { name, source });
        }
    }
    Ok(())
}

impl<Svc, S, O> Layer<Svc> for IdempotencyLayer<S, O> {
    type Service = IdempotencyService<Svc, S, O>;

    fn layer(&self, inner: Svc) -> Self::Service {
        IdempotencyService::new(inner, Arc::clone(&self.shared))
    }
}
