//! The layer and its builder: the one way to configure it, validated once
//! at [`IdempotencyLayerBuilder::build`]. The layer wraps each handler in an
//! [`IdempotencyService`] (`service.rs`, where a request goes next).

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode};
use idem_core::error::ScopeError;
use idem_core::store::Store;
use idem_core::{Idem, IdempotencyKey, Scope};
use tower_layer::Layer;

use crate::config::{Config, KeyNamespace, KeyRequirement, OperationSource};
use crate::envelope::FingerprintSpec;
use crate::headers::{Class, HeaderPolicy};
use crate::owner::{NoOwner, OwnerSource};
use crate::problem::ProblemTypes;
use crate::service::IdempotencyService;
use crate::state::{Link, Shared};
use idem_core::wire::KeySyntax;

/// A configuration [`IdempotencyLayerBuilder::build`] refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HttpConfigError {
    /// [`IdempotencyLayerBuilder::methods`] is empty: the layer would cover nothing.
    #[error("invalid idempotency layer configuration: no method is covered")]
    NoMethods,
    /// [`IdempotencyLayerBuilder::max_request_body`] is 0: no body could be fingerprinted.
    #[error("invalid idempotency layer configuration: max_request_body is 0")]
    ZeroRequestBodyLimit,
    /// An [`IdempotencyLayerBuilder::replayed_headers`] name is the key header: a replay
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
}

/// The tower layer. Cheap to clone (everything behind one `Arc`); clones
/// share the shutdown state and the tracker of detached handlers.
///
/// Configured only through its [`IdempotencyLayerBuilder`]. Per-route settings:
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
            .field("owner", &self.shared.mode)
            .field("methods", &self.shared.cfg.methods)
            .finish_non_exhaustive()
    }
}

impl<S: Store> IdempotencyLayer<S, NoOwner> {
    /// Starts from an engine: its `Policy` supplies the response and key
    /// TTLs, the lease, the in-flight mode and `max_response_bytes`; the
    /// layer adds only HTTP concerns.
    pub fn builder(idem: Idem<S>) -> IdempotencyLayerBuilder<S, NoOwner> {
        IdempotencyLayerBuilder {
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
        self.shared.shutdown().await;
    }
}

/// Builds an [`IdempotencyLayer`]; see [`IdempotencyLayer::builder`].
pub struct IdempotencyLayerBuilder<S, O> {
    idem: Idem<S>,
    owner: O,
    cfg: Config,
    /// The shutdown state of the layer this builder came from
    /// ([`IdempotencyLayer::to_builder`]).
    link: Option<Link>,
}

impl<S: fmt::Debug, O: fmt::Debug> fmt::Debug for IdempotencyLayerBuilder<S, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayerBuilder")
            .field("idem", &self.idem)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

impl<S: Store, O> IdempotencyLayerBuilder<S, O> {
    /// Who owns every record (required: `build` exists only once an owner
    /// source is set): an [`ExtensionOwner`](crate::ExtensionOwner), a
    /// closure over the request head, or a [`FixedOwner`](crate::FixedOwner).
    pub fn owner<O2: OwnerSource>(self, owner: O2) -> IdempotencyLayerBuilder<S, O2> {
        IdempotencyLayerBuilder {
            idem: self.idem,
            owner,
            cfg: self.cfg,
            link: self.link,
        }
    }

    setters! {
        /// The status when the owner is unavailable (default 500; some APIs
        /// prefer 401).
        pub fn missing_owner_status(status: StatusCode) => cfg.missing_owner_status;

        /// The covered methods (default POST, PATCH). Others pass untouched.
        pub fn methods(
            m: impl IntoIterator<Item = Method>,
        ) => cfg.methods = m.into_iter().collect();

        /// Whether covered requests need a key (default required).
        pub fn key(r: KeyRequirement) => cfg.key;

        /// The key syntax (default lenient: sf-string or bare).
        pub fn key_syntax(s: KeySyntax) => cfg.key_syntax;

        /// The key header (default `Idempotency-Key`).
        pub fn key_header(name: HeaderName) => cfg.key_header;

        /// An extra key rule, e.g. a minimum length; a refusal is 400
        /// `invalid_key` with reason `rejected_by_validator`, and the `Err`
        /// reason is the problem's `detail`.
        pub fn key_validator(
            f: impl Fn(&IdempotencyKey) -> Result<(), Cow<'static, str>> + Send + Sync + 'static,
        ) => cfg.key_validator = Some(Arc::new(f));

        /// Where the operation comes from (default [`OperationSource::Path`],
        /// in every build; axum apps name their routes with
        /// `OperationSource::MatchedPath`).
        pub fn operation(o: OperationSource) => cfg.operation;

        /// Which records share a key space (default per route).
        pub fn key_namespace(n: KeyNamespace) => cfg.namespace;

        /// What makes two requests the same.
        pub fn fingerprint(f: FingerprintSpec) => cfg.fingerprint;

        /// The request body limit (default 2 MiB); keep it ≤ the route's
        /// `DefaultBodyLimit`.
        pub fn max_request_body(bytes: usize) => cfg.max_request_body;

        /// Replaces the default classifier (a [`Class`] response extension
        /// still wins).
        pub fn classify(
            f: impl Fn(&http::response::Parts) -> Class + Send + Sync + 'static,
        ) => cfg.classify = Some(Arc::new(f));

        /// Which response headers are stored (default: all but `Set-Cookie`,
        /// trace and request ids, `Server-Timing`, `Age`).
        pub fn stored_headers(p: HeaderPolicy) => cfg.stored_headers;

        /// The headers set to `true` on a replay (default `Idempotent-Replayed`
        /// and `X-Idempotent-Replayed`).
        pub fn replayed_headers(
            names: impl IntoIterator<Item = HeaderName>,
        ) => cfg.replayed_headers = names.into_iter().collect();

        /// How problem `type` URIs are formed (default the draft's anchors).
        pub fn problem_types(t: ProblemTypes) => cfg.problem_types;

        /// Adds `Link: <url>; rel="describedby"` to every problem.
        pub fn docs_url(url: impl Into<String>) => cfg.docs_url = Some(url.into());

        /// Whether handlers run in a spawned, tracked task (default `true`): a
        /// client disconnect or an outer timeout then cannot cut an operation in
        /// half. Needs a tokio runtime. Either way a panicking handler is
        /// answered with 500 `handler_panicked` and its record is left in flight
        /// for recovery after the lease; `false` runs the handler inside the
        /// request's own future, so a disconnect drops it mid-work (a crash,
        /// recovered the same way).
        pub fn detached(on: bool) => cfg.detached;

        /// Renews the lease every `lease / 3` while a handler runs, up to
        /// `ceiling` (default 5 min); `None` turns it off.
        pub fn auto_renew_lease(ceiling: Option<Duration>) => cfg.auto_renew;
    }
}

impl<S: Store, O: OwnerSource> IdempotencyLayerBuilder<S, O> {
    /// Validates the settings and builds the layer.
    ///
    /// # Errors
    ///
    /// [`HttpConfigError`] for an empty method list, a zero body limit, a
    /// replay header that is also the key header, or a route or fixed
    /// operation name a record scope cannot hold.
    pub fn build(mut self) -> Result<IdempotencyLayer<S, O>, HttpConfigError> {
        if self.cfg.methods.is_empty() {
            return Err(HttpConfigError::NoMethods);
        }
        if self.cfg.max_request_body == 0 {
            return Err(HttpConfigError::ZeroRequestBodyLimit);
        }
        if let Some(h) = self
            .cfg
            .replayed_headers
            .iter()
            .find(|h| **h == self.cfg.key_header)
        {
            return Err(HttpConfigError::ReplayHeaderIsKeyHeader(h.clone()));
        }
        check_operation(&self.cfg)?;
        self.cfg.replayed_names = self
            .cfg
            .replayed_headers
            .iter()
            .map(|h| h.as_str().to_owned())
            .collect();
        Ok(IdempotencyLayer {
            shared: Shared::new(self.idem, self.cfg, self.owner, self.link),
        })
    }
}

impl<S: Store, O: OwnerSource> IdempotencyLayer<S, O> {
    /// A builder holding this layer's engine, owner source and settings;
    /// the layer it builds shares this layer's shutdown state and tracker.
    #[must_use]
    pub fn to_builder(&self) -> IdempotencyLayerBuilder<S, O> {
        IdempotencyLayerBuilder {
            idem: self.shared.idem.clone(),
            owner: self.shared.mode.clone(),
            cfg: self.shared.cfg.clone(),
            link: Some(self.shared.link()),
        }
    }
}

/// A `Route` or `Fixed` name is known at build time: refuse it there rather
/// than answer every request with 500 `operation_unavailable`. A route is
/// checked with each covered method.
fn check_operation(cfg: &Config) -> Result<(), HttpConfigError> {
    let names: Vec<String> = match (&cfg.namespace, &cfg.operation) {
        (KeyNamespace::PerOwner, _) => return Ok(()),
        (_, OperationSource::Route(t)) => cfg.methods.iter().map(|m| format!("{m} {t}")).collect(),
        (_, OperationSource::Fixed(n)) => vec![n.clone().into_owned()],
        _ => return Ok(()),
    };
    for name in names {
        if let Err(source) = Scope::new("owner", name.as_str()) {
            return Err(HttpConfigError::InvalidOperation { name, source });
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
