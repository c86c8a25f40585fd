//! The service a layer wraps around each handler, the same for the
//! `Idempotency-Key` layer and the webhook receiver. Step 1 of a request: a
//! request the layer does not cover passes untouched. A covered one goes
//! through the layer's [`Mode`]: its key source (steps 2 to 6: the
//! `Idempotency-Key` layer's `request.rs`, the webhook's verification and
//! event id), then the one executor `exec.rs` (7 to 10), then the mode's
//! answer policy; when the layer answers on its own, `respond.rs`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Method, Request, Response};
use idem_core::IdempotencyKey;
use idem_core::adapter::Prepared;
use idem_core::store::{BoxDynError, Store};
use tower_service::Service;
use tracing::{Instrument, Span};

use crate::body::IdemBody;
use crate::config::Config;
use crate::exec::{self, Answer};
use crate::rejection::Rejection;
use crate::respond::reject;
use crate::state::Shared;

/// A boxed `Send + 'static` future.
pub type ResponseFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'static>>;

/// What a mode's key source does with a covered request.
#[allow(
    clippy::large_enum_variant,
    reason = "one value per request, moved once; boxing would add an allocation per request"
)]
pub(crate) enum Step<ReqB, C> {
    /// The handler alone (no key on a route where it is optional).
    PassThrough(Request<ReqB>),
    /// An empty-bodied answer that is not a problem (the webhook's 405).
    #[cfg_attr(
        not(feature = "webhook"),
        allow(dead_code, reason = "made by the webhook receiver only")
    )]
    Respond(Response<()>),
    /// The layer answers on its own; the received key, when there was one.
    Reject(Rejection, Option<String>),
    /// Claim the record and run (steps 7 to 10, `exec.rs`), then answer
    /// with `context`.
    Run {
        req: Request<ReqB>,
        prepared: Prepared,
        key: IdempotencyKey,
        context: C,
    },
}

/// What makes a layer the `Idempotency-Key` layer or the webhook receiver:
/// where a covered request's record comes from (the key source) and how the
/// executor's answer goes out (the answer policy). Everything between them
/// (the claim, the handler, capture, shutdown) is the one executor.
///
/// The `Idempotency-Key` layer's mode is its owner source (`request.rs`);
/// the webhook receiver's is [`WebhookMode`](crate::webhook::WebhookMode).
pub(crate) trait Mode: Sized + Send + Sync + 'static {
    /// What the key source hands on to the answer policy.
    type Context: Send + 'static;

    /// The request's span.
    fn span(&self, method: &Method) -> Span;

    /// Whether the request goes through the layer; one that does not is
    /// passed untouched (step 1).
    fn covers(&self, cfg: &Config, method: &Method) -> bool;

    /// Steps 2 to 6: the record's key, scope and fingerprint.
    fn prepare<S, ReqB>(
        shared: &Shared<S, Self>,
        req: Request<ReqB>,
    ) -> impl Future<Output = Step<ReqB, Self::Context>> + Send
    where
        S: Store,
        ReqB: http_body::Body<Data = Bytes> + From<Bytes> + Send + 'static,
        ReqB::Error: Into<BoxDynError>;

    /// The response for the executor's answer.
    fn answer<S, B>(
        shared: &Shared<S, Self>,
        context: Self::Context,
        answer: Answer<B>,
    ) -> Response<IdemBody<B>>;
}

/// The service a layer wraps around a handler. `M` is the layer's mode: the
/// owner source of an [`IdempotencyLayer`](crate::IdempotencyLayer), or
/// [`WebhookMode`](crate::webhook::WebhookMode) for a webhook receiver.
pub struct IdempotencyService<Svc, S, M> {
    inner: Svc,
    shared: Arc<Shared<S, M>>,
}

impl<Svc, S, M> IdempotencyService<Svc, S, M> {
    pub(crate) fn new(inner: Svc, shared: Arc<Shared<S, M>>) -> Self {
        Self { inner, shared }
    }
}

impl<Svc: Clone, S, M> Clone for IdempotencyService<Svc, S, M> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<Svc: fmt::Debug, S, M> fmt::Debug for IdempotencyService<Svc, S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<Svc, S, M, ReqB, ResB> Service<Request<ReqB>> for IdempotencyService<Svc, S, M>
where
    Svc: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    Svc::Future: Send + 'static,
    Svc::Error: Send + 'static,
    ReqB: http_body::Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqB::Error: Into<BoxDynError>,
    ResB: http_body::Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxDynError>,
    S: Store,
    M: Mode,
{
    type Response = Response<IdemBody<ResB>>;
    type Error = Svc::Error;
    type Future = ResponseFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        if !self.shared.mode.covers(&self.shared.cfg, req.method()) {
            // Step 1: not covered: untouched, nothing buffered or checked.
            let fut = self.inner.call(req);
            return Box::pin(async move { fut.await.map(|r| r.map(IdemBody::inner)) });
        }
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        let span = shared.mode.span(req.method());
        let covered = async move {
            // Steps 2 to 6.
            let (req, prepared, key, context) = match M::prepare(&shared, req).await {
                Step::PassThrough(req) => {
                    let res = inner.call(req).await?;
                    return Ok(res.map(IdemBody::inner));
                }
                Step::Respond(res) => return Ok(res.map(|()| IdemBody::full(Bytes::new()))),
                Step::Reject(r, key) => return Ok(reject(&shared, &r, key.as_deref())),
                Step::Run {
                    req,
                    prepared,
                    key,
                    context,
                } => (req, prepared, key, context),
            };
            // Steps 7 to 10.
            let answer = exec::run(Arc::clone(&shared), inner, req, prepared, key).await?;
            Ok(M::answer(&shared, context, answer))
        };
        Box::pin(covered.instrument(span))
    }
}
