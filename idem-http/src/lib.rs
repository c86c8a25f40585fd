#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
mod axum;
mod body;
mod exec;
mod layer;
#[cfg(feature = "openapi")]
#[cfg_attr(docsrs, doc(cfg(feature = "openapi")))]
pub mod openapi;
mod owner;
pub mod pipeline;
mod rejection;
mod service;
#[cfg(feature = "testkit")]
#[cfg_attr(docsrs, doc(cfg(feature = "testkit")))]
pub mod testkit;

pub use body::{BoxError, IdemBody};
pub use layer::{
    Builder, Classifier, ConfigError, IdempotencyLayer, KeyNamespace, KeyRequirement, KeyValidator,
    OperationFn, OperationSource,
};
pub use owner::{
    ExtensionOwner, FixedOwner, FnOwner, NoOwner, OwnerId, OwnerSource, owner_fixed,
    owner_from_extension, owner_from_fn,
};
pub use pipeline::{
    BodyFingerprint, Class, FingerprintSpec, HeaderPolicy, KeyHeaderError, KeySyntax, ProblemTypes,
};
pub use rejection::Rejection;
pub use service::{IdemAttempt, IdemKey, IdempotencyService, ResponseFuture};

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use crate::axum::NotCovered;
