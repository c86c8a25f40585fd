//! Who owns a record: read from what the auth layer put in the request.
//!
//! One way to name each source, given to [`IdempotencyLayerBuilder::owner`](crate::IdempotencyLayerBuilder::owner):
//! [`ExtensionOwner`] (your auth type), a closure over the request head, or
//! [`FixedOwner`] (single-tenant services).

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use http::request::Parts;

/// Where the owner of every record comes from. An auth layer placed outside
/// the idempotency layer sets it; there is never a silent default.
///
/// Implemented by [`ExtensionOwner`], [`FixedOwner`] and every closure
/// `Fn(&http::request::Parts) -> Option<String> + Clone + Send + Sync +
/// 'static` (annotate the argument, `|parts: &Parts| ..`, so the closure
/// takes any lifetime):
///
/// ```
/// use http::request::Parts;
/// use idem_core::{Idem, MemoryStore};
/// use idem_http::IdempotencyLayer;
///
/// let layer = IdempotencyLayer::builder(Idem::new(MemoryStore::new()))
///     .owner(|parts: &Parts| {
///         let tenant = parts.headers.get("x-tenant")?.to_str().ok()?;
///         Some(tenant.to_owned())
///     })
///     .build()
///     .unwrap();
/// # let _ = layer;
/// ```
pub trait OwnerSource: Clone + Send + Sync + 'static {
    /// The owner of this request, or `None` when it cannot be determined.
    fn owner(&self, parts: &Parts) -> Option<String>;
}

impl<F> OwnerSource for F
where
    F: Fn(&Parts) -> Option<String> + Clone + Send + Sync + 'static,
{
    fn owner(&self, parts: &Parts) -> Option<String> {
        self(parts)
    }
}

/// Implemented on your auth type (the extension your auth layer inserts).
pub trait OwnerId {
    /// A stable id of the caller (account, tenant, user).
    fn owner_id(&self) -> Cow<'_, str>;
}

/// The builder's starting point: no owner yet (`build` needs one).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoOwner;

/// The owner is the request extension `T` that your auth layer inserts:
/// `ExtensionOwner::<AuthUser>::new()`.
pub struct ExtensionOwner<T>(PhantomData<fn() -> T>);

impl<T> ExtensionOwner<T> {
    /// Reads the owner from the extension `T`.
    #[must_use]
    pub const fn new() -> Self {
        Self(PhantomData)
    }
}

impl<T> Default for ExtensionOwner<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Clone for ExtensionOwner<T> {
    fn clone(&self) -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for ExtensionOwner<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ExtensionOwner<{}>", std::any::type_name::<T>())
    }
}

impl<T: OwnerId + Clone + Send + Sync + 'static> OwnerSource for ExtensionOwner<T> {
    fn owner(&self, parts: &Parts) -> Option<String> {
        parts
            .extensions
            .get::<T>()
            .map(|t| t.owner_id().into_owned())
    }
}

/// One owner for every request: **single-tenant or internal services only**.
/// Every caller then shares one key space, so a client that guesses another
/// client's key gets its response (draft §5): require long random keys with
/// [`IdempotencyLayerBuilder::key_validator`](crate::IdempotencyLayerBuilder::key_validator) (≥ 16 characters).
#[derive(Debug, Clone)]
pub struct FixedOwner(Arc<str>);

impl FixedOwner {
    /// `owner` for every request, e.g. read from configuration.
    pub fn new(owner: impl Into<String>) -> Self {
        Self(owner.into().into())
    }
}

impl OwnerSource for FixedOwner {
    fn owner(&self, _: &Parts) -> Option<String> {
        Some(self.0.as_ref().to_owned())
    }
}
