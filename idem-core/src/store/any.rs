//! [`AnyStore`]: a backend chosen at run time.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::RecordId;
use crate::clock::Timestamp;
use crate::store::{
    AdminStore, Capabilities, ClaimOutcome, ClaimRequest, Completion, InFlightQuery, Page,
    PurgeReport, StateCounts, Store, StoreError, StoredRecord, Token,
};

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The dyn-compatible mirrors of [`Store`] (`DynStore`) and of
/// [`AdminStore`] (`DynAdmin`), implemented for every store: what
/// [`AnyStore`] forwards to, and what an [`Attempt`](crate::Attempt) writes
/// through (so neither is generic over the store).
macro_rules! dyn_store {
    (
        store { $($m:ident($($p:ident: $t:ty),*) -> $o:ty;)* }
        admin { $($am:ident($($ap:ident: $at:ty),*) -> $ao:ty;)* }
    ) => {
        pub(crate) trait DynStore: Send + Sync + fmt::Debug + 'static {
            $(fn $m<'a>(&'a self, $($p: $t),*) -> BoxFuture<'a, Result<$o, StoreError>>;)*
            fn capabilities(&self) -> Capabilities;
        }

        trait DynAdmin: DynStore {
            $(fn $am<'a>(&'a self, $($ap: $at),*) -> BoxFuture<'a, Result<$ao, StoreError>>;)*
        }

        impl<S: Store> DynStore for S {
            $(
                fn $m<'a>(&'a self, $($p: $t),*) -> BoxFuture<'a, Result<$o, StoreError>> {
                    Box::pin(Store::$m(self, $($p),*))
                }
            )*
            fn capabilities(&self) -> Capabilities {
                Store::capabilities(self)
            }
        }

        impl<S: AdminStore> DynAdmin for S {
            $(
                fn $am<'a>(&'a self, $($ap: $at),*) -> BoxFuture<'a, Result<$ao, StoreError>> {
                    Box::pin(AdminStore::$am(self, $($ap),*))
                }
            )*
        }
    };
}

crate::store::store_methods!(dyn_store {} 'a);

/// Any store, chosen at run time: SQLite in development and Postgres in
/// production from one configuration value, without an enum of your own.
///
/// Costs one boxed future per store call (an allocation, next to a network
/// round trip or a SQLite statement). Cheap to clone.
///
/// It is an [`AdminStore`] too, so the operator API
/// ([`Idem::admin`](crate::Idem::admin)'s inspect, list, release, delete,
/// counts and purge, and the purger) works on the store chosen at run time. Every backend of this
/// workspace implements [`AdminStore`]; a third-party store implements it
/// to be wrapped here.
///
/// ```
/// use idem_core::{AnyStore, Idem, MemoryStore};
///
/// fn store_from_config(kind: &str) -> AnyStore {
///     match kind {
///         // "sqlite" => AnyStore::new(idem::sqlite::SqliteStore::open(path).await?),
///         // "postgres" => AnyStore::new(idem::postgres::PgStore::connect(url).await?),
///         _ => AnyStore::new(MemoryStore::new()),
///     }
/// }
/// let idem: Idem<AnyStore> = Idem::new(store_from_config("memory"));
/// # let _ = idem;
/// ```
#[derive(Clone)]
pub struct AnyStore(Arc<dyn DynAdmin>);

impl AnyStore {
    /// Wraps a store.
    pub fn new<S: AdminStore>(store: S) -> Self {
        Self(Arc::new(store))
    }
}

impl fmt::Debug for AnyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("AnyStore").field(&self.0).finish()
    }
}

/// Every call goes to the wrapped store, through its boxed mirror.
macro_rules! any_store {
    (
        store { $($m:ident($($p:ident: $t:ty),*) -> $o:ty;)* }
        admin { $($am:ident($($ap:ident: $at:ty),*) -> $ao:ty;)* }
    ) => {
        #[deny(clippy::missing_trait_methods)]
        impl Store for AnyStore {
            $(
                async fn $m(&self, $($p: $t),*) -> Result<$o, StoreError> {
                    self.0.$m($($p),*).await
                }
            )*
            fn capabilities(&self) -> Capabilities {
                self.0.capabilities()
            }
        }

        #[deny(clippy::missing_trait_methods)]
        impl AdminStore for AnyStore {
            $(
                async fn $am(&self, $($ap: $at),*) -> Result<$ao, StoreError> {
                    self.0.$am($($ap),*).await
                }
            )*
        }
    };
}

crate::store::store_methods!(any_store {} '_);
