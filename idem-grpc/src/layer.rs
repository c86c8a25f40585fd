//! The layer, its builder and its configuration.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use idem_core::Idem;
use idem_core::store::Store;
use tokio_util::task::TaskTracker;
use tonic::Code;
use tower_layer::Layer;

use crate::canonical::Inputs;
use crate::descriptor::{Described, DescriptorSetError};
use crate::service::GrpcIdempotencyService;
use crate::vocab::{Class, HeaderPolicy, KEY_METADATA, OwnerSource};

/// How a handler's status is remembered (see [`GrpcIdempotencyLayerBuilder::classify`]).
pub type ClassifyFn = Arc<dyn Fn(Code) -> Class + Send + Sync>;

/// The default classification of a handler's gRPC status: `OK` is a
/// success; `UNAVAILABLE`, `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`,
/// `ABORTED`, `INTERNAL` and `UNKNOWN` are transient (the key is released
/// and the same call may run again); every other code is a permanent
/// failure, stored and replayed.
#[must_use]
pub fn default_class(code: Code) -> Class {
    match code {
        Code::Ok => Class::Success,
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::ResourceExhausted
        | Code::Aborted
        | Code::Internal
        | Code::Unknown => Class::Transient,
        _ => Class::Failure,
    }
}

/// Which methods the layer covers.
#[derive(Debug, Clone)]
pub(crate) enum Covered {
    /// These full method paths only.
    Listed(HashSet<String>),
    /// Every method but these (the service's streaming methods).
    AllExcept(HashSet<String>),
}

impl Covered {
    pub(crate) fn covers(&self, path: &str) -> bool {
        match self {
            Self::Listed(s) => s.contains(path),
            Self::AllExcept(s) => !s.contains(path),
        }
    }
}

/// The layer's settings, fixed at [`GrpcIdempotencyLayerBuilder::build`].
pub(crate) struct Config {
    pub(crate) covered: Covered,
    pub(crate) key_metadata: http::HeaderName,
    pub(crate) key_fields: HashMap<String, u32>,
    pub(crate) key_required: bool,
    pub(crate) classify: ClassifyFn,
    pub(crate) metadata: HeaderPolicy,
    pub(crate) max_request_bytes: usize,
    pub(crate) auto_renew: Option<Duration>,
    /// The input types of the methods fingerprinted in canonical form.
    pub(crate) canonical: Inputs,
}

pub(crate) struct Shared<S: Store, O> {
    pub(crate) idem: Idem<S>,
    pub(crate) owner: O,
    pub(crate) cfg: Config,
    pub(crate) tracker: TaskTracker,
}

/// A tower layer for a tonic server (`Server::builder().layer(..)`) that
/// makes the unary methods it covers safe to retry: a call is run at most
/// once per (owner, method, key) and every retry gets the first answer
/// back, message bytes, status and metadata, marked `idempotent-replayed:
/// true`.
///
/// ```
/// use idem_core::{Idem, MemoryStore};
/// use idem_grpc::GrpcIdempotencyLayer;
///
/// let layer = GrpcIdempotencyLayer::builder(Idem::new(MemoryStore::new()))
///     .owner(|parts: &http::request::Parts| {
///         Some(parts.headers.get("x-account-id")?.to_str().ok()?.to_owned())
///     })
///     .method("/shop.v1.Orders/CreateOrder")
///     .build()
///     .unwrap();
/// // tonic::transport::Server::builder().layer(layer).add_service(..)
/// # let _ = layer;
/// ```
pub struct GrpcIdempotencyLayer<S: Store, O> {
    shared: Arc<Shared<S, O>>,
}

impl<S: Store, O> Clone for GrpcIdempotencyLayer<S, O> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: Store, O> fmt::Debug for GrpcIdempotencyLayer<S, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcIdempotencyLayer")
            .field("covered", &self.shared.cfg.covered)
            .field("key_metadata", &self.shared.cfg.key_metadata)
            .finish_non_exhaustive()
    }
}

impl<S: Store> GrpcIdempotencyLayer<S, crate::vocab::NoOwner> {
    /// Starts a layer on `idem` (its store and policy: lease, TTLs,
    /// response size limit).
    pub fn builder(idem: Idem<S>) -> GrpcIdempotencyLayerBuilder<S, crate::vocab::NoOwner> {
        GrpcIdempotencyLayerBuilder {
            idem,
            owner: crate::vocab::NoOwner,
            s: Settings {
                covered: Covered::Listed(HashSet::new()),
                described: Ok(None),
                canonical: Ok(Inputs::new()),
                key_metadata: KEY_METADATA.to_owned(),
                key_fields: HashMap::new(),
                key_required: true,
                classify: Arc::new(default_class),
                metadata: HeaderPolicy::default(),
                max_request_bytes: 4 * 1024 * 1024,
                auto_renew: Some(DEFAULT_AUTO_RENEW),
            },
        }
    }
}

impl<S: Store, O> GrpcIdempotencyLayer<S, O> {
    /// Waits for every call still running in the background (a client
    /// that gave up does not abandon its work: the handler runs to its end
    /// and its outcome is stored). Call it after the server stopped.
    pub fn drain(&self) -> impl Future<Output = ()> + Send + 'static {
        let tracker = self.shared.tracker.clone();
        tracker.close();
        async move { tracker.wait().await }
    }
}

impl<Svc, S: Store, O> Layer<Svc> for GrpcIdempotencyLayer<S, O> {
    type Service = GrpcIdempotencyService<Svc, S, O>;

    fn layer(&self, inner: Svc) -> Self::Service {
        GrpcIdempotencyService::new(inner, Arc::clone(&self.shared))
    }
}

/// Why [`GrpcIdempotencyLayerBuilder::build`] refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GrpcConfigError {
    /// The key metadata name is not a valid ASCII metadata key.
    #[error("invalid key metadata name: {0}")]
    KeyMetadata(String),
    /// A method path is not `/package.Service/Method`.
    #[error("not a full method path (`/package.Service/Method`): {0}")]
    MethodPath(String),
    /// No method is covered.
    #[error(
        "no method is covered: name them with `method`, give the schema to `unary_methods_of` or choose `all_unary_except`"
    )]
    NothingCovered,
    /// The bytes given to
    /// [`unary_methods_of`](GrpcIdempotencyLayerBuilder::unary_methods_of)
    /// or
    /// [`canonical_fingerprint`](GrpcIdempotencyLayerBuilder::canonical_fingerprint)
    /// are not an encoded `google.protobuf.FileDescriptorSet`, or (for
    /// `canonical_fingerprint`) its types do not resolve: the source says
    /// which.
    #[error("not an encoded protobuf FileDescriptorSet")]
    DescriptorSet(#[source] DescriptorSetError),
    /// A descriptor set given to
    /// [`unary_methods_of`](GrpcIdempotencyLayerBuilder::unary_methods_of)
    /// or
    /// [`canonical_fingerprint`](GrpcIdempotencyLayerBuilder::canonical_fingerprint)
    /// describes no unary method: it would cover nothing (streaming
    /// methods only, no service, or the wrong bytes).
    #[error("the FileDescriptorSet describes no unary method")]
    NoUnaryMethod,
}

/// Configures a [`GrpcIdempotencyLayer`]; `build` checks it.
pub struct GrpcIdempotencyLayerBuilder<S: Store, O> {
    idem: Idem<S>,
    owner: O,
    s: Settings,
}

/// What a builder collects besides the engine and the owner source (the
/// same whatever the owner source's type).
struct Settings {
    covered: Covered,
    /// The methods of the descriptor sets given to `unary_methods_of`, or
    /// the first of their errors (reported by `build`).
    described: Result<Option<Described>, GrpcConfigError>,
    /// The input types of the descriptor sets given to
    /// `canonical_fingerprint`, or the first of their errors.
    canonical: Result<Inputs, GrpcConfigError>,
    key_metadata: String,
    key_fields: HashMap<String, u32>,
    key_required: bool,
    classify: ClassifyFn,
    metadata: HeaderPolicy,
    max_request_bytes: usize,
    auto_renew: Option<Duration>,
}

/// How long a covered call's lease is renewed while its handler runs,
/// unless configured otherwise (the HTTP layer's default).
const DEFAULT_AUTO_RENEW: Duration = Duration::from_secs(300);

impl<S: Store, O> fmt::Debug for GrpcIdempotencyLayerBuilder<S, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcIdempotencyLayerBuilder")
            .field("covered", &self.s.covered)
            .field("described", &self.s.described)
            .field("key_metadata", &self.s.key_metadata)
            .finish_non_exhaustive()
    }
}

impl<S: Store, O> GrpcIdempotencyLayerBuilder<S, O> {
    /// Where the owner of every record comes from (the HTTP layer's
    /// [`OwnerSource`]: an `ExtensionOwner` your auth layer fills, a
    /// closure over the request head, a `FixedOwner`). A covered call with
    /// no owner is answered `UNAUTHENTICATED` before its key is read, and
    /// its handler does not run.
    pub fn owner<O2: OwnerSource>(self, owner: O2) -> GrpcIdempotencyLayerBuilder<S, O2> {
        GrpcIdempotencyLayerBuilder {
            idem: self.idem,
            owner,
            s: self.s,
        }
    }

    /// Covers one unary method, by its full path
    /// (`/package.Service/Method`). Every other method passes untouched.
    #[must_use]
    pub fn method(mut self, path: impl Into<String>) -> Self {
        let path = path.into();
        match &mut self.s.covered {
            Covered::Listed(s) => {
                s.insert(path);
            }
            Covered::AllExcept(s) => {
                s.remove(&path);
            }
        }
        self
    }

    /// Covers exactly the unary methods (neither client- nor
    /// server-streaming) of the services `descriptor_set` describes: an
    /// encoded `google.protobuf.FileDescriptorSet`, the file tonic-build
    /// writes with `file_descriptor_set_path` (the one server reflection
    /// serves). Its streaming methods pass untouched, and so do the methods
    /// of services it does not describe. A method's full path is
    /// `/{package}.{Service}/{Method}`, or `/{Service}/{Method}` for a file
    /// without a package.
    ///
    /// It adds to the methods named with [`method`](Self::method) and to
    /// other descriptor sets. With
    /// [`all_unary_except`](Self::all_unary_except), in either order, the
    /// set's streaming methods join the exceptions and its unary ones leave
    /// them.
    ///
    /// The bytes are decoded here; [`build`](Self::build) reports a
    /// failure: [`GrpcConfigError::DescriptorSet`] for bytes that do not
    /// decode, [`GrpcConfigError::NoUnaryMethod`] for a set with no unary
    /// method, [`GrpcConfigError::MethodPath`] for a service or method
    /// without a usable name.
    ///
    /// ```
    /// use idem_core::{Idem, MemoryStore};
    /// use idem_grpc::{FixedOwner, GrpcIdempotencyLayer};
    /// use prost::Message;
    /// use prost_types::{
    ///     FileDescriptorProto, FileDescriptorSet, MethodDescriptorProto, ServiceDescriptorProto,
    /// };
    ///
    /// // In an application:
    /// // const DESCRIPTORS: &[u8] =
    /// //     include_bytes!(concat!(env!("OUT_DIR"), "/shop_descriptor.bin"));
    /// let method = |name: &str, server_streaming| MethodDescriptorProto {
    ///     name: Some(name.to_owned()),
    ///     server_streaming: Some(server_streaming),
    ///     ..Default::default()
    /// };
    /// let descriptors = FileDescriptorSet {
    ///     file: vec![FileDescriptorProto {
    ///         package: Some("shop.v1".to_owned()),
    ///         service: vec![ServiceDescriptorProto {
    ///             name: Some("Orders".to_owned()),
    ///             method: vec![method("CreateOrder", false), method("WatchOrders", true)],
    ///             ..Default::default()
    ///         }],
    ///         ..Default::default()
    ///     }],
    /// }
    /// .encode_to_vec();
    ///
    /// // Covers `/shop.v1.Orders/CreateOrder`; `WatchOrders` passes untouched.
    /// let layer = GrpcIdempotencyLayer::builder(Idem::new(MemoryStore::new()))
    ///     .owner(FixedOwner::new("acme"))
    ///     .unary_methods_of(&descriptors)
    ///     .build()
    ///     .unwrap();
    /// # let _ = layer;
    /// ```
    #[must_use]
    pub fn unary_methods_of(mut self, descriptor_set: &[u8]) -> Self {
        if let Ok(described) = &mut self.s.described {
            match crate::descriptor::describe(descriptor_set) {
                Ok(more) => described
                    .get_or_insert_with(Described::default)
                    .extend(more),
                Err(e) => self.s.described = Err(e),
            }
        }
        self
    }

    /// Covers every method except `streaming` (full paths): name the
    /// service's streaming methods here, they pass untouched. A streaming
    /// call that reaches a covered method is refused (`INVALID_ARGUMENT`,
    /// `INVALID_REQUEST`) unless it sends exactly one message. To read
    /// which methods stream from the service's schema instead, see
    /// [`unary_methods_of`](Self::unary_methods_of).
    #[must_use]
    pub fn all_unary_except<I>(mut self, streaming: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.s.covered = Covered::AllExcept(streaming.into_iter().map(Into::into).collect());
        self
    }

    /// Fingerprints the requests of the covered unary methods that
    /// `descriptor_set` describes (an encoded
    /// `google.protobuf.FileDescriptorSet`, as for
    /// [`unary_methods_of`](Self::unary_methods_of), with the message types
    /// too) by their decoded, canonical form instead of their bytes: two
    /// encodings of one message (fields in another order, a field set to
    /// its default written or not, a field repeated, unknown fields) are
    /// one request and replay; a different message is still
    /// `FINGERPRINT_MISMATCH`. It covers nothing by itself.
    ///
    /// The message is decoded by its method's input type and written as
    /// protobuf's JSON mapping, which the engine fingerprints as it does a
    /// JSON request (RFC 8785, under the engine's field filter, the
    /// message at `/message`): 64-bit integers as strings, default fields
    /// left out, enums by number, fields by their `.proto` name, unknown
    /// fields dropped (the handler, built on the same schema, does not
    /// read them either). A message that does not decode as its input type
    /// is refused with `INVALID_ARGUMENT` (`INVALID_REQUEST`) and its
    /// handler does not run.
    ///
    /// What keeps the bytes as sent: a compressed message (the layer does
    /// not decompress), a method the set does not describe, and a message
    /// with no JSON form under these descriptors (a `google.protobuf.Any`
    /// whose type the set does not hold). The two forms never match each
    /// other: records written before the option is turned on (or after it
    /// is turned off) answer their retries `FINGERPRINT_MISMATCH`, and so
    /// do records whose message type changed (a field renamed).
    ///
    /// [`build`](Self::build) reports a failure:
    /// [`GrpcConfigError::DescriptorSet`] for bytes that do not decode or a
    /// set whose types do not resolve (a method's input type missing),
    /// [`GrpcConfigError::NoUnaryMethod`] for a set with no unary method,
    /// [`GrpcConfigError::MethodPath`] for a service or method without a
    /// usable name.
    #[must_use]
    pub fn canonical_fingerprint(mut self, descriptor_set: &[u8]) -> Self {
        if let Ok(inputs) = &mut self.s.canonical {
            match crate::canonical::inputs(descriptor_set) {
                Ok(more) => inputs.extend(more),
                Err(e) => self.s.canonical = Err(e),
            }
        }
        self
    }

    /// The metadata that carries the key (default `idempotency-key`).
    #[must_use]
    pub fn key_metadata(mut self, name: impl Into<String>) -> Self {
        self.s.key_metadata = name.into();
        self
    }

    /// Reads the key of `method` from a string field of its request
    /// message (AIP-155's `request_id`), by field number, instead of the
    /// metadata: for clients that put the key in the body. The field's
    /// value is parsed with the same syntax as the metadata; an empty field
    /// (proto3's default) is no key. The message must not be compressed.
    #[must_use]
    pub fn key_field(mut self, method: impl Into<String>, field_number: u32) -> Self {
        self.s.key_fields.insert(method.into(), field_number);
        self
    }

    /// A covered call without a key runs unprotected (default: refused
    /// with `INVALID_ARGUMENT`, `MISSING_KEY`).
    #[must_use]
    pub fn optional_key(mut self) -> Self {
        self.s.key_required = false;
        self
    }

    /// How a handler's gRPC status is remembered (default
    /// [`default_class`]): [`Class::Transient`] releases the key,
    /// [`Class::CompleteWithoutBody`] completes the record without storing
    /// the answer, the others store and replay it.
    #[must_use]
    pub fn classify(mut self, f: impl Fn(Code) -> Class + Send + Sync + 'static) -> Self {
        self.s.classify = Arc::new(f);
        self
    }

    /// Which of the handler's metadata (initial and trailing) is stored
    /// and replayed: the HTTP layer's [`HeaderPolicy`], by default its deny
    /// list (`set-cookie`, `server-timing`, `x-request-id`, `request-id`,
    /// `traceparent`, `tracestate`, `age`: a replay must not hand the first
    /// call's trace ids to another). `grpc-status`, `grpc-message`,
    /// `grpc-status-details-bin` and `grpc-encoding` are always stored;
    /// `content-type`, `content-length`, `date` and the replay marker never.
    #[must_use]
    pub fn metadata_policy(mut self, policy: HeaderPolicy) -> Self {
        self.s.metadata = policy;
        self
    }

    /// The largest request body read for a covered call (default 4 MiB,
    /// tonic's own decoding limit); above it: `RESOURCE_EXHAUSTED`.
    #[must_use]
    pub fn max_request_bytes(mut self, limit: usize) -> Self {
        self.s.max_request_bytes = limit;
        self
    }

    /// Renews the lease every third of it while a covered call's handler
    /// runs, up to `ceiling` (default 5 min, as the HTTP layer;
    /// [`Attempt::renewing`](idem_core::Attempt::renewing)): a handler that
    /// outlives one lease is not taken over by a retry while it still runs.
    /// `None` turns it off.
    #[must_use]
    pub fn auto_renew_lease(mut self, ceiling: Option<Duration>) -> Self {
        self.s.auto_renew = ceiling;
        self
    }
}

impl<S: Store, O: OwnerSource> GrpcIdempotencyLayerBuilder<S, O> {
    /// The layer.
    ///
    /// # Errors
    ///
    /// [`GrpcConfigError`] for a malformed metadata name or method path, a
    /// descriptor set that does not decode or has no unary method, or when
    /// nothing is covered.
    pub fn build(mut self) -> Result<GrpcIdempotencyLayer<S, O>, GrpcConfigError> {
        let name = self.s.key_metadata.to_ascii_lowercase();
        let key_metadata = http::HeaderName::from_bytes(name.as_bytes())
            .ok()
            .filter(|_| !name.ends_with("-bin"))
            .ok_or_else(|| GrpcConfigError::KeyMetadata(self.s.key_metadata.clone()))?;
        let canonical = self.s.canonical?;
        if let Some(described) = self.s.described? {
            match &mut self.s.covered {
                Covered::Listed(s) => s.extend(described.unary),
                Covered::AllExcept(s) => {
                    s.retain(|p| !described.unary.contains(p));
                    s.extend(described.streaming);
                }
            }
        }
        let paths: Vec<&String> = match &self.s.covered {
            Covered::Listed(s) | Covered::AllExcept(s) => s.iter().collect(),
        };
        for p in paths.into_iter().chain(self.s.key_fields.keys()) {
            if !is_method_path(p) {
                return Err(GrpcConfigError::MethodPath(p.clone()));
            }
        }
        if matches!(&self.s.covered, Covered::Listed(s) if s.is_empty()) {
            return Err(GrpcConfigError::NothingCovered);
        }
        Ok(GrpcIdempotencyLayer {
            shared: Arc::new(Shared {
                idem: self.idem,
                owner: self.owner,
                cfg: Config {
                    covered: self.s.covered,
                    key_metadata,
                    key_fields: self.s.key_fields,
                    key_required: self.s.key_required,
                    classify: self.s.classify,
                    metadata: self.s.metadata,
                    max_request_bytes: self.s.max_request_bytes,
                    auto_renew: self.s.auto_renew,
                    canonical,
                },
                tracker: TaskTracker::new(),
            }),
        })
    }
}

/// Whether `p` is `/{service}/{method}`, both non-empty.
pub(crate) fn is_method_path(p: &str) -> bool {
    let Some(rest) = p.strip_prefix('/') else {
        return false;
    };
    let mut parts = rest.split('/');
    matches!(
        (parts.next(), parts.next(), parts.next()),
        (Some(s), Some(m), None) if !s.is_empty() && !m.is_empty()
    )
}
