//! Step 6 of a covered request: the fingerprint envelope (version 1), what
//! makes two HTTP requests "the same request", as JSON arrays and strings so
//! the framing is injective.

use idem_core::adapter::{fingerprint, sha256_hex};
use idem_core::error::RequestError;
use idem_core::store::Fingerprint;
use idem_core::{FieldFilter, RawJson};
use serde_json::{Value, json};

/// How the body enters the fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum BodyFingerprint {
    /// JSON as canonical JSON, forms as sorted pairs, anything else hashed
    /// (the default).
    #[default]
    Auto,
    /// Always the SHA-256 of the bytes.
    Raw,
    /// The body does not count (upload routes): then the client alone
    /// guarantees that the same key means the same request. The layer does
    /// not buffer the body at all.
    Ignore,
}

/// Which path enters the fingerprint. Like the operation's source, it is
/// your choice by name and never follows a cargo feature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PathSource {
    /// The path of the request's URI as the layer receives it (the default,
    /// in every build). Inside axum's `Router::nest` it has lost the prefix.
    #[default]
    Uri,
    /// axum's `OriginalUri`: the path as the client sent it, nesting prefix
    /// included (feature `axum`). Outside axum's router, where there is no
    /// `OriginalUri`, the request's URI is the original and counts instead.
    #[cfg(feature = "axum")]
    OriginalUri,
}

/// What counts in "the same request". Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FingerprintSpec {
    body: BodyFingerprint,
    filter: FieldFilter,
    headers: Vec<String>,
    query: bool,
    path: PathSource,
}

impl Default for FingerprintSpec {
    fn default() -> Self {
        Self {
            body: BodyFingerprint::Auto,
            filter: FieldFilter::All,
            headers: Vec::new(),
            query: true,
            path: PathSource::Uri,
        }
    }
}

impl FingerprintSpec {
    setters! {
        /// How the body counts (default [`BodyFingerprint::Auto`]).
        pub fn body(b: BodyFingerprint) => body;
    }

    /// JSON pointers (relative to a JSON body's root) that do not count,
    /// e.g. `/client_ts`.
    #[must_use]
    pub fn ignore_fields<I: IntoIterator<Item = impl Into<String>>>(mut self, ptrs: I) -> Self {
        self.filter =
            FieldFilter::ignore(ptrs.into_iter().map(|p| format!("/body/json{}", p.into())));
        self
    }

    /// Only these JSON pointers of a JSON body count (method, route, path,
    /// query, headers and non-JSON bodies always count).
    #[must_use]
    pub fn only_fields<I: IntoIterator<Item = impl Into<String>>>(mut self, ptrs: I) -> Self {
        let fixed = [
            "/v",
            "/method",
            "/route",
            "/path",
            "/query",
            "/headers",
            "/body/raw",
            "/body/type",
            "/body/form",
        ];
        let ptrs = fixed
            .iter()
            .map(|p| (*p).to_owned())
            .chain(ptrs.into_iter().map(|p| format!("/body/json{}", p.into())));
        self.filter = FieldFilter::only(ptrs);
        self
    }

    /// Request headers that count (names, case-insensitive; none by default).
    #[must_use]
    pub fn include_headers<I: IntoIterator<Item = impl AsRef<str>>>(mut self, names: I) -> Self {
        self.headers = names
            .into_iter()
            .map(|n| n.as_ref().to_ascii_lowercase())
            .collect();
        self
    }

    setters! {
        /// Whether the query string counts (default `true`).
        pub fn include_query(on: bool) => query;

        /// Which path counts (default [`PathSource::Uri`]).
        pub fn path(p: PathSource) => path;
    }

    /// The body mode.
    #[must_use]
    pub(crate) fn body_mode(&self) -> BodyFingerprint {
        self.body
    }

    /// The included header names, lowercase.
    #[must_use]
    pub(crate) fn header_names(&self) -> &[String] {
        &self.headers
    }

    /// Which path counts.
    #[must_use]
    pub(crate) fn path_source(&self) -> PathSource {
        self.path
    }
}

/// The pieces of a request the envelope is built from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RequestView<'a> {
    /// The method, e.g. `POST`.
    pub(crate) method: &'a str,
    /// The route the operation source named, e.g. `/accounts/{id}/charges`
    /// (the path under `OperationSource::Path`).
    pub(crate) route: &'a str,
    /// The path the spec's [`PathSource`] chose.
    pub(crate) path: &'a str,
    /// The raw query string (without `?`), if any.
    pub(crate) query: Option<&'a str>,
    /// Every field line of the request, names lowercase.
    pub(crate) headers: &'a [(&'a str, &'a [u8])],
    /// The `Content-Type` value, if any.
    pub(crate) content_type: Option<&'a [u8]>,
    /// The body bytes (empty under [`BodyFingerprint::Ignore`]).
    pub(crate) body: &'a [u8],
}

/// The version-1 envelope of `req` under `spec` (before field filters).
///
/// # Errors
///
/// [`RequestError::DuplicateMember`] when a JSON body names an object member
/// twice: `{"amount":1,"amount":1000}` is not one request (serde_json would
/// keep the last value), so it is refused rather than fingerprinted.
fn envelope(req: &RequestView<'_>, spec: &FingerprintSpec) -> Result<Value, RequestError> {
    let query = if spec.query {
        Value::Array(sorted_pairs(req.query.unwrap_or("").as_bytes()).unwrap_or_default())
    } else {
        Value::Array(Vec::new())
    };
    let headers: Vec<Value> = req
        .headers
        .iter()
        .filter(|(n, _)| spec.headers.iter().any(|h| h.eq_ignore_ascii_case(n)))
        .map(|(n, v)| json!([n.to_ascii_lowercase(), text_or_hex(v)]))
        .collect();
    let body = match spec.body {
        BodyFingerprint::Ignore => None,
        BodyFingerprint::Raw if req.body.is_empty() => Some(Value::Null),
        BodyFingerprint::Raw => Some(raw(req)),
        BodyFingerprint::Auto => Some(auto_body(req)?),
    };
    let mut env = json!({
        "v": 1,
        "method": req.method,
        "route": req.route,
        "path": req.path,
        "query": query,
        "headers": headers,
    });
    if let (Some(body), Value::Object(map)) = (body, &mut env) {
        map.insert("body".to_owned(), body);
    }
    Ok(env)
}

/// The fingerprint of `req` for `operation` under `spec`: core's
/// `fingerprint` over the envelope. A JSON body that nests too deep for core
/// counts as its raw bytes instead.
///
/// # Errors
///
/// [`RequestError::DuplicateMember`] for a JSON body that names an object
/// member twice (core's strict [`RawJson`] parse); otherwise [`RequestError`]
/// only if a field filter pointer is malformed.
pub(crate) fn fingerprint_request(
    operation: &str,
    req: &RequestView<'_>,
    spec: &FingerprintSpec,
) -> Result<Fingerprint, RequestError> {
    let mut env = envelope(req, spec)?;
    match fingerprint(operation, &env, &spec.filter) {
        Err(RequestError::TooDeep) => {
            env["body"] = raw(req);
            fingerprint(operation, &env, &spec.filter)
        }
        other => other,
    }
}

fn essence(content_type: Option<&[u8]>) -> String {
    let ct = content_type.unwrap_or_default();
    let end = ct.iter().position(|&b| b == b';').unwrap_or(ct.len());
    String::from_utf8_lossy(&ct[..end])
        .trim()
        .to_ascii_lowercase()
}

fn raw(req: &RequestView<'_>) -> Value {
    json!({"raw": sha256_hex(req.body), "type": essence(req.content_type)})
}

fn auto_body(req: &RequestView<'_>) -> Result<Value, RequestError> {
    if req.body.is_empty() {
        return Ok(Value::Null);
    }
    let ty = essence(req.content_type);
    let is_json =
        ty == "application/json" || (ty.starts_with("application/") && ty.ends_with("+json"));
    if is_json {
        // Core's strict parse: the same values serde_json makes, but a
        // duplicate member name is refused instead of "last one wins".
        // Invalid or too-deep JSON still counts as its raw bytes.
        match RawJson(req.body).parse() {
            Ok(v) => return Ok(json!({ "json": v })),
            Err(RequestError::DuplicateMember) => return Err(RequestError::DuplicateMember),
            Err(_) => {}
        }
    } else if ty == "application/x-www-form-urlencoded"
        && let Some(pairs) = sorted_pairs(req.body)
    {
        return Ok(json!({ "form": pairs }));
    }
    Ok(raw(req))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

fn text_or_hex(v: &[u8]) -> Value {
    match std::str::from_utf8(v) {
        Ok(s) => Value::String(s.to_owned()),
        Err(_) => json!({ "hex": hex(v) }),
    }
}

/// `application/x-www-form-urlencoded` pairs, sorted by name (stable for
/// equal names). A pair whose decoded bytes are not UTF-8 stays raw; `None`
/// if the input itself is not UTF-8.
fn sorted_pairs(input: &[u8]) -> Option<Vec<Value>> {
    let text = std::str::from_utf8(input).ok()?;
    let mut pairs: Vec<(String, Value)> = text
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            match (decode(k), decode(v)) {
                (Some(dk), Some(dv)) => (dk.clone(), json!([dk, dv])),
                // Kept raw, as an object, so it never equals a decoded pair.
                _ => (k.to_owned(), json!({ "raw": [k, v] })),
            }
        })
        .collect();
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    Some(pairs.into_iter().map(|(_, v)| v).collect())
}

/// Percent-decoding with `+` as space; `None` if the result is not UTF-8.
///
/// Not `form_urlencoded::parse`: it decodes lossily, so `a=%FF` and `a=%FE`
/// would both become `a=\u{FFFD}` and two different requests would share a
/// fingerprint. Here such a pair stays raw (`query_framing_does_not_collide`).
fn decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match (hexval(b[i + 1]), hexval(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

fn hexval(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fp(
        method: &str,
        path: &str,
        query: Option<&str>,
        headers: &[(&str, &[u8])],
        ct: &str,
        body: &[u8],
    ) -> Fingerprint {
        let spec = FingerprintSpec::default().include_headers(["x-h"]);
        let view = RequestView {
            method,
            route: "/r/{id}",
            path,
            query,
            headers,
            content_type: Some(ct.as_bytes()),
            body,
        };
        fingerprint_request("POST /r/{id}", &view, &spec).expect("fingerprint")
    }

    #[test]
    fn query_framing_does_not_collide() {
        let a = fp("POST", "/r/1", Some("a=&a=b&c="), &[], "text/plain", b"");
        let b = fp("POST", "/r/1", Some("a=&b=c&b="), &[], "text/plain", b"");
        assert_ne!(a, b);
        assert_eq!(
            fp("POST", "/r/1", None, &[], "text/plain", b""),
            fp("POST", "/r/1", Some(""), &[], "text/plain", b"")
        );
        assert_eq!(
            fp("POST", "/r/1", Some("a=%20x"), &[], "text/plain", b""),
            fp("POST", "/r/1", Some("a=+x"), &[], "text/plain", b"")
        );
        assert_ne!(
            fp("POST", "/r/1", Some("a=%FF"), &[], "text/plain", b""),
            fp("POST", "/r/1", Some("a=%FE"), &[], "text/plain", b"")
        );
    }

    #[test]
    fn json_spelling_and_ignored_fields_do_not_count() {
        let spec = FingerprintSpec::default().ignore_fields(["/ts"]);
        let view = |body: &'static [u8]| RequestView {
            method: "POST",
            route: "/r",
            path: "/r",
            query: None,
            headers: &[],
            content_type: Some(b"application/merge-patch+json; charset=utf-8"),
            body,
        };
        let a = fingerprint_request("op", &view(br#"{"a":1,"b":[1,2],"ts":1}"#), &spec).unwrap();
        let b = fingerprint_request("op", &view(br#"{ "b":[1.0,2], "ts":9, "a":1e0 }"#), &spec)
            .unwrap();
        let c = fingerprint_request("op", &view(br#"{"a":2,"b":[1,2]}"#), &spec).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        let only = FingerprintSpec::default().only_fields(["/a"]);
        let a = fingerprint_request("op", &view(br#"{"a":1,"b":1}"#), &only).unwrap();
        let b = fingerprint_request("op", &view(br#"{"a":1,"b":2}"#), &only).unwrap();
        assert_eq!(a, b);
        // A too-deep JSON body still fingerprints, as raw bytes.
        let deep: &'static [u8] = Box::leak(
            format!("{}{}", "[".repeat(120), "]".repeat(120))
                .into_bytes()
                .into_boxed_slice(),
        );
        assert!(fingerprint_request("op", &view(deep), &spec).is_ok());
    }

    #[test]
    fn duplicate_json_members_are_refused() {
        let view = |ct: &'static [u8], body: &'static [u8]| RequestView {
            method: "POST",
            route: "/r",
            path: "/r",
            query: None,
            headers: &[],
            content_type: Some(ct),
            body,
        };
        let spec = FingerprintSpec::default();
        for body in [
            &br#"{"amount":1,"amount":1000}"#[..],
            br#"[{"a":{"b":1,"b":1}}]"#,
        ] {
            assert!(matches!(
                fingerprint_request("op", &view(b"application/json", body), &spec),
                Err(RequestError::DuplicateMember)
            ));
        }
        // Not JSON by its media type, or not JSON at all: raw bytes, as before.
        let dup = br#"{"a":1,"a":2}"#;
        assert!(fingerprint_request("op", &view(b"text/plain", dup), &spec).is_ok());
        assert!(fingerprint_request("op", &view(b"application/json", b"{nope"), &spec).is_ok());
        // Raw and Ignore never parse the body.
        for mode in [BodyFingerprint::Raw, BodyFingerprint::Ignore] {
            let spec = FingerprintSpec::default().body(mode);
            assert!(fingerprint_request("op", &view(b"application/json", dup), &spec).is_ok());
        }
    }

    proptest! {
        #[test]
        fn any_single_change_changes_the_fingerprint(
            path in "/[a-z0-9]{1,8}",
            pairs in proptest::collection::vec(("[a-z]{1,4}", "[a-z0-9]{0,4}"), 0..5),
            header in "[ -~]{0,12}",
            body in proptest::collection::vec(any::<u8>(), 0..64),
            flip in any::<usize>(),
        ) {
            let query: String = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&");
            let h: &[(&str, &[u8])] = &[("x-h", header.as_bytes())];
            let base = fp("POST", &path, Some(&query), h, "application/octet-stream", &body);
            prop_assert_ne!(base, fp("PATCH", &path, Some(&query), h, "application/octet-stream", &body));
            prop_assert_ne!(base, fp("POST", &format!("{path}x"), Some(&query), h, "application/octet-stream", &body));
            prop_assert_ne!(base, fp("POST", &path, Some(&format!("{query}&zz=1")), h, "application/octet-stream", &body));
            let h2: &[(&str, &[u8])] = &[("x-h", b"\x01other")];
            prop_assert_ne!(base, fp("POST", &path, Some(&query), h2, "application/octet-stream", &body));
            if !body.is_empty() {
                let mut changed = body.clone();
                let i = flip % changed.len();
                changed[i] ^= 1;
                prop_assert_ne!(base, fp("POST", &path, Some(&query), h, "application/octet-stream", &changed));
            }
        }

        #[test]
        fn permuting_distinct_query_names_does_not(
            names in proptest::collection::btree_set("[a-z]{1,4}", 1..6),
            seed in any::<u64>(),
        ) {
            let pairs: Vec<String> = names.iter().enumerate().map(|(i, n)| format!("{n}={i}")).collect();
            let mut shuffled = pairs.clone();
            let len = shuffled.len();
            shuffled.rotate_left((seed as usize) % len);
            let a = fp("POST", "/p", Some(&pairs.join("&")), &[], "text/plain", b"x");
            let b = fp("POST", "/p", Some(&shuffled.join("&")), &[], "text/plain", b"x");
            prop_assert_eq!(a, b);
        }
    }
}
