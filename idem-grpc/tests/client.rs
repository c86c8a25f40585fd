//! The client layer against a real tonic server behind the server layer:
//! one key per call reused on every attempt, retries on `UNAVAILABLE` and
//! on `ABORTED`/`IN_FLIGHT` after its `RetryInfo`, none on
//! `FAILED_PRECONDITION` or `INVALID_ARGUMENT`, within the deadline.

#![allow(missing_docs, clippy::unwrap_used, unreachable_pub, dead_code)]

#[path = "suite/app.rs"]
mod app;

use std::sync::Arc;
use std::time::Duration;

use app::{App, CREATE, Req, Resp, req, with};
use idem_core::MemoryStore;
use idem_grpc::{GrpcClientLayer, GrpcReport, ReportSlot};
use tonic::Code;
use tonic_prost::ProstCodec;

type Layered = idem_grpc::GrpcClientService<tonic::transport::Channel>;

async fn client(app: &App<MemoryStore>, deadline: Duration) -> tonic::client::Grpc<Layered> {
    let policy = idem_client::IdempotencyClientBuilder::default()
        .deadline(deadline)
        .backoff(Duration::from_millis(10), Duration::from_millis(50))
        .max_attempts(20)
        .build_policy()
        .unwrap();
    let layer = GrpcClientLayer::new(policy).method(CREATE);
    tonic::client::Grpc::new(tower_layer::Layer::layer(&layer, app.channel().await))
}

/// Calls `CreateOrder` as `a1`, with `key` when given: the answer and the report.
async fn call(
    grpc: &tonic::client::Grpc<Layered>,
    msg: Req,
    key: Option<&str>,
) -> (Result<tonic::Response<Resp>, tonic::Status>, GrpcReport) {
    let mut meta = with("a1", key.unwrap_or(""));
    if key.is_none() {
        meta.keys.clear();
    }
    let mut r = app::Client::request(msg, &meta);
    let slot = ReportSlot::new();
    r.extensions_mut().insert(slot.clone());
    let mut grpc = grpc.clone();
    grpc.ready().await.unwrap();
    let out = grpc
        .unary(
            r,
            http::uri::PathAndQuery::from_static(CREATE),
            ProstCodec::<Req, Resp>::default(),
        )
        .await;
    (out, slot.take().expect("a report"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_per_call_fresh_then_replayed() {
    let app = App::start(Arc::new(MemoryStore::new())).await;
    let grpc = client(&app, Duration::from_secs(5)).await;
    let (first, report) = call(&grpc, req(100), None).await;
    let first = first.unwrap();
    assert_eq!((report.kind.as_str(), report.attempts), ("fresh", 1));
    let key = report.key.as_str().to_owned();
    // Resuming the intent with its key: the stored answer.
    let (again, report) = call(&grpc, req(100), Some(&key)).await;
    assert_eq!(again.unwrap().get_ref(), first.get_ref());
    assert_eq!((report.kind.as_str(), report.attempts), ("replayed", 1));
    assert_eq!(report.key.as_str(), key);
    // Two calls, two intents, two keys.
    let (_, other) = call(&grpc, req(100), None).await;
    assert_ne!(other.key.as_str(), key);
    assert_eq!(app.counts.executions(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_is_retried_with_the_same_key_until_the_deadline() {
    let app = App::start(Arc::new(MemoryStore::new())).await;
    let grpc = client(&app, Duration::from_millis(400)).await;
    let (res, report) = call(&grpc, req(13), None).await;
    assert_eq!(res.unwrap_err().code(), Code::Unavailable);
    assert_eq!(report.kind.as_str(), "exhausted");
    assert!(report.attempts > 1, "{report:?}");
    // Every attempt ran under one key: the server released it each time.
    assert_eq!(app.counts.executions(), u64::from(report.attempts));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_precondition_and_invalid_argument_are_never_retried() {
    let app = App::start(Arc::new(MemoryStore::new())).await;
    let grpc = client(&app, Duration::from_secs(5)).await;
    let (res, report) = call(&grpc, req(7), Some("k-7")).await;
    assert_eq!(res.unwrap_err().code(), Code::FailedPrecondition);
    assert_eq!((report.kind.as_str(), report.attempts), ("fresh", 1));
    let (res, report) = call(&grpc, req(8), Some("k-7")).await;
    assert_eq!(res.unwrap_err().code(), Code::FailedPrecondition);
    assert_eq!((report.kind.as_str(), report.attempts), ("rejected", 1));
    assert_eq!(report.reason.as_deref(), Some("FINGERPRINT_MISMATCH"));
    // The handler's own INVALID_ARGUMENT: its answer, once.
    let (res, report) = call(&grpc, req(400), None).await;
    assert_eq!(res.unwrap_err().code(), Code::InvalidArgument);
    assert_eq!((report.kind.as_str(), report.attempts), ("fresh", 1));
    assert_eq!(report.reason, None);
    assert_eq!(app.counts.executions(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_is_retried_after_its_retry_info() {
    let opts = app::Options {
        lease: Duration::from_millis(300),
        ..app::Options::default()
    };
    let app = App::with(Arc::new(MemoryStore::new()), opts).await;
    let raw = app.client().await;
    let grpc = client(&app, Duration::from_secs(10)).await;
    let first = raw.spawn_gated("k-gate");
    app.counts.started.notified().await;
    let opener = {
        let counts = Arc::clone(&app.counts);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            counts.open_gate();
        })
    };
    let t0 = std::time::Instant::now();
    let (res, report) = call(&grpc, app::gated(), Some("k-gate")).await;
    opener.await.unwrap();
    let first = first.await.unwrap().unwrap();
    assert_eq!(res.unwrap().get_ref(), first.get_ref());
    assert_eq!(report.kind.as_str(), "replayed");
    assert_eq!(report.attempts, 2, "{report:?}");
    assert!(
        t0.elapsed() >= Duration::from_millis(300),
        "waited for the RetryInfo"
    );
    assert_eq!(app.counts.executions(), 1);
}
