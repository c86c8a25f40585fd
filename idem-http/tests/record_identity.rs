//! Record identity never depends on cargo features: the same request
//! through the same configuration maps to the same record (scope and key)
//! with the same fingerprint, with or without idem-http's `axum` feature
//! (CI runs this file both ways). The request goes through a nested axum
//! router, where axum's `MatchedPath` and `OriginalUri` both exist and
//! differ from the URI the layer sees: only a source asked for by name may
//! read them.
//!
//! The expected fingerprints are pinned: a change of the envelope changes
//! every stored record's fingerprint and must be a visible diff here.

use std::borrow::Cow;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{Request, StatusCode};
use idem_core::{Idem, IdempotencyKey, MemoryStore, RecordId, Scope};
use idem_http::{FingerprintSpec, FixedOwner, IdempotencyLayer, OperationSource};
use tower::ServiceExt;

const OWNER: &str = "tenant";
const KEY: &str = "identity-1";

async fn created() -> (StatusCode, &'static str) {
    (StatusCode::CREATED, "ok")
}

/// Sends `POST /v1/accounts/42/charges` through a layer on the nested
/// router and returns the stored record's fingerprint, after checking that
/// the record is `(OWNER, operation, KEY)` and nothing else.
async fn record_of(source: OperationSource, spec: FingerprintSpec, operation: &str) -> String {
    let idem = Idem::new(MemoryStore::new());
    let layer = IdempotencyLayer::builder(idem.clone())
        .owner(FixedOwner::new(OWNER))
        .operation(source)
        .fingerprint(spec)
        .build()
        .expect("layer");
    let api = Router::new()
        .route("/accounts/{id}/charges", post(created))
        .route_layer(layer);
    let app = Router::new().nest("/v1", api);
    let req = Request::post("/v1/accounts/42/charges?currency=eur")
        .header("idempotency-key", KEY)
        .header("content-type", "application/json")
        .body(Body::from(r#"{"amount": 100, "to": "acct_7"}"#))
        .expect("request");
    let res = app.oneshot(req).await.expect("infallible");
    assert_eq!(res.status(), StatusCode::CREATED, "{operation}");

    let scope = Scope::new(OWNER, operation).expect("scope");
    let key = IdempotencyKey::parse(KEY).expect("key");
    let view = idem
        .admin()
        .inspect(&scope, key.clone(), false)
        .await
        .expect("inspect")
        .unwrap_or_else(|| panic!("no record for operation {operation:?}"));
    assert_eq!(view.id, RecordId::new(scope, key));
    assert_eq!(view.id.scope().operation(), operation);
    view.fingerprint.to_hex()
}

#[tokio::test]
async fn the_default_is_the_received_path_in_every_build() {
    // Inside `Router::nest` the URI the layer sees has lost `/v1`; the
    // default names the operation and fingerprints the path from it.
    let fp = record_of(
        OperationSource::Path,
        FingerprintSpec::default(),
        "POST /accounts/42/charges",
    )
    .await;
    assert_eq!(
        fp,
        "0866644c8a5190327338745e42898dfafc75c13418e108afaeaaf22f61cca257"
    );
}

#[tokio::test]
async fn a_named_route_or_name_is_the_operation_in_every_build() {
    for (source, operation, pinned) in [
        (
            OperationSource::Route(Cow::Borrowed("/accounts/{id}/charges")),
            "POST /accounts/{id}/charges",
            "962123afebb30c64dc5c17fca9fc7e0bea46f3c7ba45b973a4d68676de6a9d01",
        ),
        (
            OperationSource::Fixed(Cow::Borrowed("charges.create")),
            "charges.create",
            "378ea561c1e68f6599bfbf2c58792734d88ec3f71087e9ad81c4931527bbd2c0",
        ),
    ] {
        let fp = record_of(source, FingerprintSpec::default(), operation).await;
        assert_eq!(fp, pinned, "{operation}");
    }
}

/// With feature `axum`, axum's names are used only when asked for.
#[cfg(feature = "axum")]
#[tokio::test]
async fn axum_names_only_when_asked_for() {
    use idem_http::PathSource;

    let fp = record_of(
        OperationSource::MatchedPath,
        FingerprintSpec::default().path(PathSource::OriginalUri),
        "POST /v1/accounts/{id}/charges",
    )
    .await;
    assert_eq!(
        fp,
        "1cab224035ed828b60c479d4e4f76da1551ed733effddd20669a76f9c3fe9859"
    );
}
