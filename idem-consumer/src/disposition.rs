//! What a message's processing decided: the broker action ([`Disposition`]),
//! why ([`Cause`]), and the outcome ([`Processed`]).

use std::fmt;
use std::time::Duration;

use idem_core::Outcome;
use idem_core::wire::ProblemCode;

/// What the adapter tells the broker. Adapters translate it and nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Disposition {
    /// Acknowledge: the message is done (run, replayed, or already done).
    Ack,
    /// Redeliver the message no earlier than `after` (NATS `Nak(Some(after))`,
    /// an SQS batch item failure, a RabbitMQ requeue after the delay).
    Retry {
        /// How long to wait before the next delivery.
        after: Duration,
    },
    /// Do not redeliver: hand the message to the dead letter (a DLQ subject,
    /// a dead-letter exchange, a hook), then drop it.
    DeadLetter {
        /// Why.
        reason: DeadLetterReason,
    },
}

impl Disposition {
    /// Whether this is [`Disposition::Ack`].
    #[must_use]
    pub fn is_ack(&self) -> bool {
        matches!(self, Self::Ack)
    }

    /// The retry delay, for [`Disposition::Retry`].
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Retry { after } => Some(*after),
            _ => None,
        }
    }

    /// The reason, for [`Disposition::DeadLetter`].
    #[must_use]
    pub fn dead_letter_reason(&self) -> Option<DeadLetterReason> {
        match self {
            Self::DeadLetter { reason } => Some(*reason),
            _ => None,
        }
    }
}

/// Why a message goes to the dead letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeadLetterReason {
    /// The same message id arrived earlier with another payload: a producer
    /// bug, which no redelivery fixes (C9).
    FingerprintMismatch,
    /// The payload cannot be fingerprinted: JSON naming a member twice, or
    /// nesting deeper than idem's limit (C10).
    InvalidMessage,
    /// The work failed permanently and the consumer is configured with
    /// [`ConsumerPermanentFailure::DeadLetter`](crate::ConsumerPermanentFailure::DeadLetter) (C2).
    PermanentFailure,
    /// The record is corrupt, or the store failed in a way a retry cannot fix
    /// (C15); logged at `error`.
    Internal,
}

impl DeadLetterReason {
    /// A short, stable code (`fingerprint_mismatch`, `invalid_message`,
    /// `permanent_failure`, `internal`), for a DLQ header or a metric label;
    /// the wire's [`ProblemCode`] where one names the same answer.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::FingerprintMismatch => ProblemCode::FingerprintMismatch.as_str(),
            Self::InvalidMessage => "invalid_message",
            Self::PermanentFailure => "permanent_failure",
            Self::Internal => "internal",
        }
    }
}

/// Why [`Processed::disposition`] is what it is: one variant per row of the
/// behaviour table, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Cause {
    /// The work ran and succeeded (C1; after a takeover, C6).
    Succeeded,
    /// The work ran and failed permanently; the failure is stored (C2).
    PermanentFailure,
    /// The work ran and failed transiently; the key was released (C3).
    TransientFailure,
    /// A stored outcome was replayed; the work did not run (C4).
    Replayed,
    /// Another delivery of the message holds a valid lease (C5).
    InFlight,
    /// A newer attempt took the record over before this one completed; this
    /// run's outcome is discarded (C7).
    LeaseLost,
    /// The message was processed, but its outcome is no longer (or was
    /// never) stored (C8).
    AlreadyDone,
    /// Same id, other payload (C9).
    FingerprintMismatch,
    /// The payload cannot be fingerprinted (C10).
    InvalidMessage,
    /// The store could not be reached to claim (C11).
    StoreUnavailable,
    /// The work finished but its outcome could not be stored; the record
    /// waits for its lease (C12).
    NotStored,
    /// The work panicked; the record waits for its lease (C13).
    Panicked,
    /// A corrupt record or a store error a retry cannot fix (C15).
    Internal,
}

impl Cause {
    /// A short, stable code (`succeeded`, `in_flight`, ...), safe as a
    /// metrics label; the wire's [`ProblemCode`] where one names the same
    /// answer.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::PermanentFailure => "permanent_failure",
            Self::TransientFailure => "transient_failure",
            Self::Replayed => "replayed",
            Self::InFlight => ProblemCode::InFlight.as_str(),
            Self::LeaseLost => ProblemCode::LeaseLost.as_str(),
            Self::AlreadyDone => "already_done",
            Self::FingerprintMismatch => ProblemCode::FingerprintMismatch.as_str(),
            Self::InvalidMessage => "invalid_message",
            Self::StoreUnavailable => ProblemCode::StoreUnavailable.as_str(),
            Self::NotStored => "not_stored",
            Self::Panicked => "panicked",
            Self::Internal => "internal",
        }
    }
}

/// `Display` as the stable code each enum's `as_str` gives.
macro_rules! display_as_str {
    ($($name:ident),+) => {$(
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    )+};
}

display_as_str!(DeadLetterReason, Cause);

/// The result of processing one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Processed<T, E> {
    /// What to tell the broker.
    pub disposition: Disposition,
    /// The outcome, when the work ran or a stored one was replayed.
    pub outcome: Option<Outcome<T, E>>,
    /// Whether [`Processed::outcome`] is a replay (the work did not run).
    pub replayed: bool,
    /// The attempt number on the record (0 when no attempt was made or
    /// known: in flight, mismatch, store down).
    pub attempt: u32,
    /// Whether this run took the record over from an earlier attempt (a
    /// lease that expired, or a released key): the work was told to
    /// reconcile (C6).
    pub recovery: bool,
    /// Why.
    pub cause: Cause,
}

impl<T, E> Processed<T, E> {
    pub(crate) fn bare(disposition: Disposition, cause: Cause) -> Self {
        Self {
            disposition,
            outcome: None,
            replayed: false,
            attempt: 0,
            recovery: false,
            cause,
        }
    }

    /// A message an adapter found no key for: dead-lettered as
    /// [`Cause::InvalidMessage`], nothing claimed or run.
    #[cfg(any(feature = "rabbitmq", feature = "sqs-lambda"))]
    pub(crate) fn keyless() -> Self {
        Self::bare(
            Disposition::DeadLetter {
                reason: DeadLetterReason::InvalidMessage,
            },
            Cause::InvalidMessage,
        )
    }

    /// Whether the work ran in this call (its outcome may still be lost, see
    /// [`Cause::LeaseLost`]).
    #[must_use]
    pub fn ran(&self) -> bool {
        !self.replayed && self.attempt > 0
    }
}
