//! The operator API on the engine: inspect, list stuck, release, delete,
//! count, purge. Backed by [`Store::fetch`] and [`AdminStore`].
//!
//! Every store call made here is bounded in time: [`Idem::admin`] with
//! [`Admin::timeout`] (default [`DEFAULT_TIMEOUT`] per call) turns a
//! store that does not answer (a row lock held by a long transaction, a
//! paused server, a full scan of a huge table) into a typed
//! [`AdminTimeout`] instead of a command that hangs.

mod purger;

pub use self::purger::{PurgerConfig, PurgerHandle};

use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::clock::Timestamp;
use crate::store::{
    AdminStore, Cursor, Fingerprint, InFlightQuery, OutcomeKind, Page, PurgeReport, RecordState,
    StateCounts, Store, StoreError,
};
use crate::{Error, Idem, IntoKey, RecordId, Scope};

/// How long one operator store call may take by default (per call: a
/// listing of many pages makes one call per page).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// An operator store call did not answer within its timeout; the call was
/// abandoned (dropped), so whatever it would have changed is either fully
/// done or not done at all (each is one atomic statement or script), but
/// which one is unknown: inspect the record before acting again.
///
/// It reaches the caller as
/// [`Error::Store`]`(`[`StoreError::Unavailable`]`)` (retryable, like any
/// timeout) whose source is this value; [`AdminTimeout::find`] digs it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the store did not answer `{call}` within {} ms", .after.as_millis())]
pub struct AdminTimeout {
    /// The store call: `fetch`, `list_in_flight`, `release_in_flight`,
    /// `delete_completed`, `count_states` or `purge_expired`.
    pub call: &'static str,
    /// The timeout that fired.
    pub after: Duration,
}

impl AdminTimeout {
    /// The timeout in `error` or anywhere in its chain of sources.
    #[must_use]
    pub fn find<'e>(error: &'e (dyn std::error::Error + 'static)) -> Option<&'e AdminTimeout> {
        let mut next = Some(error);
        while let Some(e) = next {
            if let Some(t) = e.downcast_ref::<AdminTimeout>() {
                return Some(t);
            }
            next = e.source();
        }
        None
    }
}

/// Runs one store call, abandoning it after `after`.
pub(crate) async fn bounded<T>(
    call: &'static str,
    after: Duration,
    fut: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(after, fut).await {
        Ok(result) => result,
        Err(_) => {
            tracing::warn!(
                call,
                timeout_ms = after.as_millis(),
                "operator store call timed out"
            );
            Err(StoreError::Unavailable {
                backend: "admin",
                source: Box::new(AdminTimeout { call, after }),
            })
        }
    }
}

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
    /// The resource id (saved by an attempt, or given at completion).
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

/// The operator API of one engine with a timeout per store call: see
/// [`Idem::admin`], the one entry to it.
pub struct Admin<'a, S> {
    idem: &'a Idem<S>,
    timeout: Duration,
}

impl<S: fmt::Debug> fmt::Debug for Admin<'_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admin")
            .field("idem", self.idem)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl<S: Store> Idem<S> {
    /// The operator API with a timeout on every store call
    /// ([`DEFAULT_TIMEOUT`] unless [`Admin::timeout`] says otherwise).
    ///
    /// ```
    /// # use idem_core::{Idem, MemoryStore};
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
    /// let idem = Idem::new(MemoryStore::new());
    /// let counts = idem.admin().timeout(Duration::from_secs(5)).count_states().await?;
    /// assert_eq!(counts.in_flight, 0);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn admin(&self) -> Admin<'_, S> {
        Admin {
            idem: self,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

impl<S: Store> Admin<'_, S> {
    /// Bounds every store call to `timeout` (a zero timeout is raised to
    /// 1 ms).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Reads the record for `(scope, key)`: its state, attempt, lease,
    /// expiry times and resource id, and its body only if `with_body`. One
    /// store read.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`], [`Error::Store`] (an [`AdminTimeout`] too),
    /// [`Error::CorruptRecord`].
    pub async fn inspect<K: IntoKey>(
        &self,
        scope: &Scope,
        key: K,
        with_body: bool,
    ) -> Result<Option<RecordView>, Error> {
        let (id, now) = self.record_now(scope, key)?;
        let store = self.idem.store();
        let fetch = crate::metrics::time_store("fetch", store.fetch(&id, now));
        let fetched = bounded("fetch", self.timeout, fetch).await?;
        let Some(r) = fetched else {
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

    /// Deletes expired keys and drops expired bodies, `batch` records at a
    /// time (each batch bounded by the timeout), until nothing is left;
    /// returns the totals. Safe to run from every instance at once. The
    /// background purger ([`Idem::spawn_purger`](crate::Idem::spawn_purger))
    /// does the same on a schedule.
    ///
    /// # Errors
    ///
    /// [`Error::Store`] (an [`AdminTimeout`] too).
    pub async fn purge_expired(&self, batch: u32) -> Result<PurgeReport, Error> {
        let mut total = PurgeReport::default();
        loop {
            let report = self.purge_batch(batch).await?;
            total.add(report);
            if report == PurgeReport::default() {
                return Ok(total);
            }
        }
    }

    /// One purge batch of up to `batch` records, bounded by this timeout
    /// and counted in the purge metrics: what [`Admin::purge_expired`] and
    /// the background purger each repeat until a batch comes back empty.
    pub(crate) async fn purge_batch(&self, batch: u32) -> Result<PurgeReport, Error> {
        let store = self.idem.store();
        let result = bounded(
            "purge_expired",
            self.timeout,
            crate::metrics::time_store(
                "purge",
                store.purge_expired(self.idem.clock().now(), batch.max(1)),
            ),
        )
        .await
        .map_err(Error::from);
        crate::metrics::record_purge(result.as_ref().ok());
        result
    }

    /// The record of `scope` and `key`, and the engine's time now.
    fn record_now<K: IntoKey>(
        &self,
        scope: &Scope,
        key: K,
    ) -> Result<(RecordId, Timestamp), Error> {
        let id = RecordId::new(scope.clone(), key.into_key()?);
        Ok((id, self.idem.clock().now()))
    }

    /// One operator write of the record `id` (`call`, named `what` should
    /// it time out), bounded by the timeout: done (`done` says what it did,
    /// for the log), or why not (the record is absent, or in a state the
    /// write refuses).
    async fn write(
        &self,
        what: &'static str,
        call: impl Future<Output = Result<bool, StoreError>>,
        done: &'static str,
        id: &RecordId,
        now: Timestamp,
    ) -> Result<AdminOutcome, Error> {
        if bounded(what, self.timeout, call).await? {
            tracing::info!(record = %id.log_hash(), "{done}");
            return Ok(AdminOutcome::Done);
        }
        let fetched = bounded("fetch", self.timeout, self.idem.store().fetch(id, now)).await?;
        Ok(match fetched {
            None => AdminOutcome::Absent,
            Some(r) => AdminOutcome::Refused {
                state: r.state,
                attempt: r.attempt,
            },
        })
    }
}

impl<S: AdminStore> Admin<'_, S> {
    /// One page of the records in flight whose lease has ended, or ends
    /// within `within` from now (`Duration::ZERO`: only those stuck past
    /// their lease). Follow [`Page::next`] for the rest.
    ///
    /// # Errors
    ///
    /// [`Error::Store`] (an [`AdminTimeout`] too).
    pub async fn list_stuck(
        &self,
        within: Duration,
        cursor: Option<&Cursor>,
        limit: u32,
    ) -> Result<Page, Error> {
        let now = self.idem.clock().now();
        let query = InFlightQuery {
            now,
            lease_before: now.plus(within),
            cursor,
            limit: limit.max(1),
        };
        let store = self.idem.store();
        Ok(bounded("list_in_flight", self.timeout, store.list_in_flight(&query)).await?)
    }

    /// Ends the lease of a record stuck in flight now, so that the next
    /// attempt with the same request runs as a recovery (with the saved
    /// resource id). With `attempt`, only if the record is still at that
    /// attempt (what an operator inspected).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`], [`Error::Store`] (an [`AdminTimeout`] too).
    pub async fn release_stuck<K: IntoKey>(
        &self,
        scope: &Scope,
        key: K,
        attempt: Option<u32>,
    ) -> Result<AdminOutcome, Error> {
        let (id, now) = self.record_now(scope, key)?;
        let release = self.idem.store().release_in_flight(&id, attempt, now);
        let done = "operator released an in-flight record";
        self.write("release_in_flight", release, done, &id, now)
            .await
    }

    /// Deletes a completed record: the key becomes a new operation. Records
    /// in flight or released are refused (release them instead; their next
    /// attempt recovers).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`], [`Error::Store`] (an [`AdminTimeout`] too).
    pub async fn delete_record<K: IntoKey>(
        &self,
        scope: &Scope,
        key: K,
    ) -> Result<AdminOutcome, Error> {
        let (id, now) = self.record_now(scope, key)?;
        let delete = self.idem.store().delete_completed(&id, now);
        let done = "operator deleted a record";
        self.write("delete_completed", delete, done, &id, now).await
    }

    /// Counts the live records by state (a full scan: not for a request
    /// path).
    ///
    /// # Errors
    ///
    /// [`Error::Store`] (an [`AdminTimeout`] too).
    pub async fn count_states(&self) -> Result<StateCounts, Error> {
        let now = self.idem.clock().now();
        let store = self.idem.store();
        Ok(bounded("count_states", self.timeout, store.count_states(now)).await?)
    }
}
