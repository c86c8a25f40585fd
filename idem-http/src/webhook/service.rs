//! The service the webhook layer wraps around a handler: the pipeline of
//! the module docs, in order. Steps 1 to 5 run here, before anything is
//! claimed; step 6 is the shared executor (`exec.rs`); step 7 maps its
//! answer onto what a provider understands.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use idem_core::Error;
use idem_core::IdempotencyKey;
use idem_core::RawJson;
use idem_core::RecordId;
use idem_core::adapter::Prepared;
use idem_core::adapter::sha256_hex;
use idem_core::error::RequestError;
use idem_core::store::BoxDynError;
use idem_core::store::Store;
use idem_core::wire::header::IDEMPOTENT_REPLAYED;
use tower_service::Service;
use tracing::{Instrument, error, info_span, warn};

use super::delivery::{Delivery, WebhookDelivery};
use super::layer::{DuplicateAnswer, Hook, PermanentFailure, WebhookLayer};
use super::provider::EventId;
use super::verify::VerifyError;
use crate::body::IdemBody;
use crate::envelope::{BodyFingerprint, FingerprintSpec, RequestView, fingerprint_request};
use crate::exec::{self, Answer};
use crate::headers::Class;
use crate::rejection::Rejection;
use crate::request::read_limited;
use crate::respond::reject;
use crate::service::ResponseFuture;

/// The service the [`WebhookLayer`] wraps around a handler.
pub struct WebhookService<Svc, S> {
    inner: Svc,
    layer: WebhookLayer<S>,
}

impl<Svc, S> WebhookService<Svc, S> {
    pub(crate) fn new(inner: Svc, layer: WebhookLayer<S>) -> Self {
        Self { inner, layer }
    }
}

impl<Svc: Clone, S> Clone for WebhookService<Svc, S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<Svc: fmt::Debug, S> fmt::Debug for WebhookService<Svc, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// A delivery's result, the `result` label of
/// `idem_webhook_deliveries_total`.
#[derive(Clone, Copy)]
enum Result_ {
    VerifiedFailed,
    Fresh,
    Duplicate,
    InFlight,
    Transient,
    PermanentFailure,
}

#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
fn count(hook: &Hook, result: Result_) {
    #[cfg(feature = "metrics")]
    {
        let result = match result {
            Result_::VerifiedFailed => "verified_failed",
            Result_::Fresh => "fresh",
            Result_::Duplicate => "duplicate",
            Result_::InFlight => "in_flight",
            Result_::Transient => "transient",
            Result_::PermanentFailure => "permanent_failure",
        };
        metrics::counter!(
            "idem_webhook_deliveries_total",
            "provider" => hook.provider.name.clone(),
            "result" => result,
        )
        .increment(1);
    }
}

impl<Svc, S, ReqB, ResB> Service<Request<ReqB>> for WebhookService<Svc, S>
where
    Svc: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    Svc::Future: Send + 'static,
    Svc::Error: Send + 'static,
    ReqB: http_body::Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqB::Error: Into<BoxDynError>,
    ResB: http_body::Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxDynError>,
    S: Store,
{
    type Response = Response<IdemBody<ResB>>;
    type Error = Svc::Error;
    type Future = ResponseFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        let span = info_span!(
            "idem.webhook",
            provider = %layer.hook.provider.name,
            record = tracing::field::Empty,
            outcome = tracing::field::Empty,
            code = tracing::field::Empty,
            status = tracing::field::Empty,
        );
        Box::pin(deliver(layer, inner, req).instrument(span))
    }
}

/// Steps 1 to 7.
async fn deliver<Svc, S, ReqB, ResB>(
    layer: WebhookLayer<S>,
    inner: Svc,
    req: Request<ReqB>,
) -> Result<Response<IdemBody<ResB>>, Svc::Error>
where
    Svc: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    Svc::Future: Send + 'static,
    Svc::Error: Send + 'static,
    ReqB: http_body::Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqB::Error: Into<BoxDynError>,
    ResB: http_body::Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxDynError>,
    S: Store,
{
    let (shared, hook) = (&layer.shared, &*layer.hook);
    // Step 1: POST only.
    if req.method() != Method::POST {
        let mut res = Response::new(IdemBody::full(Bytes::new()));
        *res.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
        res.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        return Ok(res);
    }
    if shared.closed.load(Ordering::SeqCst) {
        return Ok(reject(shared, &Rejection::ShuttingDown, None));
    }
    // Step 2: the body, bounded, before anything is parsed.
    let (mut parts, body) = req.into_parts();
    let bytes = match read_limited(shared.cfg.max_request_body, &parts, body).await {
        Ok(b) => b,
        Err(r) => return Ok(reject(shared, &r, None)),
    };
    // Steps 3 and 4: the signature headers, the timestamp, the HMAC.
    let now = shared.idem.clock().now();
    let verified = match hook
        .provider
        .verifier
        .verify(&parts, &bytes, now, hook.tolerance)
    {
        Ok(t) => t,
        Err(e) => {
            warn!(provider = %hook.provider.name, reason = %e, "webhook refused before any claim");
            count(hook, Result_::VerifiedFailed);
            let r = match e {
                VerifyError::Malformed(reason) => Rejection::MalformedWebhook { reason },
                VerifyError::Stale => Rejection::StaleWebhook {
                    tolerance: hook.tolerance,
                },
                VerifyError::NoMatch => Rejection::InvalidSignature,
            };
            return Ok(reject(shared, &r, None));
        }
    };
    // Step 5: the event id, from the verified request.
    let (event_id, key) = match event_key(hook, &parts, &bytes, verified.event_id) {
        Ok(k) => k,
        Err(r) => return Ok(reject(shared, &r, None)),
    };
    // Step 6: scope, key and fingerprint, then the shared executor.
    let fingerprint = match fingerprint(hook, &parts, &bytes) {
        Ok(f) => f,
        Err(e) => {
            let r = Rejection::Engine(Error::InvalidRequest(e));
            return Ok(reject(shared, &r, Some(&event_id)));
        }
    };
    let id = RecordId::new(hook.scope.clone(), key.clone());
    tracing::Span::current().record("record", id.log_hash().as_str());
    let delivery = Delivery {
        provider: hook.provider.name.clone(),
        endpoint: Arc::from(hook.scope.owner()),
        event_id,
        key: key.clone(),
        timestamp: verified.timestamp,
    };
    parts.extensions.insert(WebhookDelivery(delivery.clone()));
    let req = Request::from_parts(parts, ReqB::from(bytes));
    let answer = exec::run(
        Arc::clone(shared),
        inner,
        req,
        Prepared::new(id, fingerprint),
        key,
    )
    .await?;
    // Step 7: the answer a provider understands.
    Ok(match answer {
        Answer::Response(res) => fresh(&layer, &delivery, res),
        Answer::Replayed { response, failure } => {
            count(hook, Result_::Duplicate);
            match (hook.duplicate, failure, hook.permanent) {
                (DuplicateAnswer::Replay, false, _)
                | (DuplicateAnswer::Replay, true, PermanentFailure::PassThrough) => response,
                _ => ack(true),
            }
        }
        Answer::Reject(Rejection::Engine(
            Error::ResponseExpired { .. } | Error::ResponseNotStored { .. },
        )) => {
            count(hook, Result_::Duplicate);
            ack(true)
        }
        Answer::Reject(r) => {
            match &r {
                Rejection::Engine(Error::InFlight { .. }) => count(hook, Result_::InFlight),
                Rejection::Engine(Error::FingerprintMismatch) => error!(
                    provider = %hook.provider.name,
                    event_id = %delivery.event_id,
                    "the same event id arrived with another body"
                ),
                Rejection::HandlerPanicked { .. } | Rejection::ResponseBodyFailed => {
                    count(hook, Result_::Transient);
                }
                _ => {}
            }
            reject(shared, &r, Some(&delivery.event_id))
        }
    })
}

/// The handler ran: a permanent failure is reported and (by default)
/// acknowledged; anything else goes out as the handler made it.
fn fresh<S, B>(
    layer: &WebhookLayer<S>,
    delivery: &Delivery,
    res: Response<IdemBody<B>>,
) -> Response<IdemBody<B>> {
    let hook = &*layer.hook;
    let (parts, body) = res.into_parts();
    match exec::class_of(&layer.shared.cfg, &parts) {
        Class::Failure => {
            count(hook, Result_::PermanentFailure);
            warn!(
                provider = %hook.provider.name,
                event_id = %delivery.event_id,
                status = parts.status.as_u16(),
                "permanent webhook failure: stored, redeliveries are duplicates"
            );
            if let Some(f) = &hook.on_permanent {
                f(delivery, &parts);
            }
            match hook.permanent {
                PermanentFailure::Acknowledge => ack(false),
                PermanentFailure::PassThrough => Response::from_parts(parts, body),
            }
        }
        Class::Transient => {
            count(hook, Result_::Transient);
            Response::from_parts(parts, body)
        }
        _ => {
            count(hook, Result_::Fresh);
            Response::from_parts(parts, body)
        }
    }
}

/// `200`, an empty body, and the replay marker on a duplicate.
fn ack<B>(replayed: bool) -> Response<IdemBody<B>> {
    let mut res = Response::new(IdemBody::full(Bytes::new()));
    if replayed {
        res.headers_mut().insert(
            http::HeaderName::from_static(IDEMPOTENT_REPLAYED),
            HeaderValue::from_static("true"),
        );
    }
    res
}

/// The event id as received, and the key: the id itself when it passes the
/// key rules unchanged, else `derive(provider, id)`.
fn event_key(
    hook: &Hook,
    parts: &http::request::Parts,
    body: &[u8],
    signed: Option<String>,
) -> Result<(String, IdempotencyKey), Rejection> {
    let header = |h: &http::HeaderName| {
        parts
            .headers
            .get(h)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    };
    let hashed = || sha256_hex(body);
    let found = match &hook.event_id {
        EventId::Signed => signed.filter(|s| !s.trim().is_empty()),
        EventId::Header(h) => header(h),
        EventId::JsonPointer(p) => {
            let value = RawJson(body)
                .parse()
                .map_err(|e| Rejection::MalformedWebhook {
                    reason: match e {
                        RequestError::DuplicateMember => {
                            "the body names a JSON member twice".into()
                        }
                        _ => "the body is not JSON the event id can be read from".into(),
                    },
                })?;
            match value.pointer(p) {
                Some(serde_json::Value::String(s)) if !s.is_empty() => Some(s.clone()),
                Some(serde_json::Value::Number(n)) => Some(n.to_string()),
                _ => None,
            }
        }
        EventId::BodyHash => {
            let h = hashed();
            return Ok((h.clone(), IdempotencyKey::derive(&hook.provider.name, &h)));
        }
    };
    let Some(id) = found else {
        if hook.fallback_body_hash {
            let h = hashed();
            return Ok((h.clone(), IdempotencyKey::derive(&hook.provider.name, &h)));
        }
        return Err(Rejection::MissingEventId);
    };
    let key = match IdempotencyKey::parse(&id) {
        Ok(k) if k.as_str() == id => k,
        _ => IdempotencyKey::derive(&hook.provider.name, &id),
    };
    Ok((id, key))
}

/// No body by default (every delivery of one operation has the same
/// fingerprint); with `fingerprint_body(true)`, canonical JSON or the bytes.
fn fingerprint(
    hook: &Hook,
    parts: &http::request::Parts,
    body: &[u8],
) -> Result<idem_core::adapter::Fingerprint, RequestError> {
    let op = hook.scope.operation();
    let spec = FingerprintSpec::default()
        .include_query(false)
        .body(if hook.fingerprint_body {
            BodyFingerprint::Auto
        } else {
            BodyFingerprint::Ignore
        });
    let view = RequestView {
        method: "POST",
        route: op,
        path: op,
        query: None,
        headers: &[],
        content_type: parts
            .headers
            .get(header::CONTENT_TYPE)
            .map(HeaderValue::as_bytes),
        body,
    };
    fingerprint_request(op, &view, &spec)
}
