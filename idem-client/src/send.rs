//! What both front-ends do around the decision core: the span, the wait
//! between attempts, and turning a step into a report.

use std::time::{Duration, SystemTime};

use http::{Extensions, HeaderMap, HeaderValue, Method};
use tracing::{Span, field::Empty};

use crate::{
    Error, IdempotencyKey, Intent, Problem, ReportKind,
    config::Config,
    key,
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
            crate::metrics::record_retry(reason);
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

/// Records the end of a send on its span (and in the metrics).
pub(crate) fn finish(
    span: &Span,
    kind: ReportKind,
    attempts: u32,
    status: Option<u16>,
    problem: Option<&Problem>,
) {
    crate::metrics::record_send(kind, attempts);
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

/// A send refused before anything was sent (counted, then returned).
pub(crate) fn refused(e: Error) -> Error {
    crate::metrics::record_refused();
    e
}

/// Request extension: send once, with a key, no retries (for a streaming body).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SingleAttempt;

/// Request extension: leave this request alone.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NotIdempotent;

impl Config {
    /// Whether this request is an idempotent send at all.
    pub(crate) fn covers(&self, method: &Method, ext: &Extensions) -> bool {
        ext.get::<NotIdempotent>().is_none() && self.methods.contains(method)
    }

    /// The send's key, first match wins: the caller's header, an [`Intent`],
    /// a key already in the extensions, or a new random one (written to the
    /// extensions first, so a retry layer above reuses it). The header is set
    /// unless the caller set it. Returns the key's age when an intent gave it.
    ///
    /// Refuses an invalid caller key and (row 22) an intent past the key's lifetime.
    pub(crate) fn resolve_key(
        &self,
        headers: &mut HeaderMap,
        ext: &mut Extensions,
    ) -> Result<(IdempotencyKey, Option<Duration>), Error> {
        let mut key_age = None;
        let key = if let Some(v) = headers.get(&self.key_header) {
            // A value that is not even visible ASCII is not a key either.
            let v = v.to_str().unwrap_or("\u{0}");
            key::decode(v)?
        } else {
            let key = if let Some(intent) = ext.get::<Intent>() {
                key_age = Some(intent.age(SystemTime::now()));
                intent.key().clone()
            } else if let Some(k) = ext.get::<IdempotencyKey>() {
                k.clone()
            } else {
                let k = IdempotencyKey::random();
                ext.insert(k.clone());
                k
            };
            // Every key is printable ASCII, so every field value is valid.
            let value = HeaderValue::from_str(&self.key_syntax.encode(&key))
                .map_err(|_| Error::InvalidKey(idem_core::error::KeyError::Empty))?;
            headers.insert(self.key_header.clone(), value);
            key
        };
        if !self.policy.key_usable(key_age) {
            return Err(Error::KeyLifetimeExceeded { key });
        }
        Ok((key, key_age))
    }
}
