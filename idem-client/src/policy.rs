//! The decision core: one attempt's answer in, the next step out.
//!
//! No HTTP client here. A front-end sends, reads the answer into an
//! [`AttemptView`], and asks [`RetryPolicy::decide`] what to do: return it (and as
//! what), wait and send again with the same key, or stop. Randomness and time
//! come in as arguments, so every row of the behaviour table is a plain test.

use std::{
    fmt,
    sync::Arc,
    time::{Duration, SystemTime},
};

use http::{HeaderMap, HeaderName, StatusCode};
use idem_core::wire::{ProblemCode, header};

use crate::{Problem, StopReason, retry_after};

/// What the send ended as, for a [`Step::Return`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SendOutcome {
    /// The server ran the request now (any 2xx/3xx, a handler's own 4xx, a
    /// non-retryable 5xx): its answer.
    Fresh,
    /// The server replayed a stored answer (`Idempotent-Replayed: true`).
    Replayed,
    /// The operation happened earlier, its response is gone (409
    /// `response_expired` / `response_not_stored`). Not an error.
    AlreadyProcessed,
    /// The server rejected the request itself (a key problem, 413, 422
    /// `fingerprint_mismatch`, a non-retryable server problem). Never retried.
    Rejected,
}

/// Why a retry is made (the `reason` of the per-retry event).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RetryReason {
    /// No connection (refused, DNS, TLS): the request was not sent.
    Connect,
    /// The request may have been sent, no response came (reset, EOF, timeout).
    Transport,
    /// 409 `in_flight` / `lease_lost`, or a 409 with `Retry-After`.
    InFlight,
    /// A status or problem that says "later" (408, 425, 429, 5xx, `retryable: true`).
    Status(u16),
    /// The caller's [`classify`](crate::IdempotencyClientBuilder::classify) hook asked for it.
    Classified,
}

impl fmt::Display for RetryReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Connect => f.write_str("connect"),
            Self::Transport => f.write_str("transport"),
            Self::InFlight => f.write_str("in_flight"),
            Self::Status(s) => write!(f, "status_{s}"),
            Self::Classified => f.write_str("classified"),
        }
    }
}

/// A transport failure, by whether the request could have reached the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransportFailure {
    /// Nothing was sent (connect refused, DNS, TLS handshake): row 1.
    Connect,
    /// The request may have been written (reset, EOF, timeout before a response
    /// head): ambiguous, safe to resend only because the key is the same. Row 2.
    Ambiguous,
}

/// One attempt's answer, as the policy (and a [`classify`](crate::IdempotencyClientBuilder::classify) hook) sees it.
#[derive(Debug, Clone, Copy)]
pub enum AttemptView<'a> {
    /// No response.
    Transport(TransportFailure),
    /// A response head, and its problem body when it had one.
    Response {
        /// The status.
        status: StatusCode,
        /// The headers.
        headers: &'a HeaderMap,
        /// The problem body, read only for `application/problem+json`.
        problem: Option<&'a Problem>,
    },
}

/// A [`classify`](crate::IdempotencyClientBuilder::classify) hook's verdict, overriding the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// Return this answer to the caller as it is.
    Return,
    /// Send again after at least this long (still bounded by the deadline, the
    /// attempt cap and the key's lifetime).
    RetryAfter(Duration),
    /// Send again after the usual backoff.
    Backoff,
}

/// What to do after an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Step {
    /// The send is over; this answer goes back as `outcome`.
    Return(SendOutcome),
    /// Wait `delay`, then send again with the same key.
    Retry {
        /// How long to wait first.
        delay: Duration,
        /// Why (for the per-retry event).
        reason: RetryReason,
        /// The server's hint, when it gave one.
        retry_after: Option<Duration>,
    },
    /// The answer said "later", but no later is allowed: the caller gets the
    /// last answer (or, with none, an error) and the key, to resume.
    Stop(StopReason),
}

/// Where the send stands when an answer arrives.
#[derive(Debug, Clone, Copy)]
pub struct SendState {
    /// Attempts made so far, this one included (1 after the first).
    pub attempts: u32,
    /// Time since the send started (waits included).
    pub elapsed: Duration,
    /// Time since the key was minted (`Intent::created_at`), when known.
    pub key_age: Option<Duration>,
    /// The wall clock, for `Retry-After` dates.
    pub now: SystemTime,
}

/// The caller's override hook, before the table.
pub type Classify = Arc<dyn Fn(&AttemptView<'_>) -> Option<Decision> + Send + Sync>;

/// The client's retry rules: attempt cap, backoff, time limits and the
/// server-specific switches. Built through [`IdempotencyClientBuilder`](crate::IdempotencyClientBuilder).
#[derive(Clone)]
pub struct RetryPolicy {
    pub(crate) max_attempts: u32,
    pub(crate) backoff_initial: Duration,
    pub(crate) backoff_max: Duration,
    pub(crate) deadline: Duration,
    pub(crate) max_retry_after: Duration,
    pub(crate) key_lifetime: Option<Duration>,
    pub(crate) retry_conflicts: bool,
    pub(crate) replayed_headers: Vec<HeaderName>,
    pub(crate) classify: Option<Classify>,
}

impl fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("max_attempts", &self.max_attempts)
            .field("backoff_initial", &self.backoff_initial)
            .field("backoff_max", &self.backoff_max)
            .field("deadline", &self.deadline)
            .field("max_retry_after", &self.max_retry_after)
            .field("key_lifetime", &self.key_lifetime)
            .field("retry_conflicts", &self.retry_conflicts)
            .field("replayed_headers", &self.replayed_headers)
            .field("classify", &self.classify.is_some())
            .finish()
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 6,
            backoff_initial: Duration::from_millis(200),
            backoff_max: Duration::from_secs(10),
            deadline: Duration::from_secs(60),
            max_retry_after: Duration::from_secs(60),
            key_lifetime: None,
            retry_conflicts: false,
            replayed_headers: header::REPLAY_MARKERS
                .iter()
                .map(|n| HeaderName::from_static(n))
                .collect(),
            classify: None,
        }
    }
}

/// What a problem code tells the table.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CodeClass {
    /// The request itself is rejected: never retried (rows 5–7).
    Rejected,
    /// Another attempt holds the key: wait and send again.
    InFlight,
    /// Done earlier, the response is gone.
    AlreadyProcessed,
    /// A server problem that will not go away by resending (row 16).
    Fatal,
    /// A server problem a resend with the same key recovers from (rows 15, 18).
    Transient,
    /// A code the table does not read (the webhook receiver's, another
    /// server's own): `retryable`, then the status, decide.
    Other,
}

impl CodeClass {
    fn of(code: Option<ProblemCode>) -> Self {
        use ProblemCode as C;
        match code {
            Some(
                C::MissingKey
                | C::InvalidKey
                | C::InvalidRequest
                | C::RequestBodyUnreadable
                | C::RequestTooLarge
                | C::FingerprintMismatch
                | C::PathTooLong,
            ) => Self::Rejected,
            Some(C::InFlight | C::LeaseLost) => Self::InFlight,
            Some(C::ResponseExpired | C::ResponseNotStored) => Self::AlreadyProcessed,
            Some(
                C::CorruptRecord | C::StoreError | C::OwnerUnavailable | C::OperationUnavailable,
            ) => Self::Fatal,
            Some(
                C::HandlerPanicked | C::ResponseBodyFailed | C::StoreUnavailable | C::ShuttingDown,
            ) => Self::Transient,
            _ => Self::Other,
        }
    }
}

/// What the table says before time and attempt limits are applied.
enum Verdict {
    Return(SendOutcome),
    Retry(RetryReason),
}

impl RetryPolicy {
    /// The key's lifetime minus the clock-skew margin (1 %, at least a minute),
    /// or `None` when the lifetime is unknown.
    #[must_use]
    pub fn usable_key_lifetime(&self) -> Option<Duration> {
        self.key_lifetime.map(|l| {
            let margin = (l / 100).max(Duration::from_secs(60));
            l.saturating_sub(margin)
        })
    }

    /// Whether a key of this age may still be sent (row 22, and before every retry).
    #[must_use]
    pub fn key_usable(&self, key_age: Option<Duration>) -> bool {
        match (self.usable_key_lifetime(), key_age) {
            (Some(limit), Some(age)) => age < limit,
            _ => true,
        }
    }

    /// Whether the response carries a replay marker (`Idempotent-Replayed: true` or an alias).
    #[must_use]
    pub fn is_replayed(&self, headers: &HeaderMap) -> bool {
        self.replayed_headers.iter().any(|name| {
            headers.get_all(name).iter().any(|v| {
                v.to_str()
                    .is_ok_and(|v| v.trim().eq_ignore_ascii_case("true") || v.trim() == "?1")
            })
        })
    }

    /// The next step after an attempt. `random` returns uniform `u64`s; the
    /// front-ends pass the OS generator, tests a fixed sequence.
    pub fn decide(
        &self,
        view: &AttemptView<'_>,
        state: SendState,
        random: &mut dyn FnMut() -> u64,
    ) -> Step {
        let hint = Self::hint(view, state.now);
        let verdict = match self.classify.as_ref().and_then(|c| c(view)) {
            Some(Decision::Return) => Verdict::Return(self.returned_as(view)),
            Some(Decision::RetryAfter(d)) => {
                return self.retry(RetryReason::Classified, Some(d), state, random);
            }
            Some(Decision::Backoff) => Verdict::Retry(RetryReason::Classified),
            None => self.table(view),
        };
        match verdict {
            Verdict::Return(outcome) => Step::Return(outcome),
            Verdict::Retry(reason) => match self.retry(reason, hint, state, random) {
                // With no response to hand back, the caller learns it never got one.
                Step::Stop(_) if matches!(view, AttemptView::Transport(_)) => {
                    Step::Stop(StopReason::Transport)
                }
                step => step,
            },
        }
    }

    /// The behaviour table (spec §5), in its order: replay marker, the idem
    /// problem (`code`, then `retryable`), then the status.
    fn table(&self, view: &AttemptView<'_>) -> Verdict {
        let (status, headers, problem) = match *view {
            AttemptView::Transport(TransportFailure::Connect) => {
                return Verdict::Retry(RetryReason::Connect);
            }
            AttemptView::Transport(TransportFailure::Ambiguous) => {
                return Verdict::Retry(RetryReason::Transport);
            }
            AttemptView::Response {
                status,
                headers,
                problem,
            } => (status, headers, problem),
        };
        // Row 4: a stored answer is final, whatever its status.
        if self.is_replayed(headers) {
            return Verdict::Return(SendOutcome::Replayed);
        }
        let code = status.as_u16();
        if let Some(p) = problem
            && p.code.is_some()
        {
            let class = CodeClass::of(p.problem_code());
            match class {
                CodeClass::Rejected => return Verdict::Return(SendOutcome::Rejected),
                CodeClass::InFlight => return Verdict::Retry(RetryReason::InFlight),
                CodeClass::AlreadyProcessed => {
                    return Verdict::Return(SendOutcome::AlreadyProcessed);
                }
                _ => {}
            }
            // Row 20: `retryable` is authoritative when present.
            match p.retryable {
                Some(true) => return Verdict::Retry(RetryReason::Status(code)),
                Some(false) if class == CodeClass::Fatal || status.is_server_error() => {
                    return Verdict::Return(SendOutcome::Rejected);
                }
                // A handler's own problem with `retryable: false` is its answer.
                Some(false) => return Verdict::Return(SendOutcome::Fresh),
                None if class == CodeClass::Fatal => return Verdict::Return(SendOutcome::Rejected),
                None if class == CodeClass::Transient => {
                    return Verdict::Retry(RetryReason::Status(code));
                }
                // Unknown code, no `retryable`: the status decides.
                None => {}
            }
        }
        match code {
            408 | 425 | 429 | 500 | 502 | 503 | 504 => Verdict::Retry(RetryReason::Status(code)),
            // Row 12: a 409 that names a time to come back is "in progress".
            409 if headers.contains_key(header::RETRY_AFTER)
                || headers.contains_key(header::RETRY_AFTER_MS) =>
            {
                Verdict::Retry(RetryReason::InFlight)
            }
            409 if self.retry_conflicts => Verdict::Retry(RetryReason::Status(409)),
            // Rows 3, 8, 13, 19: the answer, fresh.
            _ => Verdict::Return(SendOutcome::Fresh),
        }
    }

    /// How a [`Decision::Return`] is reported: a replay stays a replay.
    fn returned_as(&self, view: &AttemptView<'_>) -> SendOutcome {
        match view {
            AttemptView::Response { headers, .. } if self.is_replayed(headers) => {
                SendOutcome::Replayed
            }
            _ => SendOutcome::Fresh,
        }
    }

    fn hint(view: &AttemptView<'_>, now: SystemTime) -> Option<Duration> {
        let AttemptView::Response {
            headers, problem, ..
        } = view
        else {
            return None;
        };
        retry_after::parse(headers, now).or_else(|| {
            problem
                .and_then(|p| p.retry_after)
                .filter(|s| *s > 0)
                .map(Duration::from_secs)
        })
    }

    /// A retry, if the attempt cap, the deadline and the key's lifetime allow it.
    fn retry(
        &self,
        reason: RetryReason,
        hint: Option<Duration>,
        state: SendState,
        random: &mut dyn FnMut() -> u64,
    ) -> Step {
        if let Some(h) = hint
            && h > self.max_retry_after
        {
            return Step::Stop(StopReason::RetryAfterTooLong);
        }
        if state.attempts >= self.max_attempts {
            return Step::Stop(StopReason::MaxAttempts);
        }
        let delay = match hint {
            // A floor with a little spread: value + uniform(0, min(1 s, value/10)).
            Some(h) => h + uniform(random, (h / 10).min(Duration::from_secs(1))),
            None => self.backoff(state.attempts.saturating_sub(1), random),
        };
        if state.elapsed.saturating_add(delay) >= self.deadline {
            return Step::Stop(StopReason::Deadline);
        }
        if let Some(age) = state.key_age
            && !self.key_usable(Some(age.saturating_add(delay)))
        {
            return Step::Stop(StopReason::KeyLifetime);
        }
        Step::Retry {
            delay,
            reason,
            retry_after: hint,
        }
    }

    /// Full jitter for the `n`-th retry (0-based): `uniform(0, min(max, initial·2^n))`.
    #[must_use]
    pub fn backoff(&self, n: u32, random: &mut dyn FnMut() -> u64) -> Duration {
        let cap = self
            .backoff_initial
            .checked_mul(1u32.checked_shl(n.min(31)).unwrap_or(u32::MAX))
            .unwrap_or(self.backoff_max)
            .min(self.backoff_max);
        uniform(random, cap)
    }
}

/// A uniform duration in `[0, max]`, at millisecond-or-finer grain.
fn uniform(random: &mut dyn FnMut() -> u64, max: Duration) -> Duration {
    let nanos = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(random() % nanos.saturating_add(1))
}

/// The OS generator as a `random` source for [`RetryPolicy::decide`].
#[must_use]
pub fn os_random() -> u64 {
    getrandom::u64().unwrap_or_else(|_| {
        // No entropy: jitter from the clock is still spread enough.
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u64::from(d.subsec_nanos()))
    })
}

#[cfg(test)]
mod tests;
