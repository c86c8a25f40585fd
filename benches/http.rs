//! The HTTP adapter in process: a 256-byte JSON `POST` through
//! `IdempotencyLayer` (fresh key, and replay of a stored one) against the
//! bare handler, with `tower::ServiceExt::oneshot` (no network), on
//! `MemoryStore` and SQLite memory. A counting `Store` wrapper confirms the
//! round trips: fresh = 2 store calls (claim, complete), replay = 1.
//!
//! Run with: `cargo bench --bench http --features axum`
//! (`IDEM_BENCH_QUICK=1` for a short run).

#[allow(dead_code, reason = "each bench uses a part of the shared helpers")]
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use axum::routing::post;
use common::http::{body_256, handler};
use criterion::{BenchmarkId, Criterion, Throughput};
use http_body_util::BodyExt;
use idem::clock::Timestamp;
use idem::http::{FixedOwner, IdempotencyLayer};
use idem::store::PurgeReport;
use idem::store::{
    Capabilities, ClaimOutcome, ClaimRequest, Completion, Store, StoreError, StoredRecord, Token,
};
use idem::{Idem, IdempotencyKey, RecordId};
use tokio::runtime::Runtime;
use tower::ServiceExt;

/// Forwards every call and counts them.
#[derive(Debug)]
struct Counted<S> {
    inner: S,
    calls: Arc<AtomicU64>,
}

#[deny(clippy::missing_trait_methods)]
impl<S: Store> Store for Counted<S> {
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.claim(req).await
    }
    async fn complete(
        &self,
        id: &RecordId,
        t: Token,
        c: &Completion<'_>,
    ) -> Result<(), StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.complete(id, t, c).await
    }
    async fn release(&self, id: &RecordId, t: Token, now: Timestamp) -> Result<(), StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.release(id, t, now).await
    }
    async fn save_resource_id(&self, id: &RecordId, t: Token, r: &str) -> Result<(), StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.save_resource_id(id, t, r).await
    }
    async fn extend_lease(
        &self,
        id: &RecordId,
        t: Token,
        until: Timestamp,
    ) -> Result<(), StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.extend_lease(id, t, until).await
    }
    async fn fetch(
        &self,
        id: &RecordId,
        now: Timestamp,
    ) -> Result<Option<StoredRecord>, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.fetch(id, now).await
    }
    async fn purge_expired(&self, now: Timestamp, limit: u32) -> Result<PurgeReport, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.purge_expired(now, limit).await
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

fn request(key: Option<&str>, body: &str) -> Request<Body> {
    let mut r = Request::post("/orders").header("content-type", "application/json");
    if let Some(k) = key {
        r = r.header("idempotency-key", k);
    }
    r.body(Body::from(body.to_owned())).expect("request")
}

async fn call(app: &Router, req: Request<Body>) -> usize {
    let res = app.clone().oneshot(req).await.expect("infallible");
    assert!(res.status().is_success(), "{}", res.status());
    res.into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes()
        .len()
}

fn bench_store<S: Store>(c: &mut Criterion, rt: &Runtime, name: &str, store: S) {
    let calls = Arc::new(AtomicU64::new(0));
    let idem = Idem::new(Counted {
        inner: store,
        calls: Arc::clone(&calls),
    });
    let layer = IdempotencyLayer::builder(idem)
        .owner(FixedOwner::new("bench"))
        .build()
        .expect("layer");
    let bare = Router::new().route("/orders", post(handler));
    let layered = Router::new()
        .route("/orders", post(handler))
        .route_layer(layer);
    let body = body_256();

    // Store calls per request, checked before timing.
    let replay_key = IdempotencyKey::random();
    let before = calls.load(Ordering::Relaxed);
    rt.block_on(call(&layered, request(Some(replay_key.as_str()), &body)));
    let fresh = calls.load(Ordering::Relaxed) - before;
    let before = calls.load(Ordering::Relaxed);
    rt.block_on(call(&layered, request(Some(replay_key.as_str()), &body)));
    let replay = calls.load(Ordering::Relaxed) - before;
    println!("{name}: store calls per request: fresh = {fresh}, replay = {replay}");
    assert_eq!(
        (fresh, replay),
        (2, 1),
        "the adapter adds no store round trip"
    );

    let mut g = c.benchmark_group(format!("http-{name}"));
    g.throughput(Throughput::Elements(1));
    g.bench_function(BenchmarkId::new("bare-handler", "256B"), |b| {
        b.iter(|| rt.block_on(call(&bare, request(None, &body))));
    });
    g.bench_function(BenchmarkId::new("layer-fresh", "256B"), |b| {
        b.iter(|| {
            let k = IdempotencyKey::random();
            rt.block_on(call(&layered, request(Some(k.as_str()), &body)))
        });
    });
    g.bench_function(BenchmarkId::new("layer-replay", "256B"), |b| {
        b.iter(|| rt.block_on(call(&layered, request(Some(replay_key.as_str()), &body))));
    });
    g.finish();
}

common::adapter_bench_main!(bench_store);
