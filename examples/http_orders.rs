//! An orders API behind the idempotency layer.
//!
//! Run with: `cargo run --example http_orders --features axum`
//!
//! Environment:
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `IDEM_HTTP_ADDR` | `127.0.0.1:3000` | where to listen |
//! | `IDEM_STORE` | `sqlite` | `sqlite`, `memory`, `postgres` (feature `postgres`), `mysql` (MySQL or MariaDB, feature `mysql`), `redis` (feature `redis`) |
//! | `IDEM_SQLITE_PATH` | `idem-http-orders.db` in the working directory | the SQLite database (kept across restarts: a restarted server still replays what it answered) |
//! | `IDEM_POSTGRES_URL` | `postgres://postgres@127.0.0.1:5432/test` | the Postgres server |
//! | `IDEM_POSTGRES_SCHEMA` | `idem_http_orders` | the schema of its table |
//! | `IDEM_MYSQL_URL` | `mysql://root@127.0.0.1:3306/test` | the MySQL or MariaDB server (`mariadb://` too) |
//! | `IDEM_MYSQL_TABLE` | `idem_http_orders` | its table |
//! | `IDEM_REDIS_URL` | `redis://127.0.0.1:6379/` | the Redis server |
//! | `IDEM_REDIS_PREFIX` | `idem-http-orders:` | its key prefix |
//! | `IDEM_CALL_TIMEOUT_MS` | the backend's own | how long one store call may wait on the server (on Postgres also a commit waiting for a synchronous standby): past it, a 503 instead of a request that hangs |
//! | `IDEM_REQUIRE_SYNC_REPLICATION` | `0` | `1`: on Postgres, refuse to start unless commits are synchronous to a standby (`synchronous_standby_names`); `0`: a warning on stderr |
//! | `IDEM_REPLICATION_CHECK_MS` | `5000` | with `IDEM_REQUIRE_SYNC_REPLICATION=1`: how often the store checks the server again (`0`: before every write); a failed check refuses every write with a 503 until one passes |
//! | `IDEM_REDIS_INLINE_BODY_LIMIT` | `0` | bytes: a response body up to this size is kept inside its Redis record (a replay is one command; see `ConnectOptions::redis_inline_body_limit`) |
//! | `IDEM_LEASE_MS`, `IDEM_RESPONSE_TTL_MS`, `IDEM_KEY_TTL_MS` | 60 s, 24 h, 30 days | the policy |
//! | `IDEM_IN_FLIGHT` | `reject` | `wait`: duplicates wait up to 10 s for the first |
//!
//! Its first line says which store it opened, and where (`store: sqlite
//! /abs/path/idem-….db`, `store: postgres, schema …`, `store: mysql, table …`,
//! `store: redis, prefix …`, or `store: memory`, forgotten at exit).
//!
//! Try it:
//!
//! ```text
//! curl -i -X POST localhost:3000/orders -H 'X-Account: acme' -H 'Idempotency-Key: order-1' \
//!      -H 'Content-Type: application/json' -d '{"item":"book","qty":1}'
//! ```
//!
//! `POST /orders` and `PATCH /orders/{id}` are protected; `GET`, `PUT` and
//! `DELETE` pass through. `?delay_ms=N` makes a POST take N ms, `?status=503`
//! makes it fail transiently. `GET /stats` counts handler executions. A new
//! order's id is `ord_` and a number unique across restarts.
//!
//! A POST saves its order's id as the record's resource id
//! (`attempt.save_resource_id`) before it creates the order. So when its
//! outcome cannot be stored (the store down until the lease ends, the
//! process killed), the retry after the lease runs as a recovery, is given
//! that id (`attempt.previous_resource_id()`) and answers the order it
//! names, never creating a second one; and an answer whose outcome is not
//! stored yet still goes out as 201 (without a saved id the layer would
//! answer 503 `store_unavailable`, and the retry would replay it once
//! stored).

#[path = "support/store_from_env.rs"]
mod store_from_env;

use std::collections::BTreeMap;
use std::error::Error;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idem::http::{ExtensionOwner, IdemAttempt, IdempotencyLayer, OperationSource, OwnerId};
use idem::{AnyStore, Idem, InFlightMode, Policy};
use serde::Deserialize;
use serde_json::{Value, json};
use store_from_env::{log_warnings_to_stderr, policy_from_env, store_from_env};

type BoxError = Box<dyn Error + Send + Sync>;

/// The caller, set by the auth layer from `X-Account`.
#[derive(Clone)]
struct Account(String);

impl OwnerId for Account {
    fn owner_id(&self) -> std::borrow::Cow<'_, str> {
        std::borrow::Cow::Borrowed(&self.0)
    }
}

#[derive(Default)]
struct Orders {
    orders: Mutex<BTreeMap<String, Value>>,
    /// The last order number: it starts at the process's start time in
    /// microseconds, so that ids stay unique across restarts (a record kept
    /// by a persistent store names an order of an earlier process, and a
    /// recovery reconciles from that id).
    next: AtomicU64,
    executions: AtomicU64,
}

#[derive(Deserialize)]
struct Knobs {
    delay_ms: Option<u64>,
    status: Option<u16>,
}

/// The policy from the environment; `IDEM_IN_FLIGHT=wait`: duplicates wait
/// up to 10 s for the first.
fn policy() -> Result<Policy, BoxError> {
    let mut base = Policy::builder();
    if std::env::var("IDEM_IN_FLIGHT").as_deref() == Ok("wait") {
        base = base.in_flight(InFlightMode::Wait {
            timeout: Duration::from_secs(10),
            poll: Duration::from_millis(25),
        });
    }
    policy_from_env(base)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    log_warnings_to_stderr();
    let policy = policy()?;
    let store = store_from_env("http-orders", "axum").await?;
    serve(Idem::new(store).with_policy(policy)).await
}

async fn serve(idem: Idem<AnyStore>) -> Result<(), BoxError> {
    let layer = IdempotencyLayer::builder(idem)
        .owner(ExtensionOwner::<Account>::new())
        // `POST /orders`, `PATCH /orders/{id}`: one operation per route.
        .operation(OperationSource::MatchedPath)
        .build()?;
    let started_us = SystemTime::now().duration_since(UNIX_EPOCH)?.as_micros();
    let state = Arc::new(Orders {
        next: AtomicU64::new(u64::try_from(started_us)?),
        ..Orders::default()
    });
    let orders = Router::new()
        .route("/orders", post(create).get(list))
        .route(
            "/orders/{id}",
            axum::routing::patch(update).put(put).delete(delete),
        )
        .route_layer(layer.clone())
        .layer(middleware::from_fn(auth));
    let app = Router::new()
        .route("/stats", get(stats))
        .merge(orders)
        .with_state(state);
    let addr = std::env::var("IDEM_HTTP_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    // Let detached handlers finish and store their outcomes.
    layer.shutdown().await;
    Ok(())
}

/// Auth, outside the idempotency layer: the owner is `X-Account`.
async fn auth(mut req: Request, next: Next) -> Response {
    let Some(account) = req
        .headers()
        .get("x-account")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(|v| Account(v.to_owned()))
    else {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": "X-Account header required"})),
        )
            .into_response();
    };
    req.extensions_mut().insert(account);
    next.run(req).await
}

fn bad(msg: &str) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({ "error": msg }))).into_response()
}

/// `{"item": string, "qty": integer > 0, ...}`, or the handler's own 400.
fn validate(body: &Value) -> Result<(), &'static str> {
    if !body.get("item").is_some_and(Value::is_string) {
        return Err("item must be a string");
    }
    match body.get("qty").and_then(Value::as_i64) {
        Some(q) if q > 0 => Ok(()),
        Some(_) => Err("qty must be positive"),
        None => Err("qty must be an integer"),
    }
}

async fn create(
    State(st): State<Arc<Orders>>,
    Query(knobs): Query<Knobs>,
    IdemAttempt(attempt): IdemAttempt,
    Json(body): Json<Value>,
) -> Response {
    st.executions.fetch_add(1, Ordering::SeqCst);
    if let Some(ms) = knobs.delay_ms {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if let Some(s) = knobs.status.and_then(|s| StatusCode::from_u16(s).ok()) {
        return (s, Json(json!({"error": "requested failure"}))).into_response();
    }
    if let Err(msg) = validate(&body) {
        return bad(msg);
    }
    // A recovery: an earlier attempt saved its order's id, and its outcome
    // was never stored (the store was down until its lease ended, or the
    // process died). Reconcile from that id: the order it names, never a
    // second one.
    if let Some(id) = attempt.previous_resource_id() {
        return created(reconcile(&st, id, &body));
    }
    let id = format!("ord_{}", st.next.fetch_add(1, Ordering::SeqCst) + 1);
    // The id is saved before the order exists: a recovery always finds it,
    // and a save that fails (the store down, the lease taken over) creates
    // nothing. Saved, the answer goes out even if the outcome cannot be
    // stored: a retry then replays it, or recovers from this id.
    if let Err(e) = attempt.save_resource_id(&id).await {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": format!("order id not saved: {e}")})),
        )
            .into_response();
    }
    let order = json!({"id": id, "item": body["item"], "qty": body["qty"]});
    st.orders
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(id, order.clone());
    created(order)
}

/// The order `id` names, as an earlier attempt of this request created it;
/// one this process never saw (created by a process that died, or saved
/// but not yet created) is created now under that id, from the same
/// request (the key's fingerprint guarantees it).
fn reconcile(st: &Orders, id: &str, body: &Value) -> Value {
    st.orders
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(id.to_owned())
        .or_insert_with(|| json!({"id": id, "item": body["item"], "qty": body["qty"]}))
        .clone()
}

/// 201 with the order and its `Location`.
fn created(order: Value) -> Response {
    let location = order["id"]
        .as_str()
        .and_then(|id| HeaderValue::from_str(&format!("/orders/{id}")).ok());
    let mut res = (StatusCode::CREATED, Json(order)).into_response();
    if let Some(loc) = location {
        res.headers_mut().insert(header::LOCATION, loc);
    }
    res
}

async fn update(
    State(st): State<Arc<Orders>>,
    Path(id): Path<String>,
    Json(body): Json<Value>,
) -> Response {
    st.executions.fetch_add(1, Ordering::SeqCst);
    if let Err(msg) = validate(&body) {
        return bad(msg);
    }
    let mut orders = st.orders.lock().unwrap_or_else(PoisonError::into_inner);
    match orders.get_mut(&id) {
        Some(o) => {
            o["item"] = body["item"].clone();
            o["qty"] = body["qty"].clone();
            (StatusCode::OK, Json(o.clone())).into_response()
        }
        None => (
            StatusCode::NOT_FOUND,
            Json(json!({"error": "no such order"})),
        )
            .into_response(),
    }
}

async fn list(State(st): State<Arc<Orders>>) -> Json<Value> {
    let orders = st.orders.lock().unwrap_or_else(PoisonError::into_inner);
    Json(Value::Array(orders.values().cloned().collect()))
}

async fn put(
    State(st): State<Arc<Orders>>,
    Path(id): Path<String>,
    Json(body): Json<Value>,
) -> Response {
    if let Err(msg) = validate(&body) {
        return bad(msg);
    }
    let order = json!({"id": id, "item": body["item"], "qty": body["qty"]});
    let created = st
        .orders
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(id, order.clone())
        .is_none();
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    (status, Json(order)).into_response()
}

async fn delete(State(st): State<Arc<Orders>>, Path(id): Path<String>) -> StatusCode {
    st.orders
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&id);
    StatusCode::NO_CONTENT
}

async fn stats(State(st): State<Arc<Orders>>) -> Json<Value> {
    Json(json!({"executions": st.executions.load(Ordering::SeqCst)}))
}
