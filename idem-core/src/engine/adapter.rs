//! The engine's hooks for adapters that run it on their own terms: a
//! caller that fingerprints requests itself (an HTTP layer hashing method,
//! route, query and body), and a caller that claims and completes on its own
//! connection, inside its own transaction (a transactional mode).
//!
//! Everything here is reached through two sealed extension traits,
//! [`EngineExt`] on [`Idem`] and [`ClaimExt`] on [`Claim`]: an application
//! never needs them, and an adapter imports them on purpose.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use serde::Serialize;
use tracing::{Instrument, info, info_span, warn};

use crate::clock::Timestamp;
use crate::fingerprint::fingerprint;
use crate::store::Fingerprint;
use crate::store::OutcomeKind;
use crate::store::{ClaimOutcome, ClaimRequest, Completion, Store, Token};
use crate::{
    Attempt, Begin, Claim, Error, Idem, IntoKey, Outcome, RecordId, Reply, Scope, Storable,
};

/// Whether an adapter may send its handler's answer, once the outcome was
/// handed to the engine: `pending` is [`Reply::is_pending`] (the completion
/// could not be written yet; the engine writes it again in the background).
///
/// * Stored (`pending` false): the answer goes out.
/// * Pending, and the handler saved a resource id
///   ([`Attempt::has_saved_resource_id`]): the answer goes out too; if the
///   outcome is never stored, the recovery after the lease is given that id
///   and reconciles instead of acting twice.
/// * Pending, nothing saved: the answer must not go out, since it would
///   tell the client "done" for work a retry after the lease could run
///   again. The error to answer instead is returned:
///   [`Error::Store`] with [`StoreError::Unavailable`](crate::store::StoreError)
///   (503 `store_unavailable`, retryable); the retry replays the outcome
///   once the background write stored it.
///
/// # Errors
///
/// The error to answer in place of the handler's answer, as above.
pub(crate) fn answerable(pending: bool, attempt: &Attempt) -> Result<(), Error> {
    if !pending || attempt.has_saved_resource_id() {
        return Ok(());
    }
    Err(Error::Store(crate::store::StoreError::Unavailable {
        backend: "idem",
        source: "the outcome is not stored yet".into(),
    }))
}

mod sealed {
    pub trait Sealed {}
    impl<S: crate::store::Store> Sealed for crate::Idem<S> {}
    impl<S: crate::store::Store, T, E> Sealed for crate::Claim<S, T, E> {}
}

/// A request checked and fingerprinted, ready to claim: what
/// [`EngineExt::prepare`] makes, and what [`EngineExt::begin_prepared`] takes from a
/// caller that fingerprints on its own terms (an HTTP adapter hashing the
/// method, route, query and body).
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The record it addresses.
    pub id: RecordId,
    /// Its fingerprint.
    pub fingerprint: Fingerprint,
}

impl Prepared {
    /// A prepared request from its parts.
    #[must_use]
    pub fn new(id: RecordId, fingerprint: Fingerprint) -> Self {
        Self { id, fingerprint }
    }
}

/// A claim about to be made: a fresh fencing token and the deadlines the
/// engine's policy and clock give it. For callers that run the claim on
/// their own connection (a transactional mode): send
/// [`ClaimTicket::request`] with [`Store::claim`]'s semantics, then hand the
/// answer to [`EngineExt::settle`].
#[derive(Debug, Clone)]
pub struct ClaimTicket {
    prepared: Prepared,
    token: Token,
    now: Timestamp,
    lease_until: Timestamp,
    key_expires_at: Timestamp,
    deferred: bool,
}

impl ClaimTicket {
    /// The claim, as [`Store::claim`] takes it.
    #[must_use]
    pub fn request(&self) -> ClaimRequest<'_> {
        ClaimRequest {
            id: &self.prepared.id,
            fingerprint: self.prepared.fingerprint,
            token: self.token,
            now: self.now,
            lease_until: self.lease_until,
            key_expires_at: self.key_expires_at,
        }
    }

    /// Makes the attempt's store writes *deferred*: [`Attempt::save_resource_id`]
    /// keeps the resource id in memory, to be written with the completion,
    /// and [`Attempt::extend_lease`] does nothing. For a claim held by an
    /// open transaction, whose row lock (not the lease) keeps duplicates out
    /// and whose rollback would undo any earlier write anyway.
    #[must_use]
    pub fn deferred(mut self) -> Self {
        self.deferred = true;
        self
    }
}

/// The engine hooks for adapters, on [`Idem`]. Sealed: implemented for every
/// `Idem<S>`, and by nothing else.
pub trait EngineExt: sealed::Sealed {
    /// The engine's store.
    type Store: Store;

    /// Validates the key and fingerprints the request under this engine's
    /// field filter, as [`Idem::begin`] does first (a refusal is counted as
    /// a rejection in the metrics). Nothing touches the store.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`], [`Error::InvalidRequest`].
    fn prepare<K: IntoKey, R: Serialize + ?Sized>(
        &self,
        scope: &Scope,
        key: K,
        request: &R,
    ) -> Result<Prepared, Error>;

    /// [`Idem::begin`] for a request already checked and fingerprinted
    /// ([`EngineExt::prepare`], or [`Prepared::new`] with a caller's own
    /// fingerprint).
    ///
    /// # Errors
    ///
    /// As [`Idem::execute`], except the input checks.
    fn begin_prepared<T: Storable, E: Storable>(
        &self,
        prepared: Prepared,
    ) -> impl Future<Output = Result<Begin<Self::Store, T, E>, Error>> + Send;

    /// A claim for `prepared`, to be sent on the caller's own connection
    /// (see [`ClaimTicket`]).
    fn ticket(&self, prepared: Prepared) -> ClaimTicket;

    /// What the caller of [`ticket`](EngineExt::ticket) gets for the store's
    /// answer to its claim: the claim ([`Begin::Run`]), a replay, or the
    /// rejection, counted in the metrics like [`Idem::begin`]'s. No store
    /// call.
    ///
    /// # Errors
    ///
    /// [`Error::FingerprintMismatch`], [`Error::InFlight`],
    /// [`Error::ResponseExpired`], [`Error::ResponseNotStored`],
    /// [`Error::CorruptRecord`].
    fn settle<T: Storable, E: Storable>(
        &self,
        ticket: ClaimTicket,
        answer: ClaimOutcome,
    ) -> Result<Begin<Self::Store, T, E>, Error>;
}

impl<S: Store> EngineExt for Idem<S> {
    type Store = S;

    fn prepare<K: IntoKey, R: Serialize + ?Sized>(
        &self,
        scope: &Scope,
        key: K,
        request: &R,
    ) -> Result<Prepared, Error> {
        let prepared = (|| {
            let key = key.into_key()?;
            let fingerprint = fingerprint(scope.operation(), request, self.policy.fields())?;
            Ok(Prepared {
                id: RecordId::new(scope.clone(), key),
                fingerprint,
            })
        })();
        prepared.inspect_err(|e: &Error| {
            crate::metrics::record_rejection(scope.label_shared(), e.code())
        })
    }

    async fn begin_prepared<T: Storable, E: Storable>(
        &self,
        prepared: Prepared,
    ) -> Result<Begin<S, T, E>, Error> {
        let span = info_span!(
            "idem.begin",
            record = %crate::engine::LogHash(&prepared.id),
            operation = %prepared.id.operation(),
        );
        self.begin_inner(prepared).instrument(span).await
    }

    fn ticket(&self, prepared: Prepared) -> ClaimTicket {
        let now = self.clock.now();
        ClaimTicket {
            prepared,
            token: Token::random(),
            now,
            lease_until: now.plus(self.policy.lease()),
            key_expires_at: now.plus(self.policy.key_ttl()),
            deferred: false,
        }
    }

    fn settle<T: Storable, E: Storable>(
        &self,
        ticket: ClaimTicket,
        answer: ClaimOutcome,
    ) -> Result<Begin<S, T, E>, Error> {
        let op = ticket.prepared.id.label_shared().clone();
        crate::engine::record_begin(&op, self.settle_ref(&ticket, answer))
    }
}

impl<S: Store> Idem<S> {
    /// The claim or answer for `ticket` (no metrics: the callers count).
    pub(crate) fn settle_ref<T: Storable, E: Storable>(
        &self,
        ticket: &ClaimTicket,
        answer: ClaimOutcome,
    ) -> Result<Begin<S, T, E>, Error> {
        let claimed = match answer {
            ClaimOutcome::Claimed(claimed) => claimed,
            ClaimOutcome::Existing(record) => {
                return crate::engine::existing(record, &ticket.prepared.fingerprint, ticket.now)
                    .map(Begin::Replay);
            }
        };
        let number = claimed.attempt;
        match &claimed.previous {
            Some(p) => {
                crate::metrics::record_recovery(ticket.prepared.id.label_shared(), p.reason);
                info!(attempt = number, reason = ?p.reason, "claimed: recovery");
            }
            None => tracing::debug!(attempt = number, "claimed"),
        }
        let control = if ticket.deferred {
            None
        } else {
            Some(Arc::clone(&self.control))
        };
        let attempt = Attempt::new(
            ticket.prepared.id.clone(),
            ticket.token,
            number,
            claimed.previous,
            Arc::clone(&self.clock),
            control,
            ticket.lease_until,
        );
        Ok(Begin::Run(Claim::new(self.clone(), attempt)))
    }

    /// A fresh ticket for the same request (a poll after an in-flight
    /// answer).
    pub(crate) fn reticket(&self, ticket: ClaimTicket) -> ClaimTicket {
        EngineExt::ticket(self, ticket.prepared)
    }
}

/// The adapter hook on [`Claim`]. Sealed: implemented for every `Claim`, and
/// by nothing else.
pub trait ClaimExt<T, E>: sealed::Sealed {
    /// Encodes the outcome as the engine stores it, *without* writing it,
    /// for a caller that writes the completion on its own connection (such
    /// as a transactional mode, where the completion commits with the work's
    /// own writes). The claim is finished: write
    /// [`PendingCompletion::completion`] with [`Store::complete`]'s
    /// semantics under [`PendingCompletion::token`], then call
    /// [`written`](PendingCompletion::written) or
    /// [`not_written`](PendingCompletion::not_written).
    ///
    /// A `Transient` outcome has nothing to write
    /// ([`PendingCompletion::is_transient`]): the caller undoes the claim
    /// (a rollback) and calls [`not_written`](PendingCompletion::not_written).
    fn into_pending(self, outcome: impl Into<Outcome<T, E>>) -> PendingCompletion<T, E>;

    /// Ends the claim the way an adapter does once its handler answered
    /// (`how`), and says what the adapter answers:
    ///
    /// * [`Settle::Release`]: the key is released
    ///   ([`Claim::release`]); a release that fails leaves the record to its
    ///   lease (logged at `warn`): [`Settled::Released`] either way;
    /// * [`Settle::NotStored`]: completed without its body
    ///   ([`Claim::complete_not_stored`]);
    /// * [`Settle::Store`]: completed with the outcome ([`Claim::complete`]).
    ///
    /// A completion the store took, or that is pending with a resource id
    /// the handler saved, is [`Settled::Answer`]: the handler's answer goes
    /// out. One pending with nothing saved is [`Settled::Hold`] with the
    /// error to answer instead (503 `store_unavailable`).
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when a newer attempt took the record over (its
    /// outcome is the one replayed).
    fn settle(self, how: Settle<T, E>) -> impl Future<Output = Result<Settled, Error>> + Send;
}

impl<S: Store, T: Storable, E: Storable> ClaimExt<T, E> for Claim<S, T, E> {
    fn into_pending(mut self, outcome: impl Into<Outcome<T, E>>) -> PendingCompletion<T, E> {
        self.finish();
        PendingCompletion::new(&self.idem, &self.attempt, outcome.into())
    }

    async fn settle(self, how: Settle<T, E>) -> Result<Settled, Error> {
        let attempt = self.attempt().clone();
        let pending = match how {
            Settle::Release => {
                return match self.release().await {
                    Err(e @ Error::LeaseLost { .. }) => Err(e),
                    Err(e) => {
                        warn!(error = %e, "transient answer: release failed; left to lease expiry");
                        Ok(Settled::Released)
                    }
                    Ok(()) => Ok(Settled::Released),
                };
            }
            Settle::NotStored => !self.complete_not_stored().await?,
            Settle::Store(outcome) => self.complete(outcome).await?.is_pending(),
        };
        Ok(match answerable(pending, &attempt) {
            Ok(()) => Settled::Answer,
            Err(hold) => Settled::Hold(hold),
        })
    }
}

/// What an adapter does with its claim once its handler answered:
/// [`ClaimExt::settle`].
#[derive(Debug)]
pub enum Settle<T, E> {
    /// A transient answer: release the key, so that the next attempt runs.
    Release,
    /// An answer that is not to be kept (a stream, a secret, too large):
    /// complete the record without its body; retries get
    /// [`Error::ResponseNotStored`].
    NotStored,
    /// The outcome to store and replay.
    Store(Outcome<T, E>),
}

/// What [`ClaimExt::settle`] left the adapter to answer.
#[derive(Debug)]
#[must_use]
pub enum Settled {
    /// The key was released (or left to its lease if the release failed):
    /// the handler's (transient) answer goes out.
    Released,
    /// The outcome is stored, or pending with a saved resource id a
    /// recovery reconciles from: the handler's answer goes out.
    Answer,
    /// The outcome is not stored yet and nothing was saved to reconcile
    /// from: answer this error instead (503 `store_unavailable`); the retry
    /// replays the outcome once the engine's background write stored it.
    Hold(Error),
}

/// An outcome encoded for storage but not yet written: see
/// [`ClaimExt::into_pending`].
///
/// Dropped without [`written`](Self::written) or
/// [`not_written`](Self::not_written), it logs at `warn` like a dropped
/// [`Claim`]: the record stays in flight until its lease ends.
pub struct PendingCompletion<T, E> {
    outcome: Outcome<T, E>,
    /// Warns when dropped armed: the completion was neither written nor
    /// reported unwritten.
    guard: UnwrittenGuard,
    kind: OutcomeKind,
    body: Option<Vec<u8>>,
    resource_id: Option<String>,
    completion_at: Timestamp,
    response_expires_at: Timestamp,
    key_expires_at: Timestamp,
    /// The attempt it completes (a shared handle: its record, token and number).
    attempt: Attempt,
}

impl<T, E> fmt::Debug for PendingCompletion<T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingCompletion")
            .field("kind", &self.kind)
            .field("body_len", &self.body.as_ref().map(Vec::len))
            .field("attempt", &self.attempt)
            .finish_non_exhaustive()
    }
}

/// The drop warning of a [`PendingCompletion`], kept apart so the
/// completion's own fields can be moved out when it is used.
struct UnwrittenGuard(Option<Attempt>);

impl UnwrittenGuard {
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for UnwrittenGuard {
    fn drop(&mut self) {
        if let Some(attempt) = &self.0 {
            warn!(
                record = %attempt.record().log_hash(),
                attempt = attempt.number(),
                "pending completion dropped unwritten: the record stays in flight until its lease ends, then recovery"
            );
        }
    }
}

impl<T: Storable, E: Storable> PendingCompletion<T, E> {
    pub(crate) fn new<S: Store>(idem: &Idem<S>, attempt: &Attempt, outcome: Outcome<T, E>) -> Self {
        let policy = idem.policy();
        let encoded = match &outcome {
            Outcome::Success(v) => Some((OutcomeKind::Success, v.encode())),
            Outcome::Failure(e) => Some((OutcomeKind::Failure, e.encode())),
            Outcome::Transient(_) => None,
        };
        let (kind, body) = match encoded {
            None => (OutcomeKind::NotStored, None),
            Some((kind, Ok(bytes))) if bytes.len() <= policy.max_response_bytes() => {
                (kind, Some(bytes))
            }
            Some((_, Ok(bytes))) => {
                warn!(
                    size = bytes.len(),
                    limit = policy.max_response_bytes(),
                    "response larger than max_response_bytes: not stored"
                );
                (OutcomeKind::NotStored, None)
            }
            Some((_, Err(e))) => {
                warn!(error = %e, "response could not be encoded: not stored");
                (OutcomeKind::NotStored, None)
            }
        };
        let now = idem.clock().now();
        Self {
            outcome,
            guard: UnwrittenGuard(Some(attempt.clone())),
            kind,
            response_expires_at: if body.is_some() {
                now.plus(policy.response_ttl())
            } else {
                now
            },
            body,
            resource_id: attempt.take_resource_id(),
            completion_at: now,
            key_expires_at: now.plus(policy.key_ttl()),
            attempt: attempt.clone(),
        }
    }
}

impl<T, E> PendingCompletion<T, E> {
    /// Whether the outcome is `Transient`: nothing is to be written; the
    /// claim must be undone (rolled back or released).
    pub fn is_transient(&self) -> bool {
        matches!(self.outcome, Outcome::Transient(_))
    }

    /// The record to complete.
    pub fn record(&self) -> &RecordId {
        self.attempt.record()
    }

    /// The fencing token the completion must be guarded by.
    pub fn token(&self) -> Token {
        self.attempt.token()
    }

    pub(crate) fn kind(&self) -> OutcomeKind {
        self.kind
    }

    /// What to write, as [`Store::complete`] takes it.
    pub fn completion(&self) -> Completion<'_> {
        Completion {
            outcome: self.kind,
            body: self.body.as_deref(),
            resource_id: self.resource_id.as_deref(),
            now: self.completion_at,
            response_expires_at: self.response_expires_at,
            key_expires_at: self.key_expires_at,
        }
    }

    /// The completion was written (and, in a transaction, committed): the
    /// executed reply, stored unless its body was too large or unencodable.
    pub fn written(self) -> Reply<T, E> {
        let stored = self.kind != OutcomeKind::NotStored && !self.is_transient();
        if !stored && !self.is_transient() {
            crate::metrics::record_not_stored(self.attempt.record().label_shared());
        }
        self.reply(stored)
    }

    /// The completion was not written (a transient outcome rolled back, or a
    /// store that failed): the executed reply, not stored.
    pub fn not_written(self) -> Reply<T, E> {
        let op = self.attempt.record().label_shared();
        if self.is_transient() {
            crate::metrics::record_transient_release(op);
        } else {
            crate::metrics::record_not_stored(op);
        }
        self.reply(false)
    }

    /// The attempt lost its lease: nothing was written, nothing to report.
    pub(crate) fn discard(mut self) {
        self.guard.disarm();
    }

    fn reply(mut self, stored: bool) -> Reply<T, E> {
        self.guard.disarm();
        Reply {
            outcome: self.outcome,
            replayed: false,
            attempt: self.attempt.number(),
            stored,
            pending: false,
        }
    }
}
