//! The service the layer wraps around each handler. Step 1 of a request:
//! a method the layer does not cover passes untouched; a covered one goes
//! through `request.rs` (steps 2 to 6), `exec.rs` (7 to 10) and, when the
//! layer answers on its own, `respond.rs`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use idem_core::store::{BoxDynError, Store};
use tower_service::Service;
use tracing::{Instrument, info_span};

use crate::body::IdemBody;
use crate::exec;
use crate::layer::Shared;
use crate::owner::OwnerSource;
use crate::request::{self, Step};
use crate::respond::reject;

/// A boxed `Send + 'static` future.
pub type ResponseFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'static>>;

/// The service the layer wraps around a handler.
pub struct IdempotencyService<Svc, S, O> {
    inner: Svc,
    shared: Arc<Shared<S, O>>,
}

impl<Svc, S, O> IdempotencyService<Svc, S, O> {
    pub(crate) fn new(inner: Svc, shared: Arc<Shared<S, O>>) -> Self {
        Self { inner, shared }
    }
}

impl<Svc: Clone, S, O> Clone for IdempotencyService<Svc, S, O> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<Svc: fmt::Debug, S, O> fmt::Debug for IdempotencyService<Svc, S, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<Svc, S, O, ReqB, ResB> Service<Request<ReqB>> for IdempotencyService<Svc, S, O>
where
    Svc: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    Svc::Future: Send + 'static,
    Svc::Error: Send + 'static,
    ReqB: http_body::Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqB::Error: Into<BoxDynError>,
    ResB: http_body::Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxDynError>,
    S: Store,
    O: OwnerSource,
{
    type Response = Response<IdemBody<ResB>>;
    type Error = Svc::Error;
    type Future = ResponseFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        if !self.shared.cfg.methods.contains(req.method()) {
            // Step 1: not covered: untouched, nothing buffered or checked.
            let fut = self.inner.call(req);
            return Box::pin(async move { fut.await.map(|r| r.map(IdemBody::inner)) });
        }
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        let span = info_span!(
            "idem.http",
            method = %req.method(),
            route = tracing::field::Empty,
            record = tracing::field::Empty,
            outcome = tracing::field::Empty,
            code = tracing::field::Empty,
            status = tracing::field::Empty,
        );
        let covered = async move {
            // Steps 2 to 6.
            let (req, prepared, key) = match request::prepare(&shared, req).await {
                Step::PassThrough(req) => {
                    let res = inner.call(req).await?;
                    return Ok(res.map(IdemBody::inner));
                }
                Step::Reject(r, key) => return Ok(reject(&shared, &r, key.as_deref())),
                Step::Run { req, prepared, key } => (req, prepared, key),
            };
            let key_text = key.as_str().to_owned();
            // Steps 7 to 10.
            match exec::run(Arc::clone(&shared), inner, req, prepared, key).await? {
                exec::Answer::Response(r) | exec::Answer::Replayed { response: r, .. } => Ok(r),
                exec::Answer::Reject(r) => Ok(reject(&shared, &r, Some(&key_text))),
            }
        };
        Box::pin(covered.instrument(span))
    }
}
