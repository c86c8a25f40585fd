//! Sends one `POST` through the idempotency client middleware and prints what
//! came of it, as one JSON line.
//!
//! ```text
//! cargo run --example order_client --features client -- \
//!     --url URL --account ACCOUNT [--key KEY] --body JSON [--deadline-ms MS]
//! ```
//!
//! Sends `POST URL` with `X-Account: ACCOUNT`, `Content-Type:
//! application/json` and the body, under `--key` or a key the middleware
//! mints and keeps across its retries. Prints
//! `{"outcome": "fresh"|"replayed"|"already_processed"|"error", "status": N,
//! "attempts": N, "key": "…", "code": "…" (for an error), "body": …}` and
//! exits 0 for fresh, replayed and already processed, 1 otherwise (2 for bad
//! arguments). Works against `examples/http_orders.rs`.
//!
//! `--deadline-ms` bounds the retries: no attempt starts after it. It does
//! not cut an attempt already running (the middleware never abandons a
//! request the server may be executing; the answer it waits for is the one
//! that says what happened). With `--deadline-ms`, the line also carries
//! `"after_deadline": true|false`: whether the answer (or the error) came
//! after the deadline had passed.

#[path = "support/flags.rs"]
mod flags;

use std::process::ExitCode;
use std::time::Duration;

use flags::millis;
use idem::IdempotencyKey;
use idem::client::{IdemResponseExt, IdempotencyMiddleware, IdempotentRequestExt, ReportKind};
use serde_json::{Value, json};

const USAGE: &str =
    "usage: order_client --url URL --account ACCOUNT [--key KEY] --body JSON [--deadline-ms MS]
  --deadline-ms MS  no new attempt starts after MS ms; an attempt already running is not cut
                    (it ends when the server answers), and the line then says
                    \"after_deadline\": true";

struct Args {
    url: String,
    account: String,
    key: Option<String>,
    body: String,
    deadline: Option<Duration>,
}

/// The arguments; `None` for `--help`.
fn args() -> Result<Option<Args>, String> {
    let (mut url, mut account, mut key, mut body, mut deadline) = (None, None, None, None, None);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--help" | "-h" => return Ok(None),
            "--url" => url = Some(value()?),
            "--account" => account = Some(value()?),
            "--key" => key = Some(value()?),
            "--body" => body = Some(value()?),
            "--deadline-ms" => deadline = Some(millis(&flag, &value()?)?),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(Some(Args {
        url: url.ok_or("--url is required")?,
        account: account.ok_or("--account is required")?,
        key,
        body: body.ok_or("--body is required")?,
        deadline,
    }))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = match args() {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let key = match args.key.as_deref().map(IdempotencyKey::parse).transpose() {
        Ok(k) => k,
        Err(e) => {
            eprintln!("--key: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let mut builder = IdempotencyMiddleware::builder();
    if let Some(d) = args.deadline {
        builder = builder.deadline(d);
    }
    let middleware = match builder.build() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(middleware)
        .build();
    let mut request = client
        .post(&args.url)
        .header("x-account", &args.account)
        .header("content-type", "application/json")
        .body(args.body);
    if let Some(key) = key {
        request = request.idempotency_key(key);
    }
    let started = std::time::Instant::now();
    let (mut line, ok) = match request.send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            let report = response.idem_report().cloned();
            let bytes = response.bytes().await.unwrap_or_default();
            let body = serde_json::from_slice::<Value>(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
            let (outcome, ok) = match report.as_ref().map(|r| &r.kind) {
                Some(ReportKind::Fresh) => ("fresh", true),
                Some(ReportKind::Replayed) => ("replayed", true),
                Some(ReportKind::AlreadyProcessed) => ("already_processed", true),
                _ => ("error", false),
            };
            let mut line = json!({
                "outcome": outcome,
                "status": status,
                "attempts": report.as_ref().map_or(1, |r| r.attempts),
                "key": report.as_ref().map(|r| r.key.as_str().to_owned()),
                "body": body,
            });
            if !ok {
                let code = report
                    .as_ref()
                    .and_then(|r| r.problem.as_ref())
                    .and_then(|p| p.code.clone())
                    .unwrap_or_else(|| {
                        report
                            .as_ref()
                            .map_or("no_report", |r| r.kind.as_str())
                            .to_owned()
                    });
                line["code"] = code.into();
            }
            (line, ok)
        }
        Err(e) => {
            // No response at all: the middleware's error says why, and
            // carries the key to resume with.
            use idem::client::Error;
            let err = Error::from_middleware(&e);
            let (attempts, code) = match err {
                Some(Error::Exhausted {
                    attempts, reason, ..
                }) => (*attempts, reason.as_str()),
                Some(Error::BodyNotReplayable) => (0, "body_not_replayable"),
                Some(Error::InvalidKey(_)) => (0, "invalid_key"),
                Some(Error::KeyLifetimeExceeded { .. }) => (0, "key_lifetime_exceeded"),
                _ => (0, "transport"),
            };
            let line = json!({
                "outcome": "error",
                "status": 0,
                "attempts": attempts,
                "key": err.and_then(|e| e.key()).map(|k| k.as_str().to_owned()),
                "code": code,
                "body": Value::Null,
            });
            (line, false)
        }
    };
    if let Some(deadline) = args.deadline {
        line["after_deadline"] = (started.elapsed() > deadline).into();
    }
    println!("{line}");
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
