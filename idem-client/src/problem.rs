//! RFC 9457 problem details, as `idem-http` (and any server) sends them.

use idem_core::wire::ProblemCode;
use serde_json::{Map, Value};

/// The most of a problem body the client reads; a longer body is not a problem
/// it understands, and the response goes back untouched.
pub const MAX_PROBLEM_BYTES: usize = 64 * 1024;

/// An RFC 9457 problem body. Members this crate does not name are kept in
/// [`extra`](Self::extra).
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Problem {
    /// `type`: a URI naming the problem type.
    pub type_: Option<String>,
    /// `title`: a short summary.
    pub title: Option<String>,
    /// `status`: the HTTP status the server meant.
    pub status: Option<u16>,
    /// `detail`: an explanation of this occurrence.
    pub detail: Option<String>,
    /// `code`: the machine-readable reason as sent (`in_flight`,
    /// `fingerprint_mismatch`, ..., or another server's own);
    /// [`Problem::problem_code`] reads it as idem's vocabulary.
    pub code: Option<String>,
    /// `retryable`: whether the same request may be sent again. Authoritative when present.
    pub retryable: Option<bool>,
    /// `resource_id`: what the earlier run created, when the server knows it.
    pub resource_id: Option<String>,
    /// `retry_after`: seconds, when the server repeats `Retry-After` in the body.
    pub retry_after: Option<u64>,
    /// `instance`: a URI naming this occurrence.
    pub instance: Option<String>,
    /// Every other member.
    pub extra: Map<String, Value>,
}

impl Problem {
    /// Reads a problem body. `None` when it is over [`MAX_PROBLEM_BYTES`],
    /// not JSON, or not an object: such a body is not a problem.
    #[must_use]
    pub fn from_slice(body: &[u8]) -> Option<Self> {
        if body.len() > MAX_PROBLEM_BYTES {
            return None;
        }
        let Value::Object(mut map) = serde_json::from_slice::<Value>(body).ok()? else {
            return None;
        };
        let mut string = |name: &str| match map.remove(name) {
            Some(Value::String(s)) => Some(s),
            Some(other) => {
                map.insert(name.to_owned(), other);
                None
            }
            None => None,
        };
        let type_ = string("type");
        let title = string("title");
        let detail = string("detail");
        let code = string("code");
        let resource_id = string("resource_id");
        let instance = string("instance");
        let status = map
            .get("status")
            .and_then(Value::as_u64)
            .and_then(|s| u16::try_from(s).ok());
        if status.is_some() {
            map.remove("status");
        }
        let retryable = map.get("retryable").and_then(Value::as_bool);
        if retryable.is_some() {
            map.remove("retryable");
        }
        let retry_after = map.get("retry_after").and_then(Value::as_u64);
        if retry_after.is_some() {
            map.remove("retry_after");
        }
        Some(Self {
            type_,
            title,
            status,
            detail,
            code,
            retryable,
            resource_id,
            retry_after,
            instance,
            extra: map,
        })
    }

    /// The `code` as one of idem's [`ProblemCode`]s; `None` without a code
    /// or for a code idem does not name (another server's own, still in
    /// [`code`](Self::code)).
    #[must_use]
    pub fn problem_code(&self) -> Option<ProblemCode> {
        self.code.as_deref().and_then(ProblemCode::parse)
    }

    /// Whether a `Content-Type` names a problem body (`application/problem+json`).
    #[must_use]
    pub fn is_problem_content_type(value: &str) -> bool {
        value
            .split(';')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/problem+json"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_idem_http_problem_and_keeps_unknown_members() {
        let p = Problem::from_slice(
            br#"{"type":"about:blank","title":"t","status":409,"code":"in_flight","retryable":true,"resource_id":"ord_1","vendor":1}"#,
        )
        .expect("a problem");
        assert_eq!(p.code.as_deref(), Some("in_flight"));
        assert_eq!(p.problem_code(), Some(ProblemCode::InFlight));
        assert_eq!(p.retryable, Some(true));
        assert_eq!(p.status, Some(409));
        assert_eq!(p.resource_id.as_deref(), Some("ord_1"));
        assert_eq!(p.extra.get("vendor"), Some(&Value::from(1)));
    }

    #[test]
    fn another_servers_code_stays_as_sent() {
        let p = Problem::from_slice(br#"{"code":"idempotency_key_in_use","status":409}"#)
            .expect("a problem");
        assert_eq!(p.code.as_deref(), Some("idempotency_key_in_use"));
        assert_eq!(p.problem_code(), None);
        assert_eq!(Problem::default().problem_code(), None);
    }

    #[test]
    fn not_a_problem() {
        assert!(Problem::from_slice(b"[1]").is_none());
        assert!(Problem::from_slice(b"nope").is_none());
        assert!(Problem::from_slice(&vec![b' '; MAX_PROBLEM_BYTES + 1]).is_none());
        assert!(Problem::is_problem_content_type(
            "application/problem+json; charset=utf-8"
        ));
        assert!(!Problem::is_problem_content_type("application/json"));
    }
}
