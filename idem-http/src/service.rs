//! The tower service: the request pipeline of spec 2.4, steps 1 to 6.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idem_core::IdempotencyKey;
use idem_core::RecordId;
use idem_core::Scope;
use idem_core::adapter::Prepared;
use idem_core::store::Store;
use tower_layer::Layer;
use tower_service::Service;
use tracing::{Instrument, error, info, info_span, warn};

use crate::body::{BoxError, IdemBody};
use crate::exec;
use crate::layer::{IdempotencyLayer, KeyNamespace, KeyRequirement, OperationSource, Shared};
use crate::owner::OwnerSource;
use crate::pipeline::{
    BodyFingerprint, KeyHeaderError, RequestView, fingerprint_request, parse_key_header,
};
use crate::rejection::Rejection;

/// The validated key of a covered request, in the request's extensions.
#[derive(Debug, Clone)]
pub struct IdemKey(pub IdempotencyKey);

/// The handler's [`Attempt`](idem_core::Attempt) (recovery information,
/// saved resource id, downstream keys), in the request's extensions.
#[derive(Debug, Clone)]
pub struct IdemAttempt(pub idem_core::Attempt);

/// A boxed `Send + 'static` future.
pub type ResponseFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'static>>;

/// The service the layer wraps around a handler.
pub struct IdempotencyService<Svc, S, O> {
    inner: Svc,
    shared: Arc<Shared<S, O>>,
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

impl<Svc, S, O> Layer<Svc> for IdempotencyLayer<S, O> {
    type Service = IdempotencyService<Svc, S, O>;

    fn layer(&self, inner: Svc) -> Self::Service {
        IdempotencyService {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<Svc, S, O, ReqB, ResB> Service<Request<ReqB>> for IdempotencyService<Svc, S, O>
where
    Svc: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    Svc::Future: Send + 'static,
    Svc::Error: Send + 'static,
    ReqB: http_body::Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ResB: http_body::Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
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
        let inner = std::mem::replace(&mut self.inner, clone);
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
        Box::pin(handle(shared, inner, req).instrument(span))
    }
}

/// The route template: axum's `MatchedPath` when present, else the path.
fn route_of(parts: &http::request::Parts) -> String {
    #[cfg(feature = "axum")]
    if let Some(m) = parts.extensions.get::<axum::extract::MatchedPath>() {
        return m.as_str().to_owned();
    }
    parts.uri.path().to_owned()
}

/// The path as the client sent it: inside a nested axum router
/// (`Router::nest`) the request's URI has lost the prefix, and axum keeps
/// the original in `OriginalUri`; the fingerprint hashes the received path,
/// as the route (`MatchedPath`) already holds the prefix.
fn received_path(parts: &http::request::Parts) -> &str {
    #[cfg(feature = "axum")]
    if let Some(axum::extract::OriginalUri(uri)) = parts.extensions.get() {
        return uri.path();
    }
    parts.uri.path()
}

fn received(lines: &[&HeaderValue]) -> Option<String> {
    let first = lines.first()?;
    let text = String::from_utf8_lossy(first.as_bytes());
    let t = text.trim_matches([' ', '\t']);
    Some(
        t.strip_prefix('"')
            .and_then(|s| s.strip_suffix('"'))
            .unwrap_or(t)
            .to_owned(),
    )
}

async fn handle<Svc, S, O, ReqB, ResB>(
    shared: Arc<Shared<S, O>>,
    mut inner: Svc,
    req: Request<ReqB>,
) -> Result<Response<IdemBody<ResB>>, Svc::Error>
where
    Svc: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    Svc::Future: Send + 'static,
    Svc::Error: Send + 'static,
    ReqB: http_body::Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ResB: http_body::Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
    S: Store,
    O: OwnerSource,
{
    let cfg = &shared.cfg;
    let (parts, body) = req.into_parts();

    // Step 2: the key.
    let lines: Vec<&HeaderValue> = parts.headers.get_all(&cfg.key_header).iter().collect();
    let raw: Vec<&[u8]> = lines.iter().map(|v| v.as_bytes()).collect();
    let key = match parse_key_header(&raw, cfg.key_syntax) {
        Ok(Some(k)) => k,
        Ok(None) => match cfg.key {
            KeyRequirement::Required => return Ok(reject(&shared, &Rejection::MissingKey, None)),
            KeyRequirement::Optional => {
                tracing::Span::current().record("outcome", "passthrough");
                let res = inner.call(Request::from_parts(parts, body)).await?;
                return Ok(res.map(IdemBody::inner));
            }
        },
        Err(reason) => {
            let r = Rejection::InvalidKey {
                reason,
                received: received(&lines),
            };
            return Ok(reject(&shared, &r, None));
        }
    };
    drop(lines);
    let key_text = key.as_str().to_owned();
    if let Some(validate) = &cfg.key_validator
        && validate(&key).is_err()
    {
        let r = Rejection::InvalidKey {
            reason: KeyHeaderError::RejectedByValidator,
            received: Some(key_text),
        };
        return Ok(reject(&shared, &r, None));
    }
    if shared.closed.load(Ordering::SeqCst) {
        return Ok(reject(&shared, &Rejection::ShuttingDown, Some(&key_text)));
    }

    // Steps 3 and 4: owner and operation.
    let route = route_of(&parts);
    tracing::Span::current().record("route", route.as_str());
    let operation = match (&cfg.namespace, &cfg.operation) {
        (KeyNamespace::PerOwner, _) => "http".to_owned(),
        (_, OperationSource::Fixed(s)) => s.clone().into_owned(),
        (_, OperationSource::Fn(f)) => {
            f(&parts).unwrap_or_else(|| format!("{} {route}", parts.method))
        }
        _ => format!("{} {route}", parts.method),
    };
    let scope = shared
        .owner
        .owner(&parts)
        .and_then(|owner| Scope::new(owner, operation.as_str()).ok());
    let Some(scope) = scope else {
        error!(
            "owner unavailable: is the auth layer missing or placed inside the idempotency layer?"
        );
        return Ok(reject(
            &shared,
            &Rejection::OwnerUnavailable,
            Some(&key_text),
        ));
    };

    // Step 5: the body, bounded.
    let limit = cfg.max_request_body;
    let (bytes, body) = if cfg.fingerprint.body_mode() == BodyFingerprint::Ignore {
        (Bytes::new(), Some(body))
    } else {
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let too_large = Rejection::RequestTooLarge { limit };
        if declared.is_some_and(|n| n > limit as u64)
            || http_body::Body::size_hint(&body).lower() > limit as u64
        {
            return Ok(reject(&shared, &too_large, Some(&key_text)));
        }
        match Limited::new(body, limit).collect().await {
            Ok(c) => (c.to_bytes(), None),
            Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
                return Ok(reject(&shared, &too_large, Some(&key_text)));
            }
            Err(_) => {
                return Ok(reject(
                    &shared,
                    &Rejection::RequestBodyUnreadable,
                    Some(&key_text),
                ));
            }
        }
    };

    // Step 6: the fingerprint.
    let names = cfg.fingerprint.header_names();
    let headers: Vec<(&str, &[u8])> = if names.is_empty() {
        Vec::new()
    } else {
        parts
            .headers
            .iter()
            .filter(|(n, _)| names.iter().any(|h| h == n.as_str()))
            .map(|(n, v)| (n.as_str(), v.as_bytes()))
            .collect()
    };
    let view = RequestView {
        method: parts.method.as_str(),
        route: &route,
        path: received_path(&parts),
        query: parts.uri.query(),
        headers: &headers,
        content_type: parts
            .headers
            .get(header::CONTENT_TYPE)
            .map(HeaderValue::as_bytes),
        body: &bytes,
    };
    let fp = match fingerprint_request(scope.operation(), &view, &cfg.fingerprint) {
        Ok(fp) => fp,
        Err(e) => {
            let r = Rejection::Engine(idem_core::Error::InvalidRequest(e));
            return Ok(reject(&shared, &r, Some(&key_text)));
        }
    };
    drop(headers);
    let id = RecordId::new(scope, key.clone());
    tracing::Span::current().record("record", id.log_hash().as_str());
    let prepared = Prepared {
        id,
        fingerprint: fp,
    };
    let body = body.unwrap_or_else(|| ReqB::from(bytes));
    let req = Request::from_parts(parts, body);

    // Steps 7 to 9.
    match exec::run(Arc::clone(&shared), inner, req, prepared, key).await {
        Ok(exec::Answer::Response(r)) => Ok(r),
        Ok(exec::Answer::Reject(r)) => Ok(reject(&shared, &r, Some(&key_text))),
        Err(e) => Err(e),
    }
}

/// Renders a rejection with the layer's settings, and logs its instance.
pub(crate) fn reject<S, O, B>(
    shared: &Shared<S, O>,
    r: &Rejection,
    key: Option<&str>,
) -> Response<IdemBody<B>> {
    let cfg = &shared.cfg;
    let mut problem = r.problem(key);
    if matches!(r, Rejection::OwnerUnavailable) {
        problem.status = cfg.missing_owner_status.as_u16();
    }
    let rendered = problem.render(&cfg.problem_types, cfg.docs_url.as_deref());
    let span = tracing::Span::current();
    span.record("outcome", "rejected");
    span.record("code", r.code());
    span.record("status", rendered.status);
    if rendered.status >= 500 {
        warn!(code = r.code(), instance = %rendered.instance, "idempotency rejection");
    } else {
        info!(code = r.code(), instance = %rendered.instance, "idempotency rejection");
    }
    let mut res = Response::new(IdemBody::full(rendered.body));
    *res.status_mut() = http::StatusCode::from_u16(rendered.status)
        .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    for (name, value) in rendered.headers {
        if let Ok(v) = HeaderValue::from_str(&value) {
            res.headers_mut().append(name, v);
        }
    }
    res
}
