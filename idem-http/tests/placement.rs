//! Placement in a tower stack (spec 2.2): compression outside the layer
//! stores identity bodies and compresses each replay for its own request;
//! a CORS preflight passes through and replay headers are exposed.

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderName, Method};
use axum::routing::post;
use idem_core::{HttpResponse, Idem, IdempotencyKey, MemoryStore, Scope, Storable};
use idem_http::{FixedOwner, IdempotencyLayer};
use tower_http::compression::CompressionLayer;
use tower_http::cors::{AllowOrigin, CorsLayer};

async fn handler(State(n): State<Arc<AtomicUsize>>) -> axum::Json<serde_json::Value> {
    let i = n.fetch_add(1, Ordering::SeqCst) + 1;
    axum::Json(serde_json::json!({ "id": format!("ord_{i}"), "padding": "z".repeat(512) }))
}

struct Server {
    base: String,
    idem: Idem<MemoryStore>,
    runs: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start() -> Server {
    let idem = Idem::new(MemoryStore::new());
    let layer = IdempotencyLayer::builder(idem.clone())
        .owner(FixedOwner::new("tenant"))
        .build()
        .expect("layer");
    let cors = CorsLayer::new()
        .allow_origin(AllowOrigin::exact(
            "https://app.example".parse().expect("origin"),
        ))
        .allow_methods([Method::POST])
        .allow_headers([
            HeaderName::from_static("idempotency-key"),
            HeaderName::from_static("content-type"),
        ])
        .expose_headers([
            HeaderName::from_static("idempotent-replayed"),
            HeaderName::from_static("retry-after"),
        ]);
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/orders", post(handler))
        .route_layer(layer)
        .layer(cors)
        .layer(CompressionLayer::new())
        .with_state(Arc::clone(&runs));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Server {
        base,
        idem,
        runs,
        task,
    }
}

fn gunzip(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(b)
        .read_to_end(&mut out)
        .expect("gzip");
    out
}

#[tokio::test]
async fn compression_outside_stores_identity_and_compresses_each_replay() {
    let s = start().await;
    let client = reqwest::Client::new();
    let key = IdempotencyKey::random();
    let send = |enc: &'static str| {
        client
            .post(format!("{}/orders", s.base))
            .header("idempotency-key", key.as_str())
            .header("content-type", "application/json")
            .header("accept-encoding", enc)
            .body(r#"{"item":"a"}"#)
            .send()
    };
    let first = send("gzip").await.expect("sent");
    assert_eq!(first.headers()["content-encoding"], "gzip");
    let first = gunzip(&first.bytes().await.expect("body"));
    // The stored body is identity-encoded, with no Content-Encoding.
    let scope = Scope::new("tenant", "POST /orders").expect("scope");
    let record = s
        .idem
        .admin()
        .inspect(&scope, key.as_str(), true)
        .await
        .expect("inspect")
        .expect("record");
    let stored =
        HttpResponse::decode(record.body.as_deref().expect("stored body")).expect("decode");
    assert_eq!(stored.body, first);
    assert!(stored.headers.iter().all(|(n, _)| n != "content-encoding"));
    // Each replay is encoded for its own request.
    let plain = send("identity").await.expect("sent");
    assert_eq!(plain.headers()["idempotent-replayed"], "true");
    assert!(plain.headers().get("content-encoding").is_none());
    assert_eq!(plain.bytes().await.expect("body").to_vec(), first);
    let gz = send("gzip").await.expect("sent");
    assert_eq!(gz.headers()["idempotent-replayed"], "true");
    assert_eq!(gz.headers()["content-encoding"], "gzip");
    assert_eq!(gunzip(&gz.bytes().await.expect("body")), first);
    assert_eq!(s.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn cors_preflight_passes_and_replay_headers_are_exposed() {
    let s = start().await;
    let client = reqwest::Client::new();
    let pre = client
        .request(reqwest::Method::OPTIONS, format!("{}/orders", s.base))
        .header("origin", "https://app.example")
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "idempotency-key, content-type",
        )
        .send()
        .await
        .expect("sent");
    assert!(pre.status().is_success(), "{}", pre.status());
    let allowed = pre.headers()["access-control-allow-headers"]
        .to_str()
        .expect("text")
        .to_owned();
    assert!(allowed.contains("idempotency-key"), "{allowed}");
    assert_eq!(s.runs.load(Ordering::SeqCst), 0);
    let key = IdempotencyKey::random();
    for _ in 0..2 {
        let r = client
            .post(format!("{}/orders", s.base))
            .header("origin", "https://app.example")
            .header("idempotency-key", key.as_str())
            .body("{}")
            .send()
            .await
            .expect("sent");
        let exposed = r.headers()["access-control-expose-headers"]
            .to_str()
            .expect("text")
            .to_owned();
        assert!(
            exposed.contains("idempotent-replayed") && exposed.contains("retry-after"),
            "{exposed}"
        );
    }
    assert_eq!(s.runs.load(Ordering::SeqCst), 1);
}
