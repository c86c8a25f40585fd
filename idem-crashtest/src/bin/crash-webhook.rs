//! One crash-test webhook receiver (issue 19, row W9): an axum server on a
//! free loopback port with a `WebhookLayer` (Standard Webhooks) in front of
//! a handler whose side effect is a call to the loopback "provider" stub
//! with its downstream key. Its stdout is the protocol the parent reads:
//!
//! * `listening <addr>`: ready;
//! * `run <event> <attempt> <recovery 0|1> <downstream key>`: the handler
//!   really started (every run of it);
//! * `stop after-call`: with `IDEM_CRASH_STOP_AT=after-call`, the handler
//!   stopped dead after its side effect, to be SIGKILLed there.
//!
//! Settings: `IDEM_CRASH_BACKEND` (`sqlite:<file>` or
//! `postgres:<url>#<schema>`, migrated by the parent), `IDEM_CRASH_LEASE_MS`,
//! `IDEM_CRASH_STUB`, `IDEM_CRASH_SECRET` (a `whsec_…` secret),
//! `IDEM_CRASH_ENDPOINT` (the layer's owner).

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use idem_core::store::Store;
use idem_core::{Idem, InFlightMode, Policy};
use idem_crashtest::inbound::{call_stub, stop_here};
use idem_crashtest::{backend, num, var};
use idem_http::IdemAttempt;
use idem_http::webhook::{Provider, Secret, WebhookDelivery, WebhookLayer};

const HOUR: Duration = Duration::from_secs(3600);

#[derive(Clone)]
struct Config {
    stub: String,
    stop_at: String,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let policy = Policy::builder()
        .lease(Duration::from_millis(num("IDEM_CRASH_LEASE_MS")?))
        .in_flight(InFlightMode::Reject)
        .response_ttl(72 * HOUR)
        .key_ttl(30 * 24 * HOUR)
        .build()
        .map_err(|x| e(&x))?;
    let store = backend::open(&var("IDEM_CRASH_BACKEND")?, false).await?;
    serve(Idem::new(store).with_policy(policy)).await
}

async fn serve<S: Store>(idem: Idem<S>) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let secret = Secret::whsec(&var("IDEM_CRASH_SECRET")?).map_err(|x| e(&x))?;
    let layer = WebhookLayer::builder(idem)
        .provider(Provider::standard_webhooks([secret]))
        .endpoint(var("IDEM_CRASH_ENDPOINT")?)
        .build()
        .map_err(|x| e(&x))?;
    let cfg = Config {
        stub: var("IDEM_CRASH_STUB")?,
        stop_at: std::env::var("IDEM_CRASH_STOP_AT").unwrap_or_default(),
    };
    let app = Router::new()
        .route("/hook", post(handle))
        .route_layer(layer)
        .with_state(cfg);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|x| e(&x))?;
    println!("listening {}", listener.local_addr().map_err(|x| e(&x))?);
    axum::serve(listener, app).await.map_err(|x| e(&x))
}

/// The handler: its side effect is the stub call with the downstream key.
async fn handle(
    State(cfg): State<Config>,
    WebhookDelivery(delivery): WebhookDelivery,
    IdemAttempt(attempt): IdemAttempt,
) -> (StatusCode, String) {
    let dk = attempt.downstream_key("provider", 1);
    println!(
        "run {} {} {} {dk}",
        delivery.event_id(),
        attempt.number(),
        u8::from(attempt.is_recovery())
    );
    if let Err(e) = call_stub(&cfg.stub, &dk).await {
        return (StatusCode::SERVICE_UNAVAILABLE, e);
    }
    stop_here(&cfg.stop_at, "after-call").await;
    (StatusCode::OK, format!("effect {dk}"))
}
