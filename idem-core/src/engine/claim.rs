//! The claim guard: what [`Idem::begin`](crate::Idem::begin) hands back when
//! the claim is ours.

use std::fmt;
use std::marker::PhantomData;
use std::time::Instant;

use tracing::{debug, info, warn};

use crate::engine::core::Idem;
use crate::engine::error::RETRY_SOON;
use crate::store::OutcomeKind;
use crate::store::{Completion, Store, StoreError, Token};
use crate::{Attempt, Error, Outcome, RecordId, Reply, Storable};

/// The answer of [`Idem::begin`](crate::Idem::begin): run the work, or
/// replay.
///
/// Rejections (mismatch, in flight, already done, corrupt) come back as the
/// `Err` of `begin`, never as a variant here.
#[derive(Debug)]
#[must_use = "a `Begin::Run` claim must be completed or released"]
pub enum Begin<S: Store, T, E> {
    /// The claim is ours: run the work, then [`Claim::complete`] or
    /// [`Claim::release`] it.
    Run(Claim<S, T, E>),
    /// The stored outcome of an earlier attempt: the work must not run.
    Replay(Reply<T, E>),
}

/// An in-flight claim owned by this caller: the lease and fencing token of
/// one attempt, typed by the outcome it completes with.
///
/// Finish it with [`complete`](Claim::complete) (or
/// [`complete_not_stored`](Claim::complete_not_stored), or
/// [`release`](Claim::release) for a transient failure).
///
/// A claim begun for one type completes with that type only, so a retry
/// always decodes what the first attempt stored:
///
/// ```compile_fail
/// # use idem_core::{Begin, Idem, MemoryStore, Outcome, Scope};
/// # async fn f(idem: Idem<MemoryStore>, scope: Scope) -> Result<(), idem_core::Error> {
/// if let Begin::Run(claim) = idem.begin::<String, String, _, _>(&scope, "k", &1).await? {
///     // A `Vec<u8>` for a claim begun for `String`: does not compile.
///     claim.complete(Outcome::<Vec<u8>, String>::Success(vec![1])).await?;
/// }
/// # Ok(()) }
/// ```
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
/// `Claim` is `Send + 'static`, so it can be moved into a spawned task.
#[must_use = "a claim must be completed or released; dropping it leaves the record in flight until its lease ends"]
pub struct Claim<S: Store, T, E> {
    pub(crate) idem: Idem<S>,
    pub(crate) attempt: Attempt,
    pub(crate) finished: bool,
    /// When the claim was won: the start of the work, for `idem_work_seconds`.
    pub(crate) started: Instant,
    _outcome: PhantomData<fn() -> (T, E)>,
}

impl<S: Store, T, E> fmt::Debug for Claim<S, T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Claim")
            .field("attempt", &self.attempt)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

impl<S: Store, T, E> Drop for Claim<S, T, E> {
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

impl<S: Store, T: Storable, E: Storable> Claim<S, T, E> {
    pub(crate) fn new(idem: Idem<S>, attempt: Attempt) -> Self {
        Self {
            idem,
            attempt,
            finished: false,
            started: Instant::now(),
            _outcome: PhantomData,
        }
    }

    /// This attempt: recovery information, saved resource ids, lease extension and
    /// downstream keys. Clone it to hand it to the work.
    pub fn attempt(&self) -> &Attempt {
        &self.attempt
    }

    /// Marks the claim finished and records how long the work ran.
    pub(crate) fn finish(&mut self) {
        self.finished = true;
        crate::metrics::record_work(self.attempt.record().label_shared(), self.started.elapsed());
    }

    /// Stores the outcome and returns it as an executed [`Reply`].
    ///
    /// Takes an [`Outcome`], or a `Result<T, Failure<E>>` from work that
    /// uses `?`.
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
    /// newer attempt's outcome is the one replayed), whatever the outcome:
    /// every write of a fenced holder answers a lost lease the same way.
    pub async fn complete(
        mut self,
        outcome: impl Into<Outcome<T, E>>,
    ) -> Result<Reply<T, E>, Error> {
        self.finish();
        let outcome = outcome.into();
        let number = self.attempt.number();
        let op = self.attempt.record().label_shared();
        if let Outcome::Transient(_) = outcome {
            match self.release_inner().await {
                Ok(()) => {
                    info!(attempt = number, "transient failure: key released");
                    crate::metrics::record_transient_release(op);
                }
                Err(StoreError::LeaseLost) => {
                    warn!("transient failure: lease already lost");
                    return Err(self.lease_lost());
                }
                Err(e) => {
                    warn!(error = %e, "transient failure: release failed; left to lease expiry");
                    crate::metrics::record_transient_release(op);
                }
            }
            return Ok(Reply {
                outcome,
                replayed: false,
                attempt: number,
                stored: false,
                pending: false,
            });
        }
        let pending =
            crate::engine::adapter::PendingCompletion::new(&self.idem, &self.attempt, outcome);
        match self.write_completion(&pending.completion()).await {
            Ok(()) => {
                debug!(outcome = pending.kind().as_str(), "completed");
                Ok(pending.written())
            }
            Err(StoreError::LeaseLost) => {
                warn!("lease lost before completion: outcome discarded");
                pending.discard();
                Err(self.lease_lost())
            }
            Err(e) => {
                self.keep(&pending.completion(), &e);
                let mut reply = pending.not_written();
                reply.pending = true;
                Ok(reply)
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
        self.finish();
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
        let op = self.attempt.record().label_shared();
        match self.write_completion(&completion).await {
            Ok(()) => {
                crate::metrics::record_not_stored(op);
                Ok(true)
            }
            Err(StoreError::LeaseLost) => Err(self.lease_lost()),
            Err(e) => {
                self.keep(&completion, &e);
                crate::metrics::record_not_stored(op);
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
        self.finish();
        match self.release_inner().await {
            Ok(()) => {
                crate::metrics::record_transient_release(self.attempt.record().label_shared());
                Ok(())
            }
            Err(StoreError::LeaseLost) => Err(self.lease_lost()),
            Err(e) => Err(Error::from(e)),
        }
    }

    /// Writes `completion` under this attempt's token, retried as the
    /// policy says: what `complete` and `complete_not_stored` share.
    async fn write_completion(&self, completion: &Completion<'_>) -> Result<(), StoreError> {
        self.write("complete", |store, id, token| {
            store.complete(id, token, completion)
        })
        .await
    }

    async fn release_inner(&self) -> Result<(), StoreError> {
        let now = self.idem.clock().now();
        self.write("release", |store, id, token| store.release(id, token, now))
            .await
    }

    /// One write of the store under this attempt's record and token (`call`,
    /// named `what` in the metrics), timed, and retried as the policy says.
    async fn write<'a, Fut>(
        &'a self,
        what: &'static str,
        call: impl Fn(&'a S, &'a RecordId, Token) -> Fut + Send + Sync + 'a,
    ) -> Result<(), StoreError>
    where
        Fut: Future<Output = Result<(), StoreError>> + Send + 'a,
    {
        let (id, token, store) = (
            self.attempt.record(),
            self.attempt.token(),
            self.idem.store(),
        );
        let call = &call;
        self.idem
            .with_retries(move || async move {
                let timer = crate::metrics::StoreTimer::start(what);
                let done = call(store, id, token).await;
                timer.finish(&done);
                done
            })
            .await
    }

    /// A completion whose write failed with `e` after the policy's retries:
    /// kept and written again in the background (see
    /// [`Idem::drain_completions`]), else left to lease expiry and recovery.
    fn keep(&self, completion: &Completion<'_>, e: &StoreError) {
        let (id, token) = (self.attempt.record(), self.attempt.token());
        let lease_until = self.attempt.lease_until();
        if e.is_retryable()
            && self
                .idem
                .keep_completion(id, token, completion, lease_until)
        {
            warn!(error = %e, "completion not stored yet; written again in the background until stored or the lease ends");
        } else {
            warn!(error = %e, "completion not stored; left to lease expiry and recovery");
        }
    }

    /// The lost lease, counted as a rejection like every refusal.
    fn lease_lost(&self) -> Error {
        let e = Error::LeaseLost {
            retry_after: RETRY_SOON,
        };
        crate::metrics::record_rejection(self.attempt.record().label_shared(), e.code());
        e
    }
}
