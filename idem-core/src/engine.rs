//! The engine: `Idem::execute` and the decisions around it.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::attempt::{Attempt, AttemptControl, StoreControl};
use crate::claim::{Begin, Claim};
use crate::clock::{Clock, SystemClock, Timestamp};
use crate::codec::Storable;
use crate::error::{Error, retry_after_secs};
use crate::fingerprint::{Fingerprint, fingerprint};
use crate::key::IntoKey;
use crate::outcome::{Outcome, Reply};
use crate::policy::{InFlightMode, Policy};
use crate::scope::{RecordId, Scope};
use crate::store::{
    ClaimOutcome, ClaimRequest, OutcomeKind, PurgeReport, RecordState, Store, StoreError,
    StoredRecord, Token,
};

/// The idempotency engine: a store, a [`Policy`] and a clock.
///
/// Cheap to clone (everything is behind `Arc`s); holds no per-key state, so
/// any number of processes can share one store.
///
/// # Examples
///
/// ```
/// use idem_core::{Idem, MemoryStore, Outcome, Scope};
/// use serde_json::json;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
/// let idem = Idem::new(MemoryStore::new());
/// let scope = Scope::new("acct_42", "POST /payments")?;
/// let request = json!({"amount": 1000, "currency": "eur"});
///
/// let first = idem
///     .execute(&scope, "order-7", &request, |_attempt| async {
///         Outcome::<_, String>::Success("ch_1".to_owned())
///     })
///     .await?;
/// let retry = idem
///     .execute(&scope, "order-7", &request, |_attempt| async {
///         Outcome::<_, String>::Success("ch_2".to_owned()) // never runs
///     })
///     .await?;
/// assert!(!first.is_replay());
/// assert!(retry.is_replay());
/// assert_eq!(retry.into_result(), Ok("ch_1".to_owned()));
/// # Ok(()) }
/// ```
pub struct Idem<S> {
    store: Arc<S>,
    policy: Arc<Policy>,
    clock: Arc<dyn Clock>,
    /// The store's token-guarded writes for attempts, made once (not per
    /// claim).
    control: Arc<dyn AttemptControl>,
}

impl<S> Clone for Idem<S> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            policy: Arc::clone(&self.policy),
            clock: Arc::clone(&self.clock),
            control: Arc::clone(&self.control),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Idem<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idem")
            .field("store", &self.store)
            .field("policy", &self.policy)
            .field("clock", &self.clock)
            .finish()
    }
}

/// Formats a record's short hash only if a subscriber records the field.
struct LogHash<'a>(&'a RecordId);

impl fmt::Display for LogHash<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.log_hash())
    }
}

/// A request checked and fingerprinted, ready to claim: what
/// [`Idem::prepare`] makes, and what [`Idem::begin_prepared`] takes from a
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
/// answer to [`Idem::settle`].
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

    /// The request it claims for.
    #[must_use]
    pub fn prepared(&self) -> &Prepared {
        &self.prepared
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

impl<S: Store> Idem<S> {
    /// An engine over `store` with the default [`Policy`] and the system clock.
    ///
    /// A store shared with other code can be passed as an `Arc<S>` (every
    /// `Arc<S: Store>` is a store).
    pub fn new(store: S) -> Self {
        let store = Arc::new(store);
        Self {
            control: Arc::new(StoreControl(Arc::clone(&store))),
            store,
            policy: Arc::new(Policy::default()),
            clock: Arc::new(SystemClock),
        }
    }

    /// Replaces the policy (see [`Policy::builder`]).
    #[must_use]
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = Arc::new(policy);
        self
    }

    /// Replaces the clock (e.g. a [`ManualClock`](crate::ManualClock) in
    /// tests; an `Arc<dyn Clock>` from [`Idem::clock`] shares another
    /// engine's).
    #[must_use]
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The store this engine claims in.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The policy: TTLs, lease, in-flight mode, limits.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The clock every deadline is computed from.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Runs `work` at most once per `(scope, key)` and returns its outcome, or
    /// replays the stored one.
    ///
    /// The work returns an [`Outcome`], or a `Result<T, Failure<E>>` so it
    /// can use `?` ([`Failure::permanent`](crate::Failure::permanent) is
    /// stored, [`Failure::transient`](crate::Failure::transient) releases the
    /// key).
    ///
    /// The closure convenience over [`Idem::begin`]: begin, run the work on
    /// [`Begin::Run`], [`Claim::complete`] with its outcome.
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
        let prepared = self
            .prepare(scope, key, request)
            .inspect_err(|e| crate::metrics::record_rejection(scope.operation(), e))?;
        self.execute_prepared(prepared, work).await
    }

    /// [`Idem::execute`] for a request already checked and fingerprinted.
    ///
    /// # Errors
    ///
    /// As [`Idem::execute`], except the input checks.
    pub async fn execute_prepared<T, E, O, F, Fut>(
        &self,
        prepared: Prepared,
        work: F,
    ) -> Result<Reply<T, E>, Error>
    where
        T: Storable,
        E: Storable,
        O: Into<Outcome<T, E>>,
        F: FnOnce(Attempt) -> Fut + Send,
        Fut: Future<Output = O> + Send,
    {
        let span = info_span!(
            "idem.execute",
            record = %LogHash(&prepared.id),
            operation = %prepared.id.operation(),
        );
        async move {
            let op = crate::metrics::label(prepared.id.operation());
            match crate::metrics::record_begin(op, self.begin_inner(prepared).await)? {
                Begin::Replay(reply) => Ok(reply),
                Begin::Run(claim) => {
                    let op = claim.record().operation();
                    let outcome = crate::metrics::time_work(op, work(claim.attempt().clone()))
                        .await
                        .into();
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
    ///   [`Claim::attempt`]), then [`Claim::complete`] with the outcome, or
    ///   [`Claim::release`] it. A claim dropped unfinished is a crash: the
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
        let prepared = self
            .prepare(scope, key, request)
            .inspect_err(|e| crate::metrics::record_rejection(scope.operation(), e));
        async move { self.begin_prepared(prepared?).await }
    }

    /// [`Idem::begin`] for a request already checked and fingerprinted
    /// ([`Idem::prepare`], or [`Prepared::new`] with a caller's own
    /// fingerprint).
    ///
    /// # Errors
    ///
    /// As [`Idem::execute`], except the input checks.
    pub async fn begin_prepared<T: Storable, E: Storable>(
        &self,
        prepared: Prepared,
    ) -> Result<Begin<S, T, E>, Error> {
        let span = info_span!(
            "idem.begin",
            record = %LogHash(&prepared.id),
            operation = %prepared.id.operation(),
        );
        let op = crate::metrics::label(prepared.id.operation());
        crate::metrics::record_begin(op, self.begin_inner(prepared).instrument(span).await)
    }

    async fn begin_inner<T: Storable, E: Storable>(
        &self,
        prepared: Prepared,
    ) -> Result<Begin<S, T, E>, Error> {
        let wait = match self.policy.in_flight() {
            InFlightMode::Wait { timeout, poll } => Some((deadline_after(timeout), poll)),
            InFlightMode::Reject => None,
        };
        let mut ticket = self.ticket(prepared);
        loop {
            let answer =
                crate::metrics::time_store("claim", self.store.claim(&ticket.request())).await?;
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
                    ticket = self.ticket(ticket.prepared);
                }
                other => return other,
            }
        }
    }

    /// A claim for `prepared`, to be sent on the caller's own connection
    /// (see [`ClaimTicket`]).
    #[must_use]
    pub fn ticket(&self, prepared: Prepared) -> ClaimTicket {
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

    /// What the caller of `ticket` gets for the store's answer to its claim:
    /// the claim ([`Begin::Run`]), a replay, or the rejection. No store call.
    ///
    /// # Errors
    ///
    /// [`Error::FingerprintMismatch`], [`Error::InFlight`],
    /// [`Error::ResponseExpired`], [`Error::ResponseNotStored`],
    /// [`Error::CorruptRecord`].
    pub fn settle<T: Storable, E: Storable>(
        &self,
        ticket: ClaimTicket,
        answer: ClaimOutcome,
    ) -> Result<Begin<S, T, E>, Error> {
        self.settle_ref(&ticket, answer)
    }

    fn settle_ref<T: Storable, E: Storable>(
        &self,
        ticket: &ClaimTicket,
        answer: ClaimOutcome,
    ) -> Result<Begin<S, T, E>, Error> {
        let claimed = match answer {
            ClaimOutcome::Claimed(claimed) => claimed,
            ClaimOutcome::Existing(record) => {
                return existing(record, &ticket.prepared.fingerprint, ticket.now)
                    .map(Begin::Replay);
            }
        };
        let number = claimed.attempt;
        match &claimed.previous {
            Some(p) => {
                crate::metrics::record_recovery(ticket.prepared.id.operation(), p.reason);
                info!(attempt = number, reason = ?p.reason, "claimed: recovery");
            }
            None => debug!(attempt = number, "claimed"),
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
            self.policy.lease(),
            Arc::clone(&self.clock),
            control,
        );
        Ok(Begin::Run(Claim::new(self.clone(), attempt)))
    }

    /// Runs a token-guarded store write, retrying transient failures as the
    /// policy says (never `LeaseLost`, a corrupt record or a backend error).
    pub(crate) async fn with_retries<'a, Fut>(
        &'a self,
        mut call: impl FnMut() -> Fut + Send + 'a,
    ) -> Result<(), StoreError>
    where
        Fut: Future<Output = Result<(), StoreError>> + Send + 'a,
    {
        let tries = self.policy.store_retries();
        let mut i = 1;
        loop {
            match call().await {
                Ok(()) => return Ok(()),
                Err(e) if !e.is_retryable() || i >= tries => return Err(e),
                Err(e) => {
                    debug!(error = %e, try_ = i, "store write failed; retrying");
                    tokio::time::sleep(self.policy.store_retry_backoff()).await;
                    i += 1;
                }
            }
        }
    }

    /// Validates the key and fingerprints the request under this engine's
    /// field filter. Nothing touches the store.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`], [`Error::InvalidRequest`].
    pub fn prepare<K: IntoKey, R: Serialize + ?Sized>(
        &self,
        scope: &Scope,
        key: K,
        request: &R,
    ) -> Result<Prepared, Error> {
        let key = key.into_key()?;
        let fingerprint = fingerprint(scope.operation(), request, self.policy.fields())?;
        Ok(Prepared {
            id: RecordId::new(scope.clone(), key),
            fingerprint,
        })
    }

    /// Deletes expired keys and drops expired bodies, `batch` at a time, until
    /// nothing is left; returns the totals. Safe to run from every instance.
    /// Each batch is bounded by
    /// [`DEFAULT_ADMIN_TIMEOUT`](crate::DEFAULT_ADMIN_TIMEOUT) (see
    /// [`Idem::admin`] for another).
    ///
    /// # Errors
    ///
    /// [`Error::Store`] (an [`AdminTimeout`](crate::AdminTimeout) too).
    pub async fn purge_expired(&self, batch: u32) -> Result<PurgeReport, Error> {
        self.admin().purge_expired(batch).await
    }
}

/// What a caller gets for a record it could not claim: a replay, or the
/// rejection (mismatch, in flight, already done). Pure: no store call.
fn existing<T: Storable, E: Storable>(
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
            let corrupt = |e: crate::store::BoxDynError| Error::CorruptRecord {
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
            })
        }
    }
}

/// The instant `timeout` from now, or `None` when it is too far to represent
/// (then the wait is bounded by nothing but the first attempt).
fn deadline_after(timeout: Duration) -> Option<tokio::time::Instant> {
    tokio::time::Instant::now().checked_add(timeout)
}
