//! A webhook receiver: Standard Webhooks, Stripe and GitHub deliveries,
//! verified, then run at most once per event.
//!
//! Run with: `cargo run --example webhook_receiver --features axum,webhook`
//!
//! Environment:
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `IDEM_HTTP_ADDR` | `127.0.0.1:3001` | where to listen |
//! | `IDEM_STORE` | `sqlite` | `sqlite`, `memory`, `postgres` (feature `postgres`), `mysql` (MySQL or MariaDB, feature `mysql`), `redis` (feature `redis`) |
//! | `IDEM_SQLITE_PATH` | `idem-webhook-receiver.db` in the working directory | the SQLite database (kept across restarts: a restarted server still replays what it answered) |
//! | `IDEM_POSTGRES_URL` | `postgres://postgres@127.0.0.1:5432/test` | the Postgres server |
//! | `IDEM_POSTGRES_SCHEMA` | `idem_webhook_receiver` | the schema of its table |
//! | `IDEM_MYSQL_URL` | `mysql://root@127.0.0.1:3306/test` | the MySQL or MariaDB server (`mariadb://` too) |
//! | `IDEM_MYSQL_TABLE` | `idem_webhook_receiver` | its table |
//! | `IDEM_REDIS_URL` | `redis://127.0.0.1:6379/` | the Redis server |
//! | `IDEM_REDIS_PREFIX` | `idem-webhook-receiver:` | its key prefix |
//! | `IDEM_CALL_TIMEOUT_MS` | the backend's own | how long one store call may wait on the server (on Postgres also a commit waiting for a synchronous standby): past it, a 503 instead of a request that hangs |
//! | `IDEM_REQUIRE_SYNC_REPLICATION` | `0` | `1`: on Postgres, refuse to start unless commits are synchronous to a standby (`synchronous_standby_names`); `0`: a warning on stderr |
//! | `IDEM_REPLICATION_CHECK_MS` | `5000` | with `IDEM_REQUIRE_SYNC_REPLICATION=1`: how often the store checks the server again (`0`: before every write); a failed check refuses every write with a 503 until one passes |
//! | `IDEM_REDIS_INLINE_BODY_LIMIT` | `0` | bytes: a response body up to this size is kept inside its Redis record (a replay is one command; see `ConnectOptions::redis_inline_body_limit`) |
//! | `STANDARD_WEBHOOK_SECRET` | unset | a `whsec_…` secret: mounts `POST /webhooks/standard` |
//! | `STRIPE_WEBHOOK_SECRET` | unset | Stripe's `whsec_…` signing secret: mounts `POST /webhooks/stripe` |
//! | `GITHUB_WEBHOOK_SECRET` | unset | the GitHub webhook secret: mounts `POST /webhooks/github` |
//!
//! Its first line says which store it opened, and where (`store: sqlite
//! /abs/path/idem-….db`, `store: postgres, schema …`, `store: mysql, table …`,
//! `store: redis, prefix …`, or `store: memory`, forgotten at exit).
//!
//! A route whose secret is unset is not mounted (the startup output says so).
//!
//! The handler counts each run (`GET /stats` answers `{"executions": N}`) and
//! behaves by the event's JSON `type`: `test.transient` fails transiently
//! (503: the key is released, the provider's next delivery runs again),
//! `test.permanent` fails permanently (422: stored and acknowledged with
//! 200), `test.slow` takes 2 s (a duplicate meanwhile gets 503 with
//! `Retry-After`); anything else succeeds. A duplicate of a finished
//! delivery gets 200 and `Idempotent-Replayed: true`, and does not run.
//!
//! Try it: start it with a secret,
//!
//! ```text
//! STANDARD_WEBHOOK_SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw \
//!   cargo run --example webhook_receiver --features axum,webhook
//! ```
//!
//! then, once it prints `listening on`, send a Standard Webhooks delivery
//! signed with python3 from another shell, twice (the second is a duplicate:
//! `Idempotent-Replayed: true`, and `executions` stays 1):
//!
//! ```text
//! export STANDARD_WEBHOOK_SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
//! body='{"type":"invoice.paid"}' id=msg_1 ts=$(date +%s)
//! sig=$(python3 -c 'import base64,hmac,hashlib,sys; k=base64.b64decode(sys.argv[1][6:]);
//! print(base64.b64encode(hmac.new(k, sys.argv[2].encode(), hashlib.sha256).digest()).decode())' \
//!   "$STANDARD_WEBHOOK_SECRET" "$id.$ts.$body")
//! curl -i localhost:3001/webhooks/standard -H "webhook-id: $id" -H "webhook-timestamp: $ts" \
//!      -H "webhook-signature: v1,$sig" -H 'Content-Type: application/json' -d "$body"
//! curl localhost:3001/stats
//! ```

#[path = "support/stop.rs"]
mod stop;
#[path = "support/store_from_env.rs"]
mod store_from_env;

use std::error::Error;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idem::http::IdemAttempt;
use idem::http::webhook::{Provider, Secret, WebhookDelivery, WebhookLayer};
use idem::{AnyStore, Idem};
use serde_json::{Value, json};
use stop::stop;
use store_from_env::{log_warnings_to_stderr, store_from_env};

type BoxError = Box<dyn Error + Send + Sync>;

#[derive(Default)]
struct Stats {
    executions: AtomicU64,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    log_warnings_to_stderr();
    let store = store_from_env("webhook-receiver", "axum,webhook").await?;
    serve(Idem::new(store)).await
}

/// One provider's route: its secret's variable, its path, and how the
/// secret becomes a `Provider`.
struct Route {
    var: &'static str,
    path: &'static str,
    provider: fn(&str) -> Result<Provider, BoxError>,
}

const ROUTES: [Route; 3] = [
    Route {
        var: "STANDARD_WEBHOOK_SECRET",
        path: "/webhooks/standard",
        provider: |s| Ok(Provider::standard_webhooks([Secret::whsec(s)?])),
    },
    Route {
        var: "STRIPE_WEBHOOK_SECRET",
        // Stripe's `whsec_…` string is the HMAC key as it is.
        path: "/webhooks/stripe",
        provider: |s| Ok(Provider::stripe([Secret::new(s)])),
    },
    Route {
        var: "GITHUB_WEBHOOK_SECRET",
        path: "/webhooks/github",
        provider: |s| Ok(Provider::github([Secret::new(s)])),
    },
];

async fn serve(idem: Idem<AnyStore>) -> Result<(), BoxError> {
    let stats = Arc::new(Stats::default());
    let mut app = Router::new().route("/stats", get(report));
    let mut layers = Vec::new();
    for route in &ROUTES {
        let secret = match std::env::var(route.var) {
            Ok(s) if !s.trim().is_empty() => s,
            _ => {
                println!("{} unset: POST {} not mounted", route.var, route.path);
                continue;
            }
        };
        let provider = (route.provider)(&secret).map_err(|e| format!("{}: {e}", route.var))?;
        let name = provider.name().to_owned();
        // One layer per provider; the endpoint (the owner of every record)
        // is the route, so the same event id sent to two routes is two events.
        let layer = WebhookLayer::builder(idem.clone())
            .provider(provider)
            .endpoint(route.path)
            .build()?;
        app = app.route(route.path, post(handle).route_layer(layer.clone()));
        layers.push(layer);
        println!("POST {} mounted ({name})", route.path);
    }
    let app = app.with_state(stats);
    let addr = std::env::var("IDEM_HTTP_ADDR").unwrap_or_else(|_| "127.0.0.1:3001".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(stop())
        .await?;
    // Let detached handlers finish and store their outcomes.
    for layer in &layers {
        layer.shutdown().await;
    }
    Ok(())
}

/// The work, behind the webhook layer: it runs once per event (again only
/// after a transient failure released the key).
async fn handle(
    State(stats): State<Arc<Stats>>,
    WebhookDelivery(delivery): WebhookDelivery,
    IdemAttempt(attempt): IdemAttempt,
    body: Bytes,
) -> Response {
    stats.executions.fetch_add(1, Ordering::SeqCst);
    let event: Value = serde_json::from_slice(&body).unwrap_or_default();
    let kind = event.get("type").and_then(Value::as_str).unwrap_or("");
    match kind {
        "test.transient" => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": "transient failure, deliver again"})),
        )
            .into_response(),
        "test.permanent" => (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"error": "permanent failure"})),
        )
            .into_response(),
        _ => {
            if kind == "test.slow" {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Json(json!({
                "received": delivery.event_id(),
                "provider": delivery.provider(),
                "recovery": attempt.is_recovery(),
            }))
            .into_response()
        }
    }
}

async fn report(State(stats): State<Arc<Stats>>) -> Json<Value> {
    Json(json!({"executions": stats.executions.load(Ordering::SeqCst)}))
}
