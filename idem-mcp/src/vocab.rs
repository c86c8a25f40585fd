//! The contract's wire vocabulary as this adapter speaks it: the key syntax,
//! the problem codes and the retry hints, taken from where they live
//! (idem-core's key parser and errors, `idem_core::wire::ProblemCode`), never
//! copied. Every use in this crate goes through here, so the one home of
//! that vocabulary is re-pointed in one place.
#![cfg_attr(
    not(all(feature = "server", feature = "client")),
    allow(
        dead_code,
        reason = "the server and the client side each read their part"
    )
)]

use std::time::Duration;

use idem_core::{Error, IdempotencyKey};
use rmcp::model::{ErrorCode, ErrorData};
use serde_json::{Map, Value};

/// Where a key is read from: the request's `_meta` member.
pub(crate) const META_KEY: &str = "idempotencyKey";
/// Where a key is read from: the tool argument (for hosts that cannot set meta).
pub(crate) const ARGUMENT_KEY: &str = "idempotency_key";
/// The marker a replayed result carries in its `_meta`.
pub(crate) const REPLAYED_MARKER: &str = "idempotentReplayed";
/// The experimental capability the server advertises (SEP-3182's shape).
pub(crate) const CAPABILITY: &str = "idempotency";

/// The codes this adapter answers with on its own, as idem-http names them.
pub(crate) mod code {
    use idem_core::wire::ProblemCode;

    pub(crate) const INVALID_KEY: &str = ProblemCode::InvalidKey.as_str();
    pub(crate) const MISSING_KEY: &str = ProblemCode::MissingKey.as_str();
    pub(crate) const OWNER_UNAVAILABLE: &str = ProblemCode::OwnerUnavailable.as_str();
    pub(crate) const HANDLER_PANICKED: &str = ProblemCode::HandlerPanicked.as_str();
    pub(crate) const CORRUPT_RECORD: &str = ProblemCode::CorruptRecord.as_str();
    pub(crate) const SHUTTING_DOWN: &str = ProblemCode::ShuttingDown.as_str();
}

/// A key as received: a JSON string of 1 to 255 printable ASCII characters,
/// taken as is (no trimming, no sf-string unquoting:
/// [`IdempotencyKey::parse_exact`]); anything else (another type, empty,
/// too long, another character) is `invalid_key`.
pub(crate) fn parse_key(value: &Value) -> Result<IdempotencyKey, String> {
    match value {
        Value::String(s) => IdempotencyKey::parse_exact(s).map_err(|e| e.to_string()),
        other => Err(format!(
            "the idempotency key must be a JSON string, not {}",
            json_type(other)
        )),
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The problem code of an engine error: idem-core's own (`in_flight`,
/// `fingerprint_mismatch`, `store_unavailable`, ...), the names the HTTP
/// layer's problems carry.
pub(crate) fn engine_code(e: &Error) -> &'static str {
    e.code()
}

/// The JSON-RPC error code for a problem code: the request's own fault is
/// "invalid params"; everything else is the server's ("internal error"). A
/// host tells them apart by `data.code`.
fn rpc_code(code: &str) -> ErrorCode {
    match code {
        "invalid_key" | "missing_key" | "invalid_request" | "fingerprint_mismatch" => {
            ErrorCode::INVALID_PARAMS
        }
        _ => ErrorCode::INTERNAL_ERROR,
    }
}

/// A JSON-RPC error whose `data` carries the problem `code`, `retryAfterMs`
/// when the same call may succeed later, and `resourceId` when the first
/// execution recorded one.
pub(crate) fn rpc_error(
    code: &str,
    message: String,
    retry_after: Option<Duration>,
    resource_id: Option<&str>,
) -> ErrorData {
    let mut data = Map::new();
    data.insert("code".to_owned(), Value::from(code));
    if let Some(d) = retry_after {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        data.insert("retryAfterMs".to_owned(), Value::from(ms));
    }
    if let Some(id) = resource_id {
        data.insert("resourceId".to_owned(), Value::from(id));
    }
    ErrorData::new(rpc_code(code), message, Some(Value::Object(data)))
}

/// An engine error as the JSON-RPC error a host reads.
pub(crate) fn engine_error(e: &Error) -> ErrorData {
    rpc_error(
        engine_code(e),
        e.to_string(),
        e.retry_after(),
        e.resource_id(),
    )
}

/// The HTTP status the HTTP layer answers a problem code with, for
/// `idem::client`'s policy table (which reads statuses and codes).
#[cfg(feature = "client")]
pub(crate) fn status_of(code: &str) -> http::StatusCode {
    use http::StatusCode;
    match code {
        "invalid_key" | "missing_key" | "invalid_request" => StatusCode::BAD_REQUEST,
        "fingerprint_mismatch" => StatusCode::UNPROCESSABLE_ENTITY,
        "in_flight" | "lease_lost" | "response_expired" | "response_not_stored" => {
            StatusCode::CONFLICT
        }
        "store_unavailable" | "shutting_down" => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}
