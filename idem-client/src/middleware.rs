//! The `reqwest-middleware` front-end (feature `reqwest`).

use std::sync::Arc;

use http::{Extensions, StatusCode};
use idem_core::IdempotencyKey;
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};
use tracing::Instrument;

use crate::{
    Error, Intent, MAX_PROBLEM_BYTES, Problem, Report, ReportKind,
    config::{ClientConfigError, Config, IdempotencyClientBuilder},
    policy::TransportFailure,
    send::{self, Answer, NotIdempotent, Sending, SingleAttempt},
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
    pub fn builder() -> IdempotencyClientBuilder {
        IdempotencyClientBuilder::default()
    }
}

impl IdempotencyClientBuilder {
    /// The middleware.
    ///
    /// # Errors
    ///
    /// [`ClientConfigError`] for a setting that cannot work.
    pub fn build(self) -> Result<IdempotencyMiddleware, ClientConfigError> {
        Ok(IdempotencyMiddleware {
            config: Arc::new(self.checked()?),
        })
    }
}

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
        if !cfg.covers(req.method(), extensions) {
            return next.run(req, extensions).await;
        }
        let (key, key_age) = cfg
            .resolve_key(req.headers_mut(), extensions)
            .map_err(|e| mw_error(send::refused(e)))?;
        // Row 21: a body that cannot be sent twice needs the caller's consent.
        let single = extensions.get::<SingleAttempt>().is_some();
        if !single && req.try_clone().is_none() {
            return Err(mw_error(send::refused(Error::BodyNotReplayable)));
        }
        let span = send::span(
            req.method(),
            req.url().host_str().unwrap_or(""),
            req.url().path(),
            &key,
        );
        let sending = Sending::new(cfg, key, key_age, single, span.clone());
        run(&sending, req, extensions, next).instrument(span).await
    }
}

impl Answer for Response {
    fn status(&self) -> StatusCode {
        self.status()
    }
    fn headers(&self) -> &http::HeaderMap {
        self.headers()
    }
    fn extensions_mut(&mut self) -> &mut Extensions {
        self.extensions_mut()
    }
}

/// The attempts of one send: a clone of the request kept for the next one
/// (none for a single attempt), each result handed to [`Sending::answered`].
async fn run(
    sending: &Sending<'_>,
    req: Request,
    extensions: &mut Extensions,
    next: Next<'_>,
) -> reqwest_middleware::Result<Response> {
    let mut pending = Some(req);
    let mut attempts: u32 = 0;
    loop {
        let Some(this) = pending.take() else {
            // Unreachable: a retry always has a clone.
            return Err(mw_error(Error::BodyNotReplayable));
        };
        let spare = if sending.is_single() {
            None
        } else {
            this.try_clone()
        };
        attempts += 1;
        let attempted = match sending.within(next.clone().run(this, extensions)).await {
            // The attempt timed out: the request may have been written.
            None => Err(TransportFailure::Ambiguous),
            Some(Ok(resp)) => read_problem(resp)
                .await
                .map_err(|()| TransportFailure::Ambiguous),
            Some(Err(reqwest_middleware::Error::Reqwest(e))) if e.is_connect() => {
                Err(TransportFailure::Connect)
            }
            Some(Err(reqwest_middleware::Error::Reqwest(e)))
                if e.is_timeout() || e.is_request() || e.is_body() =>
            {
                Err(TransportFailure::Ambiguous)
            }
            // An inner middleware's own error, or a builder error: not ours to retry.
            Some(Err(e)) => return Err(e),
        };
        match sending.answered(attempts, attempted) {
            send::Next::Wait(delay) => {
                tokio::time::sleep(delay).await;
                pending = spare;
            }
            send::Next::Done(done) => return done.map_err(mw_error),
        }
    }
}

/// Reads a problem body (`application/problem+json`, declared length within
/// [`MAX_PROBLEM_BYTES`]) and hands the response back rebuilt around the bytes.
/// Any other body is not touched. `Err` when the body failed mid-read.
async fn read_problem(resp: Response) -> Result<(Response, Option<Problem>), ()> {
    let small = resp
        .content_length()
        .is_some_and(|n| n <= MAX_PROBLEM_BYTES as u64);
    if !send::announces_problem(resp.headers()) || !small || resp.status() == StatusCode::NO_CONTENT
    {
        return Ok((resp, None));
    }
    let http_resp: http::Response<reqwest::Body> = resp.into();
    let (parts, body) = http_resp.into_parts();
    let (bytes, problem) = send::collect_problem(body).await?;
    Ok((
        Response::from(http::Response::from_parts(parts, bytes)),
        problem,
    ))
}
