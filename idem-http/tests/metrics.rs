//! The HTTP layer records the metrics every other execution path records: a
//! scripted run of requests through the layer (plain tower, no network),
//! read back with exact counts.

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idem_core::testkit::metrics::{assert_exactly, recorded};
use idem_core::{Idem, MemoryStore, Policy};
use idem_http::{FixedOwner, IdempotencyLayer};
use tower::{Layer, ServiceExt, service_fn};

/// Answers with the status the request's `x-status` header names, and a body
/// of `x-len` bytes.
async fn handler(req: Request<Full<Bytes>>) -> Result<Response<Full<Bytes>>, Infallible> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u16>().ok())
    };
    let status = header("x-status").unwrap_or(201);
    let len = usize::from(header("x-len").unwrap_or(2));
    let mut res = Response::new(Full::new(Bytes::from(vec![b'x'; len])));
    *res.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::CREATED);
    Ok(res)
}

#[test]
fn the_http_layer_counts_exactly() {
    let m = recorded(async {
        let policy = Policy::builder()
            .max_response_bytes(64)
            .build()
            .expect("policy");
        let idem = Idem::new(MemoryStore::new()).with_policy(policy);
        let layer = IdempotencyLayer::builder(idem)
            .owner(FixedOwner::new("acct_1"))
            .build()
            .expect("layer");
        let send = |key: &'static str, body: &'static str, status: u16, len: u16| {
            let svc = layer.layer(service_fn(handler));
            let req = Request::post("/orders")
                .header("idempotency-key", key)
                .header("content-type", "application/json")
                .header("x-status", status.to_string())
                .header("x-len", len.to_string())
                .body(Full::new(Bytes::from_static(body.as_bytes())))
                .expect("request");
            async move {
                let res = svc.oneshot(req).await.expect("infallible");
                let status = res.status();
                let replayed = res.headers().contains_key("idempotent-replayed");
                let _ = res.into_body().collect().await.expect("body");
                (status.as_u16(), replayed)
            }
        };
        // k1: runs, then a replay, then the same key with another body.
        assert_eq!(send("k1", r#"{"a":1}"#, 201, 2).await, (201, false));
        assert_eq!(send("k1", r#"{"a":1}"#, 201, 2).await, (201, true));
        assert_eq!(send("k1", r#"{"a":2}"#, 201, 2).await.0, 422);
        // k2: a 503 from the handler is transient: the key is released.
        assert_eq!(send("k2", "{}", 503, 2).await, (503, false));
        // k3: a body over max_response_bytes completes without being stored.
        assert_eq!(send("k3", "{}", 201, 1000).await, (201, false));
        layer.shutdown().await;
    });
    // The default operation source names the record by its path; the
    // metrics label is the method alone (no route template outside axum).
    let op = "operation=POST";
    let want = [
        (format!("idem_executions_total{{{op}}}"), 3),
        (format!("idem_replays_total{{{op}}}"), 1),
        (format!("idem_work_seconds{{{op}}}"), 3),
        (
            format!("idem_rejections_total{{code=fingerprint_mismatch,{op}}}"),
            1,
        ),
        (format!("idem_transient_releases_total{{{op}}}"), 1),
        (format!("idem_responses_not_stored_total{{{op}}}"), 1),
        ("idem_store_call_seconds{call=claim}".to_owned(), 5),
        // k1's completion and k3's completion without a body.
        ("idem_store_call_seconds{call=complete}".to_owned(), 2),
        ("idem_store_call_seconds{call=release}".to_owned(), 1),
    ];
    assert_exactly(&m, &want);
}

/// The `operation` label stays bounded under the default
/// `OperationSource::Path`: 10,000 distinct paths (one record each, the
/// identity keeps the concrete path) give one label value, and with axum's
/// matched route, the route template.
#[test]
fn ten_thousand_paths_give_a_bounded_label() {
    const PATHS: usize = 10_000;
    let m = recorded(async {
        let idem = Idem::new(MemoryStore::new());
        let layer = IdempotencyLayer::builder(idem.clone())
            .owner(FixedOwner::new("acct_1"))
            .build()
            .expect("layer");
        for i in 0..PATHS {
            let svc = layer.layer(service_fn(handler));
            let req = Request::post(format!("/orders/{i}/refund"))
                .header("idempotency-key", "k")
                .body(Full::new(Bytes::new()))
                .expect("request");
            let res = svc.oneshot(req).await.expect("infallible");
            assert_eq!(res.status(), StatusCode::CREATED, "path {i} ran");
        }
        // The identity keeps the concrete path: each path is its own record.
        let admin = idem.admin();
        for i in [0, PATHS - 1] {
            let scope =
                idem_core::Scope::new("acct_1", format!("POST /orders/{i}/refund")).expect("scope");
            let found = admin.inspect(&scope, "k", false).await.expect("inspect");
            assert!(found.is_some(), "the record of path {i}");
        }
        layer.shutdown().await;
    });
    let labels: std::collections::BTreeSet<&str> = m
        .keys()
        .filter_map(|k| k.split("operation=").nth(1))
        .map(|rest| rest.trim_end_matches('}').split(',').next().unwrap_or(rest))
        .collect();
    assert_eq!(labels.into_iter().collect::<Vec<_>>(), ["POST"]);
    assert_eq!(
        m.get("idem_executions_total{operation=POST}"),
        Some(&(PATHS as u64))
    );
}

/// Inside axum's router the label is the matched route template: bounded,
/// and it names the route.
#[cfg(feature = "axum")]
#[test]
fn the_matched_route_is_the_label_inside_axum() {
    let m = recorded(async {
        let idem = Idem::new(MemoryStore::new());
        let layer = IdempotencyLayer::builder(idem)
            .owner(FixedOwner::new("acct_1"))
            .build()
            .expect("layer");
        let app = axum::Router::new()
            .route(
                "/orders/{id}/refund",
                axum::routing::post(|| async { StatusCode::CREATED }),
            )
            .route_layer(layer.clone());
        for i in 0..100 {
            let req = Request::post(format!("/orders/{i}/refund"))
                .header("idempotency-key", "k")
                .body(axum::body::Body::empty())
                .expect("request");
            let res = app.clone().oneshot(req).await.expect("infallible");
            assert_eq!(res.status(), StatusCode::CREATED, "path {i} ran");
        }
        layer.shutdown().await;
    });
    assert_eq!(
        m.get("idem_executions_total{operation=POST /orders/{id}/refund}"),
        Some(&100)
    );
    assert!(
        m.keys()
            .filter(|k| k.contains("operation="))
            .all(|k| k.contains("operation=POST /orders/{id}/refund")),
        "{m:#?}"
    );
}
