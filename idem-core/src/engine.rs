//! The engine: `Idem::execute` and the decisions around it.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::attempt::{Attempt, StoreControl};
use crate::clock::{Clock, SystemClock, Timestamp};
use crate::codec::Storable;
use crate::error::Error;
use crate::fingerprint::{Fingerprint, fingerprint};
use crate::key::IntoKey;
use crate::outcome::{Outcome, Reply};
use crate::policy::{InFlightMode, Policy};
use crate::scope::{RecordId, Scope};
use crate::store::{
    ClaimOutcome, ClaimRequest, Claimed, Completion, OutcomeKind, PurgeReport, RecordState, Store,
    StoreError, StoredRecord, Token,
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
///         Outcome::<String, String>::Success("ch_1".to_owned())
///     })
///     .await?;
/// let retry = idem
///     .execute(&scope, "order-7", &request, |_attempt| async {
///         Outcome::<String, String>::Success("ch_2".to_owned()) // never runs
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
}

impl<S> Clone for Idem<S> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            policy: Arc::clone(&self.policy),
            clock: Arc::clone(&self.clock),
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

/// A request checked and fingerprinted, ready to claim.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The record it addresses.
    pub id: RecordId,
    /// Its fingerprint.
    pub fingerprint: Fingerprint,
}

impl<S: Store> Idem<S> {
    /// An engine over `store` with the default [`Policy`] and the system clock.
    pub fn new(store: S) -> Self {
        Self::from_arc(Arc::new(store))
    }

    /// An engine over a shared store.
    pub fn from_arc(store: Arc<S>) -> Self {
        Self {
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

    /// Replaces the clock (e.g. a [`ManualClock`](crate::ManualClock) in tests).
    #[must_use]
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The shared store.
    pub fn store_arc(&self) -> &Arc<S> {
        &self.store
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Runs `work` at most once per `(scope, key)` and returns its outcome, or
    /// replays the stored one.
    ///
    /// Round trips: a fresh key costs two (claim, complete), a replay one.
    /// Nothing is held between them: no lock, no per-key state in the process.
    ///
    /// * The key and the request are checked first; nothing is stored for
    ///   invalid input.
    /// * `Success` and `Failure` are stored and replayed; `Transient` releases
    ///   the key so the next retry runs the work again.
    /// * If the work's future is dropped or the process dies, the record stays
    ///   `in_flight` until its lease ends; the next retry then runs the work as
    ///   a *recovery* ([`Attempt::is_recovery`]).
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
    pub async fn execute<K, R, T, E, F, Fut>(
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
        F: FnOnce(Attempt) -> Fut + Send,
        Fut: Future<Output = Outcome<T, E>> + Send,
    {
        let prepared = self.prepare(scope, key, request)?;
        let span = info_span!(
            "idem.execute",
            record = %LogHash(&prepared.id),
            operation = %scope.operation(),
        );
        self.execute_prepared(prepared, work).instrument(span).await
    }

    /// [`Idem::execute`] for a request the caller checked and fingerprinted
    /// itself (an HTTP adapter with its own envelope and field filter).
    ///
    /// # Errors
    ///
    /// As [`Idem::execute`].
    pub async fn execute_prepared<T, E, F, Fut>(
        &self,
        prepared: Prepared,
        work: F,
    ) -> Result<Reply<T, E>, Error>
    where
        T: Storable,
        E: Storable,
        F: FnOnce(Attempt) -> Fut + Send,
        Fut: Future<Output = Outcome<T, E>> + Send,
    {
        let wait = match self.policy.in_flight() {
            InFlightMode::Wait { timeout, poll } => {
                Some((tokio::time::Instant::now() + timeout, poll))
            }
            InFlightMode::Reject => None,
        };
        let (token, claimed) = loop {
            let token = Token::random();
            let now = self.clock.now();
            let req = ClaimRequest {
                id: &prepared.id,
                fingerprint: prepared.fingerprint,
                token,
                now,
                lease_until: now.plus(self.policy.lease()),
                key_expires_at: now.plus(self.policy.key_ttl()),
            };
            let existing = match self.store.claim(&req).await? {
                ClaimOutcome::Claimed(claimed) => break (token, claimed),
                ClaimOutcome::Existing(record) => record,
            };
            match Self::resolve_existing(&existing, &prepared.fingerprint, now) {
                Err(Error::InFlight { retry_after }) => {
                    let Some((deadline, poll)) = wait else {
                        info!(?retry_after, "in flight: rejected");
                        return Err(Error::InFlight { retry_after });
                    };
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    if left.is_zero() {
                        info!(?retry_after, "in flight: wait timed out");
                        return Err(Error::InFlight { retry_after });
                    }
                    debug!("in flight: waiting");
                    tokio::time::sleep(poll.min(left)).await;
                }
                Err(Error::FingerprintMismatch) => {
                    warn!("fingerprint mismatch: work not run");
                    return Err(Error::FingerprintMismatch);
                }
                other => {
                    if other.is_ok() {
                        info!("replay");
                    }
                    return other;
                }
            }
        };
        self.run(prepared.id, token, claimed, work).await
    }

    async fn run<T, E, F, Fut>(
        &self,
        id: RecordId,
        token: Token,
        claimed: Claimed,
        work: F,
    ) -> Result<Reply<T, E>, Error>
    where
        T: Storable,
        E: Storable,
        F: FnOnce(Attempt) -> Fut + Send,
        Fut: Future<Output = Outcome<T, E>> + Send,
    {
        let number = claimed.attempt;
        match &claimed.previous {
            Some(p) => info!(attempt = number, reason = ?p.reason, "claimed: recovery"),
            None => debug!(attempt = number, "claimed"),
        }
        let attempt = Attempt::new(
            id.clone(),
            token,
            number,
            claimed.previous,
            self.policy.lease(),
            Arc::clone(&self.clock),
            Arc::new(StoreControl(Arc::clone(&self.store))),
        );
        let outcome = work(attempt.clone()).await;
        let encoded = match &outcome {
            Outcome::Transient(_) => {
                let now = self.clock.now();
                match self
                    .with_retries(|| self.store.release(&id, token, now))
                    .await
                {
                    Ok(()) => info!(attempt = number, "transient failure: key released"),
                    Err(e) => {
                        warn!(error = %e, "transient failure: release failed; left to lease expiry")
                    }
                }
                return Ok(Reply {
                    outcome,
                    replayed: false,
                    attempt: number,
                    stored: false,
                });
            }
            Outcome::Success(v) => (OutcomeKind::Success, v.encode()),
            Outcome::Failure(e) => (OutcomeKind::Failure, e.encode()),
        };
        let (kind, body) = match encoded {
            (kind, Ok(bytes)) if bytes.len() <= self.policy.max_response_bytes() => {
                (kind, Some(bytes))
            }
            (_, Ok(bytes)) => {
                warn!(
                    size = bytes.len(),
                    limit = self.policy.max_response_bytes(),
                    "response larger than max_response_bytes: not stored"
                );
                (OutcomeKind::NotStored, None)
            }
            (_, Err(e)) => {
                warn!(error = %e, "response could not be encoded: not stored");
                (OutcomeKind::NotStored, None)
            }
        };
        let resource_id = attempt.take_resource_id();
        let now = self.clock.now();
        let completion = Completion {
            outcome: kind,
            body: body.as_deref(),
            resource_id: resource_id.as_deref(),
            now,
            response_expires_at: if body.is_some() {
                now.plus(self.policy.response_ttl())
            } else {
                now
            },
            key_expires_at: now.plus(self.policy.key_ttl()),
        };
        match self
            .with_retries(|| self.store.complete(&id, token, &completion))
            .await
        {
            Ok(()) => {
                debug!(outcome = kind.as_str(), "completed");
                Ok(Reply {
                    outcome,
                    replayed: false,
                    attempt: number,
                    stored: kind != OutcomeKind::NotStored,
                })
            }
            Err(StoreError::LeaseLost) => {
                warn!("lease lost before completion: outcome discarded");
                Err(Error::LeaseLost {
                    retry_after: Duration::from_secs(1),
                })
            }
            Err(e) => {
                warn!(error = %e, "completion not stored; left to lease expiry and recovery");
                Ok(Reply {
                    outcome,
                    replayed: false,
                    attempt: number,
                    stored: false,
                })
            }
        }
    }

    async fn with_retries<'a, Fut>(
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
                Err(e @ (StoreError::LeaseLost | StoreError::Corrupt { .. })) => return Err(e),
                Err(e) if i >= tries => return Err(e),
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

    /// What a caller gets for a record it could not claim: a replay, or the
    /// rejection (mismatch, in flight, already done). Pure: no store call.
    ///
    /// # Errors
    ///
    /// [`Error::FingerprintMismatch`], [`Error::InFlight`],
    /// [`Error::ResponseExpired`], [`Error::ResponseNotStored`],
    /// [`Error::CorruptRecord`].
    pub fn resolve_existing<T: Storable, E: Storable>(
        record: &StoredRecord,
        fingerprint: &Fingerprint,
        now: Timestamp,
    ) -> Result<Reply<T, E>, Error> {
        if record.fingerprint != *fingerprint {
            return Err(Error::FingerprintMismatch);
        }
        match record.state {
            RecordState::InFlight | RecordState::Released => {
                let left = record.lease_until.saturating_since(now);
                let secs = left.as_millis().div_ceil(1000).max(1);
                Err(Error::InFlight {
                    retry_after: Duration::from_secs(u64::try_from(secs).unwrap_or(u64::MAX)),
                })
            }
            RecordState::Completed => {
                let resource_id = record.resource_id.clone();
                let kind = record.outcome.ok_or_else(|| Error::CorruptRecord {
                    detail: "completed record without an outcome".to_owned(),
                })?;
                if kind == OutcomeKind::NotStored {
                    return Err(Error::ResponseNotStored { resource_id });
                }
                let Some(bytes) = record.response.as_deref() else {
                    return Err(Error::ResponseExpired { resource_id });
                };
                let corrupt = |e: crate::error::BoxDynError| Error::CorruptRecord {
                    detail: format!("stored response does not decode: {e}"),
                };
                let outcome = match kind {
                    OutcomeKind::Failure => Outcome::Failure(E::decode(bytes).map_err(corrupt)?),
                    _ => Outcome::Success(T::decode(bytes).map_err(corrupt)?),
                };
                Ok(Reply {
                    outcome,
                    replayed: true,
                    attempt: record.attempt,
                    stored: true,
                })
            }
        }
    }

    /// Reads the record for `(scope, key)` as the store holds it now.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`], [`Error::Store`], [`Error::CorruptRecord`].
    pub async fn lookup<K: IntoKey>(
        &self,
        scope: &Scope,
        key: K,
    ) -> Result<Option<StoredRecord>, Error> {
        let id = RecordId::new(scope.clone(), key.into_key()?);
        Ok(self.store.fetch(&id, self.clock.now()).await?)
    }

    /// Deletes expired keys and drops expired bodies, `batch` at a time, until
    /// nothing is left; returns the totals. Safe to run from every instance.
    ///
    /// # Errors
    ///
    /// [`Error::Store`].
    pub async fn purge_expired(&self, batch: u32) -> Result<PurgeReport, Error> {
        let mut total = PurgeReport::default();
        loop {
            let report = self
                .store
                .purge_expired(self.clock.now(), batch.max(1))
                .await?;
            total.keys_removed += report.keys_removed;
            total.bodies_dropped += report.bodies_dropped;
            if report == PurgeReport::default() {
                return Ok(total);
            }
        }
    }
}
