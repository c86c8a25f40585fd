//! End to end over loopback: the middleware against a real `idem-http` layer
//! (axum on 127.0.0.1:0, MemoryStore). Every test counts how many times the
//! handler really ran and records the key field on every attempt.

#![allow(clippy::unwrap_used)]

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, SystemTime},
};

use axum::{
    Router,
    extract::{Request, State},
    http::{HeaderMap, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::post,
};
use idem_client::{
    Error, IdemResponseExt, IdempotencyMiddleware, IdempotentRequestExt, Intent, ReportKind, Sent,
    StopReason,
};
use idem_core::{Idem, MemoryStore, Policy};
use idem_http::{FixedOwner, IdempotencyLayer};

#[derive(Clone, Default)]
struct Counters {
    runs: Arc<AtomicUsize>,
    /// The first `fail` runs of `/flaky` answer 503.
    fail: Arc<AtomicUsize>,
    keys: Arc<Mutex<Vec<String>>>,
}

impl Counters {
    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
    fn keys(&self) -> Vec<String> {
        self.keys.lock().unwrap().clone()
    }
}

async fn orders(State(c): State<Counters>, body: String) -> Response {
    let n = c.runs.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::CREATED,
        format!(r#"{{"id":"ord_{n}","body":{body}}}"#),
    )
        .into_response()
}

async fn flaky(State(c): State<Counters>) -> Response {
    let n = c.runs.fetch_add(1, Ordering::SeqCst) + 1;
    if c.fail
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |f| f.checked_sub(1))
        .is_ok()
    {
        return (StatusCode::SERVICE_UNAVAILABLE, "try later").into_response();
    }
    (StatusCode::CREATED, format!(r#"{{"id":"ord_{n}"}}"#)).into_response()
}

async fn slow(State(c): State<Counters>) -> Response {
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let n = c.runs.fetch_add(1, Ordering::SeqCst) + 1;
    (StatusCode::CREATED, format!(r#"{{"id":"ord_{n}"}}"#)).into_response()
}

async fn validate(State(c): State<Counters>) -> Response {
    c.runs.fetch_add(1, Ordering::SeqCst);
    (
        StatusCode::UNPROCESSABLE_ENTITY,
        r#"{"error":"amount must be positive"}"#,
    )
        .into_response()
}

async fn busy(State(c): State<Counters>) -> Response {
    c.runs.fetch_add(1, Ordering::SeqCst);
    let mut h = HeaderMap::new();
    h.insert("retry-after", "30".parse().unwrap());
    (StatusCode::SERVICE_UNAVAILABLE, h, "busy").into_response()
}

async fn record(State(c): State<Counters>, req: Request, next: Next) -> Response {
    if let Some(v) = req.headers().get("idempotency-key") {
        c.keys
            .lock()
            .unwrap()
            .push(v.to_str().unwrap_or("?").to_owned());
    }
    next.run(req).await
}

struct Server {
    base: String,
    counters: Counters,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start() -> Server {
    let policy = Policy::builder()
        .lease(Duration::from_secs(3))
        .build()
        .unwrap();
    let idem = Idem::new(MemoryStore::new()).with_policy(policy);
    let layer = IdempotencyLayer::builder(idem)
        .owner(FixedOwner::new("tenant"))
        .build()
        .unwrap();
    let counters = Counters::default();
    let app = Router::new()
        .route("/orders", post(orders))
        .route("/flaky", post(flaky))
        .route("/slow", post(slow))
        .route("/validate", post(validate))
        .route("/busy", post(busy))
        .route_layer(layer)
        .layer(middleware::from_fn_with_state(counters.clone(), record))
        .with_state(counters.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Server {
        base,
        counters,
        task,
    }
}

fn client_with(b: idem_client::Builder) -> reqwest_middleware::ClientWithMiddleware {
    let inner = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    reqwest_middleware::ClientBuilder::new(inner)
        .with(b.build().unwrap())
        .build()
}

fn client() -> reqwest_middleware::ClientWithMiddleware {
    client_with(
        IdempotencyMiddleware::builder()
            .backoff(Duration::from_millis(10), Duration::from_millis(50))
            .deadline(Duration::from_secs(10)),
    )
}

fn one_key(keys: &[String]) -> &str {
    assert!(!keys.is_empty(), "no key was recorded");
    assert!(keys.iter().all(|k| k == &keys[0]), "keys differ: {keys:?}");
    &keys[0]
}

fn body_json() -> &'static str {
    r#"{"amount":100}"#
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_then_replay_is_marked_and_runs_once() {
    let s = start().await;
    let c = client();
    let intent = Intent::derive("orders", "e2e-replay");
    let send = || {
        c.post(format!("{}/orders", s.base))
            .header("content-type", "application/json")
            .body(body_json())
            .intent(&intent)
            .send()
    };
    let first = send().await.unwrap();
    let r = first.idem_report().unwrap().clone();
    assert_eq!((r.kind, r.attempts), (ReportKind::Fresh, 1));
    let Sent::Fresh(first) = first.idem().unwrap() else {
        panic!("not fresh")
    };
    let first_body = first.text().await.unwrap();
    let second = send().await.unwrap();
    assert_eq!(second.idem_report().unwrap().kind, ReportKind::Replayed);
    let Sent::Replayed(second) = second.idem().unwrap() else {
        panic!("not replayed")
    };
    assert_eq!(second.status(), 201);
    assert_eq!(second.text().await.unwrap(), first_body);
    assert_eq!(s.counters.runs(), 1);
    // The intent's key, as an sf-string, on both sends.
    let k = one_key(&s.counters.keys()).to_owned();
    assert_eq!(k, format!("\"{}\"", intent.key()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_503_is_retried_until_it_succeeds_once() {
    let s = start().await;
    s.counters.fail.store(2, Ordering::SeqCst);
    let c = client();
    let resp = c
        .post(format!("{}/flaky", s.base))
        .body("{}")
        .send()
        .await
        .unwrap();
    let r = resp.idem_report().unwrap().clone();
    assert_eq!(resp.status(), 201);
    assert_eq!((r.kind, r.attempts), (ReportKind::Fresh, 3));
    // Two released 503s and one stored success: three runs, one key.
    assert_eq!(s.counters.runs(), 3);
    assert_eq!(s.counters.keys().len(), 3);
    one_key(&s.counters.keys());
    // The stored success is never run again: resending the minted key replays it.
    let again = c
        .post(format!("{}/flaky", s.base))
        .body("{}")
        .idempotency_key(r.key.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(again.idem_report().unwrap().kind, ReportKind::Replayed);
    assert_eq!(s.counters.runs(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_duplicate_is_waited_out_and_replayed() {
    let s = start().await;
    let c1 = client();
    let c2 = client();
    let intent = Intent::random();
    let url = format!("{}/slow", s.base);
    let a = c1.post(&url).body("{}").intent(&intent).send();
    let b = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        c2.post(&url).body("{}").intent(&intent).send().await
    };
    let (a, b) = tokio::join!(a, b);
    let (a, b) = (a.unwrap(), b.unwrap());
    let (ra, rb) = (
        a.idem_report().unwrap().clone(),
        b.idem_report().unwrap().clone(),
    );
    assert_eq!((ra.kind, ra.attempts), (ReportKind::Fresh, 1));
    // The duplicate got 409 in_flight, waited Retry-After, and got the replay.
    assert_eq!(rb.kind, ReportKind::Replayed);
    assert!(rb.attempts >= 2, "{rb:?}");
    assert!(rb.elapsed >= Duration::from_secs(1), "{rb:?}");
    assert_eq!(a.text().await.unwrap(), b.text().await.unwrap());
    assert_eq!(s.counters.runs(), 1);
    one_key(&s.counters.keys());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_sequence_after_attempt_timeout() {
    let s = start().await;
    let c = client_with(
        IdempotencyMiddleware::builder()
            .backoff(Duration::from_millis(10), Duration::from_millis(50))
            .attempt_timeout(Some(Duration::from_millis(300)))
            .deadline(Duration::from_secs(10)),
    );
    let resp = c
        .post(format!("{}/slow", s.base))
        .body("{}")
        .send()
        .await
        .unwrap();
    let r = resp.idem_report().unwrap().clone();
    // Timeout (ambiguous) -> 409 in_flight (Retry-After) -> the replay.
    assert_eq!(r.kind, ReportKind::Replayed, "{r:?}");
    assert!(r.attempts >= 3, "{r:?}");
    assert_eq!(resp.status(), 201);
    assert_eq!(s.counters.runs(), 1);
    one_key(&s.counters.keys());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_422_is_its_answer_not_retried() {
    let s = start().await;
    let c = client();
    let intent = Intent::random();
    let send = || {
        c.post(format!("{}/validate", s.base))
            .body("{}")
            .intent(&intent)
            .send()
    };
    let first = send().await.unwrap();
    let r = first.idem_report().unwrap().clone();
    assert_eq!(
        (first.status().as_u16(), r.kind, r.attempts),
        (422, ReportKind::Fresh, 1)
    );
    assert!(matches!(first.idem().unwrap(), Sent::Fresh(_)));
    let second = send().await.unwrap();
    assert_eq!(second.status(), 422);
    assert_eq!(second.idem_report().unwrap().kind, ReportKind::Replayed);
    assert_eq!(s.counters.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fingerprint_mismatch_is_rejected_not_retried() {
    let s = start().await;
    let c = client();
    let intent = Intent::random();
    let url = format!("{}/orders", s.base);
    c.post(&url)
        .body(r#"{"amount":1}"#)
        .intent(&intent)
        .send()
        .await
        .unwrap();
    let other = c
        .post(&url)
        .body(r#"{"amount":2}"#)
        .intent(&intent)
        .send()
        .await
        .unwrap();
    let r = other.idem_report().unwrap().clone();
    assert_eq!(
        (other.status().as_u16(), r.kind, r.attempts),
        (422, ReportKind::Rejected, 1)
    );
    match other.idem() {
        Err(Error::Rejected { problem, key, .. }) => {
            assert_eq!(problem.code.as_deref(), Some("fingerprint_mismatch"));
            assert_eq!(&key, intent.key());
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
    assert_eq!(s.counters.runs(), 1);
    assert_eq!(s.counters.keys().len(), 2, "one attempt each");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_bounds_the_send_and_returns_the_key() {
    let s = start().await;
    let c = client_with(IdempotencyMiddleware::builder().deadline(Duration::from_secs(2)));
    let t0 = std::time::Instant::now();
    let resp = c
        .post(format!("{}/busy", s.base))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert!(t0.elapsed() < Duration::from_secs(3));
    let r = resp.idem_report().unwrap().clone();
    assert_eq!(
        (r.kind, r.attempts),
        (ReportKind::Exhausted(StopReason::Deadline), 1)
    );
    match resp.idem() {
        Err(Error::Exhausted {
            key,
            reason,
            last_status,
            ..
        }) => {
            assert_eq!(reason, StopReason::Deadline);
            assert_eq!(last_status, Some(StatusCode::SERVICE_UNAVAILABLE));
            assert_eq!(format!("\"{key}\""), one_key(&s.counters.keys()));
        }
        other => panic!("expected Exhausted, got {other:?}"),
    }
    assert_eq!(s.counters.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_lifetime_refuses_before_sending() {
    let s = start().await;
    let c = client_with(
        IdempotencyMiddleware::builder().key_lifetime(Some(Duration::from_secs(30 * 86_400))),
    );
    let old =
        Intent::random().with_created_at(SystemTime::now() - Duration::from_secs(40 * 86_400));
    let err = c
        .post(format!("{}/orders", s.base))
        .body("{}")
        .intent(&old)
        .send()
        .await
        .unwrap_err();
    match Error::from_middleware(&err) {
        Some(Error::KeyLifetimeExceeded { key }) => assert_eq!(key, old.key()),
        other => panic!("expected KeyLifetimeExceeded, got {other:?}"),
    }
    assert_eq!(s.counters.runs(), 0);
    assert!(s.counters.keys().is_empty(), "nothing reached the server");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_body_refused_unless_single_attempt() {
    let s = start().await;
    let c = client();
    let stream = || {
        reqwest::Body::wrap_stream(futures_util::stream::iter([Ok::<_, std::io::Error>(
            bytes::Bytes::from_static(b"{}"),
        )]))
    };
    let err = c
        .post(format!("{}/orders", s.base))
        .body(stream())
        .send()
        .await
        .unwrap_err();
    assert!(
        matches!(Error::from_middleware(&err), Some(Error::BodyNotReplayable)),
        "{err:?}"
    );
    assert!(s.counters.keys().is_empty(), "nothing reached the server");
    let once = c
        .post(format!("{}/orders", s.base))
        .body(stream())
        .single_attempt()
        .send()
        .await
        .unwrap();
    assert_eq!(once.idem_report().unwrap().kind, ReportKind::Fresh);
    assert_eq!(s.counters.runs(), 1);
    assert_eq!(s.counters.keys().len(), 1, "sent once, with a key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_refused_is_retried_then_exhausted_with_the_key() {
    // A port that was just free: bind, note it, close.
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let c = client_with(
        IdempotencyMiddleware::builder()
            .backoff(Duration::from_millis(5), Duration::from_millis(20))
            .max_attempts(3),
    );
    let intent = Intent::random();
    let err = c
        .post(format!("http://{addr}/orders"))
        .body("{}")
        .intent(&intent)
        .send()
        .await
        .unwrap_err();
    match Error::from_middleware(&err) {
        Some(Error::Exhausted {
            key,
            attempts,
            reason,
            last_status,
            ..
        }) => {
            assert_eq!(key, intent.key());
            assert_eq!(*attempts, 3);
            assert_eq!(*reason, StopReason::Transport);
            assert_eq!(*last_status, None);
        }
        other => panic!("expected Exhausted, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caller_keys_bare_and_structured_are_one_record() {
    let s = start().await;
    let c = client();
    let url = format!("{}/orders", s.base);
    let a = c
        .post(&url)
        .header("idempotency-key", "\"k-1\"")
        .body("{}")
        .send()
        .await
        .unwrap();
    let b = c
        .post(&url)
        .header("idempotency-key", "k-1")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(a.idem_report().unwrap().kind, ReportKind::Fresh);
    assert_eq!(b.idem_report().unwrap().kind, ReportKind::Replayed);
    assert_eq!(
        s.counters.keys(),
        vec!["\"k-1\"".to_owned(), "k-1".to_owned()]
    );
    assert_eq!(s.counters.runs(), 1);
    // A bad caller key is refused before anything is sent.
    let err = c
        .post(&url)
        .header("idempotency-key", "\"\"")
        .body("{}")
        .send()
        .await
        .unwrap_err();
    assert!(
        matches!(Error::from_middleware(&err), Some(Error::InvalidKey(_))),
        "{err:?}"
    );
    assert_eq!(s.counters.keys().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_passes_through_without_a_key() {
    let s = start().await;
    let c = client();
    let resp = c.get(format!("{}/orders", s.base)).send().await.unwrap();
    assert_eq!(resp.status(), 405);
    assert!(resp.idem_report().is_none());
    assert!(s.counters.keys().is_empty());
}

/// A TCP proxy with a script per accepted connection: `true` drops the
/// response (forward the request, wait for the server's first response
/// byte, which `idem-http` sends only after the outcome is stored, then
/// close the client's socket); `false` passes everything.
async fn fault_proxy(upstream: String, script: Vec<bool>) -> (String, tokio::task::JoinHandle<()>) {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let up = upstream.trim_start_matches("http://").to_owned();
    let task = tokio::spawn(async move {
        let mut script = script.into_iter();
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                return;
            };
            let drop_response = script.next().unwrap_or(false);
            let up = up.clone();
            tokio::spawn(async move {
                let Ok(mut server) = tokio::net::TcpStream::connect(&up).await else {
                    return;
                };
                if !drop_response {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    return;
                }
                let (mut cr, _cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let fwd = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut cr, &mut sw).await;
                });
                let mut first = [0u8; 1];
                let _ = tokio::time::timeout(Duration::from_secs(5), sr.read(&mut first)).await;
                fwd.abort();
                // `_cw` and `sr` drop here: the client sees EOF before a response head.
            });
        }
    });
    (format!("http://{addr}"), task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_response_is_replayed() {
    let s = start().await;
    let (proxy, task) = fault_proxy(s.base.clone(), vec![true, false]).await;
    let c = client();
    let resp = c
        .post(format!("{proxy}/orders"))
        .body(body_json())
        .send()
        .await
        .unwrap();
    let r = resp.idem_report().unwrap().clone();
    // Row 2 (ambiguous) then row 4: the retry gets the stored answer.
    assert_eq!((r.kind, r.attempts), (ReportKind::Replayed, 2), "{r:?}");
    assert_eq!(resp.status(), 201);
    assert_eq!(s.counters.runs(), 1);
    assert_eq!(s.counters.keys().len(), 2);
    one_key(&s.counters.keys());
    task.abort();
}

/// A server that is not idem: Stripe-like, a concurrent duplicate gets a bare
/// 409 (no problem body, no `Retry-After`), then the stored answer with
/// `Idempotent-Replayed: true`.
async fn stripe_like() -> (String, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route(
            "/v1/charges",
            post(|State(h): State<Arc<AtomicUsize>>| async move {
                if h.fetch_add(1, Ordering::SeqCst) % 2 == 0 {
                    (
                        StatusCode::CONFLICT,
                        r#"{"error":{"type":"idempotency_error"}}"#,
                    )
                        .into_response()
                } else {
                    let mut m = HeaderMap::new();
                    m.insert("idempotent-replayed", "true".parse().unwrap());
                    (StatusCode::OK, m, r#"{"id":"ch_1"}"#).into_response()
                }
            }),
        )
        .with_state(Arc::clone(&hits));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (base, hits, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_409_from_a_server_that_is_not_idem() {
    let (base, hits, task) = stripe_like().await;
    // Default: a 409 with no code and no Retry-After is the server's answer (row 13).
    let resp = client()
        .post(format!("{base}/v1/charges"))
        .body("{}")
        .send()
        .await
        .unwrap();
    let r = resp.idem_report().unwrap().clone();
    assert_eq!(
        (resp.status().as_u16(), r.kind, r.attempts),
        (409, ReportKind::Fresh, 1)
    );
    assert_eq!(hits.swap(0, Ordering::SeqCst), 1);
    // retry_conflicts: retried with the same key, and the replay is read.
    let c = client_with(
        IdempotencyMiddleware::builder()
            .backoff(Duration::from_millis(10), Duration::from_millis(50))
            .retry_conflicts(true),
    );
    let resp = c
        .post(format!("{base}/v1/charges"))
        .body("{}")
        .send()
        .await
        .unwrap();
    let r = resp.idem_report().unwrap().clone();
    assert_eq!(
        (resp.status().as_u16(), r.kind, r.attempts),
        (200, ReportKind::Replayed, 2)
    );
    assert_eq!(hits.load(Ordering::SeqCst), 2);
    task.abort();
}

/// A retry layer *above* the idempotency middleware (as reqwest-retry is):
/// it sends each request twice through the same extensions.
struct SendTwice;

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for SendTwice {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut http::Extensions,
        next: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let copy = req.try_clone().unwrap();
        let _first = next.clone().run(req, extensions).await?;
        next.run(copy, extensions).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outer_retry_layer_keeps_the_minted_key() {
    let s = start().await;
    let inner = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let c = reqwest_middleware::ClientBuilder::new(inner)
        .with(SendTwice)
        .with(IdempotencyMiddleware::builder().build().unwrap())
        .build();
    let resp = c
        .post(format!("{}/orders", s.base))
        .body("{}")
        .send()
        .await
        .unwrap();
    // The second pass found the key the first minted in the extensions.
    assert_eq!(resp.idem_report().unwrap().kind, ReportKind::Replayed);
    assert_eq!(s.counters.keys().len(), 2);
    one_key(&s.counters.keys());
    assert_eq!(s.counters.runs(), 1);
}

/// A minimal subscriber that writes down what `idem_client` emits: spans
/// (with their later records) and events, as `name field=value` lines.
#[derive(Default)]
struct Capture {
    lines: Arc<Mutex<Vec<String>>>,
    ours: Mutex<std::collections::HashSet<u64>>,
    next: AtomicUsize,
}

struct Line<'a>(&'a mut String);

impl tracing::field::Visit for Line<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write;
        let _ = write!(self.0, " {}={value:?}", field.name());
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attrs: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let id = self.next.fetch_add(1, Ordering::SeqCst) as u64 + 1;
        if attrs.metadata().target().starts_with("idem_client") {
            self.ours.lock().unwrap().insert(id);
            let mut s = format!("span {}", attrs.metadata().name());
            attrs.record(&mut Line(&mut s));
            self.lines.lock().unwrap().push(s);
        }
        tracing::span::Id::from_u64(id)
    }
    fn record(&self, id: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        if self.ours.lock().unwrap().contains(&id.into_u64()) {
            let mut s = "record".to_owned();
            values.record(&mut Line(&mut s));
            self.lines.lock().unwrap().push(s);
        }
    }
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if event.metadata().target().starts_with("idem_client") {
            let mut s = "event".to_owned();
            event.record(&mut Line(&mut s));
            self.lines.lock().unwrap().push(s);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[tokio::test(flavor = "current_thread")]
async fn one_span_per_send_with_the_key_hash_never_the_key() {
    let capture = Capture::default();
    let lines = Arc::clone(&capture.lines);
    let _guard = tracing::dispatcher::set_default(&tracing::Dispatch::new(capture));
    let s = start().await;
    s.counters.fail.store(1, Ordering::SeqCst);
    let intent = Intent::random();
    let resp = client()
        .post(format!("{}/flaky?token=secret", s.base))
        .body("{}")
        .intent(&intent)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.idem_report().unwrap().attempts, 2);
    let lines = lines.lock().unwrap().clone();
    let all = lines.join("\n");
    let spans: Vec<_> = lines
        .iter()
        .filter(|l| l.starts_with("span idem.client.send"))
        .collect();
    assert_eq!(spans.len(), 1, "{all}");
    assert!(spans[0].contains(&intent.key().log_hash()), "{all}");
    assert!(spans[0].contains("url.path=\"/flaky\""), "{all}");
    assert!(all.contains("idem.attempts=2"), "{all}");
    assert!(all.contains("idem.outcome=\"fresh\""), "{all}");
    assert!(all.contains("http.response.status_code=201"), "{all}");
    assert!(all.contains("reason=status_503"), "one retry event: {all}");
    assert!(
        !all.contains(intent.key().as_str()),
        "the raw key leaked: {all}"
    );
    assert!(!all.contains("secret"), "the query string leaked: {all}");
}
