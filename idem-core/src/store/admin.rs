//! Operator operations: find records stuck in flight, release or delete one,
//! count records by state.
//!
//! These are the answers to the three pages an idem deployment gets: a client
//! stuck on 409 because an attempt crashed holding a long lease, a surge of
//! rejections, and a store that grows. They live in [`AdminStore`], a trait
//! beside [`Store`] (not in it): an engine runs on any `Store`, while the
//! operator API ([`Admin`](crate::ops::Admin)'s listing, release, delete and
//! counts), [`AnyStore`](crate::AnyStore) and the conformance suite need
//! `AdminStore` too.
//!
//! # Safety against a live system
//!
//! None of these operations can make the work run twice without going
//! through a recovery:
//!
//! * [`AdminStore::release_in_flight`] only moves an in-flight record's lease
//!   end to `now`. Its token is unchanged (the holder, if alive, may still
//!   complete), and the next claim with the same fingerprint takes it over as
//!   [`TakeoverReason::LeaseExpired`](crate::TakeoverReason) with the
//!   resource id kept, under a new token that fences the old holder out: the
//!   same path as a lease that ended by itself.
//! * [`AdminStore::delete_completed`] removes only completed records (the key
//!   becomes a new operation, as after `key_ttl`); it refuses records in
//!   flight or released, whose work may have had effects that only a recovery
//!   reconciles.
//! * Listing and counting only read.

use std::future::Future;

use crate::RecordId;
use crate::clock::Timestamp;
use crate::store::{Cursor, Page, StateCounts, Store, StoreError};

/// A position in a keyset listing: the last record of the previous page.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct KeysetPosition {
    /// Its lease end.
    pub lease_until: Timestamp,
    /// Its owner.
    pub owner: String,
    /// Its operation.
    pub operation: String,
    /// Its key.
    pub key: String,
}

/// A cursor that this store did not write (or from another backend).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the cursor is not one this store wrote")]
pub struct CursorError;

impl From<CursorError> for StoreError {
    fn from(e: CursorError) -> Self {
        let CursorError = e;
        StoreError::InvalidCursor
    }
}

/// Which in-flight records to list.
#[derive(Debug, Clone, Copy)]
pub struct InFlightQuery<'a> {
    /// The engine's time: records whose key expired are not listed.
    pub now: Timestamp,
    /// List records whose lease ends at or before this. `now` lists the
    /// records stuck past their lease; a later time also lists live leases
    /// that end soon (or a crashed attempt's long lease).
    pub lease_before: Timestamp,
    /// Where the previous page stopped (`None`: from the start).
    pub cursor: Option<&'a Cursor>,
    /// The page size (at least 1). SQL backends return at most this many;
    /// Redis returns what a bounded `SCAN` found (see its crate docs).
    pub limit: u32,
}

/// The operator operations of a store. Every backend of this workspace
/// implements them; the conformance suite proves them.
///
/// None of them can make the work run twice without a recovery:
/// [`release_in_flight`](AdminStore::release_in_flight) only ends a lease
/// (the next claim is a takeover under a new token, the resource id kept),
/// [`delete_completed`](AdminStore::delete_completed) removes only completed
/// records, and listing and counting only read.
pub trait AdminStore: Store {
    /// Lists in-flight records whose lease ends at or before
    /// `query.lease_before` and whose key lives at `query.now`, one page at a
    /// time.
    ///
    /// # Behavior
    ///
    /// Following `next` until it is `None` visits every matching record that
    /// existed for the whole walk; records never hold a body here.
    fn list_in_flight(
        &self,
        query: &InFlightQuery<'_>,
    ) -> impl Future<Output = Result<Page, StoreError>> + Send;

    /// Ends the lease of an in-flight record now, so that the next claim with
    /// the same fingerprint takes it over as a recovery (resource id kept).
    ///
    /// # Behavior
    ///
    /// Atomically, only if the record is live, `in_flight`, and (when
    /// `attempt` is given) at exactly that attempt: `lease_until` becomes
    /// `min(lease_until, now)`; the token, resource id and attempt are kept.
    /// Returns whether it did.
    fn release_in_flight(
        &self,
        id: &RecordId,
        attempt: Option<u32>,
        now: Timestamp,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Deletes a completed record (the key becomes a new operation).
    ///
    /// # Behavior
    ///
    /// Atomically, only if the record is `completed` or its key expired at
    /// `now`: the record (and its body) is removed. Records in flight or
    /// released are refused. Returns whether it deleted.
    fn delete_completed(
        &self,
        id: &RecordId,
        now: Timestamp,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Counts the records by state at `now`.
    ///
    /// # Behavior
    ///
    /// Reads every record (a full scan on every backend: for dashboards and
    /// the command-line tool, not for a request path).
    fn count_states(
        &self,
        now: Timestamp,
    ) -> impl Future<Output = Result<StateCounts, StoreError>> + Send;
}
