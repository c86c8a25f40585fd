//! What a send did: kept in every returned response's extensions.

use std::time::Duration;

use idem_core::IdempotencyKey;

use crate::{Problem, StopReason};

/// How a send ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReportKind {
    /// The server ran it now; this is its answer (a 2xx, or a handler's own 4xx).
    Fresh,
    /// A stored answer, replayed (`Idempotent-Replayed: true`).
    Replayed,
    /// Done earlier; the response is gone (409 `response_expired` / `response_not_stored`).
    AlreadyProcessed,
    /// The server rejected the request itself; never retried.
    Rejected,
    /// The server still said "later" when a limit was reached.
    Exhausted(StopReason),
    /// Not an idempotent send (a method not configured, or `not_idempotent()`).
    PassThrough,
}

impl ReportKind {
    /// A stable name for logs (`idem.outcome`) and metrics.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fresh => "fresh",
            Self::Replayed => "replayed",
            Self::AlreadyProcessed => "already_processed",
            Self::Rejected => "rejected",
            Self::Exhausted(_) => "exhausted",
            Self::PassThrough => "pass_through",
        }
    }
}

/// The record of one logical send.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Report {
    /// The key sent on every attempt.
    pub key: IdempotencyKey,
    /// Attempts made.
    pub attempts: u32,
    /// Time spent, waits included.
    pub elapsed: Duration,
    /// How it ended.
    pub kind: ReportKind,
    /// The problem body of the last answer, when it had one.
    pub problem: Option<Problem>,
}
