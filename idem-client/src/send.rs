//! What both front-ends do around the decision core: the span, the answer
//! read and decided on, the wait between attempts, and the report or error
//! that ends a send. A front-end only sends and hands over what came back.

use std::future::Future;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Extensions, HeaderMap, HeaderValue, Method, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Limited};
use idem_core::store::BoxDynError;
use tokio::time::Instant;
use tracing::{Span, field::Empty};

use crate::{
    Error, IdempotencyKey, Intent, MAX_PROBLEM_BYTES, Problem, Report, ReportKind, StopReason,
    config::Config,
    key,
    policy::{AttemptView, RetryReason, SendOutcome, SendState, Step, TransportFailure, os_random},
};

/// A step, as a front-end acts on it.
enum Then {
    /// The send is over.
    Done(ReportKind),
    /// Wait, then send again.
    Wait(Duration),
}

/// Maps a step, and logs a retry (one `debug` event per retry).
fn then(step: Step, attempt: u32) -> Then {
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
        Step::Return(SendOutcome::Replayed) => Then::Done(ReportKind::Replayed),
        Step::Return(SendOutcome::AlreadyProcessed) => Then::Done(ReportKind::AlreadyProcessed),
        Step::Return(SendOutcome::Rejected) => Then::Done(ReportKind::Rejected),
        Step::Return(_) => Then::Done(ReportKind::Fresh),
        Step::Stop(reason) => Then::Done(ReportKind::Exhausted(reason)),
    }
}

/// A response as the send reads it, whichever HTTP client made it.
pub(crate) trait Answer {
    /// The status.
    fn status(&self) -> StatusCode;
    /// The headers.
    fn headers(&self) -> &HeaderMap;
    /// Where the [`Report`] goes.
    fn extensions_mut(&mut self) -> &mut Extensions;
}

impl<B> Answer for http::Response<B> {
    fn status(&self) -> StatusCode {
        self.status()
    }
    fn headers(&self) -> &HeaderMap {
        self.headers()
    }
    fn extensions_mut(&mut self) -> &mut Extensions {
        self.extensions_mut()
    }
}

/// What an attempt gave: a response (with its problem body, when read), or
/// no response at all.
pub(crate) type Attempted<R> = Result<(R, Option<Problem>), TransportFailure>;

/// After an attempt: wait and send again, or the send's end.
pub(crate) enum Next<R> {
    /// Wait this long, then send again with the same key.
    Wait(Duration),
    /// The response to return (its [`Report`] in its extensions), or the
    /// error that carries the key when there is none.
    Done(Result<R, Error>),
}

/// One logical send, the same for both front-ends.
pub(crate) struct Sending<'c> {
    cfg: &'c Config,
    key: IdempotencyKey,
    key_age: Option<Duration>,
    /// One attempt only (a body that cannot be sent twice).
    single: bool,
    span: Span,
    start: Instant,
}

impl<'c> Sending<'c> {
    /// A send starting now, in `span`.
    pub(crate) fn new(
        cfg: &'c Config,
        key: IdempotencyKey,
        key_age: Option<Duration>,
        single: bool,
        span: Span,
    ) -> Self {
        Self {
            cfg,
            key,
            key_age,
            single,
            span,
            start: Instant::now(),
        }
    }

    /// Whether the send makes one attempt only (the reqwest front-end then
    /// keeps no clone of the request).
    #[cfg(feature = "reqwest")]
    pub(crate) fn is_single(&self) -> bool {
        self.single
    }

    /// Runs one attempt within the configured limit: `None` when it passed
    /// (the request may have been written).
    pub(crate) async fn within<F: Future>(&self, attempt: F) -> Option<F::Output> {
        match self.cfg.attempt_timeout {
            Some(t) => tokio::time::timeout(t, attempt).await.ok(),
            None => Some(attempt.await),
        }
    }

    /// Decides on the `attempts`-th attempt's result: a wait (the response,
    /// if any, is dropped), or the end of the send, recorded on its span.
    pub(crate) fn answered<R: Answer>(&self, attempts: u32, attempted: Attempted<R>) -> Next<R> {
        let elapsed = self.start.elapsed();
        let (response, problem) = match attempted {
            Ok((r, p)) => (Ok(r), p),
            Err(f) => (Err(f), None),
        };
        let view = match &response {
            Ok(r) => AttemptView::Response {
                status: r.status(),
                headers: r.headers(),
                problem: problem.as_ref(),
            },
            Err(f) => AttemptView::Transport(*f),
        };
        let state = SendState {
            attempts,
            elapsed,
            key_age: Some(self.key_age.unwrap_or_default() + elapsed),
            now: SystemTime::now(),
        };
        let mut step = self.cfg.policy.decide(&view, state, &mut os_random);
        if self.single && matches!(step, Step::Retry { .. }) {
            step = Step::Stop(if response.is_ok() {
                StopReason::MaxAttempts
            } else {
                StopReason::Transport
            });
        }
        let kind = match then(step, attempts) {
            Then::Done(kind) => kind,
            Then::Wait(delay) => return Next::Wait(delay),
        };
        finish(
            &self.span,
            kind,
            attempts,
            response.as_ref().ok().map(|r| r.status().as_u16()),
            problem.as_ref(),
        );
        let Ok(mut resp) = response else {
            let reason = match kind {
                ReportKind::Exhausted(r) => r,
                _ => StopReason::Transport,
            };
            return Next::Done(Err(Error::Exhausted {
                key: self.key.clone(),
                attempts,
                reason,
                last_status: None,
                elapsed,
            }));
        };
        resp.extensions_mut().insert(Report {
            key: self.key.clone(),
            attempts,
            elapsed,
            kind,
            problem,
        });
        Next::Done(Ok(resp))
    }
}

/// Whether a response head announces a problem body
/// (`application/problem+json`).
pub(crate) fn announces_problem(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(Problem::is_problem_content_type)
}

/// Collects a problem body (at most [`MAX_PROBLEM_BYTES`]) and reads it; the
/// bytes go back into the response. `Err` when the body failed mid-read.
pub(crate) async fn collect_problem<B>(body: B) -> Result<(Bytes, Option<Problem>), ()>
where
    B: Body,
    B::Error: Into<BoxDynError>,
{
    let bytes = Limited::new(body, MAX_PROBLEM_BYTES)
        .collect()
        .await
        .map_err(|_| ())?
        .to_bytes();
    let problem = Problem::from_slice(&bytes);
    Ok((bytes, problem))
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
fn finish(
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
