//! An MCP server whose `create_order` tool is safe to retry.
//!
//! Run with: `cargo run --example mcp_orders --features mcp`
//!
//! Transport: stdio by default (stdout carries MCP messages only; every log
//! line goes to stderr), the owner is `IDEM_MCP_OWNER` (default `local`).
//! With `IDEM_MCP_ADDR` set: streamable HTTP at `/mcp`, it prints
//! `listening on http://ADDR/mcp`, and the owner is the token of an
//! `Authorization: Bearer` header (a stand-in for real authentication; no
//! header, another scheme or an empty token: HTTP 401, nothing runs).
//!
//! Environment, as `http_orders`:
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `IDEM_STORE` | `sqlite` | `sqlite`, `memory`, `postgres`, `redis`, `mysql` (with the backend's feature) |
//! | `IDEM_SQLITE_PATH` | a file in a temp dir | the SQLite database |
//! | `IDEM_POSTGRES_URL` | `postgres://postgres@127.0.0.1:5432/test` | schema `idem_mcp_orders` |
//! | `IDEM_REDIS_URL` | `redis://127.0.0.1:6379/` | prefix `idem-mcp-orders:` |
//! | `IDEM_MYSQL_URL` | `mysql://root@127.0.0.1:3306/test` | table `idem_mcp_orders` |
//! | `IDEM_LEASE_MS`, `IDEM_RESPONSE_TTL_MS`, `IDEM_KEY_TTL_MS` | 60 s, 24 h, 30 days | the policy |
//!
//! Tools:
//!
//! * `create_order` (`amount` integer, `currency` string, `note` optional
//!   string, `idempotency_key` optional string): `structuredContent`
//!   `{"id": "ord_…", "amount", "currency", "created_at_ms"}`, a new id per
//!   execution. `amount` 7: `isError: true`, `{"error":
//!   "insufficient_funds"}`, permanent (replayed); `amount` 13: the same
//!   with `provider_unavailable`, transient (the key released); `note`
//!   `"slow"`: answers after 2 s (1 s of work, then, once the outcome is
//!   stored, 1 s more before the answer).
//! * `stats`: `{"executions": N}`, the `create_order` executions of this
//!   process; never keyed.
//!
//! The key: `_meta.idempotencyKey`, else the `idempotency_key` argument.

#[path = "support/store_from_env.rs"]
#[allow(
    dead_code,
    reason = "only its policy: the store is opened here, logging on stderr"
)]
mod store_from_env;

use std::error::Error;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use idem::mcp::rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ErrorData, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use idem::mcp::rmcp::service::RequestContext;
use idem::mcp::rmcp::{RoleServer, ServerHandler, ServiceExt};
use idem::mcp::{IdempotentTools, ToolCall, ToolKeys, ToolOutcome};
use idem::{AnyStore, ConnectOptions, Idem, IdempotencyKey, Policy};
use serde_json::{Value, json};
use store_from_env::policy_from_env;

type BoxError = Box<dyn Error + Send + Sync>;

/// The caller, set by the bearer check from the token.
#[derive(Clone)]
struct Owner(String);

#[derive(Clone)]
struct Orders {
    tools: IdempotentTools<AnyStore>,
    executions: Arc<AtomicU64>,
}

impl ServerHandler for Orders {
    fn get_info(&self) -> ServerConfig {
        let mut caps = ServerCapabilities::builder().enable_tools().build();
        self.tools.advertise(&mut caps);
        ServerConfig::new(caps)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let executions = Arc::clone(&self.executions);
        match request.name.as_ref() {
            "stats" => {
                let n = executions.load(Ordering::SeqCst);
                return Ok(CallToolResult::structured(json!({ "executions": n })).into());
            }
            "create_order" => {}
            other => {
                return Err(ErrorData::invalid_params(format!("no tool {other}"), None));
            }
        }
        let slow = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("note"))
            .and_then(Value::as_str)
            == Some("slow");
        let answer = self
            .tools
            .call(request, &context, move |call| {
                create_order(call, executions)
            })
            .await;
        if slow {
            eprintln!("slow: outcome stored, answering in 1 s");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        answer.map(Into::into)
    }
}

async fn create_order(call: ToolCall, executions: Arc<AtomicU64>) -> ToolOutcome {
    let args = call.arguments();
    let (Some(amount), Some(currency)) = (
        args.get("amount").and_then(Value::as_i64),
        args.get("currency").and_then(Value::as_str),
    ) else {
        let why = "amount (integer) and currency (string) are required";
        return ToolOutcome::error(ErrorData::invalid_params(why, None));
    };
    executions.fetch_add(1, Ordering::SeqCst);
    if args.get("note").and_then(Value::as_str) == Some("slow") {
        eprintln!("slow: working for 1 s");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    match amount {
        7 => failed("insufficient_funds").into(),
        13 => ToolOutcome::transient(failed("provider_unavailable")),
        _ => {
            // Unique across restarts: 128 random bits.
            let id = format!("ord_{}", IdempotencyKey::random().as_str());
            if let Some(attempt) = call.attempt() {
                attempt.set_resource_id(&id);
            }
            let now = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
            eprintln!("created {id}");
            CallToolResult::structured(json!({
                "id": id, "amount": amount, "currency": currency, "created_at_ms": now,
            }))
            .into()
        }
    }
}

fn tools() -> Vec<Tool> {
    let schema = |v: Value| match v {
        Value::Object(m) => Arc::new(m),
        _ => Arc::default(),
    };
    vec![
        Tool::new(
            "create_order",
            "Creates an order. Send one idempotency key per intended order.",
            schema(json!({
                "type": "object",
                "properties": {
                    "amount": {"type": "integer"},
                    "currency": {"type": "string"},
                    "note": {"type": "string"},
                    "idempotency_key": {"type": "string", "minLength": 1, "maxLength": 255},
                },
                "required": ["amount", "currency"],
            })),
        ),
        Tool::new(
            "stats",
            "How many times create_order ran in this process.",
            schema(json!({"type": "object", "properties": {}})),
        ),
    ]
}

/// A permanent or transient failure the host sees: `isError`, the word in
/// `structuredContent.error` and in the text.
fn failed(why: &str) -> CallToolResult {
    CallToolResult::structured_error(json!({ "error": why }))
}

/// The store `IDEM_STORE` names, logged on stderr (stdout is the MCP
/// channel on stdio).
async fn store() -> Result<AnyStore, BoxError> {
    let var =
        |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_owned());
    let which = var("IDEM_STORE", "sqlite");
    let options = ConnectOptions::new();
    let (url, options) = match which.as_str() {
        "memory" => return Ok(AnyStore::new(idem::MemoryStore::new())),
        "sqlite" => {
            let tmp =
                std::env::temp_dir().join(format!("idem-mcp-orders-{}.db", std::process::id()));
            (var("IDEM_SQLITE_PATH", &tmp.to_string_lossy()), options)
        }
        "postgres" => (
            var(
                "IDEM_POSTGRES_URL",
                "postgres://postgres@127.0.0.1:5432/test",
            ),
            options.schema_name("idem_mcp_orders"),
        ),
        "redis" => (
            var("IDEM_REDIS_URL", "redis://127.0.0.1:6379/"),
            options.key_prefix("idem-mcp-orders:"),
        ),
        "mysql" => (
            var("IDEM_MYSQL_URL", "mysql://root@127.0.0.1:3306/test"),
            options.table_name("idem_mcp_orders"),
        ),
        other => {
            return Err(format!(
                "IDEM_STORE={other}: use sqlite, memory, postgres, redis or mysql"
            )
            .into());
        }
    };
    let store = options.connect(&url).await?;
    eprintln!("store: {which}");
    Ok(store)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let idem = Idem::new(store().await?).with_policy(policy_from_env(Policy::builder())?);
    let keys = |tools: IdempotentTools<AnyStore>| {
        tools
            .tool("create_order", ToolKeys::optional().with_argument())
            .tool("stats", ToolKeys::never())
    };
    let executions = Arc::new(AtomicU64::new(0));
    match std::env::var("IDEM_MCP_ADDR") {
        Err(_) => {
            let owner = std::env::var("IDEM_MCP_OWNER").unwrap_or_else(|_| "local".to_owned());
            let tools = keys(IdempotentTools::with_owner(idem, owner));
            let orders = Orders {
                tools: tools.clone(),
                executions,
            };
            let running = orders.serve(idem::mcp::rmcp::transport::stdio()).await?;
            let _ = running.waiting().await;
            tools.shutdown().await;
        }
        Ok(addr) => {
            let tools = keys(IdempotentTools::new(idem, bearer_owner));
            serve_http(&addr, tools.clone(), executions).await?;
            tools.shutdown().await;
        }
    }
    Ok(())
}

/// The owner the bearer check put in the HTTP request's extensions.
fn bearer_owner(ctx: &RequestContext<RoleServer>) -> Option<String> {
    let parts = ctx.extensions.get::<axum::http::request::Parts>()?;
    parts.extensions.get::<Owner>().map(|o| o.0.clone())
}

async fn serve_http(
    addr: &str,
    tools: IdempotentTools<AnyStore>,
    executions: Arc<AtomicU64>,
) -> Result<(), BoxError> {
    use idem::mcp::rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use idem::mcp::rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
    let orders = Orders { tools, executions };
    let service = StreamableHttpService::new(
        move || Ok(orders.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let app = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(middleware::from_fn(bearer));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening on http://{}/mcp", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

/// `Authorization: Bearer TOKEN`, the token as the owner; anything else is
/// 401 and nothing runs.
async fn bearer(mut req: Request, next: Next) -> Response {
    let token = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        // The scheme is case-insensitive (RFC 9110 §11.1).
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .filter(|t| !t.is_empty())
        .map(str::to_owned);
    let Some(token) = token else {
        return (StatusCode::UNAUTHORIZED, "a bearer token is required").into_response();
    };
    req.extensions_mut().insert(Owner(token));
    next.run(req).await
}
