//! What both front-ends do around the decision core: the span, the wait
//! between attempts, and turning a step into a report.

use std::time::Duration;

use tracing::{Span, field::Empty};

use crate::{
    IdempotencyKey, Problem, ReportKind,
    policy::{Outcome, RetryReason, Step},
};

/// A step, as a front-end acts on it.
pub(crate) enum Then {
    /// The send is over.
    Done(ReportKind),
    /// Wait, then send again.
    Wait(Duration),
}

/// Maps a step, and logs a retry (one `debug` event per retry).
pub(crate) fn then(step: Step, attempt: u32) -> Then {
    match step {
        Step::Retry {
            delay,
            reason,
            retry_after,
        } => {
            log_retry(attempt, reason, delay, retry_after);
            Then::Wait(delay)
        }
        Step::Return(Outcome::Replayed) => Then::Done(ReportKind::Replayed),
        Step::Return(Outcome::AlreadyProcessed) => Then::Done(ReportKind::AlreadyProcessed),
        Step::Return(Outcome::Rejected) => Then::Done(ReportKind::Rejected),
        Step::Return(_) => Then::Done(ReportKind::Fresh),
        Step::Stop(reason) => Then::Done(ReportKind::Exhausted(reason)),
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn log_retry(attempt: u32, reason: RetryReason, delay: Duration, retry_after: Option<Duration>) {
    tracing::debug!(
        attempt,
        reason = %reason,
        delay_ms = millis(delay),
        retry_after_ms = retry_after.map(millis),
        "idem.client.retry"
    );
}

/// One span per logical send: the key's log hash, never the key; the path,
/// never the query string (it may hold secrets).
pub(crate) fn span(method: &http::Method, host: &str, path: &str, key: &IdempotencyKey) -> Span {
    tracing::info_span!(
        "idem.client.send",
        http.request.method = %method,
        server.address = host,
        url.path = path,
        idem.key_hash = %key.log_hash(),
        idem.attempts = Empty,
        idem.outcome = Empty,
        http.response.status_code = Empty,
        error.type = Empty,
    )
}

/// Records the end of a send on the current span.
pub(crate) fn finish(
    kind: ReportKind,
    attempts: u32,
    status: Option<u16>,
    problem: Option<&Problem>,
) {
    let span = Span::current();
    span.record("idem.attempts", attempts);
    span.record("idem.outcome", kind.as_str());
    if let Some(s) = status {
        span.record("http.response.status_code", s);
    }
    match kind {
        ReportKind::Exhausted(r) => {
            span.record(
                "error.type",
                if status.is_some() {
                    r.as_str()
                } else {
                    "transport"
                },
            );
        }
        ReportKind::Rejected => {
            span.record(
                "error.type",
                problem
                    .and_then(|p| p.code.as_deref())
                    .unwrap_or("rejected"),
            );
        }
        _ => {}
    }
}
