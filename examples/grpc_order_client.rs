//! Calls `CreateOrder` of `examples/grpc_orders.rs` through the gRPC client
//! layer (`idem::grpc::GrpcClientLayer`) and prints what came of it, as one
//! JSON line.
//!
//! ```text
//! cargo run --example grpc_order_client --features grpc -- \
//!     --url http://HOST:PORT --account ID [--key KEY] --amount N --currency C \
//!     [--note S] [--deadline-ms MS]
//! ```
//!
//! `--account` sets both the `x-account-id` metadata and the request's
//! `account`. Without `--key` the layer makes one key for this call (kept
//! across its retries) and the line shows it. Prints
//! `{"outcome": "fresh"|"replayed"|"already_processed"|"error", "status":
//! "OK"|"FAILED_PRECONDITION"|…, "attempts": N, "key": "…", "reason": the
//! ErrorInfo reason as sent or null, "order": {"id", "account", "amount",
//! "currency", "created_at_ms"} or null}` and exits 0 when the handler's
//! answer came back (first or replayed, whatever its status, as
//! `order_client`), 1 on a rejection by idem or when retries ran out (2 for
//! bad arguments).

#[path = "support/flags.rs"]
mod flags;
#[path = "support/orders_proto.rs"]
mod orders_proto;

use std::process::ExitCode;
use std::time::Duration;

use flags::{millis, number};
use idem::IdempotencyKey;
use idem::client::ReportKind;
use idem::grpc::{GrpcClientLayer, ReportSlot};
use orders_proto::{CREATE_ORDER, CreateOrderRequest, Order};
use serde_json::Value;
use tonic::Code;
use tonic_prost::ProstCodec;
use tonic_types::StatusExt;

const USAGE: &str = "usage: grpc_order_client --url http://HOST:PORT --account ID [--key KEY] \
                     --amount N --currency C [--note S] [--deadline-ms MS]";

struct Args {
    url: String,
    account: String,
    key: Option<String>,
    amount: i64,
    currency: String,
    note: String,
    deadline: Option<Duration>,
}

fn args() -> Result<Args, String> {
    let (mut url, mut account, mut key, mut amount, mut currency, mut note, mut deadline) =
        (None, None, None, None, None, String::new(), None);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--url" => url = Some(value()?),
            "--account" => account = Some(value()?),
            "--key" => key = Some(value()?),
            "--amount" => amount = Some(number(&flag, &value()?)?),
            "--currency" => currency = Some(value()?),
            "--note" => note = value()?,
            "--deadline-ms" => deadline = Some(millis(&flag, &value()?)?),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(Args {
        url: url.ok_or("--url is required")?,
        account: account.ok_or("--account is required")?,
        key,
        amount: amount.ok_or("--amount is required")?,
        currency: currency.ok_or("--currency is required")?,
        note,
        deadline,
    })
}

/// The gRPC name of a code (`FAILED_PRECONDITION`).
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if let Some(Err(e)) = args.key.as_deref().map(IdempotencyKey::parse) {
        eprintln!("--key: {e}\n{USAGE}");
        return ExitCode::from(2);
    }
    let mut builder = idem::client::IdempotencyClientBuilder::default();
    if let Some(d) = args.deadline {
        builder = builder.deadline(d);
    }
    let policy = match builder.build_policy() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let channel = match tonic::transport::Channel::from_shared(args.url.clone()) {
        Ok(c) => c.connect_lazy(),
        Err(e) => {
            eprintln!("--url {}: {e}\n{USAGE}", args.url);
            return ExitCode::from(2);
        }
    };
    let layer = GrpcClientLayer::new(policy).method(CREATE_ORDER);
    let mut grpc = tonic::client::Grpc::new(tower::Layer::layer(&layer, channel));

    let mut request = tonic::Request::new(CreateOrderRequest {
        account: args.account.clone(),
        amount: args.amount,
        currency: args.currency,
        note: args.note,
    });
    let Ok(account) = args.account.parse() else {
        eprintln!("--account {}: not valid metadata\n{USAGE}", args.account);
        return ExitCode::from(2);
    };
    request.metadata_mut().insert("x-account-id", account);
    if let Some(k) = &args.key
        && let Ok(v) = k.parse()
    {
        request.metadata_mut().insert("idempotency-key", v);
    }
    let slot = ReportSlot::new();
    request.extensions_mut().insert(slot.clone());

    let result = match grpc.ready().await {
        Ok(()) => {
            grpc.unary(
                request,
                http::uri::PathAndQuery::from_static(CREATE_ORDER),
                ProstCodec::<CreateOrderRequest, Order>::default(),
            )
            .await
        }
        Err(e) => Err(tonic::Status::unavailable(e.to_string())),
    };
    let report = slot.take();
    let (status, reason, order) = match &result {
        Ok(r) => {
            let o = r.get_ref();
            // The proto's field order.
            let order = format!(
                r#"{{"id":{},"account":{},"amount":{},"currency":{},"created_at_ms":{}}}"#,
                Value::from(o.id.as_str()),
                Value::from(o.account.as_str()),
                o.amount,
                Value::from(o.currency.as_str()),
                o.created_at_ms,
            );
            ("OK", Value::Null, order)
        }
        Err(s) => {
            let reason = s
                .get_error_details()
                .error_info()
                .map_or(Value::Null, |i| Value::String(i.reason.clone()));
            (code_name(s.code()), reason, "null".to_owned())
        }
    };
    let (outcome, ok) = match report.as_ref().map(|r| r.kind) {
        Some(ReportKind::Fresh) => ("fresh", true),
        Some(ReportKind::Replayed) => ("replayed", true),
        Some(ReportKind::AlreadyProcessed) => ("already_processed", true),
        _ => ("error", false),
    };
    let key = report
        .as_ref()
        .map(|r| r.key.as_str().to_owned())
        .or(args.key);
    // The fields in the documented order.
    println!(
        r#"{{"outcome":{},"status":{},"attempts":{},"key":{},"reason":{},"order":{}}}"#,
        Value::from(outcome),
        Value::from(status),
        report.as_ref().map_or(0, |r| r.attempts),
        key.map_or(Value::Null, Value::from),
        reason,
        order,
    );
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
