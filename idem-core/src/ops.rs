//! The operator API on the engine: inspect, list stuck, release, delete,
//! count. Backed by [`Store::fetch`] and [`AdminStore`].

use std::time::Duration;

use crate::admin::{AdminStore, Cursor, InFlightQuery, Page, StateCounts};
use crate::clock::Timestamp;
use crate::engine::Idem;
use crate::error::Error;
use crate::fingerprint::Fingerprint;
use crate::key::IntoKey;
use crate::scope::{RecordId, Scope};
use crate::store::{OutcomeKind, RecordState, Store};

/// One record as an operator sees it: everything but the body, unless asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordView {
    /// Its identity.
    pub id: RecordId,
    /// The fingerprint of the request that created (or last claimed) it.
    pub fingerprint: Fingerprint,
    /// Its state.
    pub state: RecordState,
    /// Attempts so far.
    pub attempt: u32,
    /// When the current (or last) lease ends.
    pub lease_until: Timestamp,
    /// Whether the lease has ended at the time of the read (meaningful while
    /// in flight: then the next attempt is a recovery).
    pub lease_expired: bool,
    /// The checkpoint or resource id.
    pub resource_id: Option<String>,
    /// The outcome, once completed.
    pub outcome: Option<OutcomeKind>,
    /// When the body is (or was) dropped.
    pub response_expires_at: Option<Timestamp>,
    /// When the key is forgotten.
    pub key_expires_at: Timestamp,
    /// The body's size while it is stored.
    pub body_len: Option<usize>,
    /// The body itself, only when asked for.
    pub body: Option<Vec<u8>>,
}

/// The answer to an operator action on one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AdminOutcome {
    /// Done.
    Done,
    /// No live record has this identity.
    Absent,
    /// The record is not in a state the action applies to (or its attempt
    /// changed since it was inspected); nothing changed.
    Refused {
        /// Its state now.
        state: RecordState,
        /// Its attempt now.
        attempt: u32,
    },
}

impl<S: Store> Idem<S> {
    /// Reads the record for `(scope, key)` for an operator: its state,
    /// attempt, lease, expiry times and resource id, and its body only if
    /// `with_body`. One [`Store::fetch`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`], [`Error::Store`], [`Error::CorruptRecord`].
    pub async fn inspect<K: IntoKey>(
        &self,
        scope: &Scope,
        key: K,
        with_body: bool,
    ) -> Result<Option<RecordView>, Error> {
        let id = RecordId::new(scope.clone(), key.into_key()?);
        let now = self.clock().now();
        let Some(r) = self.store().fetch(&id, now).await? else {
            return Ok(None);
        };
        Ok(Some(RecordView {
            id,
            fingerprint: r.fingerprint,
            state: r.state,
            attempt: r.attempt,
            lease_until: r.lease_until,
            lease_expired: r.lease_until <= now,
            resource_id: r.resource_id,
            outcome: r.outcome,
            response_expires_at: r.response_expires_at,
            key_expires_at: r.key_expires_at,
            body_len: r.response.as_ref().map(Vec::len),
            body: if with_body { r.response } else { None },
        }))
    }
}

impl<S: AdminStore> Idem<S> {
    /// One page of the records in flight whose lease has ended, or ends
    /// within `within` from now (`Duration::ZERO`: only those stuck past
    /// their lease). Follow [`Page::next`] for the rest.
    ///
    /// # Errors
    ///
    /// [`Error::Store`].
    pub async fn list_stuck(
        &self,
        within: Duration,
        cursor: Option<&Cursor>,
        limit: u32,
    ) -> Result<Page, Error> {
        let now = self.clock().now();
        let query = InFlightQuery {
            now,
            lease_before: now.plus(within),
            cursor,
            limit: limit.max(1),
        };
        Ok(self.store().list_in_flight(&query).await?)
    }

    /// Ends the lease of a record stuck in flight now, so that the next
    /// attempt with the same request runs as a recovery (with the
    /// checkpoint). With `attempt`, only if the record is still at that
    /// attempt (what an operator inspected).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`], [`Error::Store`].
    pub async fn release_stuck<K: IntoKey>(
        &self,
        scope: &Scope,
        key: K,
        attempt: Option<u32>,
    ) -> Result<AdminOutcome, Error> {
        let id = RecordId::new(scope.clone(), key.into_key()?);
        let now = self.clock().now();
        if self.store().release_in_flight(&id, attempt, now).await? {
            tracing::info!(record = %id.log_hash(), "operator released an in-flight record");
            return Ok(AdminOutcome::Done);
        }
        self.explain(&id, now).await
    }

    /// Deletes a completed record: the key becomes a new operation. Records
    /// in flight or released are refused (release them instead; their next
    /// attempt recovers).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`], [`Error::Store`].
    pub async fn delete_record<K: IntoKey>(
        &self,
        scope: &Scope,
        key: K,
    ) -> Result<AdminOutcome, Error> {
        let id = RecordId::new(scope.clone(), key.into_key()?);
        let now = self.clock().now();
        if self.store().delete_completed(&id, now).await? {
            tracing::info!(record = %id.log_hash(), "operator deleted a record");
            return Ok(AdminOutcome::Done);
        }
        self.explain(&id, now).await
    }

    /// Counts the live records by state (a full scan: not for a request
    /// path).
    ///
    /// # Errors
    ///
    /// [`Error::Store`].
    pub async fn count_states(&self) -> Result<StateCounts, Error> {
        Ok(self.store().count_states(self.clock().now()).await?)
    }

    async fn explain(&self, id: &RecordId, now: Timestamp) -> Result<AdminOutcome, Error> {
        Ok(match self.store().fetch(id, now).await? {
            None => AdminOutcome::Absent,
            Some(r) => AdminOutcome::Refused {
                state: r.state,
                attempt: r.attempt,
            },
        })
    }
}
