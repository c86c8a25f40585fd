//! Steps 7 to 10 of a covered request: the engine, the handler, capture
//! and the answer.
//!
//! This is the one place that talks to the engine, through the claim guard:
//! `Idem::begin_prepared` answers a replay or a rejection, or hands over the
//! claim; the handler runs (in a tracked task when detached) and the claim
//! is completed, completed without a body, or released, before the response
//! goes out. A panic drops the claim mid-work: the record stays in flight
//! and is recovered after the lease, as core's "a panic is a crash" rule says.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode, header};
use http_body::Body;
use http_body_util::BodyExt;
use idem_core::adapter::{ClaimExt, EngineExt, Prepared, Settle, Settled};
use idem_core::store::{BoxDynError, Store};
use idem_core::{Begin, Error, HttpResponse, Outcome};
use tower_service::Service;
use tracing::{Instrument, warn};

use crate::body::IdemBody;
use crate::config::Config;
use crate::extract::{IdemAttempt, IdemKey};
use crate::headers::{Class, default_class, stored_headers};
use crate::rejection::Rejection;
use crate::state::Shared;

/// What the engine is told about the handler's response: release the key
/// (transient), complete without a body (streamed, oversized,
/// `CompleteWithoutBody`), or store it (success or permanent failure).
type Capture = Settle<HttpResponse, HttpResponse>;

/// What the handler side produced for this caller.
#[allow(
    clippy::large_enum_variant,
    reason = "one value per request, moved once; boxing would add an allocation per request"
)]
enum Done<B, E> {
    Response(Response<IdemBody<B>>),
    Err(E),
    Reject(Rejection),
}

#[allow(
    clippy::large_enum_variant,
    reason = "one value per request, moved once; boxing would add an allocation per request"
)]
pub(crate) enum Answer<B> {
    /// The handler ran: its response (or what stands in for it).
    Response(Response<IdemBody<B>>),
    /// A stored outcome, replayed with the marker(s); `failure` when it was
    /// stored as a permanent failure.
    Replayed {
        response: Response<IdemBody<B>>,
        #[cfg_attr(
            not(feature = "webhook"),
            allow(dead_code, reason = "read by the webhook receiver only")
        )]
        failure: bool,
    },
    Reject(Rejection),
}

pub(crate) async fn run<Svc, S, O, ReqB, ResB>(
    shared: Arc<Shared<S, O>>,
    inner: Svc,
    mut req: Request<ReqB>,
    prepared: Prepared,
    key: idem_core::IdempotencyKey,
) -> Result<Answer<ResB>, Svc::Error>
where
    Svc: Service<Request<ReqB>, Response = Response<ResB>> + Send + 'static,
    Svc::Future: Send + 'static,
    Svc::Error: Send + 'static,
    ReqB: Send + 'static,
    ResB: Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxDynError>,
    S: Store,
    O: Send + Sync + 'static,
{
    let span = tracing::Span::current();
    let begin = shared
        .idem
        .begin_prepared::<HttpResponse, HttpResponse>(prepared)
        .await;
    let claim = match begin {
        Err(e) => return Ok(Answer::Reject(Rejection::Engine(e))),
        Ok(Begin::Replay(reply)) => {
            span.record("outcome", "replayed");
            let (stored, failure) = match reply.into_outcome() {
                Outcome::Success(r) | Outcome::Transient(r) => (r, false),
                Outcome::Failure(r) => (r, true),
            };
            return Ok(Answer::Replayed {
                response: replay(&shared.cfg.replayed_headers, stored),
                failure,
            });
        }
        Ok(Begin::Run(claim)) => claim,
    };
    let lease = shared.idem.policy().lease();
    let task = {
        let shared = Arc::clone(&shared);
        async move {
            let attempt = claim.attempt().clone();
            req.extensions_mut().insert(IdemAttempt(attempt.clone()));
            req.extensions_mut().insert(IdemKey(key));
            let call = call_and_capture(&shared, inner, req);
            let (capture, done) = attempt.renewing(lease, shared.cfg.auto_renew, call).await;
            let finished = claim.settle(capture).await;
            (finished, done)
        }
        .in_current_span()
    };
    let (finished, done) = if shared.cfg.detached {
        match shared.tracker.spawn(task).await {
            Ok(out) => out,
            Err(e) => {
                if e.is_panic() {
                    warn!("handler panicked: record left in flight for recovery");
                }
                return Ok(Answer::Reject(Rejection::HandlerPanicked {
                    retry_after: lease,
                }));
            }
        }
    } else {
        // Not detached, the handler runs in this future: a panic is caught
        // here (its claim dropped on the way, so the record stays in flight
        // for recovery) and answered as in a detached task, not left to
        // unwind into the server's connection task.
        match AssertUnwindSafe(task).catch_unwind().await {
            Ok(out) => out,
            Err(_) => {
                warn!("handler panicked: record left in flight for recovery");
                return Ok(Answer::Reject(Rejection::HandlerPanicked {
                    retry_after: lease,
                }));
            }
        }
    };
    match finished {
        Err(e @ Error::LeaseLost { .. }) => return Ok(Answer::Reject(Rejection::Engine(e))),
        Err(e) => warn!(error = %e, "completion failed; left to lease expiry and recovery"),
        Ok(Settled::Hold(e)) => {
            // The handler ran but its outcome is not stored yet (the store
            // failed: a failover, a call timeout), and it saved no resource
            // id a recovery could reconcile from: the client is told to
            // retry (503 with `Retry-After`), and the retry replays the
            // outcome once the background write stored it.
            span.record("outcome", "pending");
            warn!("outcome not stored yet: answered 503 so that the retry replays it");
            return Ok(Answer::Reject(Rejection::Engine(e)));
        }
        Ok(Settled::Released) => {
            span.record("outcome", "released");
        }
        Ok(Settled::Answer) => {
            span.record("outcome", "executed");
        }
    }
    match done {
        Done::Response(r) => {
            span.record("status", r.status().as_u16());
            Ok(Answer::Response(r))
        }
        Done::Err(e) => Err(e),
        Done::Reject(r) => Ok(Answer::Reject(r)),
    }
}

/// How a response is remembered: its [`Class`] extension, else the
/// layer's classifier, else the default by status.
pub(crate) fn class_of(cfg: &Config, parts: &http::response::Parts) -> Class {
    parts.extensions.get::<Class>().copied().unwrap_or_else(|| {
        cfg.classify
            .as_ref()
            .map_or_else(|| default_class(parts.status.as_u16()), |f| f(parts))
    })
}

fn is_streaming(parts: &http::response::Parts) -> bool {
    parts.status == StatusCode::SWITCHING_PROTOCOLS
        || parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                v.split(';')
                    .next()
                    .is_some_and(|m| m.trim().eq_ignore_ascii_case("text/event-stream"))
            })
}

/// Step 9: calls the handler and decides what the engine stores (the
/// README's "remembered outcomes").
async fn call_and_capture<Svc, S, O, ReqB, ResB>(
    shared: &Shared<S, O>,
    mut inner: Svc,
    req: Request<ReqB>,
) -> (Capture, Done<ResB, Svc::Error>)
where
    Svc: Service<Request<ReqB>, Response = Response<ResB>> + Send,
    Svc::Future: Send,
    Svc::Error: Send,
    ReqB: Send,
    ResB: Body<Data = Bytes> + Send,
    ResB::Error: Into<BoxDynError>,
    S: Store,
    O: Sync,
{
    let res = match inner.call(req).await {
        Ok(r) => r,
        Err(e) => return (Capture::Release, Done::Err(e)),
    };
    let cfg = &shared.cfg;
    let (parts, body) = res.into_parts();
    let class = class_of(cfg, &parts);
    let pass = |parts, body| Done::Response(Response::from_parts(parts, IdemBody::inner(body)));
    if class == Class::Transient {
        return (Capture::Release, pass(parts, body));
    }
    let limit = shared.idem.policy().max_response_bytes();
    if class == Class::CompleteWithoutBody
        || is_streaming(&parts)
        || body.size_hint().lower() > limit as u64
    {
        return (Capture::NotStored, pass(parts, body));
    }
    let mut body = Box::pin(body);
    let mut buf = BytesMut::new();
    loop {
        match body.frame().await {
            None => break,
            Some(Err(_)) => {
                warn!("response body failed: key released");
                return (
                    Capture::Release,
                    Done::Reject(Rejection::ResponseBodyFailed),
                );
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) if buf.len() + data.len() <= limit => buf.extend_from_slice(&data),
                Ok(data) => {
                    warn!(
                        limit,
                        "response larger than max_response_bytes: streamed, not stored"
                    );
                    buf.extend_from_slice(&data);
                    let r = IdemBody::resumed(buf.freeze(), None, body);
                    return (
                        Capture::NotStored,
                        Done::Response(Response::from_parts(parts, r)),
                    );
                }
                Err(frame) => {
                    warn!("response has trailers: streamed, not stored");
                    let r = IdemBody::resumed(buf.freeze(), frame.into_trailers().ok(), body);
                    return (
                        Capture::NotStored,
                        Done::Response(Response::from_parts(parts, r)),
                    );
                }
            },
        }
    }
    let bytes: Bytes = buf.freeze();
    let pairs: Vec<(&str, &[u8])> = parts
        .headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_bytes()))
        .collect();
    let replay_names: Vec<&str> = cfg.replayed_names.iter().map(String::as_str).collect();
    let headers = stored_headers(&pairs, &cfg.stored_headers, &replay_names);
    drop(pairs);
    if headers.iter().any(|(n, _)| n == "content-encoding") {
        warn!(
            "stored response carries Content-Encoding: place compression outside the idempotency layer"
        );
    }
    let captured = HttpResponse::new(parts.status.as_u16(), headers, bytes.to_vec());
    let outcome = match class {
        Class::Failure => Outcome::Failure(captured),
        _ => Outcome::Success(captured),
    };
    (
        Capture::Store(outcome),
        Done::Response(Response::from_parts(parts, IdemBody::full(bytes))),
    )
}

/// A stored response, replayed: stored status, headers in order, bytes, a
/// recomputed `Content-Length` and the replay marker(s).
fn replay<B>(markers: &[HeaderName], r: HttpResponse) -> Response<IdemBody<B>> {
    let len = r.body.len();
    let mut res = Response::new(IdemBody::full(r.body));
    *res.status_mut() = StatusCode::from_u16(r.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = res.headers_mut();
    for (name, value) in &r.headers {
        match (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            (Ok(n), Ok(v)) => {
                headers.append(n, v);
            }
            _ => warn!("stored header not valid HTTP: skipped"),
        }
    }
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    for m in markers {
        headers.insert(m.clone(), HeaderValue::from_static("true"));
    }
    res
}
