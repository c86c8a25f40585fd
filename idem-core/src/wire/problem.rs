//! The problem document (RFC 9457 problem details): the one shape idem-http
//! writes an answer's body in and a client reads it back from.

use serde_json::{Map, Value};

use super::ProblemCode;

/// The most of a problem body a client reads; a longer body is not a problem
/// it understands, and the response goes back untouched.
pub const MAX_PROBLEM_BYTES: usize = 64 * 1024;

/// An RFC 9457 problem document, as idem-http (and any server) sends it:
/// written with [`Problem::to_json`], read with [`Problem::from_slice`].
/// Members this type does not name are kept in [`extra`](Self::extra).
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
    /// `idempotency_key`: the key the server received, when it echoes it.
    pub idempotency_key: Option<String>,
    /// `limit`: the limit a request broke (`request_too_large`'s body limit).
    pub limit: Option<u64>,
    /// `instance`: a URI naming this occurrence.
    pub instance: Option<String>,
    /// Every other member.
    pub extra: Map<String, Value>,
}

impl Problem {
    /// The media type of a problem document.
    pub const CONTENT_TYPE: &'static str = "application/problem+json";

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
        let idempotency_key = string("idempotency_key");
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
        let mut number = |name: &str| {
            let n = map.get(name).and_then(Value::as_u64);
            if n.is_some() {
                map.remove(name);
            }
            n
        };
        let retry_after = number("retry_after");
        let limit = number("limit");
        Some(Self {
            type_,
            title,
            status,
            detail,
            code,
            retryable,
            resource_id,
            retry_after,
            idempotency_key,
            limit,
            instance,
            extra: map,
        })
    }

    /// The document as JSON: every member that is set, then
    /// [`extra`](Self::extra).
    #[must_use]
    pub fn to_json(&self) -> Value {
        let mut body = Map::new();
        let mut put = |name: &str, value: Option<Value>| {
            if let Some(v) = value {
                body.insert(name.to_owned(), v);
            }
        };
        put("type", self.type_.clone().map(Value::from));
        put("title", self.title.clone().map(Value::from));
        put("status", self.status.map(Value::from));
        put("detail", self.detail.clone().map(Value::from));
        put("instance", self.instance.clone().map(Value::from));
        put("code", self.code.clone().map(Value::from));
        put("retryable", self.retryable.map(Value::from));
        put(
            "idempotency_key",
            self.idempotency_key.clone().map(Value::from),
        );
        put("resource_id", self.resource_id.clone().map(Value::from));
        put("retry_after", self.retry_after.map(Value::from));
        put("limit", self.limit.map(Value::from));
        for (name, value) in &self.extra {
            body.entry(name.clone()).or_insert_with(|| value.clone());
        }
        Value::Object(body)
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
            .is_some_and(|t| t.trim().eq_ignore_ascii_case(Self::CONTENT_TYPE))
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
    fn what_is_written_reads_back() {
        let p = Problem {
            type_: Some("urn:idem:problem:request_too_large".into()),
            title: Some("t".into()),
            status: Some(413),
            detail: Some("d".into()),
            code: Some("request_too_large".into()),
            retryable: Some(false),
            idempotency_key: Some("k".into()),
            limit: Some(10),
            instance: Some("urn:uuid:x".into()),
            extra: Map::from_iter([("vendor".to_owned(), Value::from(1))]),
            ..Problem::default()
        };
        let bytes = p.to_json().to_string();
        assert_eq!(Problem::from_slice(bytes.as_bytes()), Some(p));
        assert_eq!(Problem::default().to_json(), Value::Object(Map::new()));
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
