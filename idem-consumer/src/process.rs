//! `Consumer::process`: the claim, the work and the disposition.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt;
use idem_core::adapter::{EngineExt, Prepared, fingerprint_raw};
use idem_core::error::RequestError;
use idem_core::store::Store;
use idem_core::{
    Attempt, Begin, Error, IdempotencyKey, Outcome, RawJson, RecordId, Reply, Storable,
};
use tracing::{error, info, warn};

use crate::config::{Consumer, ConsumerPermanentFailure, FingerprintMode};
use crate::disposition::{Cause, DeadLetterReason, Disposition, Processed};

/// Tags the fingerprints this crate computes itself ([`fingerprint_raw`]),
/// so they never equal a JSON fingerprint.
const BYTES_TAG: &[u8] = b"idem-consumer-bytes-v1\0";
const IGNORED_TAG: &[u8] = b"idem-consumer-ignored-v1\0";

/// One delivery of a message, with the broker's delivery count (for the
/// backoff): [`Consumer::delivery`].
#[derive(Debug)]
pub struct Delivered<'a, S: Store> {
    consumer: &'a Consumer<S>,
    count: u32,
}

impl<S: Store> Consumer<S> {
    /// The `count`th delivery of a message (1 = first), as the broker counts
    /// (NATS `info.delivered`, SQS `ApproximateReceiveCount`): the backoff
    /// of a retry grows with it.
    #[must_use]
    pub fn delivery(&self, count: u32) -> Delivered<'_, S> {
        Delivered {
            consumer: self,
            count,
        }
    }

    /// Processes one delivery: runs `work` unless this consumer group
    /// already ran it for `message_id`, and says what to tell the broker.
    ///
    /// The same as [`Consumer::delivery`]`(1).process(..)`: a retry's delay
    /// is then the backoff's base.
    ///
    /// * `message_id` is the record's key (an id that breaks the key rules
    ///   is derived: `IdempotencyKey::derive(owner, id)`).
    /// * `payload` is the fingerprint ([`FingerprintMode`]).
    /// * `work` returns an [`Outcome`], or `Result<T, Failure<E>>`: a
    ///   permanent failure is stored, a transient one releases the key.
    ///
    /// Never fails: every store error and rejection becomes a
    /// [`Disposition`] with its [`Cause`]. A panic in the work is caught and
    /// becomes a retry after the lease (the record waits for it, then the
    /// next delivery recovers).
    pub async fn process<T, E, O, F, Fut>(
        &self,
        message_id: &str,
        payload: &[u8],
        work: F,
    ) -> Processed<T, E>
    where
        T: Storable,
        E: Storable + fmt::Debug,
        O: Into<Outcome<T, E>>,
        F: FnOnce(Attempt) -> Fut + Send,
        Fut: Future<Output = O> + Send,
    {
        self.delivery(1).process(message_id, payload, work).await
    }

    /// The record `message_id` and `payload` claim: key and fingerprint.
    pub(crate) fn prepare(&self, message_id: &str, payload: &[u8]) -> Result<Prepared, Error> {
        let inner = &self.inner;
        let key = IdempotencyKey::parse(message_id)
            .unwrap_or_else(|_| IdempotencyKey::derive(inner.scope.owner(), message_id));
        let id = RecordId::new(inner.scope.clone(), key);
        let fingerprint = match inner.fingerprint {
            FingerprintMode::Ignore => fingerprint_raw(IGNORED_TAG, inner.scope.operation(), b""),
            FingerprintMode::Payload => match RawJson(payload).parse() {
                Ok(value) => {
                    // The engine's own fingerprint (and field filter) over the JSON.
                    return inner.idem.prepare(&inner.scope, id.key().clone(), &value);
                }
                Err(RequestError::NotJson(_)) => {
                    fingerprint_raw(BYTES_TAG, inner.scope.operation(), payload)
                }
                Err(e) => return Err(Error::InvalidRequest(e)),
            },
        };
        Ok(Prepared::new(id, fingerprint))
    }
}

impl<'a, S: Store> Delivered<'a, S> {
    // Only the transactional inbox (feature `sql`) reads these.
    #[cfg(feature = "sql")]
    pub(crate) fn consumer(&self) -> &'a Consumer<S> {
        self.consumer
    }

    #[cfg(feature = "sql")]
    pub(crate) fn count(&self) -> u32 {
        self.count
    }

    /// [`Consumer::process`] for this delivery.
    pub async fn process<T, E, O, F, Fut>(
        self,
        message_id: &str,
        payload: &[u8],
        work: F,
    ) -> Processed<T, E>
    where
        T: Storable,
        E: Storable + fmt::Debug,
        O: Into<Outcome<T, E>>,
        F: FnOnce(Attempt) -> Fut + Send,
        Fut: Future<Output = O> + Send,
    {
        let consumer = self.consumer;
        let inner = &consumer.inner;
        let retry = || Disposition::Retry {
            after: consumer.backoff(self.count),
        };
        let prepared = match consumer.prepare(message_id, payload) {
            Ok(p) => p,
            Err(e) => return rejected(message_id, &e, retry()),
        };
        let claim = match inner.idem.begin_prepared::<T, E>(prepared).await {
            Ok(Begin::Run(claim)) => claim,
            Ok(Begin::Replay(reply)) => return self.replayed(reply),
            Err(e) => return rejected(message_id, &e, retry()),
        };
        let attempt = claim.attempt().clone();
        let (number, recovery) = (attempt.number(), attempt.is_recovery());
        let started = inner.idem.clock().now();
        let ran = AssertUnwindSafe(work(attempt)).catch_unwind().await;
        let outcome: Outcome<T, E> = match ran {
            Ok(o) => o.into(),
            Err(_) => {
                // The claim is dropped unfinished: a crash, as the engine
                // defines it. The record waits for its lease, then recovery.
                drop(claim);
                let spent = inner.idem.clock().now().saturating_since(started);
                let left = inner.idem.policy().lease().saturating_sub(spent);
                error!(
                    message_id,
                    attempt = number,
                    "work panicked: retry after the lease"
                );
                return Processed {
                    attempt: number,
                    recovery,
                    ..Processed::bare(
                        Disposition::Retry {
                            after: left.max(Duration::from_secs(1)),
                        },
                        Cause::Panicked,
                    )
                };
            }
        };
        let reply = match claim.complete(outcome).await {
            Ok(reply) => reply,
            Err(e) => {
                let mut p = rejected(message_id, &e, retry());
                p.attempt = number;
                p.recovery = recovery;
                return p;
            }
        };
        self.executed(message_id, reply, recovery)
    }

    /// The disposition for an outcome this delivery's work produced (stored
    /// or not): a transient failure retries, a permanent one is acknowledged
    /// (or dead-lettered) and reported to the hook, a success is acked.
    pub(crate) fn executed<T, E: fmt::Debug>(
        &self,
        message_id: &str,
        reply: Reply<T, E>,
        recovery: bool,
    ) -> Processed<T, E> {
        let inner = &self.consumer.inner;
        let number = reply.attempt();
        let retry = || Disposition::Retry {
            after: self.consumer.backoff(self.count),
        };
        let stored = reply.is_stored();
        let outcome = reply.into_outcome();
        let (disposition, cause) = match &outcome {
            Outcome::Transient(e) => {
                info!(message_id, attempt = number, error = ?e, "transient failure: retry");
                (retry(), Cause::TransientFailure)
            }
            Outcome::Failure(e) => (
                permanent(inner.permanent.report(|hook| hook(message_id, e))),
                Cause::PermanentFailure,
            ),
            Outcome::Success(_) if !stored => (Disposition::Ack, Cause::NotStored),
            Outcome::Success(_) => (Disposition::Ack, Cause::Succeeded),
        };
        Processed {
            disposition,
            outcome: Some(outcome),
            replayed: false,
            attempt: number,
            recovery,
            cause,
        }
    }

    /// C4: a stored outcome. A stored failure under
    /// [`ConsumerPermanentFailure::DeadLetter`] is dead-lettered again, so a failed
    /// dead-lettering is retried.
    pub(crate) fn replayed<T, E>(&self, reply: Reply<T, E>) -> Processed<T, E> {
        let attempt = reply.attempt();
        let outcome = reply.into_outcome();
        let disposition = match outcome {
            Outcome::Failure(_) => permanent(self.consumer.inner.permanent.policy()),
            _ => Disposition::Ack,
        };
        Processed {
            disposition,
            outcome: Some(outcome),
            replayed: true,
            attempt,
            recovery: false,
            cause: Cause::Replayed,
        }
    }
}

/// The disposition for a permanent failure, on its first run and on a replay.
fn permanent(policy: ConsumerPermanentFailure) -> Disposition {
    match policy {
        ConsumerPermanentFailure::Acknowledge => Disposition::Ack,
        ConsumerPermanentFailure::DeadLetter => Disposition::DeadLetter {
            reason: DeadLetterReason::PermanentFailure,
        },
    }
}

/// The disposition for an engine error (at the claim or the completion).
pub(crate) fn rejected<T, E>(message_id: &str, e: &Error, retry: Disposition) -> Processed<T, E> {
    let dead = |reason| Disposition::DeadLetter { reason };
    let (disposition, cause) = match e {
        Error::InFlight { retry_after } => (
            Disposition::Retry {
                after: *retry_after,
            },
            Cause::InFlight,
        ),
        Error::LeaseLost { retry_after } => (
            Disposition::Retry {
                after: *retry_after,
            },
            Cause::LeaseLost,
        ),
        Error::ResponseExpired { .. } | Error::ResponseNotStored { .. } => {
            (Disposition::Ack, Cause::AlreadyDone)
        }
        Error::FingerprintMismatch => {
            warn!(message_id, "same message id, other payload: dead letter");
            (
                dead(DeadLetterReason::FingerprintMismatch),
                Cause::FingerprintMismatch,
            )
        }
        Error::InvalidKey(_) | Error::InvalidRequest(_) => {
            warn!(message_id, error = %e, "payload cannot be fingerprinted: dead letter");
            (
                dead(DeadLetterReason::InvalidMessage),
                Cause::InvalidMessage,
            )
        }
        e if e.is_retryable() => {
            warn!(message_id, error = %e, "store unavailable: retry");
            (retry, Cause::StoreUnavailable)
        }
        e => {
            error!(message_id, error = %e, code = e.code(), "store error a retry cannot fix: dead letter");
            (dead(DeadLetterReason::Internal), Cause::Internal)
        }
    };
    Processed::bare(disposition, cause)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fingerprints of a payload that is not JSON and of an ignored one,
    /// pinned: stored records hold them, so a change would turn every
    /// redelivery of a stored message into a mismatch.
    #[test]
    fn byte_fingerprints_keep_their_stored_values() {
        assert_eq!(
            fingerprint_raw(BYTES_TAG, "orders", b"\xff\x00raw").to_hex(),
            "79a11c1cf0f46104663f0f68eeb6415d4bc7168c7217e73c0707c37d2794a478"
        );
        assert_eq!(
            fingerprint_raw(IGNORED_TAG, "orders", b"").to_hex(),
            "331c84d5eeb017565802134958214f55fd2ba8b78c18f26125ce2bb2b59177f8"
        );
    }
}
