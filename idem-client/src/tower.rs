//! The `tower` client front-end (feature `tower`): the same policy and key
//! rules over any `Service<http::Request<B>>`.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, Limited};
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;
use tracing::Instrument;

use crate::{
    Error, IdempotencyKey, MAX_PROBLEM_BYTES, Problem, Report, ReportKind, StopReason,
    config::{Builder, Config, ConfigError},
    policy::{AttemptView, SendState, TransportFailure, os_random},
    send::{self, SingleAttempt, Then},
};

/// The error type of [`IdempotencyClient`]: an [`Error`] of this crate
/// (downcast it), or the inner service's own error.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The largest request body collected for replay by default (2 MiB, as `idem-http`).
pub const DEFAULT_MAX_REQUEST_BODY: usize = 2 * 1024 * 1024;

/// A tower layer that gives every covered request one key, kept across its
/// retries, and retries only what the server's answer allows.
///
/// The request body is collected once (up to [`max_request_body`](Self::max_request_body))
/// so every attempt sends the same bytes; a larger body is
/// [`Error::BodyNotReplayable`], nothing sent. Every response carries a
/// [`Report`] in its extensions.
#[derive(Debug, Clone)]
pub struct IdempotencyClientLayer {
    config: Arc<Config>,
    max_request_body: usize,
}

impl IdempotencyClientLayer {
    /// A builder with every default (the same one as the reqwest middleware).
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// The largest request body collected for replay (default 2 MiB).
    #[must_use]
    pub fn max_request_body(mut self, bytes: usize) -> Self {
        self.max_request_body = bytes;
        self
    }
}

impl Builder {
    /// The tower layer.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] for a setting that cannot work.
    pub fn build_layer(self) -> Result<IdempotencyClientLayer, ConfigError> {
        Ok(IdempotencyClientLayer {
            config: Arc::new(self.checked()?),
            max_request_body: DEFAULT_MAX_REQUEST_BODY,
        })
    }
}

impl<S> Layer<S> for IdempotencyClientLayer {
    type Service = IdempotencyClient<S>;
    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyClient {
            inner,
            config: Arc::clone(&self.config),
            max_request_body: self.max_request_body,
        }
    }
}

/// The service [`IdempotencyClientLayer`] makes.
#[derive(Debug, Clone)]
pub struct IdempotencyClient<S> {
    inner: S,
    config: Arc<Config>,
    max_request_body: usize,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, RB> Service<Request<B>> for IdempotencyClient<S>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: Body + From<Bytes> + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    RB: Body + From<Bytes> + Send + 'static,
    RB::Data: Send,
    RB::Error: Into<BoxError>,
{
    type Response = Response<RB>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Response<RB>, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The clone swap: the service that was polled ready serves this call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let cfg = Arc::clone(&self.config);
        if !cfg.covers(req.method(), req.extensions()) {
            return Box::pin(async move { inner.call(req).await.map_err(Into::into) });
        }
        let limit = self.max_request_body;
        Box::pin(async move {
            let (mut parts, body) = req.into_parts();
            let (key, key_age) = cfg
                .resolve_key(&mut parts.headers, &mut parts.extensions)
                .map_err(send::refused)?;
            let single = parts.extensions.get::<SingleAttempt>().is_some();
            let bytes = match Limited::new(body, limit).collect().await {
                Ok(c) => c.to_bytes(),
                Err(_) => {
                    return Err(Box::new(send::refused(Error::BodyNotReplayable)) as BoxError);
                }
            };
            let span = send::span(
                &parts.method,
                parts.uri.host().unwrap_or(""),
                parts.uri.path(),
                &key,
            );
            let send = TowerSend {
                cfg: &cfg,
                key,
                key_age,
                single,
                span: span.clone(),
            };
            send.run(inner, parts, bytes).instrument(span).await
        })
    }
}

struct TowerSend<'c> {
    cfg: &'c Config,
    key: IdempotencyKey,
    key_age: Option<Duration>,
    single: bool,
    span: tracing::Span,
}

impl TowerSend<'_> {
    async fn run<S, B, RB>(
        self,
        mut svc: S,
        parts: http::request::Parts,
        bytes: Bytes,
    ) -> Result<Response<RB>, BoxError>
    where
        S: Service<Request<B>, Response = Response<RB>> + Clone,
        S::Error: Into<BoxError>,
        B: From<Bytes>,
        RB: Body + From<Bytes>,
        RB::Error: Into<BoxError>,
    {
        let start = Instant::now();
        let mut attempts: u32 = 0;
        loop {
            if attempts > 0 {
                svc = svc.clone();
                std::future::poll_fn(|cx| svc.poll_ready(cx))
                    .await
                    .map_err(Into::into)?;
            }
            attempts += 1;
            let mut req = Request::new(B::from(bytes.clone()));
            *req.method_mut() = parts.method.clone();
            *req.uri_mut() = parts.uri.clone();
            *req.version_mut() = parts.version;
            *req.headers_mut() = parts.headers.clone();
            *req.extensions_mut() = parts.extensions.clone();
            let fut = svc.call(req);
            let result = match self.cfg.attempt_timeout {
                Some(t) => tokio::time::timeout(t, fut).await.ok(),
                None => Some(fut.await),
            }
            // The inner error itself is not kept: only that there was no answer.
            .and_then(Result::ok);
            let (response, problem) = match result {
                Some(resp) => match read_problem(resp).await {
                    Ok((resp, problem)) => (Some(resp), problem),
                    Err(()) => (None, None),
                },
                // A generic service error cannot tell "not sent" from "sent,
                // no answer": treated as ambiguous, safe with the same key.
                None => (None, None),
            };
            let elapsed = start.elapsed();
            let view = match &response {
                Some(r) => AttemptView::Response {
                    status: r.status(),
                    headers: r.headers(),
                    problem: problem.as_ref(),
                },
                None => AttemptView::Transport(TransportFailure::Ambiguous),
            };
            let state = SendState {
                attempts,
                elapsed,
                key_age: Some(self.key_age.unwrap_or_default() + elapsed),
                now: SystemTime::now(),
            };
            let mut step = self.cfg.policy.decide(&view, state, &mut os_random);
            if self.single && matches!(step, crate::Step::Retry { .. }) {
                step = crate::Step::Stop(if response.is_some() {
                    StopReason::MaxAttempts
                } else {
                    StopReason::Transport
                });
            }
            let kind = match send::then(step, attempts) {
                Then::Done(kind) => kind,
                Then::Wait(delay) => {
                    drop(response);
                    tokio::time::sleep(delay).await;
                    continue;
                }
            };
            send::finish(
                &self.span,
                kind,
                attempts,
                response.as_ref().map(|r| r.status().as_u16()),
                problem.as_ref(),
            );
            let Some(mut resp) = response else {
                let reason = match kind {
                    ReportKind::Exhausted(r) => r,
                    _ => StopReason::Transport,
                };
                return Err(Box::new(Error::Exhausted {
                    key: self.key,
                    attempts,
                    reason,
                    last_status: None,
                    elapsed,
                }));
            };
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

/// Reads a problem body (declared length within [`MAX_PROBLEM_BYTES`]) and
/// rebuilds the response around the bytes; other bodies are not touched.
async fn read_problem<RB>(resp: Response<RB>) -> Result<(Response<RB>, Option<Problem>), ()>
where
    RB: Body + From<Bytes>,
    RB::Error: Into<BoxError>,
{
    let is_problem = resp
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(Problem::is_problem_content_type);
    let small = resp
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .is_some_and(|n| n <= MAX_PROBLEM_BYTES);
    if !is_problem || !small {
        return Ok((resp, None));
    }
    let (parts, body) = resp.into_parts();
    let bytes = Limited::new(body, MAX_PROBLEM_BYTES)
        .collect()
        .await
        .map_err(|_| ())?
        .to_bytes();
    let problem = Problem::from_slice(&bytes);
    Ok((Response::from_parts(parts, RB::from(bytes)), problem))
}
