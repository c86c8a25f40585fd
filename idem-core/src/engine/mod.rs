//! The engine: `Idem::execute`, `Idem::begin` and the decisions around them.
//!
//! `core` holds the engine's state; `claim` (the guard) is built on `core`
//! only; this module's entry points are built on both; `adapter` holds the
//! hooks for adapters.

pub(crate) mod adapter;
pub(crate) mod attempt;
pub(crate) mod backlog;
pub(crate) mod claim;
pub(crate) mod codec;
pub(crate) mod core;
pub(crate) mod error;
pub(crate) mod outcome;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tracing::{Instrument, debug, info, info_span, warn};

use self::adapter::{EngineExt, Prepared};
pub use self::core::Idem;
use crate::clock::Timestamp;
use crate::store::Fingerprint;
use crate::store::{OutcomeKind, RecordState};
use crate::store::{Store, StoredRecord};
use crate::wire::retry_after_secs;
use crate::{
    Attempt, Begin, Error, InFlightMode, IntoKey, Outcome, RecordId, Reply, Scope, Storable,
};

/// Counts a begin's answer: a claim won, a replay, or a rejection.
pub(crate) fn record_begin<S: Store, T, E>(
    op: &Arc<str>,
    result: Result<Begin<S, T, E>, Error>,
) -> Result<Begin<S, T, E>, Error> {
    match &result {
        Ok(Begin::Run(_)) => crate::metrics::record_run(op),
        Ok(Begin::Replay(_)) => crate::metrics::record_replay(op),
        Err(e) => crate::metrics::record_rejection(op, e.code()),
    }
    result
}

/// Formats a record's short hash only if a subscriber records the field.
pub(crate) struct LogHash<'a>(pub(crate) &'a RecordId);

impl fmt::Display for LogHash<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.log_hash())
    }
}

impl<S: Store> Idem<S> {
    /// Runs `work` at most once per `(scope, key)` and returns its outcome, or
    /// replays the stored one.
    ///
    /// The work returns an [`Outcome`], or a `Result<T, Failure<E>>` so it
    /// can use `?` ([`Failure::permanent`](crate::Failure::permanent) is
    /// stored, [`Failure::transient`](crate::Failure::transient) releases the
    /// key).
    ///
    /// The closure convenience over [`Idem::begin`]: begin, run the work on
    /// [`Begin::Run`], [`Claim::complete`](crate::Claim::complete) with its outcome.
    ///
    /// Round trips: a fresh key costs two (claim, complete), a replay one.
    /// Nothing is held between them: no lock, no per-key state in the process.
    ///
    /// * The key and the request are checked first; nothing is stored for
    ///   invalid input.
    /// * `Success` and `Failure` are stored and replayed; `Transient` releases
    ///   the key so the next retry runs the work again.
    /// * If the work's future is dropped, it panics, or the process dies, the
    ///   record stays `in_flight` until its lease ends; the next retry then
    ///   runs the work as a *recovery* ([`Attempt::is_recovery`]).
    /// * If the store fails after the work finished, the completion write is
    ///   retried briefly; if it still fails the caller gets the work's outcome
    ///   with [`Reply::is_stored`] `false`, and the record is left to lease
    ///   expiry and recovery. The work never runs twice because of it.
    ///
    /// # Errors
    ///
    /// The rejections of the contract ([`Error::InvalidKey`],
    /// [`Error::FingerprintMismatch`], [`Error::InFlight`],
    /// [`Error::ResponseExpired`], ...), each with its
    /// [`http_status`](Error::http_status).
    pub async fn execute<K, R, T, E, O, F, Fut>(
        &self,
        scope: &Scope,
        key: K,
        request: &R,
        work: F,
    ) -> Result<Reply<T, E>, Error>
    where
        K: IntoKey + Send,
        R: Serialize + Sync + ?Sized,
        T: Storable,
        E: Storable,
        O: Into<Outcome<T, E>>,
        F: FnOnce(Attempt) -> Fut + Send,
        Fut: Future<Output = O> + Send,
    {
        let prepared = self.prepare(scope, key, request)?;
        let span = info_span!(
            "idem.execute",
            record = %LogHash(&prepared.id),
            operation = %prepared.id.operation(),
        );
        async move {
            match self.begin_inner(prepared).await? {
                Begin::Replay(reply) => Ok(reply),
                Begin::Run(claim) => {
                    let outcome = work(claim.attempt().clone()).await;
                    claim.complete(outcome).await
                }
            }
        }
        .instrument(span)
        .await
    }

    /// Begins an idempotent operation: claims `(scope, key)` for this caller,
    /// or answers with what stands.
    ///
    /// * [`Begin::Run`]: the claim is ours. Run the work (its handle is
    ///   [`Claim::attempt`](crate::Claim::attempt)), then [`Claim::complete`](crate::Claim::complete) with the outcome, or
    ///   [`Claim::release`](crate::Claim::release) it. A claim dropped unfinished is a crash: the
    ///   record waits for its lease, then recovery.
    /// * [`Begin::Replay`]: the stored outcome; the work must not run.
    ///
    /// In [`InFlightMode::Wait`] a duplicate of a running attempt waits here,
    /// polling, up to the policy's timeout.
    ///
    /// ```
    /// use idem_core::{Begin, Idem, MemoryStore, Outcome, Scope};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
    /// let idem = Idem::new(MemoryStore::new());
    /// let scope = Scope::new("acct_42", "POST /payments")?;
    /// let request = serde_json::json!({"amount": 1000});
    /// let reply = match idem.begin::<String, String, _, _>(&scope, "order-7", &request).await? {
    ///     Begin::Replay(reply) => reply,
    ///     Begin::Run(claim) => {
    ///         let charge = format!("ch_{}", &claim.attempt().downstream_key("charge", 1)[..8]);
    ///         claim.complete(Outcome::Success(charge)).await?
    ///     }
    /// };
    /// assert!(!reply.is_replay());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Idem::execute`].
    pub fn begin<T, E, K, R>(
        &self,
        scope: &Scope,
        key: K,
        request: &R,
    ) -> impl Future<Output = Result<Begin<S, T, E>, Error>> + Send + '_
    where
        T: Storable,
        E: Storable,
        K: IntoKey,
        R: Serialize + ?Sized,
    {
        // Checked and fingerprinted before the future exists, so it
        // captures neither the key nor the request.
        let prepared = self.prepare(scope, key, request);
        async move { self.begin_prepared(prepared?).await }
    }

    /// Claims (waiting on in-flight duplicates if the policy says so) and
    /// counts the answer in the metrics.
    pub(crate) async fn begin_inner<T: Storable, E: Storable>(
        &self,
        prepared: Prepared,
    ) -> Result<Begin<S, T, E>, Error> {
        let op = prepared.id.label_shared().clone();
        record_begin(&op, self.claim_or_wait(prepared).await)
    }

    async fn claim_or_wait<T: Storable, E: Storable>(
        &self,
        prepared: Prepared,
    ) -> Result<Begin<S, T, E>, Error> {
        let wait = match self.policy.in_flight() {
            InFlightMode::Wait { timeout, poll } => Some((deadline_after(timeout), poll)),
            InFlightMode::Reject => None,
        };
        let mut ticket = EngineExt::ticket(self, prepared);
        loop {
            let timer = crate::metrics::StoreTimer::start("claim");
            let answer = self.store.claim(&ticket.request()).await;
            timer.finish(&answer);
            let answer = answer?;
            match self.settle_ref(&ticket, answer) {
                Err(Error::InFlight { retry_after }) => {
                    let Some((deadline, poll)) = wait else {
                        info!(?retry_after, "in flight: rejected");
                        return Err(Error::InFlight { retry_after });
                    };
                    let left = deadline.map_or(poll, |d| {
                        d.saturating_duration_since(tokio::time::Instant::now())
                    });
                    if left.is_zero() {
                        info!(?retry_after, "in flight: wait timed out");
                        return Err(Error::InFlight { retry_after });
                    }
                    debug!("in flight: waiting");
                    tokio::time::sleep(poll.min(left)).await;
                    ticket = self.reticket(ticket);
                }
                other => return other,
            }
        }
    }
}

/// What a caller gets for a record it could not claim: a replay, or the
/// rejection (mismatch, in flight, already done). Pure: no store call.
pub(crate) fn existing<T: Storable, E: Storable>(
    record: StoredRecord,
    fingerprint: &Fingerprint,
    now: Timestamp,
) -> Result<Reply<T, E>, Error> {
    if record.fingerprint != *fingerprint {
        warn!("fingerprint mismatch: work not run");
        return Err(Error::FingerprintMismatch);
    }
    match record.state {
        RecordState::InFlight | RecordState::Released => {
            let left = record.lease_until.saturating_since(now);
            Err(Error::InFlight {
                retry_after: Duration::from_secs(retry_after_secs(left)),
            })
        }
        RecordState::Completed => {
            let kind = record.outcome.ok_or_else(|| Error::CorruptRecord {
                detail: "completed record without an outcome".to_owned(),
            })?;
            if kind == OutcomeKind::NotStored {
                let resource_id = record.resource_id;
                return Err(Error::ResponseNotStored { resource_id });
            }
            let Some(bytes) = record.response else {
                let resource_id = record.resource_id;
                return Err(Error::ResponseExpired { resource_id });
            };
            let corrupt = |e: crate::util::BoxDynError| Error::CorruptRecord {
                detail: format!("stored response does not decode: {e}"),
            };
            // The record is ours: the body is decoded from its buffer.
            let outcome = match kind {
                OutcomeKind::Failure => Outcome::Failure(E::decode_owned(bytes).map_err(corrupt)?),
                _ => Outcome::Success(T::decode_owned(bytes).map_err(corrupt)?),
            };
            info!("replay");
            Ok(Reply {
                outcome,
                replayed: true,
                attempt: record.attempt,
                stored: true,
                pending: false,
            })
        }
    }
}

/// The instant `timeout` from now, or `None` when it is too far to represent
/// (then the wait is bounded by nothing but the first attempt).
fn deadline_after(timeout: Duration) -> Option<tokio::time::Instant> {
    tokio::time::Instant::now().checked_add(timeout)
}
