//! The OpenAPI 3.1 components a layer publishes (the draft: a resource MUST
//! publish its idempotency specification and expiry policy), filled with the
//! layer's own numbers. The static version is `openapi/idempotency.yaml`.

use std::time::Duration;

use idem_core::InFlightMode;
use serde_json::{Value, json};

use crate::config::KeyRequirement;
use crate::layer::IdempotencyLayer;
use idem_core::wire::ProblemCode;

/// The shipped YAML document (defaults).
pub const YAML: &str = include_str!("../openapi/idempotency.yaml");

/// ISO 8601 duration (`PT24H`, `P30D`, `PT1.5S`).
fn iso(d: Duration) -> String {
    let s = d.as_secs();
    if d.subsec_millis() == 0 && s >= 2 * 86_400 && s.is_multiple_of(86_400) {
        format!("P{}D", s / 86_400)
    } else if d.subsec_millis() == 0 && s > 0 && s.is_multiple_of(3600) {
        format!("PT{}H", s / 3600)
    } else if d.subsec_millis() == 0 {
        format!("PT{s}S")
    } else {
        format!("PT{}S", d.as_secs_f64())
    }
}

fn problem_ref() -> Value {
    json!({ "application/problem+json": { "schema": { "$ref": "#/components/schemas/IdempotencyProblem" } } })
}

/// The `components` object (parameters, headers, schemas, responses) plus
/// the `x-idempotency` policy object to put on each protected operation,
/// with this layer's key header, requirement, TTLs, in-flight mode and
/// replay header.
///
/// # Examples
///
/// ```
/// use idem_core::{Idem, MemoryStore};
/// use idem_http::{FixedOwner, IdempotencyLayer};
///
/// let layer = IdempotencyLayer::builder(Idem::new(MemoryStore::new()))
///     .owner(FixedOwner::new("internal"))
///     .build()
///     .unwrap();
/// let doc = idem_http::openapi::components(&layer);
/// assert_eq!(doc["x-idempotency"]["response-ttl"], "PT24H");
/// assert_eq!(doc["components"]["parameters"]["IdempotencyKey"]["required"], true);
/// ```
#[must_use]
pub fn components<S: idem_core::store::Store, O>(layer: &IdempotencyLayer<S, O>) -> Value {
    let cfg = &layer.shared.cfg;
    let policy = layer.shared.idem.policy();
    let header = cfg.key_header.as_str();
    let replayed = cfg
        .replayed_headers
        .first()
        .map_or("Idempotent-Replayed", |h| h.as_str());
    let codes: Vec<&str> = ProblemCode::ALL.iter().map(|c| c.as_str()).collect();
    let in_flight = match policy.in_flight() {
        InFlightMode::Wait { timeout, .. } => format!("wait {}", iso(timeout)),
        _ => "reject".to_owned(),
    };
    json!({
        "x-idempotency": {
            "header": header,
            "response-ttl": iso(policy.response_ttl()),
            "key-ttl": iso(policy.key_ttl()),
            "in-flight": in_flight,
            "replayed-header": replayed,
            "max-request-body": cfg.max_request_body,
        },
        "components": {
            "parameters": {
                "IdempotencyKey": {
                    "name": header,
                    "in": "header",
                    "required": cfg.key == KeyRequirement::Required,
                    "description": format!(
                        "Client-generated key, one per intent, reused on every retry of that intent. \
                         An RFC 8941 sf-string (the bare form is also accepted and names the same key); \
                         1 to 255 printable ASCII characters; one field line; no lists. Scoped to the \
                         authenticated caller and the operation. A replay is returned for {}; the key \
                         is remembered for {}.",
                        iso(policy.response_ttl()),
                        iso(policy.key_ttl())
                    ),
                    "schema": { "type": "string", "minLength": 1, "maxLength": 300 },
                }
            },
            "headers": {
                "IdempotentReplayed": {
                    "description": "Present, with value `true`, only on a replayed response.",
                    "schema": { "type": "string", "enum": ["true"] },
                },
                "RetryAfter": {
                    "description": "Whole seconds to wait before retrying the same request (at least 1).",
                    "schema": { "type": "integer", "minimum": 1 },
                },
            },
            "schemas": {
                "IdempotencyProblem": {
                    "type": "object",
                    "description": "RFC 9457 problem details for idempotency rejections.",
                    "required": ["type", "title", "status", "code", "retryable", "instance"],
                    "properties": {
                        "type": { "type": "string", "format": "uri-reference" },
                        "title": { "type": "string" },
                        "status": { "type": "integer" },
                        "detail": { "type": "string" },
                        "instance": { "type": "string", "pattern": "^urn:uuid:" },
                        "code": { "type": "string", "enum": codes },
                        "retryable": { "type": "boolean" },
                        "idempotency_key": { "type": "string" },
                        "resource_id": { "type": "string" },
                        "retry_after": { "type": "integer", "minimum": 1 },
                        "limit": { "type": "integer" },
                    },
                }
            },
            "responses": {
                "IdempotencyBadRequest": { "description": "Idempotency-Key missing or invalid, the request body unreadable, or a JSON body naming a member twice (invalid_request).", "content": problem_ref() },
                "IdempotencyKeyReused": { "description": "The key was already used with a different request.", "content": problem_ref() },
                "IdempotencyConflict": {
                    "description": "in_flight, lease_lost (retry after Retry-After), response_expired or response_not_stored (done; see resource_id).",
                    "headers": { "Retry-After": { "$ref": "#/components/headers/RetryAfter" } },
                    "content": problem_ref(),
                },
                "IdempotencyPayloadTooLarge": { "description": format!("Request body over {} bytes.", cfg.max_request_body), "content": problem_ref() },
                "IdempotencyUriTooLong": { "description": "The method and path are too long to name the operation (path_too_long).", "content": problem_ref() },
                "IdempotencyUnavailable": {
                    "description": "Idempotency store unavailable or server shutting down; nothing was executed.",
                    "headers": { "Retry-After": { "$ref": "#/components/headers/RetryAfter" } },
                    "content": problem_ref(),
                },
                "IdempotencyServerError": { "description": "owner_unavailable, operation_unavailable, corrupt_record, store_error, handler_panicked or response_body_failed.", "content": problem_ref() },
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_durations() {
        assert_eq!(iso(Duration::from_secs(86_400 * 30)), "P30D");
        assert_eq!(iso(Duration::from_secs(86_400)), "PT24H");
        assert_eq!(iso(Duration::from_secs(7200)), "PT2H");
        assert_eq!(iso(Duration::from_secs(90)), "PT90S");
        assert_eq!(iso(Duration::from_millis(1500)), "PT1.5S");
    }

    /// Keeps the shipped YAML in sync with the codes the layer can answer.
    #[test]
    fn every_code_is_in_the_yaml_enum() {
        let start = YAML
            .find("enum: [missing_key")
            .expect("code enum in the YAML");
        let end = start + YAML[start..].find(']').expect("end of the enum");
        let listed: Vec<&str> = YAML[start + "enum: [".len()..end]
            .split(',')
            .map(str::trim)
            .collect();
        let mut want: Vec<&str> = ProblemCode::ALL.iter().map(|c| c.as_str()).collect();
        let mut got = listed.clone();
        want.sort_unstable();
        got.sort_unstable();
        assert_eq!(got, want);
    }
}
