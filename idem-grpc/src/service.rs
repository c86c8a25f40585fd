//! The service the layer wraps around a tonic server: a method it does not
//! cover passes untouched; a covered unary call is checked (owner, key,
//! message, fingerprint), claimed, run in a tracked task and captured.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body as HttpBody;
use http_body_util::{BodyExt, Full, Limited};
use idem_core::adapter::{ClaimExt, EngineExt, Settle, Settled};
use idem_core::error::RequestError;
use idem_core::store::{BoxDynError, Store};
use idem_core::{Begin, HttpResponse, IdempotencyKey, Outcome, Scope};
use sha2::{Digest, Sha256};
use tonic::Code;
use tonic::body::Body;
use tower_service::Service;
use tracing::{Instrument, debug, info_span, warn};

use crate::canonical::{NotCanonical, canonical};
use crate::layer::Shared;
use crate::status::reject;
use crate::vocab::{
    Class, IdemAttempt, IdemKey, KeyHeaderError, OwnerSource, Rejection, parse_key,
};
use crate::wire;

/// A boxed `Send + 'static` future.
pub type ResponseFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'static>>;

/// The service [`GrpcIdempotencyLayer`](crate::GrpcIdempotencyLayer) wraps
/// around a tonic server's routes.
pub struct GrpcIdempotencyService<Svc, S: Store, O> {
    inner: Svc,
    shared: Arc<Shared<S, O>>,
}

impl<Svc, S: Store, O> GrpcIdempotencyService<Svc, S, O> {
    pub(crate) fn new(inner: Svc, shared: Arc<Shared<S, O>>) -> Self {
        Self { inner, shared }
    }
}

impl<Svc: Clone, S: Store, O> Clone for GrpcIdempotencyService<Svc, S, O> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<Svc: fmt::Debug, S: Store, O> fmt::Debug for GrpcIdempotencyService<Svc, S, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcIdempotencyService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

fn boxed<B: Answer>(res: Response<B>) -> Response<Body> {
    res.map(Body::new)
}

/// The routes the layer wraps, as its own steps need them: a tonic service
/// whose future and error can move into the task that runs the work.
trait Routes<ResB>:
    Service<Request<Body>, Response = Response<ResB>, Future: Send + 'static, Error: Send + 'static>
    + Send
    + 'static
{
}

impl<T, ResB> Routes<ResB> for T where
    T: Service<
            Request<Body>,
            Response = Response<ResB>,
            Future: Send + 'static,
            Error: Send + 'static,
        > + Send
        + 'static
{
}

/// The body of a handler's answer: bytes, with an error the engine can box.
trait Answer: HttpBody<Data = Bytes, Error: Into<BoxDynError>> + Send + 'static {}

impl<B: HttpBody<Data = Bytes, Error: Into<BoxDynError>> + Send + 'static> Answer for B {}

impl<Svc, S, O, ResB> Service<Request<Body>> for GrpcIdempotencyService<Svc, S, O>
where
    Svc: Service<Request<Body>, Response = Response<ResB>> + Clone + Send + 'static,
    Svc::Future: Send + 'static,
    Svc::Error: Send + 'static,
    ResB: HttpBody<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxDynError>,
    S: Store,
    O: OwnerSource,
{
    type Response = Response<Body>;
    type Error = Svc::Error;
    type Future = ResponseFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        if !self.shared.cfg.covered.covers(req.uri().path()) {
            // Not covered (a streaming method, or one not listed): untouched.
            let fut = self.inner.call(req);
            return Box::pin(async move { fut.await.map(boxed) });
        }
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        let span = info_span!(
            "idem.grpc",
            method = %req.uri().path(),
            record = tracing::field::Empty,
            outcome = tracing::field::Empty,
            code = tracing::field::Empty,
        );
        Box::pin(covered(shared, inner, req).instrument(span))
    }
}

/// What the checks before the engine decided.
enum Step {
    PassThrough(Request<Body>),
    Reject(Rejection),
    Run(Request<Body>, idem_core::adapter::Prepared),
}

async fn covered<Svc: Routes<ResB>, ResB: Answer, S: Store, O: OwnerSource>(
    shared: Arc<Shared<S, O>>,
    mut inner: Svc,
    req: Request<Body>,
) -> Result<Response<Body>, Svc::Error> {
    match prepare(&shared, req).await {
        Step::PassThrough(req) => {
            tracing::Span::current().record("outcome", "passthrough");
            inner.call(req).await.map(boxed)
        }
        Step::Reject(r) => {
            tracing::Span::current().record("code", r.code().as_str());
            Ok(reject(&r))
        }
        Step::Run(req, prepared) => run(shared, inner, req, prepared).await,
    }
}

fn invalid_key(reason: KeyHeaderError) -> Rejection {
    Rejection::InvalidKey {
        reason,
        received: None,
        message: None,
    }
}

/// The owner (before the key), the key, the one message, the fingerprint.
async fn prepare<S: Store, O: OwnerSource>(shared: &Shared<S, O>, req: Request<Body>) -> Step {
    let cfg = &shared.cfg;
    let (parts, body) = req.into_parts();
    let Some(owner) = shared.owner.owner(&parts) else {
        return Step::Reject(Rejection::OwnerUnavailable);
    };
    let method = parts.uri.path().to_owned();
    let Ok(scope) = Scope::new(owner, method.as_str()) else {
        return Step::Reject(Rejection::OwnerUnavailable);
    };
    let field = cfg.key_fields.get(&method).copied();
    let from_metadata = if field.is_none() {
        let values: Vec<&[u8]> = parts
            .headers
            .get_all(&cfg.key_metadata)
            .iter()
            .map(http::HeaderValue::as_bytes)
            .collect();
        match parse_key(&values) {
            Ok(k) => k,
            Err(e) => return Step::Reject(invalid_key(e)),
        }
    } else {
        None
    };
    let bytes = match Limited::new(body, cfg.max_request_bytes).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Step::Reject(Rejection::RequestTooLarge {
                limit: cfg.max_request_bytes,
            });
        }
        Err(_) => return Step::Reject(Rejection::RequestBodyUnreadable),
    };
    let Some((compressed, message)) = wire::single_message(&bytes) else {
        return Step::Reject(Rejection::RequestBodyUnreadable);
    };
    let key: Option<IdempotencyKey> = match field {
        None => from_metadata,
        Some(n) => match wire::string_field(message, n).filter(|_| !compressed) {
            None | Some([]) => None,
            Some(v) => match parse_key(&[v]) {
                Ok(k) => k,
                Err(e) => return Step::Reject(invalid_key(e)),
            },
        },
    };
    let Some(key) = key else {
        if cfg.key_required {
            return Step::Reject(Rejection::MissingKey);
        }
        return Step::PassThrough(Request::from_parts(parts, full(bytes)));
    };
    // The canonical form, when configured for the method and the message
    // is not compressed (the layer does not decompress).
    let canonical = match cfg.canonical.get(&method).filter(|_| !compressed) {
        None => None,
        Some(input) => match canonical(input, message) {
            Ok(c) => Some(c),
            Err(NotCanonical::Undecodable(e)) => {
                return Step::Reject(undecodable(input.full_name(), &e));
            }
            Err(NotCanonical::NoJson) => {
                debug!(
                    "message has no JSON form under the descriptors: its bytes are fingerprinted"
                );
                None
            }
        },
    };
    let prepared = if let Some(c) = canonical {
        shared.idem.prepare(&scope, key, &c)
    } else {
        let encoding = if compressed {
            parts
                .headers
                .get("grpc-encoding")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
        } else {
            "identity"
        };
        let envelope = Envelope {
            v: 1,
            encoding,
            message_sha256: hex::encode(Sha256::digest(message)),
        };
        shared.idem.prepare(&scope, key, &envelope)
    };
    match prepared {
        Ok(p) => {
            tracing::Span::current().record("record", p.id.log_hash().as_str());
            Step::Run(Request::from_parts(parts, full(bytes)), p)
        }
        Err(e) => Step::Reject(Rejection::Engine(e)),
    }
}

/// The refusal of a message that does not decode as its method's input
/// type: the HTTP layer's answer to a request it cannot fingerprint
/// (`INVALID_REQUEST`), with protobuf's reason.
fn undecodable(message_type: &str, e: &prost::DecodeError) -> Rejection {
    let reason = format!("the request message does not decode as {message_type}: {e}");
    Rejection::Engine(idem_core::Error::InvalidRequest(RequestError::Undecodable(
        reason,
    )))
}

/// What is fingerprinted by default (under the method, as the operation):
/// the request message's bytes as sent, and how they are compressed. A retry of the
/// same call resends the same bytes and matches; a different message does
/// not. Two encoders may write one message two ways (field order, explicit
/// defaults, unknown fields): a client that re-encodes its request on retry
/// with another library may see a mismatch, never a false match (the
/// canonical form, [`crate::canonical::Canonical`], is the opt-in answer).
#[derive(serde::Serialize)]
struct Envelope<'a> {
    v: u8,
    encoding: &'a str,
    message_sha256: String,
}

fn full(bytes: Bytes) -> Body {
    Body::new(Full::new(bytes))
}

/// What the engine is told about the handler's answer.
type Capture = Settle<HttpResponse, HttpResponse>;

async fn run<Svc: Routes<ResB>, ResB: Answer, S: Store, O: OwnerSource>(
    shared: Arc<Shared<S, O>>,
    inner: Svc,
    mut req: Request<Body>,
    prepared: idem_core::adapter::Prepared,
) -> Result<Response<Body>, Svc::Error> {
    let span = tracing::Span::current();
    req.extensions_mut()
        .insert(IdemKey(prepared.id.key().clone()));
    let claim = match shared
        .idem
        .begin_prepared::<HttpResponse, HttpResponse>(prepared)
        .await
    {
        Err(e) => {
            let r = Rejection::Engine(e);
            span.record("code", r.code().as_str());
            return Ok(reject(&r));
        }
        Ok(Begin::Replay(reply)) => {
            span.record("outcome", "replayed");
            let (Outcome::Success(r) | Outcome::Failure(r) | Outcome::Transient(r)) =
                reply.into_outcome();
            return Ok(wire::replay(r));
        }
        Ok(Begin::Run(claim)) => claim,
    };
    // The work runs in a tracked task: a client that gives up (deadline,
    // RST_STREAM) drops this future, not the work, whose outcome is stored.
    let task = {
        let shared = Arc::clone(&shared);
        async move {
            let attempt = claim.attempt().clone();
            req.extensions_mut().insert(IdemAttempt(attempt.clone()));
            let lease = shared.idem.policy().lease();
            let call = call_and_capture(&shared, inner, req);
            let (capture, done) = attempt.renewing(lease, shared.cfg.auto_renew, call).await;
            let finished = claim.settle(capture).await;
            (finished, done)
        }
        .in_current_span()
    };
    let Ok((finished, done)) = shared.tracker.spawn(task).await else {
        warn!("handler panicked: record left in flight for recovery");
        let r = Rejection::HandlerPanicked {
            retry_after: shared.idem.policy().lease(),
        };
        return Ok(reject(&r));
    };
    match finished {
        Err(e @ idem_core::Error::LeaseLost { .. }) => return Ok(reject(&Rejection::Engine(e))),
        Err(e) => warn!(error = %e, "completion failed; left to lease expiry and recovery"),
        Ok(Settled::Hold(hold)) => {
            // The retry replays the outcome once the engine's background
            // write stored it.
            span.record("outcome", "pending");
            warn!("outcome not stored yet: answered UNAVAILABLE so that the retry replays it");
            return Ok(reject(&Rejection::Engine(hold)));
        }
        Ok(Settled::Released) => {
            span.record("outcome", "released");
        }
        Ok(Settled::Answer) => {
            span.record("outcome", "executed");
        }
    }
    done
}

/// Calls the handler, reads its whole answer (a unary call has one message)
/// and decides what the engine stores.
async fn call_and_capture<Svc: Routes<ResB>, ResB: Answer, S: Store, O: Sync>(
    shared: &Shared<S, O>,
    mut inner: Svc,
    req: Request<Body>,
) -> (Capture, Result<Response<Body>, Svc::Error>) {
    let res = match inner.call(req).await {
        Ok(r) => r,
        Err(e) => return (Capture::Release, Err(e)),
    };
    let cfg = &shared.cfg;
    let (parts, body) = res.into_parts();
    let (code, data, trailers) = if let Some(code) = wire::status_in(&parts.headers) {
        // Trailers-only: the status is in the headers, no message.
        (code, Bytes::new(), None)
    } else {
        match body.collect().await {
            Ok(c) => {
                let trailers = c.trailers().cloned().unwrap_or_default();
                let code = wire::status_in(&trailers).unwrap_or(Code::Unknown);
                (code, c.to_bytes(), Some(trailers))
            }
            Err(_) => {
                warn!("response body failed: key released");
                return (Capture::Release, Ok(reject(&Rejection::ResponseBodyFailed)));
            }
        }
    };
    tracing::Span::current().record("code", i32::from(code));
    let class = (cfg.classify)(code);
    let capture = if class == Class::Transient {
        Capture::Release
    } else if class == Class::CompleteWithoutBody
        || data.len() > shared.idem.policy().max_response_bytes()
    {
        Capture::NotStored
    } else {
        let s = wire::stored(
            code,
            &parts.headers,
            trailers.as_ref(),
            &data,
            &cfg.metadata,
        );
        if class == Class::Failure {
            Capture::Store(Outcome::Failure(s))
        } else {
            Capture::Store(Outcome::Success(s))
        }
    };
    let body = if trailers.is_some() {
        wire::body_of(data, trailers)
    } else {
        Body::empty()
    };
    (capture, Ok(Response::from_parts(parts, body)))
}
