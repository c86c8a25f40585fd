//! Calls `create_order` through the MCP client helper and prints what came
//! of it, as one JSON line.
//!
//! ```text
//! cargo run --example mcp_order_client --features mcp -- \
//!     (--server-cmd CMD | --url URL --token TOKEN) --amount N --currency C \
//!     [--key KEY] [--deadline-ms MS]
//! ```
//!
//! With `--server-cmd`, the server is a child process spoken to over stdio
//! (`sh -c CMD`); with `--url`, streamable HTTP with `Authorization: Bearer
//! TOKEN`. The call carries `--key` (or a key the helper mints and keeps
//! across its retries) in `_meta.idempotencyKey`; an `in_flight` answer, a
//! lost answer or a dropped connection is retried with it, on a new
//! connection when the last one failed. Prints `{"outcome":
//! "fresh"|"replayed"|"already_processed"|"error", "attempts": N, "key":
//! "…", "code": "…" (for an error), "result": …}` and exits 0 for fresh,
//! replayed and already processed, 1 otherwise (2 for bad arguments).
//! Works against `examples/mcp_orders.rs`.

#[path = "support/flags.rs"]
mod flags;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use flags::millis;
use idem::IdempotencyKey;
use idem::mcp::rmcp::model::{CallToolRequestParams, CallToolResult};
use idem::mcp::rmcp::service::{RunningService, ServiceError};
use idem::mcp::rmcp::{RoleClient, ServiceExt};
use idem::mcp::{ReportKind, ToolCaller, error_code};
use serde_json::{Value, json};
use tokio::sync::Mutex;

const USAGE: &str = "usage: mcp_order_client (--server-cmd CMD | --url URL --token TOKEN) \
                     --amount N --currency C [--key KEY] [--deadline-ms MS]";

#[derive(Clone)]
enum Server {
    Cmd(String),
    Url { url: String, token: String },
}

struct Args {
    server: Server,
    amount: i64,
    currency: String,
    key: Option<IdempotencyKey>,
    deadline: Option<Duration>,
}

fn args() -> Result<Args, String> {
    let mut flags = std::collections::HashMap::new();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let known = [
            "--server-cmd",
            "--url",
            "--token",
            "--amount",
            "--currency",
            "--key",
            "--deadline-ms",
        ];
        if !known.contains(&flag.as_str()) {
            return Err(format!("unknown argument {flag}"));
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        flags.insert(flag, value);
    }
    let mut take = |name: &str| flags.remove(name);
    let server = match (take("--server-cmd"), take("--url"), take("--token")) {
        (Some(cmd), None, None) => Server::Cmd(cmd),
        (None, Some(url), Some(token)) => Server::Url { url, token },
        _ => return Err("give --server-cmd, or --url with --token".to_owned()),
    };
    let amount = take("--amount").ok_or("--amount is required")?;
    let amount = amount
        .parse()
        .map_err(|_| format!("--amount {amount}: not an integer"))?;
    let deadline = match take("--deadline-ms") {
        None => None,
        Some(ms) => Some(millis("--deadline-ms", &ms)?),
    };
    Ok(Args {
        server,
        amount,
        currency: take("--currency").ok_or("--currency is required")?,
        key: take("--key")
            .map(|k| IdempotencyKey::parse(&k).map_err(|e| format!("--key: {e}")))
            .transpose()?,
        deadline,
    })
}

/// The helper under `idem::client`'s policy, with `--deadline-ms`; an
/// attempt whose answer is 5 s late counts as lost.
fn caller(deadline: Option<Duration>) -> Result<ToolCaller, String> {
    let builder = ToolCaller::policy();
    let builder = match deadline {
        Some(d) => builder.deadline(d),
        None => builder,
    };
    let policy = builder.build_policy().map_err(|e| e.to_string())?;
    Ok(ToolCaller::new(policy).attempt_timeout(Some(Duration::from_secs(5))))
}

type Client = RunningService<RoleClient, ()>;

async fn connect(server: &Server) -> Result<Client, ServiceError> {
    use idem::mcp::rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    use idem::mcp::rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
    let closed = |e: &dyn std::fmt::Display| {
        eprintln!("connect: {e}");
        ServiceError::TransportClosed
    };
    match server {
        Server::Cmd(cmd) => {
            let mut command = tokio::process::Command::new("sh");
            command.arg("-c").arg(cmd);
            let transport = TokioChildProcess::new(command).map_err(|e| closed(&e))?;
            ().serve(transport).await.map_err(|e| closed(&e))
        }
        Server::Url { url, token } => {
            let config =
                StreamableHttpClientTransportConfig::with_uri(url.as_str()).auth_header(token);
            let transport = StreamableHttpClientTransport::from_config(config);
            ().serve(transport).await.map_err(|e| closed(&e))
        }
    }
}

/// One attempt on the open connection, or a new one when the last failed.
async fn attempt(
    server: Server,
    slot: Arc<Mutex<Option<Client>>>,
    request: CallToolRequestParams,
) -> Result<CallToolResult, ServiceError> {
    let mut slot = slot.lock().await;
    if slot.is_none() {
        *slot = Some(connect(&server).await?);
    }
    let client = slot.as_ref().ok_or(ServiceError::TransportClosed)?;
    let answer = client.call_tool(request).await;
    if matches!(&answer, Err(e) if !matches!(e, ServiceError::McpError(_))) {
        // The connection is suspect: the next attempt opens a new one.
        if let Some(old) = slot.take() {
            let _ = old.cancel().await;
        }
    }
    answer
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let (args, caller) = match args().and_then(|a| caller(a.deadline).map(|c| (a, c))) {
        Ok(set) => set,
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let mut arguments = serde_json::Map::new();
    arguments.insert("amount".to_owned(), args.amount.into());
    arguments.insert("currency".to_owned(), args.currency.into());
    let request = CallToolRequestParams::new("create_order").with_arguments(arguments);
    let slot = Arc::new(Mutex::new(None));
    let report = {
        let slot = Arc::clone(&slot);
        let server = args.server.clone();
        caller
            .call(request, args.key, move |r| {
                attempt(server.clone(), Arc::clone(&slot), r)
            })
            .await
    };
    if let Some(client) = slot.lock().await.take() {
        let _ = client.cancel().await;
    }
    let (outcome, ok) = match report.outcome {
        ReportKind::Fresh => ("fresh", true),
        ReportKind::Replayed => ("replayed", true),
        ReportKind::AlreadyProcessed => ("already_processed", true),
        _ => ("error", false),
    };
    let (result, code) = match &report.answer {
        Some(Ok(r)) => (serde_json::to_value(r).unwrap_or(Value::Null), None),
        Some(Err(e)) => (
            serde_json::to_value(e).unwrap_or(Value::Null),
            error_code(e).map(str::to_owned),
        ),
        None => (Value::Null, None),
    };
    let mut line = json!({
        "outcome": outcome,
        "attempts": report.attempts,
        "key": report.key.as_str(),
        "result": result,
    });
    if !ok {
        let code = match report.outcome {
            ReportKind::Exhausted(reason) if report.answer.is_none() => reason.as_str().to_owned(),
            ReportKind::Exhausted(_) => "exhausted".to_owned(),
            _ => code.unwrap_or_else(|| report.outcome.as_str().to_owned()),
        };
        line["code"] = code.into();
    }
    println!("{line}");
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
