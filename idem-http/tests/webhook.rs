//! The webhook receiver, black box: a real axum server on 127.0.0.1:0 with
//! `WebhookLayer`, a test "provider" that signs each delivery at the
//! engine's (manual) clock and posts it with reqwest, and a handler that
//! counts how many times it really ran. One test per row of the behaviour
//! table (W1-W19), on every backend.

use idem_test_support::fixtures as support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use idem_core::Idem;
use idem_core::IdempotencyKey;
use idem_core::InFlightMode;
use idem_core::Policy;
use idem_core::clock::ManualClock;
use idem_core::store::Store;
use idem_core::store::{OutcomeKind, RecordState};
use idem_core::testkit::FailingStore;
use idem_http::IdemAttempt;
use idem_http::webhook::{
    DuplicateAnswer, EventId, Provider, Secret, WebhookDelivery, WebhookLayer, WebhookLayerBuilder,
    WebhookPermanentFailure,
};
use sha2::Sha256;
use tokio::sync::{Notify, Semaphore};

const SW_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const SW_OTHER: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const STRIPE_SECRET: &str = "whsec_test_secret";
const GITHUB_SECRET: &str = "It's a Secret to Everybody";
const LEASE: Duration = Duration::from_secs(10);
const HOUR: Duration = Duration::from_secs(3600);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Standard,
    Svix,
    Stripe,
    GitHub,
}

/// What the handler saw.
struct Runs {
    count: AtomicUsize,
    recoveries: Mutex<Vec<bool>>,
    hook_calls: AtomicUsize,
    entered: Notify,
    gate: Semaphore,
}

impl Default for Runs {
    fn default() -> Self {
        Self {
            count: AtomicUsize::new(0),
            recoveries: Mutex::new(Vec::new()),
            hook_calls: AtomicUsize::new(0),
            entered: Notify::new(),
            gate: Semaphore::new(0),
        }
    }
}

impl Runs {
    fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }
    fn recoveries(&self) -> Vec<bool> {
        self.recoveries.lock().expect("lock").clone()
    }
}

/// The handler: behaviour by the event's `type`.
async fn handle(
    State(runs): State<Arc<Runs>>,
    WebhookDelivery(d): WebhookDelivery,
    IdemAttempt(a): IdemAttempt,
    body: Bytes,
) -> Response {
    let n = runs.count.fetch_add(1, Ordering::SeqCst);
    runs.recoveries.lock().expect("lock").push(a.is_recovery());
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    match v["type"].as_str().unwrap_or("ok") {
        "permanent" => (StatusCode::UNPROCESSABLE_ENTITY, "cannot process").into_response(),
        "transient" => StatusCode::SERVICE_UNAVAILABLE.into_response(),
        "flaky" if n == 0 => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        "slow" => {
            runs.entered.notify_one();
            let _permit = runs.gate.acquire().await;
            (StatusCode::OK, "slow done").into_response()
        }
        "busy" => {
            // Long enough for concurrent duplicates to overlap it.
            tokio::time::sleep(Duration::from_millis(50)).await;
            (StatusCode::OK, "busy done").into_response()
        }
        "body_error" => {
            // The response body fails mid-way: transient, key released.
            let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
                Ok(Bytes::from_static(b"partial")),
                Err(std::io::Error::other("disk gone")),
            ];
            let body = axum::body::Body::from_stream(futures_util::stream::iter(chunks));
            (StatusCode::OK, body).into_response()
        }
        "panic" if n == 0 => panic!("handler panics on its first run"),
        _ => (StatusCode::OK, format!("processed {}", d.event_id())).into_response(),
    }
}

struct App<S: Store> {
    addr: String,
    client: reqwest::Client,
    clock: ManualClock,
    store: FailingStore<S>,
    layer: WebhookLayer<FailingStore<S>>,
    runs: Arc<Runs>,
    kind: Kind,
    server: tokio::task::JoinHandle<()>,
}

impl<S: Store> Drop for App<S> {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn provider(kind: Kind) -> Provider {
    match kind {
        Kind::Standard => Provider::standard_webhooks([Secret::whsec(SW_SECRET).expect("whsec")]),
        // A rotation list: the old secret first, the signing one second.
        Kind::Svix => Provider::svix([
            Secret::whsec(SW_OTHER).expect("whsec"),
            Secret::whsec(SW_SECRET).expect("whsec"),
        ]),
        Kind::Stripe => Provider::stripe([Secret::new(STRIPE_SECRET)]),
        Kind::GitHub => Provider::github([Secret::new(GITHUB_SECRET)]),
    }
}

fn engine<S: Store>(
    store: FailingStore<S>,
    clock: &ManualClock,
    wait: Option<Duration>,
) -> Idem<FailingStore<S>> {
    let in_flight = wait.map_or(InFlightMode::Reject, |timeout| InFlightMode::Wait {
        timeout,
        poll: Duration::from_millis(5),
    });
    let policy = Policy::builder()
        .in_flight(in_flight)
        .lease(LEASE)
        .response_ttl(72 * HOUR)
        .key_ttl(30 * 24 * HOUR)
        .store_retries(1, Duration::from_millis(1))
        .build()
        .expect("policy");
    Idem::new(store)
        .with_clock(clock.clone())
        .with_policy(policy)
}

type Tweak<S> = fn(WebhookLayerBuilder<FailingStore<S>>) -> WebhookLayerBuilder<FailingStore<S>>;

impl<S: Store> App<S> {
    async fn start(store: Arc<S>, kind: Kind) -> Self {
        Self::with(store, kind, |b| b).await
    }

    async fn with(store: Arc<S>, kind: Kind, tweak: Tweak<S>) -> Self {
        Self::build(store, kind, tweak, None).await
    }

    async fn build(store: Arc<S>, kind: Kind, tweak: Tweak<S>, wait: Option<Duration>) -> Self {
        let clock = ManualClock::starting_now();
        let store = FailingStore::new(store);
        let runs = Arc::new(Runs::default());
        let layer = {
            let runs = Arc::clone(&runs);
            tweak(
                WebhookLayer::builder(engine(store.clone(), &clock, wait))
                    .provider(provider(kind))
                    .endpoint(format!("test/{}", IdempotencyKey::random().as_str()))
                    .max_body(64 * 1024)
                    .on_permanent_failure(move |_, _| {
                        runs.hook_calls.fetch_add(1, Ordering::SeqCst);
                    }),
            )
            .build()
            .expect("layer")
        };
        let app = Router::new()
            .route("/hook", post(handle))
            .route_layer(layer.clone())
            .with_state(Arc::clone(&runs));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = format!("http://{}", listener.local_addr().expect("addr"));
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            addr,
            client: reqwest::Client::new(),
            clock,
            store,
            layer,
            runs,
            kind,
            server,
        }
    }

    fn now_secs(&self) -> i64 {
        use idem_core::clock::Clock as _;
        self.clock.now().as_unix_millis() / 1000
    }

    /// A delivery of event `id` signed now.
    fn delivery(&self, id: &str, ty: &str) -> Delivery {
        Delivery::signed(self.kind, id, &event(id, ty), self.now_secs())
    }

    async fn send(&self, d: &Delivery) -> Got {
        send_to(&self.client, &format!("{}/hook", self.addr), d).await
    }

    /// Sends `d` from a task of its own (a delivery racing others).
    fn spawn_send(&self, d: Delivery) -> tokio::task::JoinHandle<Got> {
        let (client, url) = (self.client.clone(), format!("{}/hook", self.addr));
        tokio::spawn(async move { send_to(&client, &url, &d).await })
    }

    /// Asserts that nothing ran and that `key` has no record.
    async fn assert_untouched(&self, key: &str) {
        assert_eq!(self.runs.count(), 0);
        assert_eq!(self.state(key).await, None);
    }

    /// Asserts that `key`'s record completed with `outcome` on the first
    /// attempt.
    async fn assert_completed_once(&self, key: &str, outcome: OutcomeKind) {
        assert_eq!(
            self.state(key).await,
            Some((RecordState::Completed, Some(outcome), 1))
        );
    }

    async fn state(&self, key: &str) -> Option<(RecordState, Option<OutcomeKind>, u32)> {
        self.layer
            .idem()
            .admin()
            .inspect(self.layer.scope(), key, false)
            .await
            .expect("inspect")
            .map(|v| (v.state, v.outcome, v.attempt))
    }
}

async fn send_to(client: &reqwest::Client, url: &str, d: &Delivery) -> Got {
    let mut r = client
        .post(url)
        .header("content-type", "application/json")
        .body(d.body.clone());
    for (n, v) in &d.headers {
        r = r.header(n.as_str(), v.as_str());
    }
    let res = r.send().await.expect("send");
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    let body = res.bytes().await.expect("body").to_vec();
    Got {
        status,
        headers,
        body,
    }
}

fn event(id: &str, ty: &str) -> String {
    serde_json::json!({ "id": id, "type": ty, "object": "event" }).to_string()
}

fn hmac(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("key");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().to_vec()
}

fn whsec_key(s: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(s.trim_start_matches("whsec_"))
        .expect("base64")
}

#[derive(Clone, Debug)]
struct Delivery {
    headers: Vec<(String, String)>,
    body: String,
}

impl Delivery {
    /// Signed as the provider of `kind` signs, at `ts` (Unix seconds).
    fn signed(kind: Kind, id: &str, body: &str, ts: i64) -> Self {
        let t = ts.to_string();
        let headers = match kind {
            Kind::Standard | Kind::Svix => {
                let prefix = if kind == Kind::Svix {
                    "svix"
                } else {
                    "webhook"
                };
                let sig = hmac(
                    &whsec_key(SW_SECRET),
                    &[id.as_bytes(), b".", t.as_bytes(), b".", body.as_bytes()],
                );
                let b64 = base64::engine::general_purpose::STANDARD.encode(sig);
                vec![
                    (format!("{prefix}-id"), id.to_owned()),
                    (format!("{prefix}-timestamp"), t),
                    (
                        format!("{prefix}-signature"),
                        // A rotation list: a stale signature first.
                        format!("v1,R3PTzyfHASBKHH98a7yexTwaJ4yNIcGhFQc1yuN+BPU= v1,{b64}"),
                    ),
                ]
            }
            Kind::Stripe => {
                let sig = hmac(
                    STRIPE_SECRET.as_bytes(),
                    &[t.as_bytes(), b".", body.as_bytes()],
                );
                vec![(
                    "stripe-signature".to_owned(),
                    format!("t={t},v1={}", hex::encode(sig)),
                )]
            }
            Kind::GitHub => {
                let sig = hmac(GITHUB_SECRET.as_bytes(), &[body.as_bytes()]);
                vec![
                    ("x-github-delivery".to_owned(), id.to_owned()),
                    ("x-github-event".to_owned(), "push".to_owned()),
                    (
                        "x-hub-signature-256".to_owned(),
                        format!("sha256={}", hex::encode(sig)),
                    ),
                ]
            }
        };
        Self {
            headers,
            body: body.to_owned(),
        }
    }

    fn without(mut self, name: &str) -> Self {
        self.headers.retain(|(n, _)| n != name);
        self
    }

    fn with(mut self, name: &str, value: &str) -> Self {
        self.headers.retain(|(n, _)| n != name);
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }
}

struct Got {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
}

impl Got {
    fn header(&self, n: &str) -> Option<&str> {
        self.headers.get(n).and_then(|v| v.to_str().ok())
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    fn problem(&self, status: u16, code: &str) {
        assert_eq!(self.status, status, "{}", self.text());
        let v: serde_json::Value = serde_json::from_slice(&self.body).expect("problem json");
        assert_eq!(v["code"], code, "{v}");
        assert_eq!(v["status"], status, "{v}");
    }
    fn is_ack(&self) {
        assert_eq!(self.status, 200, "{}", self.text());
        assert!(self.body.is_empty(), "{}", self.text());
        assert_eq!(self.header("idempotent-replayed"), Some("true"));
    }
}

fn id() -> String {
    format!("msg_{}", IdempotencyKey::random().as_str())
}

mod rows {
    use super::*;

    /// W1: a missing or unparsable signature header is 400
    /// `malformed_webhook`; nothing runs, nothing is stored.
    pub(crate) async fn w01_malformed_signature_is_400<S: Store>(store: Arc<S>) {
        let app = App::start(store, Kind::Standard).await;
        let e = id();
        let d = app.delivery(&e, "ok");
        for bad in [
            d.clone().without("webhook-signature"),
            d.clone().without("webhook-timestamp"),
            d.clone().with("webhook-signature", "garbage"),
            d.clone().with("webhook-signature", "v1a,abc v0,def"),
            d.clone().with("webhook-timestamp", "soon"),
        ] {
            app.send(&bad).await.problem(400, "malformed_webhook");
        }
        app.assert_untouched(&e).await;
    }

    /// W2: no signature matches (wrong secret, tampered body, `v1,` empty,
    /// truncated): 401 `invalid_signature`; nothing runs or is stored.
    pub(crate) async fn w02_unmatched_signature_is_401<S: Store>(store: Arc<S>) {
        let app = App::start(store, Kind::Standard).await;
        let e = id();
        let d = app.delivery(&e, "ok");
        let mut tampered = d.clone();
        tampered.body = event(&e, "permanent");
        let sig = d
            .headers
            .iter()
            .find(|(n, _)| n == "webhook-signature")
            .map(|(_, v)| v.clone())
            .expect("sig");
        let good = sig.split(' ').nth(1).expect("second").to_owned();
        for bad in [
            tampered,
            d.clone().with("webhook-signature", "v1,"),
            d.clone().with("webhook-signature", &good[..good.len() - 4]),
            d.clone().with(
                "webhook-signature",
                "v1,R3PTzyfHASBKHH98a7yexTwaJ4yNIcGhFQc1yuN+BPU=",
            ),
            d.clone().with("webhook-id", "msg_other"),
        ] {
            let g = app.send(&bad).await;
            g.problem(401, "invalid_signature");
            assert!(
                !g.text().contains(&good[3..]),
                "the detail quotes no signature"
            );
        }
        app.assert_untouched(&e).await;
        assert_eq!(app.state("msg_other").await, None);
    }

    /// W3: a timestamp outside ±tolerance is 401 `stale_webhook`, in the
    /// past and in the future.
    pub(crate) async fn w03_stale_timestamp_is_401<S: Store>(store: Arc<S>) {
        let app = App::start(store, Kind::Standard).await;
        let e = id();
        let now = app.now_secs();
        for ts in [now - 301, now + 301] {
            let d = Delivery::signed(Kind::Standard, &e, &event(&e, "ok"), ts);
            app.send(&d).await.problem(401, "stale_webhook");
        }
        let d = Delivery::signed(Kind::Standard, &e, &event(&e, "ok"), now - 299);
        assert_eq!(app.send(&d).await.status, 200);
        assert_eq!(app.runs.count(), 1);
    }

    /// W4: a body over the limit is 413 before anything is verified.
    pub(crate) async fn w04_body_over_the_limit_is_413<S: Store>(store: Arc<S>) {
        let app = App::start(store, Kind::Standard).await;
        let e = id();
        let big = format!("{{\"id\":\"{e}\",\"pad\":\"{}\"}}", "x".repeat(64 * 1024));
        let d = Delivery::signed(Kind::Standard, &e, &big, app.now_secs());
        app.send(&d).await.problem(413, "request_too_large");
        app.assert_untouched(&e).await;
    }

    /// W5: verified but no event id: 400 `missing_event_id`; with
    /// `fallback_body_hash` the body's hash is the key, and a redelivery of
    /// the same body is a duplicate.
    pub(crate) async fn w05_no_event_id<S: Store>(store: Arc<S>) {
        let app = App::start(Arc::clone(&store), Kind::Stripe).await;
        let body = r#"{"object":"event","type":"ok"}"#;
        let d = Delivery::signed(Kind::Stripe, "", body, app.now_secs());
        app.send(&d).await.problem(400, "missing_event_id");
        assert_eq!(app.runs.count(), 0);
        // A body naming a member twice cannot give an id.
        let dup = r#"{"id":"evt_1","id":"evt_2"}"#;
        let d = Delivery::signed(Kind::Stripe, "", dup, app.now_secs());
        app.send(&d).await.problem(400, "malformed_webhook");
        assert_eq!(app.runs.count(), 0);
        assert_eq!(app.state("evt_1").await, None);
        assert_eq!(app.state("evt_2").await, None);

        let app = App::with(store, Kind::Stripe, |b| b.fallback_body_hash(true)).await;
        let d = Delivery::signed(Kind::Stripe, "", body, app.now_secs());
        assert_eq!(app.send(&d).await.status, 200);
        app.clock.advance(Duration::from_secs(60));
        let again = Delivery::signed(Kind::Stripe, "", body, app.now_secs());
        app.send(&again).await.is_ack();
        assert_eq!(app.runs.count(), 1);
        let hash = hex::encode(<Sha256 as sha2::Digest>::digest(body.as_bytes()));
        let key = IdempotencyKey::derive("stripe", &hash);
        assert_eq!(
            app.state(key.as_str()).await.map(|s| s.0),
            Some(RecordState::Completed)
        );
    }

    /// W6: the first delivery runs once and is stored as a success; the
    /// handler's response goes out; the id is the key, verbatim.
    pub(crate) async fn w06_first_delivery_runs_once<S: Store>(store: Arc<S>) {
        let app = App::start(store, Kind::Standard).await;
        let e = id();
        let g = app.send(&app.delivery(&e, "ok")).await;
        assert_eq!(g.status, 200);
        assert_eq!(g.text(), format!("processed {e}"));
        assert_eq!(g.header("idempotent-replayed"), None);
        assert_eq!(app.runs.count(), 1);
        assert_eq!(app.runs.recoveries(), vec![false]);
        app.assert_completed_once(&e, OutcomeKind::Success).await;
    }

    /// W7: a 4xx is a permanent failure: stored, acknowledged with 200, the
    /// hook called once; its redelivery is a duplicate. `PassThrough`
    /// sends the handler's status instead.
    pub(crate) async fn w07_permanent_failure_is_acknowledged<S: Store>(store: Arc<S>) {
        let app = App::start(Arc::clone(&store), Kind::Standard).await;
        let e = id();
        let g = app.send(&app.delivery(&e, "permanent")).await;
        assert_eq!(g.status, 200, "{}", g.text());
        assert!(g.body.is_empty());
        assert_eq!(app.runs.hook_calls.load(Ordering::SeqCst), 1);
        app.assert_completed_once(&e, OutcomeKind::Failure).await;
        app.clock.advance(Duration::from_secs(30));
        app.send(&app.delivery(&e, "permanent")).await.is_ack();
        assert_eq!(app.runs.count(), 1);
        assert_eq!(app.runs.hook_calls.load(Ordering::SeqCst), 1);

        let app = App::with(store, Kind::Standard, |b| {
            b.permanent_failure(WebhookPermanentFailure::PassThrough)
        })
        .await;
        let e = id();
        let g = app.send(&app.delivery(&e, "permanent")).await;
        assert_eq!(g.status, 422);
        assert_eq!(g.text(), "cannot process");
        assert_eq!(app.runs.hook_calls.load(Ordering::SeqCst), 1);
        app.send(&app.delivery(&e, "permanent")).await.is_ack();
        assert_eq!(app.runs.count(), 1);
    }

    /// W8: a 5xx (or 408/425/429) goes out as is and releases the key: the
    /// next delivery runs again, as a recovery.
    pub(crate) async fn w08_transient_failure_runs_again_as_recovery<S: Store>(store: Arc<S>) {
        let app = App::start(store, Kind::Standard).await;
        let e = id();
        let g = app.send(&app.delivery(&e, "flaky")).await;
        assert_eq!(g.status, 500);
        assert_eq!(
            app.state(&e).await.map(|s| s.0),
            Some(RecordState::Released)
        );
        app.clock.advance(Duration::from_secs(60));
        let g = app.send(&app.delivery(&e, "flaky")).await;
        assert_eq!(g.status, 200, "{}", g.text());
        assert_eq!(app.runs.count(), 2);
        assert_eq!(app.runs.recoveries(), vec![false, true]);
        let e2 = id();
        assert_eq!(app.send(&app.delivery(&e2, "transient")).await.status, 503);
        assert_eq!(
            app.state(&e2).await.map(|s| s.0),
            Some(RecordState::Released)
        );
        // A response body that fails is transient too.
        let e3 = id();
        app.send(&app.delivery(&e3, "body_error"))
            .await
            .problem(500, "response_body_failed");
        assert_eq!(
            app.state(&e3).await.map(|s| s.0),
            Some(RecordState::Released)
        );
        assert_eq!(app.runs.hook_calls.load(Ordering::SeqCst), 0);
    }

    /// W9: a panic is 500 and leaves the record in flight: a redelivery
    /// within the lease is W12, one after it runs as a recovery.
    pub(crate) async fn w09_panic_is_in_flight_until_the_lease_ends<S: Store>(store: Arc<S>) {
        let app = App::start(store, Kind::Standard).await;
        let e = id();
        app.send(&app.delivery(&e, "panic"))
            .await
            .problem(500, "handler_panicked");
        assert_eq!(
            app.state(&e).await.map(|s| s.0),
            Some(RecordState::InFlight)
        );
        let g = app.send(&app.delivery(&e, "panic")).await;
        g.problem(503, "in_flight");
        app.clock.advance(LEASE + Duration::from_secs(1));
        let g = app.send(&app.delivery(&e, "panic")).await;
        assert_eq!(g.status, 200, "{}", g.text());
        assert_eq!(app.runs.count(), 2);
        assert_eq!(app.runs.recoveries(), vec![false, true]);
    }

    /// W10: a redelivery, re-signed with a new timestamp, of a finished
    /// event: 200, empty, `Idempotent-Replayed: true`; the handler does not
    /// run again.
    pub(crate) async fn w10_duplicate_is_acknowledged<S: Store>(store: Arc<S>) {
        let app = App::start(store, Kind::Standard).await;
        let e = id();
        assert_eq!(app.send(&app.delivery(&e, "ok")).await.status, 200);
        app.clock.advance(Duration::from_secs(3600));
        app.send(&app.delivery(&e, "ok")).await.is_ack();
        assert_eq!(app.runs.count(), 1);
        app.assert_completed_once(&e, OutcomeKind::Success).await;
    }

    /// W11: with `Replay`, a duplicate gets the stored response and the
    /// marker; a permanent failure acknowledged with 200 stays 200.
    pub(crate) async fn w11_duplicate_replays_the_stored_response<S: Store>(store: Arc<S>) {
        let app = App::with(store, Kind::Standard, |b| {
            b.duplicate(DuplicateAnswer::Replay)
        })
        .await;
        let e = id();
        let first = app.send(&app.delivery(&e, "ok")).await;
        let g = app.send(&app.delivery(&e, "ok")).await;
        assert_eq!(g.status, 200);
        assert_eq!(g.body, first.body);
        assert_eq!(g.header("idempotent-replayed"), Some("true"));
        let f = id();
        assert_eq!(app.send(&app.delivery(&f, "permanent")).await.status, 200);
        app.send(&app.delivery(&f, "permanent")).await.is_ack();
        assert_eq!(app.runs.count(), 2);
    }

    /// W12: a duplicate while the first delivery runs: 503 with
    /// `Retry-After` (the lease left), and the handler runs once.
    pub(crate) async fn w12_in_flight_duplicate_is_503<S: Store>(store: Arc<S>) {
        let app = App::start(store, Kind::Standard).await;
        let e = id();
        let first = app.spawn_send(app.delivery(&e, "slow"));
        app.runs.entered.notified().await;
        let g = app.send(&app.delivery(&e, "slow")).await;
        g.problem(503, "in_flight");
        let ra: u64 = g
            .header("retry-after")
            .and_then(|v| v.parse().ok())
            .expect("retry-after");
        assert!((1..=LEASE.as_secs()).contains(&ra), "{ra}");
        app.runs.gate.add_permits(1);
        assert_eq!(first.await.expect("first").status, 200);
        app.send(&app.delivery(&e, "slow")).await.is_ack();
        assert_eq!(app.runs.count(), 1);
    }

    /// W12 under a short `InFlightMode::Wait`: the duplicate waits for the
    /// first delivery and is answered as a duplicate (W10) instead.
    pub(crate) async fn w12_wait_mode_turns_in_flight_into_a_duplicate<S: Store>(store: Arc<S>) {
        let app = App::build(store, Kind::Standard, |b| b, Some(Duration::from_secs(5))).await;
        let e = id();
        let first = app.spawn_send(app.delivery(&e, "slow"));
        app.runs.entered.notified().await;
        let second = app.spawn_send(app.delivery(&e, "slow"));
        tokio::time::sleep(Duration::from_millis(50)).await;
        app.runs.gate.add_permits(1);
        assert_eq!(first.await.expect("first").status, 200);
        second.await.expect("second").is_ack();
        assert_eq!(app.runs.count(), 1);
    }

    /// W13: after `response_ttl` the body is gone, the key is not: a
    /// duplicate is still 200, as W10 (under `Replay` too).
    pub(crate) async fn w13_duplicate_after_response_ttl_is_200<S: Store>(store: Arc<S>) {
        let app = App::with(store, Kind::Standard, |b| {
            b.duplicate(DuplicateAnswer::Replay)
        })
        .await;
        let e = id();
        assert_eq!(app.send(&app.delivery(&e, "ok")).await.status, 200);
        app.clock.advance(73 * HOUR);
        app.send(&app.delivery(&e, "ok")).await.is_ack();
        assert_eq!(app.runs.count(), 1);
    }

    /// W14: after `key_ttl` the record is gone: a delivery is a new
    /// operation. `build` refuses a `key_ttl` below the provider's window.
    pub(crate) async fn w14_after_key_ttl_runs_again<S: Store>(store: Arc<S>) {
        let app = App::start(Arc::clone(&store), Kind::Standard).await;
        let e = id();
        assert_eq!(app.send(&app.delivery(&e, "ok")).await.status, 200);
        app.clock.advance(31 * 24 * HOUR);
        let g = app.send(&app.delivery(&e, "ok")).await;
        assert_eq!(g.status, 200);
        assert_eq!(g.header("idempotent-replayed"), None);
        assert_eq!(app.runs.count(), 2);
        assert_eq!(app.runs.recoveries(), vec![false, false]);

        let short = Policy::builder()
            .response_ttl(HOUR)
            .key_ttl(24 * HOUR)
            .build()
            .expect("policy");
        let idem = Idem::new(FailingStore::new(store)).with_policy(short);
        let err = WebhookLayer::builder(idem.clone())
            .provider(provider(Kind::Stripe))
            .endpoint("stripe/acct")
            .build()
            .expect_err("24 h < Stripe's 72 h");
        assert!(
            matches!(
                err,
                idem_http::webhook::WebhookConfigError::RetentionTooShort { .. }
            ),
            "{err}"
        );
        WebhookLayer::builder(idem.clone())
            .provider(provider(Kind::Stripe))
            .endpoint("stripe/acct")
            .allow_short_retention()
            .build()
            .expect("allowed on purpose");
        let err = WebhookLayer::builder(idem)
            .provider(provider(Kind::Stripe))
            .endpoint("stripe/acct")
            .allow_short_retention()
            .tolerance(48 * HOUR)
            .build()
            .expect_err("tolerance beyond key_ttl");
        assert!(matches!(
            err,
            idem_http::webhook::WebhookConfigError::ToleranceExceedsRetention { .. }
        ));
    }

    /// W15: with `fingerprint_body(true)`, the same id with another body is
    /// 422 `fingerprint_mismatch`; without it, a duplicate.
    pub(crate) async fn w15_other_body_with_fingerprint_is_422<S: Store>(store: Arc<S>) {
        let app = App::with(Arc::clone(&store), Kind::Standard, |b| {
            b.fingerprint_body(true)
        })
        .await;
        let e = id();
        assert_eq!(app.send(&app.delivery(&e, "ok")).await.status, 200);
        // Re-serialised (other member order): the same canonical JSON.
        let reordered = format!(r#"{{"type":"ok","object":"event","id":"{e}"}}"#);
        let d = Delivery::signed(Kind::Standard, &e, &reordered, app.now_secs());
        app.send(&d).await.is_ack();
        let other = Delivery::signed(Kind::Standard, &e, &event(&e, "other"), app.now_secs());
        app.send(&other).await.problem(422, "fingerprint_mismatch");
        assert_eq!(app.runs.count(), 1);

        let app = App::start(store, Kind::Standard).await;
        let e = id();
        assert_eq!(app.send(&app.delivery(&e, "ok")).await.status, 200);
        let other = Delivery::signed(Kind::Standard, &e, &event(&e, "other"), app.now_secs());
        app.send(&other).await.is_ack();
        assert_eq!(app.runs.count(), 1);
    }

    /// W16: the store unavailable: 503 `store_unavailable`, `Retry-After:
    /// 1`; nothing runs; the redelivery runs.
    pub(crate) async fn w16_store_unavailable_is_503<S: Store>(store: Arc<S>) {
        let app = App::start(store, Kind::Standard).await;
        let e = id();
        app.store.fail_all(true);
        let g = app.send(&app.delivery(&e, "ok")).await;
        g.problem(503, "store_unavailable");
        assert_eq!(g.header("retry-after"), Some("1"));
        assert_eq!(app.runs.count(), 0);
        app.store.fail_all(false);
        assert_eq!(app.state(&e).await, None);
        assert_eq!(app.send(&app.delivery(&e, "ok")).await.status, 200);
        assert_eq!(app.runs.count(), 1);
    }

    /// W17: a layer shutting down: 503 `shutting_down`; nothing runs or is
    /// stored.
    pub(crate) async fn w17_shutting_down_is_503<S: Store>(store: Arc<S>) {
        let app = App::start(store, Kind::Standard).await;
        let e = id();
        app.layer.shutdown().await;
        app.send(&app.delivery(&e, "ok"))
            .await
            .problem(503, "shutting_down");
        app.assert_untouched(&e).await;
    }

    /// W18: 16 identical deliveries at once: the handler runs once; every
    /// answer is the first's 200, a duplicate's 200 or an in-flight 503.
    pub(crate) async fn w18_concurrent_deliveries_run_once<S: Store>(store: Arc<S>) {
        let app = App::start(store, Kind::Standard).await;
        let e = id();
        let d = app.delivery(&e, "busy");
        let tasks: Vec<_> = (0..16).map(|_| app.spawn_send(d.clone())).collect();
        let mut fresh = 0;
        for t in tasks {
            let g = t.await.expect("task");
            match (g.status, g.header("idempotent-replayed")) {
                (200, None) => fresh += 1,
                (200, Some("true")) => assert!(g.body.is_empty()),
                (503, _) => g.problem(503, "in_flight"),
                other => panic!("unexpected answer {other:?}: {}", g.text()),
            }
        }
        assert_eq!(fresh, 1);
        assert_eq!(app.runs.count(), 1);
        app.assert_completed_once(&e, OutcomeKind::Success).await;
    }

    /// W19: a captured signed request replayed verbatim: a duplicate inside
    /// the tolerance, stale after it; GitHub (no timestamp) a duplicate for
    /// days, until `key_ttl`.
    pub(crate) async fn w19_replayed_capture_never_runs_twice<S: Store>(store: Arc<S>) {
        let app = App::start(Arc::clone(&store), Kind::Standard).await;
        let e = id();
        let captured = app.delivery(&e, "ok");
        assert_eq!(app.send(&captured).await.status, 200);
        app.clock.advance(Duration::from_secs(120));
        app.send(&captured).await.is_ack();
        app.clock.advance(Duration::from_secs(600));
        app.send(&captured).await.problem(401, "stale_webhook");
        assert_eq!(app.runs.count(), 1);

        let app = App::start(store, Kind::GitHub).await;
        let e = id();
        let captured = app.delivery(&e, "ok");
        assert_eq!(app.send(&captured).await.status, 200);
        app.clock.advance(10 * 24 * HOUR);
        app.send(&captured).await.is_ack();
        assert_eq!(app.runs.count(), 1);
    }

    /// Stripe: the key is the body's `/id`, verbatim (`evt_…`).
    pub(crate) async fn stripe_id_comes_from_the_body<S: Store>(store: Arc<S>) {
        let app = App::start(store, Kind::Stripe).await;
        let e = format!("evt_{}", IdempotencyKey::random().as_str());
        assert_eq!(app.send(&app.delivery(&e, "ok")).await.status, 200);
        app.clock.advance(Duration::from_secs(5));
        app.send(&app.delivery(&e, "ok")).await.is_ack();
        assert_eq!(app.runs.count(), 1);
        assert_eq!(
            app.state(&e).await.map(|s| s.0),
            Some(RecordState::Completed)
        );
    }

    /// GitHub: the key is `X-GitHub-Delivery`; an id the key rules refuse
    /// is derived, not refused.
    pub(crate) async fn github_id_comes_from_the_delivery_header<S: Store>(store: Arc<S>) {
        let app = App::start(store, Kind::GitHub).await;
        let e = IdempotencyKey::random().as_str().to_owned();
        assert_eq!(app.send(&app.delivery(&e, "ok")).await.status, 200);
        app.send(&app.delivery(&e, "ok")).await.is_ack();
        assert_eq!(
            app.state(&e).await.map(|s| s.0),
            Some(RecordState::Completed)
        );
        let long = "d".repeat(IdempotencyKey::MAX_LEN + 10);
        assert_eq!(app.send(&app.delivery(&long, "ok")).await.status, 200);
        app.send(&app.delivery(&long, "ok")).await.is_ack();
        let derived = IdempotencyKey::derive("github", &long);
        assert_eq!(
            app.state(derived.as_str()).await.map(|s| s.0),
            Some(RecordState::Completed)
        );
        assert_eq!(app.runs.count(), 2);
    }

    /// Svix: `svix-*` headers, verified against a rotation list of secrets.
    pub(crate) async fn svix_with_a_rotation_list<S: Store>(store: Arc<S>) {
        let app = App::start(store, Kind::Svix).await;
        let e = id();
        assert_eq!(app.send(&app.delivery(&e, "ok")).await.status, 200);
        app.send(&app.delivery(&e, "ok")).await.is_ack();
        assert_eq!(app.runs.count(), 1);
        // White-labelled `webhook-*` names reach the same record.
        let white = Delivery::signed(Kind::Standard, &e, &event(&e, "ok"), app.now_secs());
        app.send(&white).await.is_ack();
        assert_eq!(app.runs.count(), 1);
        // The key is the id the signature covers: an unsigned `svix-id`
        // added to a captured white-labelled delivery is no new event.
        app.send(&white.clone().with("svix-id", "msg_forged"))
            .await
            .is_ack();
        assert_eq!(app.runs.count(), 1);
        assert_eq!(app.state("msg_forged").await, None);
    }

    /// Only POST is a delivery: the layer answers anything else 405 with
    /// `Allow: POST`, without reading or verifying it.
    pub(crate) async fn other_methods_are_405<S: Store>(store: Arc<S>) {
        let app = App::with(store, Kind::Standard, |b| b.event_id(EventId::BodyHash)).await;
        // A router whose route takes every method, the layer around it.
        let router = Router::new()
            .route("/hook", axum::routing::any(handle))
            .layer(app.layer.clone())
            .with_state(Arc::clone(&app.runs));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        for method in [reqwest::Method::PUT, reqwest::Method::GET] {
            let res = app
                .client
                .request(method, format!("http://{addr}/hook"))
                .send()
                .await
                .expect("send");
            assert_eq!(res.status().as_u16(), 405);
            assert_eq!(
                res.headers().get("allow").and_then(|v| v.to_str().ok()),
                Some("POST")
            );
        }
        server.abort();
        assert_eq!(app.runs.count(), 0);
    }
}

macro_rules! webhook_rows {
    ($setup:path) => {
        webhook_rows!(@each $setup;
            w01_malformed_signature_is_400,
            w02_unmatched_signature_is_401,
            w03_stale_timestamp_is_401,
            w04_body_over_the_limit_is_413,
            w05_no_event_id,
            w06_first_delivery_runs_once,
            w07_permanent_failure_is_acknowledged,
            w08_transient_failure_runs_again_as_recovery,
            w09_panic_is_in_flight_until_the_lease_ends,
            w10_duplicate_is_acknowledged,
            w11_duplicate_replays_the_stored_response,
            w12_in_flight_duplicate_is_503,
            w12_wait_mode_turns_in_flight_into_a_duplicate,
            w13_duplicate_after_response_ttl_is_200,
            w14_after_key_ttl_runs_again,
            w15_other_body_with_fingerprint_is_422,
            w16_store_unavailable_is_503,
            w17_shutting_down_is_503,
            w18_concurrent_deliveries_run_once,
            w19_replayed_capture_never_runs_twice,
            stripe_id_comes_from_the_body,
            github_id_comes_from_the_delivery_header,
            svix_with_a_rotation_list,
            other_methods_are_405,
        );
    };
    (@each $setup:path; $($name:ident,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                idem_core::testkit::run($setup(), |s| crate::rows::$name(s)).await;
            }
        )*
    };
}

mod memory {
    webhook_rows!(crate::support::memory);
}

mod sqlite {
    webhook_rows!(crate::support::sqlite_file);
}

mod postgres {
    webhook_rows!(crate::support::postgres);
}

mod redis {
    webhook_rows!(crate::support::redis);
}

/// `idem_webhook_deliveries_total{provider, result}` counts each delivery
/// once, by what became of it.
#[cfg(feature = "metrics")]
#[test]
fn deliveries_are_counted_by_result() {
    let m = idem_core::testkit::metrics::recorded(async {
        let app = App::start(Arc::new(idem_core::MemoryStore::new()), Kind::Standard).await;
        let e = id();
        assert_eq!(app.send(&app.delivery(&e, "ok")).await.status, 200);
        app.send(&app.delivery(&e, "ok")).await.is_ack();
        app.send(&app.delivery(&e, "ok").with("webhook-signature", "v1,"))
            .await
            .problem(401, "invalid_signature");
        assert_eq!(
            app.send(&app.delivery(&id(), "permanent")).await.status,
            200
        );
        assert_eq!(
            app.send(&app.delivery(&id(), "transient")).await.status,
            503
        );
    });
    let mut got: Vec<(String, u64)> = m
        .into_iter()
        .filter(|(k, _)| k.starts_with("idem_webhook_deliveries_total"))
        .collect();
    got.sort();
    let want: Vec<(String, u64)> = [
        "duplicate",
        "fresh",
        "permanent_failure",
        "transient",
        "verified_failed",
    ]
    .iter()
    .map(|r| {
        (
            format!("idem_webhook_deliveries_total{{provider=standard_webhooks,result={r}}}"),
            1,
        )
    })
    .collect();
    assert_eq!(got, want);
}
