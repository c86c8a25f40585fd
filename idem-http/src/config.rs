//! What a layer is configured with (set through the [`IdempotencyLayerBuilder`](crate::IdempotencyLayerBuilder)):
//! which requests it covers, how a key is read, how a record is named and
//! what counts in "the same request".

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode};
use idem_core::IdempotencyKey;

use crate::envelope::FingerprintSpec;
use crate::headers::{Class, HeaderPolicy};
use crate::problem::ProblemTypes;
use idem_core::wire::{DEFAULT_MAX_REQUEST_BODY, KeySyntax, header};

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
    /// `(owner, operation, key)`: the same key for two operations is two
    /// records (the default). The operation comes from the
    /// [`OperationSource`].
    #[default]
    PerRoute,
    /// `(owner, "http", key)`: reusing a key on another route is a 422
    /// (Stripe's behaviour); method and route stay in the fingerprint.
    PerOwner,
}

/// A function naming the operation of a request.
pub type OperationFn = Arc<dyn Fn(&http::request::Parts) -> Option<String> + Send + Sync>;

/// Where the operation part of a record's scope (and the route that enters
/// the fingerprint) comes from.
///
/// It is always your choice by name, and the default is the same in every
/// build: no cargo feature, enabled by you or by any other crate in your
/// dependency graph, changes the record a request maps to, so a deploy that
/// adds one cannot turn a retry into a new operation.
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum OperationSource {
    /// `"{METHOD} {path}"` with the path of the request's URI as the layer
    /// receives it, e.g. `POST /accounts/42/charges` (the default).
    ///
    /// Every concrete path is then its own key space, and inside axum's
    /// `Router::nest` the URI the layer sees has lost the prefix. The
    /// `operation` metrics label is not the path (it would take one value
    /// per id): it is `"{METHOD} {template}"` when axum's `MatchedPath` is
    /// on the request, else the method alone, so it stays bounded. A method and path longer than
    /// a scope allows (1,024 bytes) is answered 414 `path_too_long`.
    #[default]
    Path,
    /// `"{METHOD} {template}"` with a route template you name, e.g.
    /// `Route("/accounts/{id}/charges".into())` for a layer on that route.
    Route(Cow<'static, str>),
    /// Exactly this name for every request (no method added).
    Fixed(Cow<'static, str>),
    /// What the function returns for the request head; `None` names it as
    /// [`OperationSource::Path`] does.
    Fn(OperationFn),
    /// `"{METHOD} {template}"` with axum's `MatchedPath`, the full template
    /// with any nesting prefix (`POST /v1/accounts/{id}/charges`). Exists
    /// only with feature `axum`, and is used only when asked for. A request
    /// without `MatchedPath` (the layer is not inside axum's router) is
    /// answered 500 `operation_unavailable`.
    #[cfg(feature = "axum")]
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    MatchedPath,
}

impl fmt::Debug for OperationSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Path => f.write_str("Path"),
            Self::Route(s) => f.debug_tuple("Route").field(s).finish(),
            Self::Fixed(s) => f.debug_tuple("Fixed").field(s).finish(),
            Self::Fn(_) => f.write_str("Fn(..)"),
            #[cfg(feature = "axum")]
            Self::MatchedPath => f.write_str("MatchedPath"),
        }
    }
}

/// A key rule on top of the draft's syntax (e.g. a minimum length); the
/// `Err` reason is sent as the problem's `detail`.
pub(crate) type KeyValidator =
    Arc<dyn Fn(&IdempotencyKey) -> Result<(), Cow<'static, str>> + Send + Sync>;
/// A response classifier.
pub(crate) type Classifier = Arc<dyn Fn(&http::response::Parts) -> Class + Send + Sync>;

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
    /// The status of an in-flight duplicate when not the engine's 409 (the
    /// webhook receiver's 503).
    pub(crate) in_flight_status: Option<StatusCode>,
    pub(crate) detached: bool,
    pub(crate) auto_renew: Option<Duration>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            methods: vec![Method::POST, Method::PATCH],
            key: KeyRequirement::Required,
            key_syntax: KeySyntax::Lenient,
            key_header: HeaderName::from_static(header::IDEMPOTENCY_KEY),
            key_validator: None,
            operation: OperationSource::Path,
            namespace: KeyNamespace::PerRoute,
            fingerprint: FingerprintSpec::default(),
            max_request_body: DEFAULT_MAX_REQUEST_BODY,
            classify: None,
            stored_headers: HeaderPolicy::default(),
            replayed_headers: header::REPLAY_MARKERS
                .iter()
                .map(|n| HeaderName::from_static(n))
                .collect(),
            replayed_names: Vec::new(),
            problem_types: ProblemTypes::Draft,
            docs_url: None,
            missing_owner_status: StatusCode::INTERNAL_SERVER_ERROR,
            in_flight_status: None,
            detached: true,
            auto_renew: Some(Duration::from_secs(300)),
        }
    }
}
