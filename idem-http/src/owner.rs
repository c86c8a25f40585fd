//! Who owns a record: read from what the auth layer put in the request.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use http::request::Parts;

/// Where the owner of every record comes from. An auth layer placed outside
/// the idempotency layer sets it; there is never a silent default.
pub trait OwnerSource: Clone + Send + Sync + 'static {
    /// The owner of this request, or `None` when it cannot be determined.
    fn owner(&self, parts: &Parts) -> Option<String>;
}

/// Implemented on your auth type (the extension your auth layer inserts).
pub trait OwnerId {
    /// A stable id of the caller (account, tenant, user).
    fn owner_id(&self) -> Cow<'_, str>;
}

/// The builder's starting point: no owner yet (`build` needs one).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoOwner;

/// Reads the owner from the request extension `T`.
pub struct ExtensionOwner<T>(PhantomData<fn() -> T>);

impl<T> Clone for ExtensionOwner<T> {
    fn clone(&self) -> Self {
        Self(PhantomData)
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

/// The owner is the extension `T` that your auth layer inserts.
#[must_use]
pub fn owner_from_extension<T: OwnerId + Clone + Send + Sync + 'static>() -> ExtensionOwner<T> {
    ExtensionOwner(PhantomData)
}

/// Reads the owner with a function of the request head.
#[derive(Clone)]
pub struct FnOwner<F>(F);

impl<F> fmt::Debug for FnOwner<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FnOwner(..)")
    }
}

impl<F> OwnerSource for FnOwner<F>
where
    F: Fn(&Parts) -> Option<String> + Clone + Send + Sync + 'static,
{
    fn owner(&self, parts: &Parts) -> Option<String> {
        (self.0)(parts)
    }
}

/// The owner is what `f` returns for the request head.
pub fn owner_from_fn<F>(f: F) -> FnOwner<F>
where
    F: Fn(&Parts) -> Option<String> + Clone + Send + Sync + 'static,
{
    FnOwner(f)
}

/// One owner for every request.
#[derive(Debug, Clone)]
pub struct FixedOwner(&'static str);

impl OwnerSource for FixedOwner {
    fn owner(&self, _: &Parts) -> Option<String> {
        Some(self.0.to_owned())
    }
}

/// One owner for every request: **single-tenant or internal services only**.
/// Every caller then shares one key space, so a client that guesses another
/// client's key gets its response (draft §5): require long random keys with
/// [`Builder::key_validator`](crate::Builder::key_validator) (≥ 16 characters).
#[must_use]
pub fn owner_fixed(owner: &'static str) -> FixedOwner {
    FixedOwner(owner)
}
