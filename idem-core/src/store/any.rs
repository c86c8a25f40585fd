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

/// The dyn-compatible mirror of [`Store`], implemented for every store: what
/// [`AnyStore`] forwards to, and what an [`Attempt`](crate::Attempt) writes
/// through (so neither is generic over the store).
pub(crate) trait DynStore: Send + Sync + fmt::Debug + 'static {
    fn claim<'a>(
        &'a self,
        req: &'a ClaimRequest<'a>,
    ) -> BoxFuture<'a, Result<ClaimOutcome, StoreError>>;
    fn complete<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        completion: &'a Completion<'a>,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    fn release<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    fn save_resource_id<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        resource_id: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    fn extend_lease<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        lease_until: Timestamp,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    fn fetch<'a>(
        &'a self,
        id: &'a RecordId,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Option<StoredRecord>, StoreError>>;
    fn purge_expired(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<PurgeReport, StoreError>>;
    fn capabilities(&self) -> Capabilities;
}

/// The dyn-compatible mirror of [`AdminStore`], for [`AnyStore`].
trait DynAdmin: DynStore {
    fn list_in_flight<'a>(
        &'a self,
        query: &'a InFlightQuery<'a>,
    ) -> BoxFuture<'a, Result<Page, StoreError>>;
    fn release_in_flight<'a>(
        &'a self,
        id: &'a RecordId,
        attempt: Option<u32>,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
    fn delete_completed<'a>(
        &'a self,
        id: &'a RecordId,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
    fn count_states(&self, now: Timestamp) -> BoxFuture<'_, Result<StateCounts, StoreError>>;
}

impl<S: Store> DynStore for S {
    fn claim<'a>(
        &'a self,
        req: &'a ClaimRequest<'a>,
    ) -> BoxFuture<'a, Result<ClaimOutcome, StoreError>> {
        Box::pin(Store::claim(self, req))
    }
    fn complete<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        completion: &'a Completion<'a>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(Store::complete(self, id, token, completion))
    }
    fn release<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(Store::release(self, id, token, now))
    }
    fn save_resource_id<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        resource_id: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(Store::save_resource_id(self, id, token, resource_id))
    }
    fn extend_lease<'a>(
        &'a self,
        id: &'a RecordId,
        token: Token,
        lease_until: Timestamp,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(Store::extend_lease(self, id, token, lease_until))
    }
    fn fetch<'a>(
        &'a self,
        id: &'a RecordId,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<Option<StoredRecord>, StoreError>> {
        Box::pin(Store::fetch(self, id, now))
    }
    fn purge_expired(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> BoxFuture<'_, Result<PurgeReport, StoreError>> {
        Box::pin(Store::purge_expired(self, now, limit))
    }
    fn capabilities(&self) -> Capabilities {
        Store::capabilities(self)
    }
}

impl<S: AdminStore> DynAdmin for S {
    fn list_in_flight<'a>(
        &'a self,
        query: &'a InFlightQuery<'a>,
    ) -> BoxFuture<'a, Result<Page, StoreError>> {
        Box::pin(AdminStore::list_in_flight(self, query))
    }
    fn release_in_flight<'a>(
        &'a self,
        id: &'a RecordId,
        attempt: Option<u32>,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(AdminStore::release_in_flight(self, id, attempt, now))
    }
    fn delete_completed<'a>(
        &'a self,
        id: &'a RecordId,
        now: Timestamp,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(AdminStore::delete_completed(self, id, now))
    }
    fn count_states(&self, now: Timestamp) -> BoxFuture<'_, Result<StateCounts, StoreError>> {
        Box::pin(AdminStore::count_states(self, now))
    }
}

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

#[deny(clippy::missing_trait_methods)]
impl Store for AnyStore {
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        self.0.claim(req).await
    }
    async fn complete(
        &self,
        id: &RecordId,
        token: Token,
        completion: &Completion<'_>,
    ) -> Result<(), StoreError> {
        self.0.complete(id, token, completion).await
    }
    async fn release(&self, id: &RecordId, token: Token, now: Timestamp) -> Result<(), StoreError> {
        self.0.release(id, token, now).await
    }
    async fn save_resource_id(
        &self,
        id: &RecordId,
        token: Token,
        resource_id: &str,
    ) -> Result<(), StoreError> {
        self.0.save_resource_id(id, token, resource_id).await
    }
    async fn extend_lease(
        &self,
        id: &RecordId,
        token: Token,
        lease_until: Timestamp,
    ) -> Result<(), StoreError> {
        self.0.extend_lease(id, token, lease_until).await
    }
    async fn fetch(
        &self,
        id: &RecordId,
        now: Timestamp,
    ) -> Result<Option<StoredRecord>, StoreError> {
        self.0.fetch(id, now).await
    }
    async fn purge_expired(&self, now: Timestamp, limit: u32) -> Result<PurgeReport, StoreError> {
        self.0.purge_expired(now, limit).await
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
}

#[deny(clippy::missing_trait_methods)]
impl AdminStore for AnyStore {
    async fn list_in_flight(&self, query: &InFlightQuery<'_>) -> Result<Page, StoreError> {
        self.0.list_in_flight(query).await
    }
    async fn release_in_flight(
        &self,
        id: &RecordId,
        attempt: Option<u32>,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        self.0.release_in_flight(id, attempt, now).await
    }
    async fn delete_completed(&self, id: &RecordId, now: Timestamp) -> Result<bool, StoreError> {
        self.0.delete_completed(id, now).await
    }
    async fn count_states(&self, now: Timestamp) -> Result<StateCounts, StoreError> {
        self.0.count_states(now).await
    }
}
