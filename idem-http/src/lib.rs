#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

/// Builder methods that each set one setting and return the builder, with
/// their docs and `#[must_use]`: `=> field` stores the argument as given,
/// `=> field = value` stores `value` (made from the argument).
macro_rules! setters {
    ($(
        $(#[$attr:meta])*
        $vis:vis fn $name:ident($arg:ident: $ty:ty $(,)?) => $($field:ident).+ $(= $value:expr)?;
    )*) => {$(
        $(#[$attr])*
        #[must_use]
        $vis fn $name(mut self, $arg: $ty) -> Self {
            self.$($field).+ = setters!(@value $arg $(, $value)?);
            self
        }
    )*};
    (@value $arg:ident) => {
        $arg
    };
    (@value $arg:ident, $value:expr) => {
        $value
    };
}

// The files in the order one covered request flows through them.
// The layer: its builder and configuration, and who owns a record. No
// module imports one that imports it back: the layer builds the state
// (`state.rs`) and wraps the service; the service runs a mode's key source
// (`request.rs`, `webhook/service.rs`), the executor and the renderer,
// which all read the state.
mod layer;
// (one module per line group, so `cargo fmt` keeps this order)
mod config;

mod owner;

// Step 1: covered or not; the state every service of a layer shares.
mod service;

mod state;

// Steps 2-6: key, owner and operation (the scope), body, fingerprint.
mod request;

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

// The webhook receiver: the same layer, service and executor in another
// mode (the provider's event id as the key, answers a provider understands).
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
pub use idem_core::wire::{KeyHeaderError, KeySyntax, ProblemCode};
pub use layer::{HttpConfigError, IdempotencyLayer, IdempotencyLayerBuilder};
pub use owner::{ExtensionOwner, FixedOwner, NoOwner, OwnerId, OwnerSource};
pub use problem::ProblemTypes;
pub use rejection::Rejection;
pub use service::{IdempotencyService, ResponseFuture};
