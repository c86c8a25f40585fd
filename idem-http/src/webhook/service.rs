//! The webhook receiver's mode of the idempotency service: the pipeline of
//! the module docs, in order. Steps 1 to 5 (the key source) run here,
//! before anything is claimed; step 6 is the shared executor (`exec.rs`);
//! step 7 (the answer policy) maps its answer onto what a provider
//! understands.

use std::sync::Arc;

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
use tracing::{Span, error, info_span, warn};

use super::config::{DuplicateAnswer, WebhookMode, WebhookPermanentFailure};
use super::delivery::{Delivery, WebhookDelivery};
use super::provider::EventId;
use super::verify::VerifyError;
use crate::body::IdemBody;
use crate::config::Config;
use crate::envelope::{BodyFingerprint, FingerprintSpec, RequestView, fingerprint_request};
use crate::exec::{self, Answer};
use crate::headers::Class;
use crate::rejection::Rejection;
use crate::request::read_limited;
use crate::respond::reject;
use crate::service::{IdempotencyService, Mode, Step};
use crate::state::Shared;

/// The service a [`WebhookLayer`](super::WebhookLayer) wraps around a
/// handler: the idempotency service in [`WebhookMode`].
pub type WebhookService<Svc, S> = IdempotencyService<Svc, S, WebhookMode>;

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
fn count(hook: &WebhookMode, result: Result_) {
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

/// The key source is the verified delivery's event id; the answer policy
/// turns the executor's answer into what a provider understands.
impl Mode for WebhookMode {
    /// The verified delivery.
    type Context = Delivery;

    fn span(&self, _method: &Method) -> Span {
        info_span!(
            "idem.webhook",
            provider = %self.provider.name,
            record = tracing::field::Empty,
            outcome = tracing::field::Empty,
            code = tracing::field::Empty,
            status = tracing::field::Empty,
        )
    }

    /// Every method: anything but `POST` is answered 405.
    fn covers(&self, _cfg: &Config, _method: &Method) -> bool {
        true
    }

    /// Steps 1 to 6.
    async fn prepare<S, ReqB>(shared: &Shared<S, Self>, req: Request<ReqB>) -> Step<ReqB, Delivery>
    where
        S: Store,
        ReqB: http_body::Body<Data = Bytes> + From<Bytes> + Send + 'static,
        ReqB::Error: Into<BoxDynError>,
    {
        let hook = &shared.mode;
        // Step 1: POST only.
        if req.method() != Method::POST {
            let mut res = Response::new(());
            *res.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
            res.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("POST"));
            return Step::Respond(res);
        }
        if shared.is_closed() {
            return Step::Reject(Rejection::ShuttingDown, None);
        }
        // Step 2: the body, bounded, before anything is parsed.
        let (mut parts, body) = req.into_parts();
        let bytes = match read_limited(shared.cfg.max_request_body, &parts, body).await {
            Ok(b) => b,
            Err(r) => return Step::Reject(r, None),
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
                return Step::Reject(r, None);
            }
        };
        // Step 5: the event id, from the verified request.
        let (event_id, key) = match event_key(hook, &parts, &bytes, verified.event_id) {
            Ok(k) => k,
            Err(r) => return Step::Reject(r, None),
        };
        // Step 6: scope, key and fingerprint, then the shared executor.
        let fingerprint = match fingerprint(hook, &parts, &bytes) {
            Ok(f) => f,
            Err(e) => {
                let r = Rejection::Engine(Error::InvalidRequest(e));
                return Step::Reject(r, Some(event_id));
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
        Step::Run {
            req: Request::from_parts(parts, ReqB::from(bytes)),
            prepared: Prepared::new(id, fingerprint),
            key,
            context: delivery,
        }
    }

    /// Step 7: the answer a provider understands.
    fn answer<S, B>(
        shared: &Shared<S, Self>,
        delivery: Delivery,
        answer: Answer<B>,
    ) -> Response<IdemBody<B>> {
        let hook = &shared.mode;
        match answer {
            Answer::Response(res) => fresh(shared, &delivery, res),
            Answer::Replayed { response, failure } => {
                count(hook, Result_::Duplicate);
                match (hook.duplicate, failure, hook.permanent.policy()) {
                    (DuplicateAnswer::Replay, false, _)
                    | (DuplicateAnswer::Replay, true, WebhookPermanentFailure::PassThrough) => {
                        response
                    }
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
        }
    }
}

/// The handler ran: a permanent failure is reported and (by default)
/// acknowledged; anything else goes out as the handler made it.
fn fresh<S, B>(
    shared: &Shared<S, WebhookMode>,
    delivery: &Delivery,
    res: Response<IdemBody<B>>,
) -> Response<IdemBody<B>> {
    let hook = &shared.mode;
    let (parts, body) = res.into_parts();
    match exec::class_of(&shared.cfg, &parts) {
        Class::Failure => {
            count(hook, Result_::PermanentFailure);
            warn!(
                provider = %hook.provider.name,
                event_id = %delivery.event_id,
                status = parts.status.as_u16(),
                "permanent webhook failure: stored, redeliveries are duplicates"
            );
            match hook.permanent.report(|f| f(delivery, &parts)) {
                WebhookPermanentFailure::Acknowledge => ack(false),
                WebhookPermanentFailure::PassThrough => Response::from_parts(parts, body),
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
    hook: &WebhookMode,
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
    hook: &WebhookMode,
    parts: &http::request::Parts,
    body: &[u8],
) -> Result<idem_core::store::Fingerprint, RequestError> {
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
