//! The test app: a real axum server on `127.0.0.1:0` with handlers that
//! count executions, can be held in flight, answer chosen statuses, bodies
//! and headers, and can panic; an auth layer that sets the owner.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{patch, post};
use bytes::Bytes;
use http_body::Frame;
use idem_core::clock::ManualClock;
use idem_core::store::Store;
use idem_core::testkit::FailingStore;
use idem_core::{Idem, InFlightMode, Policy};
use tokio::sync::{Notify, Semaphore};

use super::check::{Got, key, send};
use idem_http::{
    Class, ExtensionOwner, FingerprintSpec, IdemAttempt, IdempotencyLayer, KeyNamespace,
    KeyRequirement, OperationSource, OwnerId, PathSource,
};

/// The lease the test policy uses.
pub const LEASE: Duration = Duration::from_secs(60);
/// The response TTL of the test policy.
pub const RESPONSE_TTL: Duration = Duration::from_secs(3600);
/// The key TTL of the test policy.
pub const KEY_TTL: Duration = Duration::from_secs(86_400);
/// How long the test policy's wait mode waits, unless
/// [`Options::wait_timeout`] says otherwise.
pub const WAIT_TIMEOUT: Duration = Duration::from_secs(10);
/// `max_response_bytes` of the test policy.
pub const MAX_RESPONSE: usize = 16 * 1024;
/// `max_request_body` of the test layer.
pub const MAX_REQUEST: usize = 8 * 1024;

/// The `Date` every test handler response carries: a fixed, long-past
/// value (RFC 9110's example), so a replay's `Date` can be told apart from
/// the stored response's without a real clock gap.
pub const STALE_DATE: &str = "Sun, 06 Nov 1994 08:49:37 GMT";

/// The owner the test auth layer inserts (from the `x-owner` header).
#[derive(Debug, Clone)]
pub struct Owner(pub String);

impl OwnerId for Owner {
    fn owner_id(&self) -> std::borrow::Cow<'_, str> {
        std::borrow::Cow::Borrowed(&self.0)
    }
}

/// Handler executions and the gate that holds a handler in flight.
#[derive(Debug)]
pub struct Counts {
    executions: AtomicUsize,
    entered: Notify,
    release: Semaphore,
    stream: Semaphore,
}

impl Default for Counts {
    fn default() -> Self {
        Self {
            executions: AtomicUsize::new(0),
            entered: Notify::new(),
            release: Semaphore::new(0),
            stream: Semaphore::new(0),
        }
    }
}

impl Counts {
    /// How many times a handler ran.
    pub fn executions(&self) -> usize {
        self.executions.load(Ordering::SeqCst)
    }
    /// Waits until a handler holding on `x-hold` has entered.
    pub async fn entered(&self) {
        self.entered.notified().await;
    }
    /// Lets `n` held handlers go on.
    pub fn release(&self, n: usize) {
        self.release.add_permits(n);
    }
    /// Lets `n` live SSE bodies (`x-sse-live`) produce their last event.
    pub fn release_stream(&self, n: usize) {
        self.stream.add_permits(n);
    }
}

/// The `x-stream` body: `chunks` chunks of distinct bytes (execution `n`
/// included), with a yield to the runtime before each one and no size hint.
pub fn streamed_body(n: usize, chunks: usize) -> Vec<u8> {
    (0..chunks).flat_map(|i| stream_chunk(n, i)).collect()
}

fn stream_chunk(n: usize, i: usize) -> Vec<u8> {
    let mut c = format!("exec {n} chunk {i};").into_bytes();
    c.push(u8::try_from(i % 256).unwrap_or_default());
    c.push(0xff);
    c
}

/// How the test app is configured.
#[derive(Debug, Clone)]
pub struct Options {
    /// Wait mode instead of reject.
    pub wait: bool,
    /// How long wait mode waits (10 s by default).
    pub wait_timeout: Duration,
    /// Detached handlers.
    pub detached: bool,
    /// Key namespace.
    pub namespace: KeyNamespace,
    /// The layer's `docs_url`.
    pub docs_url: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            wait: false,
            wait_timeout: WAIT_TIMEOUT,
            detached: true,
            namespace: KeyNamespace::PerRoute,
            docs_url: None,
        }
    }
}

impl Options {
    /// The defaults, in wait mode.
    pub fn waiting() -> Self {
        Self {
            wait: true,
            ..Self::default()
        }
    }

    /// The defaults, with handlers that are not detached.
    pub fn attached() -> Self {
        Self {
            detached: false,
            ..Self::default()
        }
    }
}

/// The layer type of the test app.
pub type TestLayer<S> = IdempotencyLayer<FailingStore<S>, ExtensionOwner<Owner>>;

/// A running test app.
#[derive(Debug)]
pub struct App<S: Store> {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// A real HTTP client.
    pub client: reqwest::Client,
    /// The engine's clock.
    pub clock: ManualClock,
    /// The store, with fault switches.
    pub store: FailingStore<S>,
    /// The layer (to shut it down).
    pub layer: TestLayer<S>,
    /// Executions and the gate.
    pub counts: Arc<Counts>,
    /// The router (to drive it in-process).
    pub router: Router,
    server: tokio::task::JoinHandle<()>,
}

impl<S: Store> Drop for App<S> {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// The engine of the test app: a manual clock and the test policy (wait
/// mode: [`WAIT_TIMEOUT`]).
pub fn engine<S: Store>(
    store: FailingStore<S>,
    clock: &ManualClock,
    wait: bool,
) -> Idem<FailingStore<S>> {
    engine_waiting(store, clock, wait.then_some(WAIT_TIMEOUT))
}

/// The engine of the test app, in wait mode for `wait` when given.
pub fn engine_waiting<S: Store>(
    store: FailingStore<S>,
    clock: &ManualClock,
    wait: Option<Duration>,
) -> Idem<FailingStore<S>> {
    let in_flight = match wait {
        Some(timeout) => InFlightMode::Wait {
            timeout,
            poll: Duration::from_millis(5),
        },
        None => InFlightMode::Reject,
    };
    let policy = Policy::builder()
        .lease(LEASE)
        .response_ttl(RESPONSE_TTL)
        .key_ttl(KEY_TTL)
        .max_response_bytes(MAX_RESPONSE)
        .in_flight(in_flight)
        .store_retries(1, Duration::from_millis(1))
        .build()
        .expect("test policy");
    Idem::new(store)
        .with_clock(clock.clone())
        .with_policy(policy)
}

impl<S: Store> App<S> {
    /// Starts the app over `store` with the default options.
    pub async fn start(store: Arc<S>) -> Self {
        Self::with(store, Options::default()).await
    }

    /// Starts the app over `store`.
    pub async fn with(store: Arc<S>, opts: Options) -> Self {
        let clock = ManualClock::starting_now();
        let store = FailingStore::new(store);
        let idem = engine_waiting(
            store.clone(),
            &clock,
            opts.wait.then_some(opts.wait_timeout),
        );
        // axum's route templates name the operations, and the path as the
        // client sent it (nesting prefix included) counts: both by name.
        let fp = FingerprintSpec::default()
            .ignore_fields(["/client_ts"])
            .include_headers(["x-fp"])
            .path(PathSource::OriginalUri);
        let mut layer = IdempotencyLayer::builder(idem.clone())
            .owner(ExtensionOwner::<Owner>::new())
            .operation(OperationSource::MatchedPath)
            .max_request_body(MAX_REQUEST)
            .fingerprint(fp.clone())
            .detached(opts.detached)
            .key_namespace(opts.namespace);
        if let Some(url) = opts.docs_url {
            layer = layer.docs_url(url);
        }
        let layer = layer.build().expect("layer");
        let optional = IdempotencyLayer::builder(idem)
            .owner(ExtensionOwner::<Owner>::new())
            .operation(OperationSource::MatchedPath)
            .key(KeyRequirement::Optional)
            .fingerprint(fp)
            .build()
            .expect("layer");
        let counts = Arc::new(Counts::default());
        let router = Router::new()
            .route("/orders", post(order).get(order))
            .route(
                "/orders/{id}",
                patch(order)
                    .put(order)
                    .delete(order)
                    .options(order)
                    .trace(order),
            )
            .route("/accounts/{id}/charges", post(order))
            .route("/other", post(order))
            .route_layer(layer.clone())
            .route("/optional", post(order).layer(optional))
            // Per-route layers derived from the main one (`to_builder`).
            .route(
                "/strict",
                post(order).layer(
                    layer
                        .to_builder()
                        .fingerprint(FingerprintSpec::default().path(PathSource::OriginalUri))
                        .build()
                        .expect("a valid layer"),
                ),
            )
            .route(
                "/small",
                post(order).layer(
                    layer
                        .to_builder()
                        .max_request_body(16)
                        .build()
                        .expect("a valid limit"),
                ),
            )
            // The same handlers nested twice under a prefix, each with the
            // layer on the nested router (`Router::nest`).
            .nest("/v1", nested(&layer))
            .nest("/v2", nested(&layer))
            .layer(middleware::from_fn(auth))
            .with_state(Arc::clone(&counts));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let app = router.clone();
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            base: format!("http://{addr}"),
            client: reqwest::Client::new(),
            clock,
            store,
            layer,
            counts,
            router,
            server,
        }
    }

    /// The server's `host:port`.
    pub fn addr(&self) -> &str {
        self.base.trim_start_matches("http://")
    }

    /// A JSON POST as owner `alice` with `key` (sent as given).
    pub fn post(&self, path: &str, key: Option<&str>, body: &str) -> reqwest::RequestBuilder {
        self.request(reqwest::Method::POST, path, key, body)
    }

    /// A JSON request as owner `alice`.
    pub fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        key: Option<&str>,
        body: &str,
    ) -> reqwest::RequestBuilder {
        self.build(method, path, key, body, "alice", "application/json")
    }

    /// A POST as `owner` with `content_type`.
    pub fn post_with(
        &self,
        path: &str,
        key: Option<&str>,
        body: &str,
        owner: &str,
        content_type: &str,
    ) -> reqwest::RequestBuilder {
        self.build(reqwest::Method::POST, path, key, body, owner, content_type)
    }

    fn build(
        &self,
        method: reqwest::Method,
        path: &str,
        key: Option<&str>,
        body: &str,
        owner: &str,
        content_type: &str,
    ) -> reqwest::RequestBuilder {
        let mut r = self
            .client
            .request(method, format!("{}{path}", self.base))
            .header("x-owner", owner)
            .header("content-type", content_type)
            .body(body.to_owned());
        if let Some(k) = key {
            r = r.header("idempotency-key", k);
        }
        r
    }

    /// The fingerprint a layer with the app's fingerprint settings stores
    /// for a JSON `POST` of `body` to `path`, with the operation named
    /// `POST {route}`: read back from the record a probe layer makes on the
    /// app's store (owner `probe`, a random key), so the scenarios compare
    /// with what idem-http computes, through its public API.
    pub async fn fingerprint_of(
        &self,
        route: &str,
        path: &str,
        body: &'static [u8],
    ) -> idem_core::store::Fingerprint {
        use tower::ServiceExt as _;
        let idem = engine(self.store.clone(), &self.clock, false);
        let layer = IdempotencyLayer::builder(idem.clone())
            .owner(idem_http::FixedOwner::new("probe"))
            .operation(OperationSource::Route(route.to_owned().into()))
            .fingerprint(
                FingerprintSpec::default()
                    .ignore_fields(["/client_ts"])
                    .include_headers(["x-fp"]),
            )
            .build()
            .expect("probe layer");
        let probe = Router::new()
            .fallback(|| async { StatusCode::CREATED })
            .layer(layer);
        let key = idem_core::IdempotencyKey::random();
        let req = Request::post(path)
            .header("idempotency-key", key.as_str())
            .header("content-type", "application/json")
            .body(Body::from(body))
            .expect("probe request");
        let res = probe.oneshot(req).await.expect("infallible");
        assert_eq!(res.status(), StatusCode::CREATED, "the probe ran");
        let scope = idem_core::Scope::new("probe", format!("POST {route}")).expect("scope");
        idem.admin()
            .inspect(&scope, key.as_str(), false)
            .await
            .expect("inspect")
            .expect("the probe's record")
            .fingerprint
    }

    /// Moves the engine's clock past the lease.
    pub fn expire_lease(&self) {
        self.clock.advance(LEASE + Duration::from_secs(1));
    }

    /// The test's usual request: a JSON `POST /orders` of `{}` with `key`.
    pub fn order(&self, key: &str) -> reqwest::RequestBuilder {
        self.post("/orders", Some(key), "{}")
    }

    /// Sends [`order`](Self::order) and reads the answer.
    pub async fn send_order(&self, key: &str) -> Got {
        send(self.order(key)).await
    }

    /// Starts an [`order`](Self::order) whose handler holds (`x-hold`) and
    /// waits until the handler has entered; the task answers once
    /// [`Counts::release`]d (read it with [`Got::joined`]).
    pub async fn hold(
        &self,
        key: &str,
    ) -> tokio::task::JoinHandle<reqwest::Result<reqwest::Response>> {
        let task = tokio::spawn(self.order(key).header("x-hold", "1").send());
        self.counts.entered().await;
        task
    }

    /// Releases the handler of a [`hold`](Self::hold) and asserts that it
    /// ran (201) and that the same order is then a replay of it; returns its
    /// answer.
    pub async fn finish(
        &self,
        held: tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>,
        key: &str,
    ) -> Got {
        self.counts.release(1);
        let first = Got::joined(held).await;
        first.assert_executed(201);
        self.send_order(key).await.assert_replay_of(&first);
        first
    }

    /// Moves past the lease and sends the [`order`](Self::order) again:
    /// asserts it runs (201) as a recovery, and returns its answer.
    pub async fn recover(&self, key: &str) -> Got {
        self.expire_lease();
        let g = self.send_order(key).await;
        g.assert_executed(201);
        assert_eq!(g.header("x-recovery"), Some("true"));
        g
    }

    /// Waits (10 s at most) for the engine's background completions; returns
    /// how many are left.
    pub async fn drain(&self) -> usize {
        self.layer
            .idem()
            .drain_completions(Duration::from_secs(10))
            .await
    }
}

/// The app with the default options, and a fresh key.
pub(super) async fn start<S: Store>(store: Arc<S>) -> (App<S>, String) {
    (App::start(store).await, key())
}

/// Routes under a prefix, the layer applied inside the nested router.
fn nested<S: Store>(layer: &TestLayer<S>) -> Router<Arc<Counts>> {
    Router::new()
        .route("/orders", post(order))
        .route("/accounts/{id}/charges", post(order))
        .route_layer(layer.clone())
}

async fn auth(mut req: Request, next: Next) -> Response {
    if let Some(owner) = req.headers().get("x-owner").and_then(|v| v.to_str().ok()) {
        let owner = Owner(owner.to_owned());
        req.extensions_mut().insert(owner);
    }
    next.run(req).await
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// The test handler. Behaviour comes from request headers (not part of the
/// fingerprint): `x-hold`, `x-panic`, `x-status`, `x-size`, `x-chunked`,
/// `x-sse`, `x-sse-live`, `x-stream`, `x-bin`, `x-cookie`, `x-nonutf8`,
/// `x-resource`, `x-save-resource` (saved at once with
/// `Attempt::save_resource_id`), `x-class`, `x-body-error`. The answer's
/// `x-previous-resource` is the resource id a recovery was given.
async fn order(
    State(counts): State<Arc<Counts>>,
    attempt: Option<IdemAttempt>,
    headers: HeaderMap,
    uri: Uri,
    body: Bytes,
) -> Response {
    let n = counts.executions.fetch_add(1, Ordering::SeqCst) + 1;
    if headers.contains_key("x-hold") {
        counts.entered.notify_one();
        if let Ok(p) = counts.release.acquire().await {
            p.forget();
        }
    }
    assert!(!headers.contains_key("x-panic"), "handler panic (test)");
    if let (Some(a), Some(r)) = (&attempt, header(&headers, "x-resource")) {
        a.0.set_resource_id(r);
    }
    if let (Some(a), Some(r)) = (&attempt, header(&headers, "x-save-resource")) {
        a.0.save_resource_id(r).await.expect("save_resource_id");
    }
    let status = header(&headers, "x-status")
        .and_then(|s| s.parse().ok())
        .unwrap_or(201);
    let size: Option<usize> = header(&headers, "x-size").and_then(|s| s.parse().ok());
    let stream: Option<usize> = header(&headers, "x-stream").and_then(|s| s.parse().ok());
    let mut res = if headers.contains_key("x-sse-live") {
        // A live event stream: the first event at once, the second only
        // after the test's signal, so the client can hold the first event
        // while the handler's stream is still unfinished.
        let counts = Arc::clone(&counts);
        let events = futures_util::stream::unfold(0u8, move |i| {
            let counts = Arc::clone(&counts);
            async move {
                match i {
                    0 => Some((
                        Ok::<_, std::io::Error>(Bytes::from_static(b"data: 1\n\n")),
                        1,
                    )),
                    1 => {
                        if let Ok(p) = counts.stream.acquire().await {
                            p.forget();
                        }
                        Some((Ok(Bytes::from_static(b"data: 2\n\n")), 2))
                    }
                    _ => None,
                }
            }
        });
        let mut r = Response::new(Body::from_stream(events));
        r.headers_mut().insert(
            "content-type",
            HeaderValue::from_static("text/event-stream"),
        );
        r
    } else if let Some(chunks) = stream {
        let parts = futures_util::stream::unfold(0usize, move |i| async move {
            if i == chunks {
                return None;
            }
            tokio::task::yield_now().await;
            Some((
                Ok::<_, std::io::Error>(Bytes::from(stream_chunk(n, i))),
                i + 1,
            ))
        });
        Response::new(Body::from_stream(parts))
    } else if headers.contains_key("x-sse") {
        let mut r = Response::new(Body::from("data: 1\n\ndata: 2\n\n"));
        r.headers_mut().insert(
            "content-type",
            HeaderValue::from_static("text/event-stream"),
        );
        r
    } else if headers.contains_key("x-body-error") {
        Response::new(Body::new(Chunks {
            left: 2,
            chunk: 16,
            fail: true,
        }))
    } else if let Some(size) = size {
        let b = if headers.contains_key("x-chunked") {
            Body::new(Chunks {
                left: size.div_ceil(1024),
                chunk: 1024,
                fail: false,
            })
        } else {
            Body::from(vec![b'x'; size])
        };
        Response::new(b)
    } else if headers.contains_key("x-bin") {
        Response::new(Body::from(vec![0u8, 0xff, 0xfe, b'{', n as u8]))
    } else {
        let v = serde_json::json!({
            "id": format!("ord_{n}"),
            "path": uri.path(),
            "body": String::from_utf8_lossy(&body),
        });
        let mut r = Response::new(Body::from(v.to_string()));
        r.headers_mut()
            .insert("content-type", HeaderValue::from_static("application/json"));
        r
    };
    *res.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::CREATED);
    let h = res.headers_mut();
    let recovery = attempt.as_ref().is_some_and(|a| a.0.is_recovery());
    h.insert(
        "x-recovery",
        HeaderValue::from_static(if recovery { "true" } else { "false" }),
    );
    h.insert("x-execution", HeaderValue::from(n));
    if let Some(previous) = attempt.as_ref().and_then(|a| a.0.previous_resource_id())
        && let Ok(v) = HeaderValue::from_str(previous)
    {
        h.insert("x-previous-resource", v);
    }
    h.insert("date", HeaderValue::from_static(STALE_DATE));
    h.append("link", HeaderValue::from_static("</a>; rel=\"a\""));
    h.append("link", HeaderValue::from_static("</b>; rel=\"b\""));
    if headers.contains_key("x-cookie") {
        h.insert(
            "set-cookie",
            HeaderValue::from_static("session=first; HttpOnly"),
        );
    }
    if headers.contains_key("x-nonutf8") {
        h.insert(
            "x-bin-header",
            HeaderValue::from_bytes(b"caf\xe9").expect("obs-text"),
        );
    }
    if header(&headers, "x-class") == Some("complete-without-body") {
        res.extensions_mut().insert(Class::CompleteWithoutBody);
    }
    res
}

/// A body of `left` chunks of `chunk` bytes with no size hint; with `fail`,
/// an error after the first chunk.
struct Chunks {
    left: usize,
    chunk: usize,
    fail: bool,
}

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        self.left -= 1;
        if self.fail && self.left == 0 {
            return Poll::Ready(Some(Err(std::io::Error::other("body failed (test)"))));
        }
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![b'y'; self.chunk])))))
    }
}
