#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The files in the order one covered request flows through them.
// The layer: its builder and configuration, and who owns a record.
mod layer;
// (one module per line group, so `cargo fmt` keeps this order)
mod config;

mod owner;

// Step 1: covered or not.
mod service;

// Steps 2-6: key, owner and operation (the scope), body, fingerprint.
mod request;

mod key;

mod envelope;

// Steps 7-10: the engine, the handler and its extensions, capture.
mod exec;

mod extract;

mod headers;

mod body;

// The answers the layer gives on its own.
mod rejection;

mod problem;

mod respond;

#[cfg(feature = "openapi")]
#[cfg_attr(docsrs, doc(cfg(feature = "openapi")))]
pub mod openapi;

// The webhook receiver: its own layer on the same body limit, executor,
// classification and problem renderer.
#[cfg(feature = "testkit")]
#[doc(hidden)]
pub mod testkit;
#[cfg(feature = "webhook")]
#[cfg_attr(docsrs, doc(cfg(feature = "webhook")))]
pub mod webhook;

pub use body::IdemBody;
pub use config::{KeyNamespace, KeyRequirement, OperationFn, OperationSource};
pub use envelope::{BodyFingerprint, FingerprintSpec, PathSource};
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use extract::NotCovered;
pub use extract::{IdemAttempt, IdemKey};
pub use headers::{Class, HeaderPolicy};
// The key field's parser, for the sibling adapters (idem-grpc reads the
// `idempotency-key` metadata with it): one syntax for every protocol.
#[doc(hidden)]
pub use key::parse_key_header;
pub use key::{KeyHeaderError, KeySyntax};
pub use layer::{Builder, ConfigError, IdempotencyLayer};
pub use owner::{ExtensionOwner, FixedOwner, NoOwner, OwnerId, OwnerSource};
pub use problem::{ProblemCode, ProblemTypes};
pub use rejection::Rejection;
pub use service::{IdempotencyService, ResponseFuture};
