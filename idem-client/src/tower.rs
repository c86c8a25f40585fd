//! The `tower` client front-end (feature `tower`): the same policy and key
//! rules over any `Service<http::Request<B>>`.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, Limited};
use idem_core::store::BoxDynError;
use idem_core::wire::DEFAULT_MAX_REQUEST_BODY;
use tower_layer::Layer;
use tower_service::Service;
use tracing::Instrument;

use crate::{
    Error, MAX_PROBLEM_BYTES, Problem,
    config::{ClientConfigError, Config, IdempotencyClientBuilder},
    policy::TransportFailure,
    send::{self, Sending, SingleAttempt},
};

/// A tower layer that gives every covered request one key, kept across its
/// retries, and retries only what the server's answer allows.
///
/// The request body is collected once (up to [`max_request_body`](Self::max_request_body))
/// so every attempt sends the same bytes; a larger body is
/// [`Error::BodyNotReplayable`], nothing sent. Every response carries a
/// [`Report`](crate::Report) in its extensions.
#[derive(Debug, Clone)]
pub struct IdempotencyClientLayer {
    config: Arc<Config>,
    max_request_body: usize,
}

impl IdempotencyClientLayer {
    /// A builder with every default (the same one as the reqwest middleware).
    pub fn builder() -> IdempotencyClientBuilder {
        IdempotencyClientBuilder::default()
    }

    /// The largest request body collected for replay (default 2 MiB).
    #[must_use]
    pub fn max_request_body(mut self, bytes: usize) -> Self {
        self.max_request_body = bytes;
        self
    }
}

impl IdempotencyClientBuilder {
    /// The tower layer.
    ///
    /// # Errors
    ///
    /// [`ClientConfigError`] for a setting that cannot work.
    pub fn build_layer(self) -> Result<IdempotencyClientLayer, ClientConfigError> {
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

/// The service [`IdempotencyClientLayer`] makes. Its error is
/// `idem_core::store::BoxDynError` (`tower::BoxError`): an [`Error`] of this
/// crate (downcast it), or the inner service's own error.
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
    S::Error: Into<BoxDynError>,
    B: Body + From<Bytes> + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxDynError>,
    RB: Body + From<Bytes> + Send + 'static,
    RB::Data: Send,
    RB::Error: Into<BoxDynError>,
{
    type Response = Response<RB>;
    type Error = BoxDynError;
    type Future = BoxFuture<Result<Response<RB>, BoxDynError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxDynError>> {
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
                    return Err(Box::new(send::refused(Error::BodyNotReplayable)) as BoxDynError);
                }
            };
            let span = send::span(
                &parts.method,
                parts.uri.host().unwrap_or(""),
                parts.uri.path(),
                &key,
            );
            let sending = Sending::new(&cfg, key, key_age, single, span.clone());
            run(&sending, inner, parts, bytes).instrument(span).await
        })
    }
}

/// The attempts of one send, each a fresh request around the same bytes,
/// each result handed to [`Sending::answered`].
async fn run<S, B, RB>(
    sending: &Sending<'_>,
    mut svc: S,
    parts: http::request::Parts,
    bytes: Bytes,
) -> Result<Response<RB>, BoxDynError>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxDynError>,
    B: From<Bytes>,
    RB: Body + From<Bytes>,
    RB::Error: Into<BoxDynError>,
{
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
        // The inner error itself is not kept: only that there was no answer.
        // A generic service error cannot tell "not sent" from "sent, no
        // answer": treated as ambiguous, safe with the same key.
        let attempted = match sending.within(svc.call(req)).await.and_then(Result::ok) {
            Some(resp) => read_problem(resp)
                .await
                .map_err(|()| TransportFailure::Ambiguous),
            None => Err(TransportFailure::Ambiguous),
        };
        match sending.answered(attempts, attempted) {
            send::Next::Wait(delay) => tokio::time::sleep(delay).await,
            send::Next::Done(done) => return done.map_err(Into::into),
        }
    }
}

/// Reads a problem body (declared length within [`MAX_PROBLEM_BYTES`]) and
/// rebuilds the response around the bytes; other bodies are not touched.
async fn read_problem<RB>(resp: Response<RB>) -> Result<(Response<RB>, Option<Problem>), ()>
where
    RB: Body + From<Bytes>,
    RB::Error: Into<BoxDynError>,
{
    let small = resp
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .is_some_and(|n| n <= MAX_PROBLEM_BYTES);
    if !send::announces_problem(resp.headers()) || !small {
        return Ok((resp, None));
    }
    let (parts, body) = resp.into_parts();
    let (bytes, problem) = send::collect_problem(body).await?;
    Ok((Response::from_parts(parts, RB::from(bytes)), problem))
}
