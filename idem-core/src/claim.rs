//! The claim guard: what [`Idem::begin`] hands back when the claim is ours.

use std::fmt;
use std::time::Duration;

use tracing::{debug, info, warn};

use crate::attempt::Attempt;
use crate::codec::Storable;
use crate::engine::Idem;
use crate::error::Error;
use crate::outcome::{Outcome, Reply};
use crate::scope::RecordId;
use crate::store::{Completion, OutcomeKind, Store, StoreError, Token};

/// The answer of [`Idem::begin`]: run the work, or replay.
///
/// Rejections (mismatch, in flight, already done, corrupt) come back as the
/// `Err` of `begin`, never as a variant here.
#[derive(Debug)]
#[must_use = "a `Begin::Run` claim must be completed or released"]
pub enum Begin<S: Store, T, E> {
    /// The claim is ours: run the work, then [`Claim::complete`] or
    /// [`Claim::release`] it.
    Run(Claim<S>),
    /// The stored outcome of an earlier attempt: the work must not run.
    Replay(Reply<T, E>),
}

/// An in-flight claim owned by this caller: the lease and fencing token of
/// one attempt.
///
/// Finish it with [`complete`](Claim::complete) (or
/// [`complete_not_stored`](Claim::complete_not_stored), or
/// [`release`](Claim::release) for a transient failure).
///
/// # Dropping
///
/// A claim dropped without finishing is treated as a crash, exactly like a
/// process that dies mid-work: the record stays `in_flight` until its lease
/// ends (duplicates get [`Error::InFlight`] meanwhile), then the next attempt
/// with the same request takes it over as a recovery
/// ([`Attempt::is_recovery`]). Nothing is deleted, because the work's side
/// effects may have happened. The drop is logged at `warn`.
///
/// `Claim<S>` is `Send + 'static`, so it can be moved into a spawned task.
#[must_use = "a claim must be completed or released; dropping it leaves the record in flight until its lease ends"]
pub struct Claim<S: Store> {
    idem: Idem<S>,
    attempt: Attempt,
    finished: bool,
}

impl<S: Store> fmt::Debug for Claim<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Claim")
            .field("attempt", &self.attempt)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

impl<S: Store> Drop for Claim<S> {
    fn drop(&mut self) {
        if !self.finished {
            warn!(
                record = %self.attempt.record().log_hash(),
                attempt = self.attempt.number(),
                "claim dropped without completing: the record stays in flight until its lease ends, then recovery"
            );
        }
    }
}

impl<S: Store> Claim<S> {
    pub(crate) fn new(idem: Idem<S>, attempt: Attempt) -> Self {
        Self {
            idem,
            attempt,
            finished: false,
        }
    }

    /// This attempt: recovery information, saved resource ids, lease extension and
    /// downstream keys. Clone it to hand it to the work.
    pub fn attempt(&self) -> &Attempt {
        &self.attempt
    }

    /// The record this claim holds.
    pub fn record(&self) -> &RecordId {
        self.attempt.record()
    }

    fn token(&self) -> Token {
        self.attempt.token()
    }

    /// Stores the outcome and returns it as an executed [`Reply`].
    ///
    /// * `Success` and `Failure` are stored (one round trip) and replayed to
    ///   every retry. An outcome larger than `max_response_bytes`, or one
    ///   that cannot be encoded, completes the record *without* a body:
    ///   retries get [`Error::ResponseNotStored`], never a second run.
    /// * `Transient` releases the key (one round trip): the next retry with
    ///   the same request runs the work again, as a recovery.
    /// * If the store write still fails after the policy's retries, this
    ///   caller gets the outcome with [`Reply::is_stored`] `false`, and the
    ///   record is left to lease expiry and recovery.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when a newer attempt took the record over (the
    /// newer attempt's outcome is the one replayed).
    pub async fn complete<T: Storable, E: Storable>(
        self,
        outcome: Outcome<T, E>,
    ) -> Result<Reply<T, E>, Error> {
        let label = crate::metrics::label(self.record().operation());
        let result = self.complete_unmetered(outcome).await;
        crate::metrics::record_completion(label, &result);
        result
    }

    async fn complete_unmetered<T: Storable, E: Storable>(
        mut self,
        outcome: Outcome<T, E>,
    ) -> Result<Reply<T, E>, Error> {
        self.finished = true;
        let number = self.attempt.number();
        if let Outcome::Transient(_) = outcome {
            match self.release_inner().await {
                Ok(()) => info!(attempt = number, "transient failure: key released"),
                Err(StoreError::LeaseLost) => {
                    warn!("transient failure: lease already lost");
                }
                Err(e) => {
                    warn!(error = %e, "transient failure: release failed; left to lease expiry");
                }
            }
            return Ok(Reply {
                outcome,
                replayed: false,
                attempt: number,
                stored: false,
            });
        }
        let pending = PendingCompletion::new(&self.idem, &self.attempt, outcome);
        let completion = pending.completion();
        let (id, token, store) = (self.record(), self.token(), self.idem.store());
        match self
            .idem
            .with_retries(|| {
                crate::metrics::time_store("complete", store.complete(id, token, &completion))
            })
            .await
        {
            Ok(()) => {
                debug!(outcome = pending.kind.as_str(), "completed");
                Ok(pending.written())
            }
            Err(StoreError::LeaseLost) => {
                warn!("lease lost before completion: outcome discarded");
                Err(lease_lost())
            }
            Err(e) => {
                warn!(error = %e, "completion not stored; left to lease expiry and recovery");
                Ok(pending.not_written())
            }
        }
    }

    /// Completes the record *without* storing a body, for responses that
    /// must not (a streamed or event-stream body, a new API secret) or cannot
    /// be kept. Retries get [`Error::ResponseNotStored`] with the resource id
    /// ([`Attempt::set_resource_id`]), never a second run.
    ///
    /// Returns `true` when the completion was written, `false` when the
    /// store failed after the policy's retries (the record is then left to
    /// lease expiry and recovery).
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when a newer attempt took the record over.
    pub async fn complete_not_stored(mut self) -> Result<bool, Error> {
        self.finished = true;
        let resource_id = self.attempt.take_resource_id();
        let now = self.idem.clock().now();
        let completion = Completion {
            outcome: OutcomeKind::NotStored,
            body: None,
            resource_id: resource_id.as_deref(),
            now,
            response_expires_at: now,
            key_expires_at: now.plus(self.idem.policy().key_ttl()),
        };
        let (id, token, store) = (self.record(), self.token(), self.idem.store());
        match self
            .idem
            .with_retries(|| {
                crate::metrics::time_store("complete", store.complete(id, token, &completion))
            })
            .await
        {
            Ok(()) => Ok(true),
            Err(StoreError::LeaseLost) => Err(lease_lost()),
            Err(e) => {
                warn!(error = %e, "completion not stored; left to lease expiry and recovery");
                Ok(false)
            }
        }
    }

    /// Releases the key after a transient failure: the next attempt with the
    /// same request runs the work again, as a recovery with the saved resource id.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when a newer attempt took the record over;
    /// [`Error::Store`] when the store still fails after the policy's
    /// retries (the record is then left to lease expiry).
    pub async fn release(mut self) -> Result<(), Error> {
        self.finished = true;
        self.release_inner().await.map_err(Error::from)
    }

    async fn release_inner(&self) -> Result<(), StoreError> {
        let (id, token, store) = (self.record(), self.token(), self.idem.store());
        let now = self.idem.clock().now();
        self.idem
            .with_retries(|| crate::metrics::time_store("release", store.release(id, token, now)))
            .await
    }

    /// Encodes the outcome as the engine stores it, *without* writing it,
    /// for a caller that writes the completion on its own connection (such
    /// as a transactional mode, where the completion commits with the work's
    /// own writes). The claim is finished: write
    /// [`PendingCompletion::completion`] with
    /// [`Store::complete`]'s semantics, then call
    /// [`written`](PendingCompletion::written) or
    /// [`not_written`](PendingCompletion::not_written).
    ///
    /// A `Transient` outcome has nothing to write
    /// ([`PendingCompletion::is_transient`]): the caller undoes the claim
    /// (a rollback) or calls [`Claim::release`] instead.
    pub fn into_pending<T: Storable, E: Storable>(
        mut self,
        outcome: Outcome<T, E>,
    ) -> PendingCompletion<T, E> {
        self.finished = true;
        PendingCompletion::new(&self.idem, &self.attempt, outcome)
    }
}

fn lease_lost() -> Error {
    Error::LeaseLost {
        retry_after: Duration::from_secs(1),
    }
}

/// An outcome encoded for storage but not yet written: see
/// [`Claim::into_pending`].
#[derive(Debug)]
pub struct PendingCompletion<T, E> {
    outcome: Outcome<T, E>,
    kind: OutcomeKind,
    body: Option<Vec<u8>>,
    resource_id: Option<String>,
    completion_at: crate::clock::Timestamp,
    response_expires_at: crate::clock::Timestamp,
    key_expires_at: crate::clock::Timestamp,
    /// The attempt it completes (a shared handle: its record, token and number).
    attempt: Attempt,
}

impl<T: Storable, E: Storable> PendingCompletion<T, E> {
    fn new<S: Store>(idem: &Idem<S>, attempt: &Attempt, outcome: Outcome<T, E>) -> Self {
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
        Reply {
            outcome: self.outcome,
            replayed: false,
            attempt: self.attempt.number(),
            stored,
        }
    }

    /// The completion was not written: the executed reply, not stored.
    pub fn not_written(self) -> Reply<T, E> {
        Reply {
            outcome: self.outcome,
            replayed: false,
            attempt: self.attempt.number(),
            stored: false,
        }
    }
}
