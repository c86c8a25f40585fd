//! The layer, its builder and its configuration.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::{HeaderName, Method, StatusCode};
use idem_core::Idem;
use idem_core::IdempotencyKey;
use idem_core::store::Store;
use tokio_util::task::TaskTracker;

use crate::owner::{NoOwner, OwnerSource};
use crate::pipeline::{Class, FingerprintSpec, HeaderPolicy, KeySyntax, ProblemTypes};

/// Whether covered requests must carry a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeyRequirement {
    /// No key → 400 `missing_key` (the default).
    #[default]
    Required,
    /// No key → plain pass-through (a present key is still validated).
    Optional,
}

/// Which records share a key space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeyNamespace {
    /// `(owner, "METHOD /route", key)`: the same key on two routes is two
    /// records (the default).
    #[default]
    PerRoute,
    /// `(owner, "http", key)`: reusing a key on another route is a 422
    /// (Stripe's behaviour); method and route stay in the fingerprint.
    PerOwner,
}

/// A function naming the operation of a request.
pub type OperationFn = Arc<dyn Fn(&http::request::Parts) -> Option<String> + Send + Sync>;

/// Where the operation part of the scope comes from.
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum OperationSource {
    /// `"{METHOD} {template}"` from axum's `MatchedPath`; without it, the
    /// literal path (then every concrete path is its own key namespace).
    #[default]
    MatchedRoute,
    /// A fixed name.
    Fixed(Cow<'static, str>),
    /// A function; `None` falls back to [`OperationSource::MatchedRoute`].
    Fn(OperationFn),
}

impl fmt::Debug for OperationSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MatchedRoute => f.write_str("MatchedRoute"),
            Self::Fixed(s) => f.debug_tuple("Fixed").field(s).finish(),
            Self::Fn(_) => f.write_str("Fn(..)"),
        }
    }
}

/// A key rule on top of the draft's syntax (e.g. a minimum length).
pub type KeyValidator = Arc<dyn Fn(&IdempotencyKey) -> Result<(), Cow<'static, str>> + Send + Sync>;
/// A response classifier.
pub type Classifier = Arc<dyn Fn(&http::response::Parts) -> Class + Send + Sync>;

/// A configuration the layer refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid idempotency layer configuration: {0}")]
pub struct ConfigError(String);

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) methods: Vec<Method>,
    pub(crate) key: KeyRequirement,
    pub(crate) key_syntax: KeySyntax,
    pub(crate) key_header: HeaderName,
    pub(crate) key_validator: Option<KeyValidator>,
    pub(crate) operation: OperationSource,
    pub(crate) namespace: KeyNamespace,
    pub(crate) fingerprint: FingerprintSpec,
    pub(crate) max_request_body: usize,
    pub(crate) classify: Option<Classifier>,
    pub(crate) stored_headers: HeaderPolicy,
    pub(crate) replayed_headers: Vec<HeaderName>,
    pub(crate) replayed_names: Vec<String>,
    pub(crate) problem_types: ProblemTypes,
    pub(crate) docs_url: Option<String>,
    pub(crate) missing_owner_status: StatusCode,
    pub(crate) detached: bool,
    pub(crate) auto_renew: Option<Duration>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            methods: vec![Method::POST, Method::PATCH],
            key: KeyRequirement::Required,
            key_syntax: KeySyntax::Lenient,
            key_header: HeaderName::from_static("idempotency-key"),
            key_validator: None,
            operation: OperationSource::MatchedRoute,
            namespace: KeyNamespace::PerRoute,
            fingerprint: FingerprintSpec::default(),
            max_request_body: 2 * 1024 * 1024,
            classify: None,
            stored_headers: HeaderPolicy::default(),
            replayed_headers: vec![
                HeaderName::from_static("idempotent-replayed"),
                HeaderName::from_static("x-idempotent-replayed"),
            ],
            replayed_names: Vec::new(),
            problem_types: ProblemTypes::Draft,
            docs_url: None,
            missing_owner_status: StatusCode::INTERNAL_SERVER_ERROR,
            detached: true,
            auto_renew: Some(Duration::from_secs(300)),
        }
    }
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
/// Per-route settings: every setter of the [`Builder`] exists on the layer
/// too (`layer.clone().fingerprint(spec)`), returning a layer with that one
/// setting changed that still shares the engine, the owner source, the
/// shutdown state and the tracker with the original, so one
/// [`shutdown`](Self::shutdown) stops them all. The settings the builder
/// validates are `with_methods`, `with_key_header`, `with_max_request_body`
/// and `with_replayed_headers` here (the plain names are the getters), and
/// return a `Result`; [`to_builder`](Self::to_builder) changes several at
/// once.
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
    /// The engine.
    pub fn idem(&self) -> &Idem<S> {
        &self.shared.idem
    }

    /// The covered methods.
    pub fn methods(&self) -> &[Method] {
        &self.shared.cfg.methods
    }

    /// Whether covered requests must carry a key.
    pub fn key_requirement(&self) -> KeyRequirement {
        self.shared.cfg.key
    }

    /// The key header's name.
    pub fn key_header(&self) -> &HeaderName {
        &self.shared.cfg.key_header
    }

    /// The replay header names.
    pub fn replayed_headers(&self) -> &[HeaderName] {
        &self.shared.cfg.replayed_headers
    }

    /// The request body limit.
    pub fn max_request_body(&self) -> usize {
        self.shared.cfg.max_request_body
    }

    /// Stops accepting keyed requests: from now on they get 503
    /// `shutting_down` (uncovered requests still pass).
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.shared.tracker.close();
    }

    /// [`close`](Self::close), then waits for every detached handler to
    /// finish and store its outcome. Call it after the server stopped
    /// accepting connections (`axum::serve(..).with_graceful_shutdown(..)`).
    pub async fn shutdown(&self)
    where
        S: Send + Sync,
        O: Send + Sync,
    {
        self.close();
        self.shared.tracker.wait().await;
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
    /// source is set). See [`owner_from_extension`](crate::owner_from_extension).
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
    /// `invalid_key` with reason `rejected_by_validator`.
    #[must_use]
    pub fn key_validator(
        mut self,
        f: impl Fn(&IdempotencyKey) -> Result<(), Cow<'static, str>> + Send + Sync + 'static,
    ) -> Self {
        self.cfg.key_validator = Some(Arc::new(f));
        self
    }

    /// Where the operation comes from (default the matched route).
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
    /// The layer.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] for an empty method list, a zero body limit or a
    /// replay header that is also the key header.
    pub fn build(mut self) -> Result<IdempotencyLayer<S, O>, ConfigError> {
        if self.cfg.methods.is_empty() {
            return Err(ConfigError("no method is covered".to_owned()));
        }
        if self.cfg.max_request_body == 0 {
            return Err(ConfigError("max_request_body is 0".to_owned()));
        }
        if self.cfg.replayed_headers.contains(&self.cfg.key_header) {
            return Err(ConfigError(
                "a replay header cannot be the key header".to_owned(),
            ));
        }
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

    /// This layer with one setting changed that needs no validation.
    fn with_cfg(&self, change: impl FnOnce(&mut Config)) -> Self {
        let mut cfg = self.shared.cfg.clone();
        change(&mut cfg);
        Self {
            shared: Arc::new(Shared {
                idem: self.shared.idem.clone(),
                cfg,
                owner: self.shared.owner.clone(),
                tracker: self.shared.tracker.clone(),
                closed: Arc::clone(&self.shared.closed),
            }),
        }
    }

    /// [`Builder::owner`] on a built layer.
    #[must_use]
    pub fn owner<O2: OwnerSource>(self, owner: O2) -> IdempotencyLayer<S, O2> {
        IdempotencyLayer {
            shared: Arc::new(Shared {
                idem: self.shared.idem.clone(),
                cfg: self.shared.cfg.clone(),
                owner,
                tracker: self.shared.tracker.clone(),
                closed: Arc::clone(&self.shared.closed),
            }),
        }
    }

    /// [`Builder::missing_owner_status`] on a built layer.
    #[must_use]
    pub fn missing_owner_status(self, status: StatusCode) -> Self {
        self.with_cfg(|c| c.missing_owner_status = status)
    }

    /// [`Builder::methods`] on a built layer.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] as [`Builder::build`].
    pub fn with_methods(self, m: impl IntoIterator<Item = Method>) -> Result<Self, ConfigError> {
        self.to_builder().methods(m).build()
    }

    /// [`Builder::key`] on a built layer.
    #[must_use]
    pub fn key(self, r: KeyRequirement) -> Self {
        self.with_cfg(|c| c.key = r)
    }

    /// [`Builder::key_syntax`] on a built layer.
    #[must_use]
    pub fn key_syntax(self, s: KeySyntax) -> Self {
        self.with_cfg(|c| c.key_syntax = s)
    }

    /// [`Builder::key_header`] on a built layer.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] as [`Builder::build`].
    pub fn with_key_header(self, name: HeaderName) -> Result<Self, ConfigError> {
        self.to_builder().key_header(name).build()
    }

    /// [`Builder::key_validator`] on a built layer.
    #[must_use]
    pub fn key_validator(
        self,
        f: impl Fn(&IdempotencyKey) -> Result<(), Cow<'static, str>> + Send + Sync + 'static,
    ) -> Self {
        let f: KeyValidator = Arc::new(f);
        self.with_cfg(|c| c.key_validator = Some(f))
    }

    /// [`Builder::operation`] on a built layer.
    #[must_use]
    pub fn operation(self, o: OperationSource) -> Self {
        self.with_cfg(|c| c.operation = o)
    }

    /// [`Builder::key_namespace`] on a built layer.
    #[must_use]
    pub fn key_namespace(self, n: KeyNamespace) -> Self {
        self.with_cfg(|c| c.namespace = n)
    }

    /// [`Builder::fingerprint`] on a built layer.
    #[must_use]
    pub fn fingerprint(self, f: FingerprintSpec) -> Self {
        self.with_cfg(|c| c.fingerprint = f)
    }

    /// [`Builder::max_request_body`] on a built layer.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] as [`Builder::build`].
    pub fn with_max_request_body(self, bytes: usize) -> Result<Self, ConfigError> {
        self.to_builder().max_request_body(bytes).build()
    }

    /// [`Builder::classify`] on a built layer.
    #[must_use]
    pub fn classify(
        self,
        f: impl Fn(&http::response::Parts) -> Class + Send + Sync + 'static,
    ) -> Self {
        let f: Classifier = Arc::new(f);
        self.with_cfg(|c| c.classify = Some(f))
    }

    /// [`Builder::stored_headers`] on a built layer.
    #[must_use]
    pub fn stored_headers(self, p: HeaderPolicy) -> Self {
        self.with_cfg(|c| c.stored_headers = p)
    }

    /// [`Builder::replayed_headers`] on a built layer.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] as [`Builder::build`].
    pub fn with_replayed_headers(
        self,
        names: impl IntoIterator<Item = HeaderName>,
    ) -> Result<Self, ConfigError> {
        self.to_builder().replayed_headers(names).build()
    }

    /// [`Builder::problem_types`] on a built layer.
    #[must_use]
    pub fn problem_types(self, t: ProblemTypes) -> Self {
        self.with_cfg(|c| c.problem_types = t)
    }

    /// [`Builder::docs_url`] on a built layer.
    #[must_use]
    pub fn docs_url(self, url: impl Into<String>) -> Self {
        let url = url.into();
        self.with_cfg(|c| c.docs_url = Some(url))
    }

    /// [`Builder::detached`] on a built layer.
    #[must_use]
    pub fn detached(self, on: bool) -> Self {
        self.with_cfg(|c| c.detached = on)
    }

    /// [`Builder::auto_renew_lease`] on a built layer.
    #[must_use]
    pub fn auto_renew_lease(self, ceiling: Option<Duration>) -> Self {
        self.with_cfg(|c| c.auto_renew = ceiling)
    }
}
