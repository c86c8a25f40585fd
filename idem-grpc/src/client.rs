//! The client side: a tower layer for a tonic `Channel` that keeps one key
//! per call across its attempts and retries only what is safe, by
//! `idem::client`'s own decision table.
//!
//! Each attempt's answer is read as the HTTP client reads one: the gRPC
//! code as the HTTP status gRPC maps it to (`UNAVAILABLE` 503, `ABORTED`
//! 409, `FAILED_PRECONDITION` and `INVALID_ARGUMENT` 400, ...), an
//! `ErrorInfo` of domain `idem` as the problem code (`IN_FLIGHT` →
//! `in_flight`), a `RetryInfo` as `retry-after-ms`, and
//! `idempotent-replayed` from the initial metadata or the trailers. A call
//! that got no status from the server (a reset connection, whatever code
//! tonic gives it) is an ambiguous transport failure: resent with the same
//! key. So: retried on `UNAVAILABLE`, on `ABORTED`/`IN_FLIGHT` after its
//! `RetryInfo`, and on a lost answer; never on `FAILED_PRECONDITION` or
//! `INVALID_ARGUMENT`; within the policy's deadline and attempt cap.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body::Body as HttpBody;
use http_body_util::{BodyExt, Full, Limited};
use idem_core::IdempotencyKey;
use tonic::Code;
use tonic::body::Body;
use tonic_types::StatusExt;
use tower_layer::Layer;
use tower_service::Service;

use crate::service::ResponseFuture;
use crate::vocab::{
    AttemptView, DOMAIN, Intent, KEY_METADATA, Problem, ReportKind, RetryPolicy, SendOutcome,
    SendState, Step, StopReason, TransportFailure, code_of_reason, decode_key, os_random,
    quote_key,
};
use crate::wire;

/// An error of the client layer (boxed, as tonic's transport errors are).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What one call did: its key, its attempts and how it ended (the outcome
/// vocabulary of `idem::client`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GrpcReport {
    /// The key sent on every attempt.
    pub key: IdempotencyKey,
    /// Attempts made.
    pub attempts: u32,
    /// Time spent, waits included.
    pub elapsed: Duration,
    /// How it ended.
    pub kind: ReportKind,
    /// The `ErrorInfo` reason of the last answer, as sent, when it had one.
    pub reason: Option<String>,
}

/// Where the layer leaves a call's [`GrpcReport`]: put a clone in the
/// request's extensions (`tonic::Request::extensions_mut`), read it after
/// the call, whatever its status.
#[derive(Debug, Clone, Default)]
pub struct ReportSlot(Arc<Mutex<Option<GrpcReport>>>);

impl ReportSlot {
    /// An empty slot.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The report, once the call is over.
    #[must_use]
    pub fn take(&self) -> Option<GrpcReport> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }

    fn put(&self, r: GrpcReport) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(r);
    }
}

#[derive(Clone)]
struct ClientShared {
    policy: RetryPolicy,
    key_metadata: HeaderName,
    methods: Option<Vec<String>>,
    max_request_bytes: usize,
}

/// A tower layer for a tonic `Channel`: one key per call (the caller's own
/// `idempotency-key` metadata when set, to resume an intent; else a fresh
/// one), reused on every attempt of that call, and the retries
/// `idem::client`'s [`RetryPolicy`] allows.
///
/// ```
/// use idem_grpc::GrpcClientLayer;
///
/// let policy = idem_client::IdempotencyClientBuilder::default()
///     .deadline(std::time::Duration::from_secs(10))
///     .build_policy()
///     .unwrap();
/// let layer = GrpcClientLayer::new(policy).method("/shop.v1.Orders/CreateOrder");
/// // let channel = tower::ServiceBuilder::new().layer(layer).service(channel);
/// // let client = tonic::client::Grpc::new(channel);
/// # let _ = layer;
/// ```
#[derive(Clone)]
pub struct GrpcClientLayer {
    shared: Arc<ClientShared>,
}

impl fmt::Debug for GrpcClientLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcClientLayer")
            .field("policy", &self.shared.policy)
            .field("methods", &self.shared.methods)
            .finish_non_exhaustive()
    }
}

impl GrpcClientLayer {
    /// A layer that keys and retries every call under `policy` (build it
    /// with `idem_client::IdempotencyClientBuilder::build_policy`). Each attempt's request
    /// and answer are buffered whole: on a channel that also carries
    /// streaming methods, name the unary ones with [`method`](Self::method).
    #[must_use]
    pub fn new(policy: RetryPolicy) -> Self {
        Self {
            shared: Arc::new(ClientShared {
                policy,
                key_metadata: HeaderName::from_static(KEY_METADATA),
                methods: None,
                max_request_bytes: 4 * 1024 * 1024,
            }),
        }
    }

    /// Keys and retries only these methods (full paths), repeatable; the
    /// others pass untouched.
    #[must_use]
    pub fn method(mut self, path: impl Into<String>) -> Self {
        Arc::make_mut(&mut self.shared)
            .methods
            .get_or_insert_with(Vec::new)
            .push(path.into());
        self
    }
}

impl<Svc> Layer<Svc> for GrpcClientLayer {
    type Service = GrpcClientService<Svc>;

    fn layer(&self, inner: Svc) -> Self::Service {
        GrpcClientService {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The service [`GrpcClientLayer`] wraps around a channel.
#[derive(Clone)]
pub struct GrpcClientService<Svc> {
    inner: Svc,
    shared: Arc<ClientShared>,
}

impl<Svc: fmt::Debug> fmt::Debug for GrpcClientService<Svc> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcClientService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<Svc, ResB> Service<Request<Body>> for GrpcClientService<Svc>
where
    Svc: Service<Request<Body>, Response = Response<ResB>> + Clone + Send + 'static,
    Svc::Future: Send + 'static,
    Svc::Error: Into<BoxError>,
    ResB: HttpBody<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = ResponseFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Each attempt waits for the channel itself.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let inner = self.inner.clone();
        let shared = Arc::clone(&self.shared);
        let covered = shared
            .methods
            .as_ref()
            .is_none_or(|m| m.iter().any(|p| p == req.uri().path()));
        if !covered {
            let mut inner = inner;
            return Box::pin(async move {
                futures_util::future::poll_fn(|cx| inner.poll_ready(cx))
                    .await
                    .map_err(Into::into)?;
                inner
                    .call(req)
                    .await
                    .map(|r| r.map(Body::new))
                    .map_err(Into::into)
            });
        }
        Box::pin(send(shared, inner, req))
    }
}

/// One attempt's answer.
#[allow(
    clippy::large_enum_variant,
    reason = "one value per attempt, moved once; boxing would add an allocation per attempt"
)]
enum Answer {
    /// No status from the server.
    Transport(TransportFailure, BoxError),
    /// The server's answer, read whole.
    Status {
        head: http::response::Parts,
        data: Bytes,
        trailers: Option<HeaderMap>,
        /// Initial metadata and trailers together, as the policy reads them.
        view: HeaderMap,
        status: StatusCode,
        problem: Option<Problem>,
        reason: Option<String>,
    },
}

/// The HTTP status gRPC maps a code to (`google.rpc.Code`'s table).
fn http_status(code: Code) -> StatusCode {
    let s = match code {
        Code::Ok => 200,
        Code::Cancelled => 499,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
        Code::DeadlineExceeded => 504,
        Code::NotFound => 404,
        Code::AlreadyExists | Code::Aborted => 409,
        Code::PermissionDenied => 403,
        Code::ResourceExhausted => 429,
        Code::Unimplemented => 501,
        Code::Unavailable => 503,
        Code::Unauthenticated => 401,
        Code::Unknown | Code::Internal | Code::DataLoss => 500,
    };
    StatusCode::from_u16(s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// A call that failed with no status from the server: `Connect` when the
/// connection was refused (nothing was sent), else ambiguous.
fn transport(e: BoxError) -> Answer {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e.as_ref());
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return Answer::Transport(TransportFailure::Connect, e);
        }
        source = err.source();
    }
    Answer::Transport(TransportFailure::Ambiguous, e)
}

async fn attempt<Svc, ResB>(inner: &mut Svc, req: Request<Body>) -> Answer
where
    Svc: Service<Request<Body>, Response = Response<ResB>>,
    Svc::Error: Into<BoxError>,
    ResB: HttpBody<Data = Bytes>,
    ResB::Error: Into<BoxError>,
{
    if let Err(e) = futures_util::future::poll_fn(|cx| inner.poll_ready(cx)).await {
        return transport(e.into());
    }
    let res = match inner.call(req).await {
        Ok(r) => r,
        Err(e) => return transport(e.into()),
    };
    let (head, body) = res.into_parts();
    let (code, data, trailers) = if let Some(code) = wire::status_in(&head.headers) {
        (code, Bytes::new(), None)
    } else {
        match body.collect().await {
            Err(e) => return Answer::Transport(TransportFailure::Ambiguous, e.into()),
            Ok(c) => {
                let trailers = c.trailers().cloned().unwrap_or_default();
                let Some(code) = wire::status_in(&trailers) else {
                    return Answer::Transport(
                        TransportFailure::Ambiguous,
                        "the answer ended without a grpc-status".into(),
                    );
                };
                (code, c.to_bytes(), Some(trailers))
            }
        }
    };
    let mut view = head.headers.clone();
    if let Some(t) = &trailers {
        for (n, v) in t {
            view.append(n.clone(), v.clone());
        }
    }
    let (mut problem, mut reason) = (None, None);
    if code != Code::Ok
        && let Some(status) = tonic::Status::from_header_map(&view)
    {
        let details = status.get_error_details();
        if let Some(info) = details.error_info() {
            reason = Some(info.reason.clone());
            if info.domain == DOMAIN {
                let mut p = Problem::default();
                p.code = Some(code_of_reason(&info.reason));
                problem = Some(p);
            }
        }
        if let Some(delay) = details.retry_info().and_then(|r| r.retry_delay) {
            view.insert(
                HeaderName::from_static("retry-after-ms"),
                HeaderValue::from(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX)),
            );
        }
    }
    Answer::Status {
        head,
        data,
        trailers,
        view,
        status: http_status(code),
        problem,
        reason,
    }
}

fn kind_of(outcome: SendOutcome) -> ReportKind {
    match outcome {
        SendOutcome::Replayed => ReportKind::Replayed,
        SendOutcome::AlreadyProcessed => ReportKind::AlreadyProcessed,
        SendOutcome::Rejected => ReportKind::Rejected,
        _ => ReportKind::Fresh,
    }
}

async fn send<Svc, ResB>(
    shared: Arc<ClientShared>,
    mut inner: Svc,
    req: Request<Body>,
) -> Result<Response<Body>, BoxError>
where
    Svc: Service<Request<Body>, Response = Response<ResB>>,
    Svc::Error: Into<BoxError>,
    ResB: HttpBody<Data = Bytes>,
    ResB::Error: Into<BoxError>,
{
    let started = Instant::now();
    let (parts, body) = req.into_parts();
    let slot = parts.extensions.get::<ReportSlot>().cloned();
    let key = match parts
        .headers
        .get(&shared.key_metadata)
        .and_then(|v| v.to_str().ok())
    {
        Some(v) => decode_key(v)?,
        None => Intent::random().key().clone(),
    };
    let key_value = HeaderValue::from_str(&quote_key(&key))?;
    let bytes = Limited::new(body, shared.max_request_bytes)
        .collect()
        .await?
        .to_bytes();
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let mut r = Request::new(Body::new(Full::new(bytes.clone())));
        *r.method_mut() = parts.method.clone();
        *r.uri_mut() = parts.uri.clone();
        *r.version_mut() = parts.version;
        *r.headers_mut() = parts.headers.clone();
        r.headers_mut()
            .insert(shared.key_metadata.clone(), key_value.clone());
        let answer = attempt(&mut inner, r).await;
        let view = match &answer {
            Answer::Transport(t, _) => AttemptView::Transport(*t),
            Answer::Status {
                view,
                status,
                problem,
                ..
            } => AttemptView::Response {
                status: *status,
                headers: view,
                problem: problem.as_ref(),
            },
        };
        let state = SendState {
            attempts,
            elapsed: started.elapsed(),
            key_age: None,
            now: SystemTime::now(),
        };
        let kind = match shared.policy.decide(&view, state, &mut os_random) {
            Step::Retry { delay, .. } => {
                tokio::time::sleep(delay).await;
                continue;
            }
            Step::Return(outcome) => kind_of(outcome),
            Step::Stop(reason) => ReportKind::Exhausted(reason),
            _ => ReportKind::Exhausted(StopReason::MaxAttempts),
        };
        let report = |reason| GrpcReport {
            key: key.clone(),
            attempts,
            elapsed: started.elapsed(),
            kind,
            reason,
        };
        return match answer {
            Answer::Transport(_, e) => {
                if let Some(s) = &slot {
                    s.put(report(None));
                }
                Err(e)
            }
            Answer::Status {
                head,
                data,
                trailers,
                reason,
                ..
            } => {
                if let Some(s) = &slot {
                    s.put(report(reason));
                }
                let body = if trailers.is_some() {
                    wire::body_of(data, trailers)
                } else {
                    Body::empty()
                };
                Ok(Response::from_parts(head, body))
            }
        };
    }
}
