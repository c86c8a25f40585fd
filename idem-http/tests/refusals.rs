//! What the layer answers when a record cannot be named, each for what it
//! is: an owner a scope cannot hold is `owner_unavailable`, a path too long
//! to name the operation is the client's 414 `path_too_long`, an operation
//! source that cannot name the request is `operation_unavailable`; and a key
//! validator's reason is the problem's `detail`. Plain tower, no axum router.

use std::borrow::Cow;
use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use idem_core::{Idem, MemoryStore};
use idem_http::{FixedOwner, IdempotencyLayer, IdempotencyLayerBuilder, NoOwner, OperationSource};
use tower::{Layer, ServiceExt, service_fn};

async fn created(_: Request<Full<Bytes>>) -> Result<Response<Full<Bytes>>, Infallible> {
    let mut res = Response::new(Full::new(Bytes::from_static(b"ok")));
    *res.status_mut() = StatusCode::CREATED;
    Ok(res)
}

fn builder() -> IdempotencyLayerBuilder<MemoryStore, NoOwner> {
    IdempotencyLayer::builder(Idem::new(MemoryStore::new()))
}

/// Sends `POST path` with `key` and returns the status and the problem (or
/// `null` for a handler's answer).
async fn send<O: idem_http::OwnerSource>(
    layer: IdempotencyLayer<MemoryStore, O>,
    path: &str,
    key: &str,
) -> (StatusCode, serde_json::Value) {
    let req = Request::post(path)
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(b"{}")))
        .expect("request");
    let res = layer
        .layer(service_fn(created))
        .oneshot(req)
        .await
        .expect("infallible");
    let status = res.status();
    let bytes = res.into_body().collect().await.expect("body").to_bytes();
    let problem = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (status, problem)
}

#[tokio::test]
async fn an_owner_a_scope_cannot_hold_is_owner_unavailable() {
    let layer = builder().owner(FixedOwner::new("")).build().expect("layer");
    let (status, problem) = send(layer, "/orders", "k-1").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(problem["code"], "owner_unavailable");
}

#[tokio::test]
async fn a_path_too_long_to_name_the_operation_is_414() {
    let path = format!("/{}", "p".repeat(1100));
    let layer = builder()
        .owner(FixedOwner::new("t"))
        .build()
        .expect("layer");
    let (status, problem) = send(layer, &path, "k-1").await;
    assert_eq!(status, StatusCode::URI_TOO_LONG);
    assert_eq!(problem["code"], "path_too_long");
    assert_eq!(problem["limit"], 1024);
    // A named route does not depend on the path's length.
    let layer = builder()
        .owner(FixedOwner::new("t"))
        .operation(OperationSource::Route(Cow::Borrowed("/{p}")))
        .build()
        .expect("layer");
    let (status, _) = send(layer, &path, "k-1").await;
    assert_eq!(status, StatusCode::CREATED);
}

#[tokio::test]
async fn an_operation_function_naming_nothing_usable_is_operation_unavailable() {
    let layer = builder()
        .owner(FixedOwner::new("t"))
        .operation(OperationSource::Fn(std::sync::Arc::new(|_| {
            Some("bad\nname".to_owned())
        })))
        .build()
        .expect("layer");
    let (status, problem) = send(layer, "/orders", "k-1").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(problem["code"], "operation_unavailable");
}

#[tokio::test]
async fn the_key_validators_reason_is_the_detail() {
    let layer = builder()
        .owner(FixedOwner::new("t"))
        .key_validator(|k| {
            if k.as_str().len() >= 16 {
                Ok(())
            } else {
                Err("keys are at least 16 characters".into())
            }
        })
        .build()
        .expect("layer");
    let (status, problem) = send(layer.clone(), "/orders", "short").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(problem["code"], "invalid_key");
    assert_eq!(
        problem["detail"],
        "invalid Idempotency-Key (rejected_by_validator): keys are at least 16 characters"
    );
    assert_eq!(problem["idempotency_key"], "short");
    let (status, _) = send(layer, "/orders", "a-long-enough-key-1").await;
    assert_eq!(status, StatusCode::CREATED);
}

/// A closure over the request head is an owner source as it is.
#[tokio::test]
async fn a_closure_is_an_owner_source() {
    let layer = builder()
        .owner(|parts: &http::request::Parts| parts.uri.query().map(str::to_owned))
        .build()
        .expect("layer");
    let (status, problem) = send(layer.clone(), "/orders", "k-1").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(problem["code"], "owner_unavailable");
    let (status, _) = send(layer, "/orders?alice", "k-1").await;
    assert_eq!(status, StatusCode::CREATED);
}

/// `MatchedPath`, asked for by name, outside axum's router: the layer
/// cannot name the operation and says so.
#[cfg(feature = "axum")]
#[tokio::test]
async fn matched_path_outside_axums_router_is_operation_unavailable() {
    let layer = builder()
        .owner(FixedOwner::new("t"))
        .operation(OperationSource::MatchedPath)
        .build()
        .expect("layer");
    let (status, problem) = send(layer, "/orders", "k-1").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(problem["code"], "operation_unavailable");
}
