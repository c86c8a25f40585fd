//! The `reqwest-middleware` front-end (feature `reqwest`).

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use http::{Extensions, HeaderValue, StatusCode};
use http_body_util::{BodyExt, Limited};
use idem_core::IdempotencyKey;
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};
use tokio::time::Instant;
use tracing::{Instrument, field::Empty};

use crate::{
    Error, Intent, MAX_PROBLEM_BYTES, Problem, Report, ReportKind, StopReason,
    config::{Builder, Config, ConfigError},
    key,
    policy::{AttemptView, Outcome, SendState, Step, TransportFailure, os_random},
};

/// The middleware: one key per send, kept across its retries; retries only
/// what the server's answer allows. Put it first in
/// `reqwest_middleware::ClientBuilder::with` (outermost).
///
/// Every response it returns carries a [`Report`] in its extensions
/// ([`IdemResponseExt`]). With no response to return (transport failures to
/// the end, a refused body, an expired key) the error is
/// `reqwest_middleware::Error::Middleware` holding an [`Error`]
/// ([`Error::from_middleware`]), which carries the key.
#[derive(Debug, Clone, Default)]
pub struct IdempotencyMiddleware {
    config: Arc<Config>,
}

impl IdempotencyMiddleware {
    /// A builder with every default.
    pub fn builder() -> Builder {
        Builder::default()
    }
}

impl Builder {
    /// The middleware.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] for a setting that cannot work.
    pub fn build(self) -> Result<IdempotencyMiddleware, ConfigError> {
        Ok(IdempotencyMiddleware {
            config: Arc::new(self.checked()?),
        })
    }
}

/// Request extension: send once, with a key, no retries (for a streaming body).
#[derive(Debug, Clone, Copy)]
struct SingleAttempt;

/// Request extension: leave this request alone.
#[derive(Debug, Clone, Copy)]
struct NotIdempotent;

/// Per-request options on `reqwest_middleware::RequestBuilder`.
pub trait IdempotentRequestExt: Sized {
    /// Send with this key (instead of a minted one).
    #[must_use]
    fn idempotency_key(self, key: IdempotencyKey) -> Self;
    /// Send a persisted intent: its key, refused once older than `key_lifetime`.
    #[must_use]
    fn intent(self, intent: &Intent) -> Self;
    /// One attempt only, with a key: for a body that cannot be replayed.
    #[must_use]
    fn single_attempt(self) -> Self;
    /// No key, no retries: the request passes through untouched.
    #[must_use]
    fn not_idempotent(self) -> Self;
}

impl IdempotentRequestExt for reqwest_middleware::RequestBuilder {
    fn idempotency_key(self, key: IdempotencyKey) -> Self {
        self.with_extension(key)
    }
    fn intent(self, intent: &Intent) -> Self {
        self.with_extension(intent.clone())
    }
    fn single_attempt(self) -> Self {
        self.with_extension(SingleAttempt)
    }
    fn not_idempotent(self) -> Self {
        self.with_extension(NotIdempotent)
    }
}

/// What a send gave, read from a response's [`Report`].
#[derive(Debug)]
#[non_exhaustive]
pub enum Sent {
    /// The server ran it now: a 2xx, or a handler's own answer.
    Fresh(Response),
    /// A stored answer, replayed.
    Replayed(Response),
    /// It was done earlier; the response is gone. Look the resource up.
    AlreadyProcessed {
        /// What the earlier run created, when the server says.
        resource_id: Option<String>,
        /// The server's problem body.
        problem: Box<Problem>,
        /// The key.
        key: IdempotencyKey,
    },
}

/// Reads the [`Report`] a response carries.
pub trait IdemResponseExt: Sized {
    /// The report, for a response that went through the middleware.
    fn idem_report(&self) -> Option<&Report>;
    /// The send's result: [`Sent`], or an [`Error`] carrying the key.
    ///
    /// # Errors
    ///
    /// [`Error::Rejected`] and [`Error::Exhausted`] as the report says. A
    /// response that did not go through the middleware (no report) is
    /// [`Sent::Fresh`].
    fn idem(self) -> Result<Sent, Error>;
}

impl IdemResponseExt for Response {
    fn idem_report(&self) -> Option<&Report> {
        self.extensions().get::<Report>()
    }

    fn idem(self) -> Result<Sent, Error> {
        let Some(report) = self.idem_report().cloned() else {
            return Ok(Sent::Fresh(self));
        };
        let status = self.status();
        match report.kind {
            ReportKind::Replayed => Ok(Sent::Replayed(self)),
            ReportKind::AlreadyProcessed => {
                let problem = report.problem.unwrap_or_default();
                Ok(Sent::AlreadyProcessed {
                    resource_id: problem.resource_id.clone(),
                    problem: Box::new(problem),
                    key: report.key,
                })
            }
            ReportKind::Rejected => Err(Error::Rejected {
                status,
                problem: Box::new(report.problem.unwrap_or_default()),
                key: report.key,
            }),
            ReportKind::Exhausted(reason) => Err(Error::Exhausted {
                key: report.key,
                attempts: report.attempts,
                reason,
                last_status: Some(status),
                elapsed: report.elapsed,
            }),
            _ => Ok(Sent::Fresh(self)),
        }
    }
}

fn mw_error(e: Error) -> reqwest_middleware::Error {
    reqwest_middleware::Error::Middleware(anyhow::Error::new(e))
}

#[async_trait::async_trait]
impl Middleware for IdempotencyMiddleware {
    async fn handle(
        &self,
        mut req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let cfg = &*self.config;
        if extensions.get::<NotIdempotent>().is_some() || !cfg.methods.contains(req.method()) {
            return next.run(req, extensions).await;
        }
        let now = SystemTime::now();
        // The key: the caller's header, an intent, a key in the extensions, or a new one.
        let mut key_age = None;
        let key = if let Some(v) = req.headers().get(&cfg.key_header) {
            let v = v.to_str().unwrap_or("\u{0}");
            key::decode(v).map_err(|e| mw_error(Error::InvalidKey(e)))?
        } else {
            let key = if let Some(intent) = extensions.get::<Intent>() {
                key_age = Some(intent.age(now));
                intent.key().clone()
            } else if let Some(k) = extensions.get::<IdempotencyKey>() {
                k.clone()
            } else {
                let k = IdempotencyKey::random();
                extensions.insert(k.clone());
                k
            };
            let field = cfg.key_syntax.encode(&key);
            // Every key is printable ASCII, so every field value is valid.
            let value = HeaderValue::from_str(&field)
                .map_err(|_| mw_error(Error::InvalidKey(idem_core::error::KeyError::Empty)))?;
            req.headers_mut().insert(cfg.key_header.clone(), value);
            key
        };
        // Row 22: a key the server may have forgotten is never sent.
        if !cfg.policy.key_usable(key_age) {
            return Err(mw_error(Error::KeyLifetimeExceeded { key }));
        }
        // Row 21: a body that cannot be sent twice needs the caller's consent.
        let single = extensions.get::<SingleAttempt>().is_some();
        if !single && req.try_clone().is_none() {
            return Err(mw_error(Error::BodyNotReplayable));
        }
        let span = tracing::info_span!(
            "idem.client.send",
            http.request.method = %req.method(),
            server.address = req.url().host_str().unwrap_or(""),
            url.path = req.url().path(),
            idem.key_hash = %key.log_hash(),
            idem.attempts = Empty,
            idem.outcome = Empty,
            http.response.status_code = Empty,
            error.type = Empty,
        );
        let send = Send {
            cfg,
            key,
            key_age,
            single,
        };
        send.run(req, extensions, next).instrument(span).await
    }
}

/// One logical send.
struct Send<'c> {
    cfg: &'c Config,
    key: IdempotencyKey,
    key_age: Option<Duration>,
    single: bool,
}

impl Send<'_> {
    async fn run(
        self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let start = Instant::now();
        let mut pending = Some(req);
        let mut attempts: u32 = 0;
        loop {
            let Some(this) = pending.take() else {
                // Unreachable: a retry always has a clone.
                return Err(mw_error(Error::BodyNotReplayable));
            };
            let spare = if self.single { None } else { this.try_clone() };
            attempts += 1;
            let fut = next.clone().run(this, extensions);
            let result = match self.cfg.attempt_timeout {
                Some(t) => tokio::time::timeout(t, fut).await.ok(),
                None => Some(fut.await),
            };
            let (failure, response, problem) = match result {
                // The attempt timed out: the request may have been written.
                None => (Some(TransportFailure::Ambiguous), None, None),
                Some(Ok(resp)) => match read_problem(resp).await {
                    Ok((resp, problem)) => (None, Some(resp), problem),
                    Err(()) => (Some(TransportFailure::Ambiguous), None, None),
                },
                Some(Err(reqwest_middleware::Error::Reqwest(e))) if e.is_connect() => {
                    (Some(TransportFailure::Connect), None, None)
                }
                Some(Err(reqwest_middleware::Error::Reqwest(e)))
                    if e.is_timeout() || e.is_request() || e.is_body() =>
                {
                    (Some(TransportFailure::Ambiguous), None, None)
                }
                // An inner middleware's own error, or a builder error: not ours to retry.
                Some(Err(e)) => return Err(e),
            };
            let elapsed = start.elapsed();
            let view = match (&failure, &response) {
                (Some(f), _) => AttemptView::Transport(*f),
                (None, Some(r)) => AttemptView::Response {
                    status: r.status(),
                    headers: r.headers(),
                    problem: problem.as_ref(),
                },
                (None, None) => AttemptView::Transport(TransportFailure::Ambiguous),
            };
            let state = SendState {
                attempts,
                elapsed,
                key_age: Some(self.key_age.unwrap_or_default() + elapsed),
                now: SystemTime::now(),
            };
            let mut step = self.cfg.policy.decide(&view, state, &mut os_random);
            if self.single && matches!(step, Step::Retry { .. }) {
                step = Step::Stop(if failure.is_some() {
                    StopReason::Transport
                } else {
                    StopReason::MaxAttempts
                });
            }
            let kind = match step {
                Step::Retry {
                    delay,
                    reason,
                    retry_after,
                } => {
                    tracing::debug!(
                        attempt = attempts,
                        reason = %reason,
                        delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                        retry_after_ms = retry_after.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                        "idem.client.retry"
                    );
                    drop(response);
                    tokio::time::sleep(delay).await;
                    pending = spare;
                    continue;
                }
                Step::Return(Outcome::Fresh) => ReportKind::Fresh,
                Step::Return(Outcome::Replayed) => ReportKind::Replayed,
                Step::Return(Outcome::AlreadyProcessed) => ReportKind::AlreadyProcessed,
                Step::Return(Outcome::Rejected) => ReportKind::Rejected,
                Step::Stop(reason) => ReportKind::Exhausted(reason),
            };
            let span = tracing::Span::current();
            span.record("idem.attempts", attempts);
            span.record("idem.outcome", kind.as_str());
            let Some(mut resp) = response else {
                span.record("error.type", "transport");
                let reason = match kind {
                    ReportKind::Exhausted(r) => r,
                    _ => StopReason::Transport,
                };
                return Err(mw_error(Error::Exhausted {
                    key: self.key,
                    attempts,
                    reason,
                    last_status: None,
                    elapsed,
                }));
            };
            span.record("http.response.status_code", resp.status().as_u16());
            if let ReportKind::Exhausted(r) = kind {
                span.record("error.type", r.as_str());
            } else if kind == ReportKind::Rejected {
                span.record(
                    "error.type",
                    problem
                        .as_ref()
                        .and_then(|p| p.code.as_deref())
                        .unwrap_or("rejected"),
                );
            }
            resp.extensions_mut().insert(Report {
                key: self.key,
                attempts,
                elapsed,
                kind,
                problem,
            });
            return Ok(resp);
        }
    }
}

/// Reads a problem body (`application/problem+json`, declared length within
/// [`MAX_PROBLEM_BYTES`]) and hands the response back rebuilt around the bytes.
/// Any other body is not touched. `Err` when the body failed mid-read.
async fn read_problem(resp: Response) -> Result<(Response, Option<Problem>), ()> {
    let is_problem = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(Problem::is_problem_content_type);
    let small = resp
        .content_length()
        .is_some_and(|n| n <= MAX_PROBLEM_BYTES as u64);
    if !is_problem || !small || resp.status() == StatusCode::NO_CONTENT {
        return Ok((resp, None));
    }
    let http_resp: http::Response<reqwest::Body> = resp.into();
    let (parts, body) = http_resp.into_parts();
    let bytes: Bytes = Limited::new(body, MAX_PROBLEM_BYTES)
        .collect()
        .await
        .map_err(|_| ())?
        .to_bytes();
    let problem = Problem::from_slice(&bytes);
    Ok((
        Response::from(http::Response::from_parts(parts, bytes)),
        problem,
    ))
}
