//! Step 9 of a covered request: how the handler's response is classified
//! and which of its headers are stored and replayed (the README's
//! "remembered outcomes" and "stored headers").

/// Never stored, never replayed: hop-by-hop fields, `Content-Length`
/// (recomputed from the stored body) and `Date` (the server sets a fresh one).
pub(crate) const NEVER_STORED: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "content-length",
    "date",
];

/// Not stored by default: a replay must not hand the first attempt's session
/// cookie or trace ids to another caller.
pub(crate) const DEFAULT_DENY: &[&str] = &[
    "set-cookie",
    "server-timing",
    "x-request-id",
    "request-id",
    "traceparent",
    "tracestate",
    "age",
];

/// Which of the other response headers are stored.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderPolicy {
    /// Everything but these names (lowercase).
    DenyList(Vec<String>),
    /// Only these names (lowercase).
    AllowList(Vec<String>),
}

/// The default: a deny list of `set-cookie`, `server-timing`,
/// `x-request-id`, `request-id`, `traceparent`, `tracestate` and `age` (a
/// replay must not hand the first attempt's session cookie or trace ids to
/// another caller). Hop-by-hop fields, `Content-Length` and `Date` are never
/// stored, whatever the policy.
impl Default for HeaderPolicy {
    fn default() -> Self {
        Self::DenyList(DEFAULT_DENY.iter().map(|s| (*s).to_owned()).collect())
    }
}

impl HeaderPolicy {
    /// A deny list (names are lowercased).
    pub fn deny<I: IntoIterator<Item = impl AsRef<str>>>(names: I) -> Self {
        Self::DenyList(lower(names))
    }

    /// An allow list (names are lowercased).
    pub fn allow<I: IntoIterator<Item = impl AsRef<str>>>(names: I) -> Self {
        Self::AllowList(lower(names))
    }

    fn admits(&self, name: &str) -> bool {
        match self {
            Self::DenyList(d) => !d.iter().any(|n| n == name),
            Self::AllowList(a) => a.iter().any(|n| n == name),
        }
    }
}

fn lower<I: IntoIterator<Item = impl AsRef<str>>>(names: I) -> Vec<String> {
    names
        .into_iter()
        .map(|n| n.as_ref().to_ascii_lowercase())
        .collect()
}

/// The headers to store, in order, names lowercase, values as bytes;
/// repeated names kept. `replay_names` (the replay marker and its aliases)
/// are never stored.
#[must_use]
pub(crate) fn stored_headers(
    headers: &[(&str, &[u8])],
    policy: &HeaderPolicy,
    replay_names: &[&str],
) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::with_capacity(headers.len());
    for (name, value) in headers {
        let name = name.to_ascii_lowercase();
        if NEVER_STORED.contains(&name.as_str())
            || replay_names.iter().any(|r| r.eq_ignore_ascii_case(&name))
            || !policy.admits(&name)
        {
            continue;
        }
        out.push((name, value.to_vec()));
    }
    out
}

/// How a handler's response is remembered. Set it as a response extension to
/// override the layer's classifier for one response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Class {
    /// Stored and replayed.
    Success,
    /// A permanent failure: stored and replayed.
    Failure,
    /// Not stored: the key is released and the same request may run again
    /// (as a recovery).
    Transient,
    /// Completed without a body (a response that must not sit in a store,
    /// such as a newly created secret): retries get 409
    /// `response_not_stored`.
    CompleteWithoutBody,
}

impl Class {
    /// The layer's default classification of a status: 1xx/2xx/3xx
    /// success; 401, 403, 407, 408, 425, 429 and 5xx transient; other 4xx
    /// failure. A classifier of your own
    /// ([`IdempotencyLayerBuilder::classify`](crate::IdempotencyLayerBuilder::classify)) can fall back to it.
    #[must_use]
    pub fn of_status(status: http::StatusCode) -> Self {
        default_class(status.as_u16())
    }
}

/// [`Class::of_status`] over a numeric status.
pub(crate) fn default_class(status: u16) -> Class {
    match status {
        401 | 403 | 407 | 408 | 425 | 429 | 500.. => Class::Transient,
        400..=499 => Class::Failure,
        _ => Class::Success,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifier_table() {
        for (s, c) in [
            (100, Class::Success),
            (200, Class::Success),
            (201, Class::Success),
            (302, Class::Success),
            (400, Class::Failure),
            (404, Class::Failure),
            (409, Class::Failure),
            (422, Class::Failure),
            (401, Class::Transient),
            (403, Class::Transient),
            (407, Class::Transient),
            (408, Class::Transient),
            (425, Class::Transient),
            (429, Class::Transient),
            (500, Class::Transient),
            (503, Class::Transient),
        ] {
            assert_eq!(default_class(s), c, "{s}");
        }
    }

    #[test]
    fn header_policy() {
        let h: &[(&str, &[u8])] = &[
            ("Connection", b"close"),
            ("Transfer-Encoding", b"chunked"),
            ("Content-Length", b"3"),
            ("Idempotent-Replayed", b"true"),
            ("X-Request-Id", b"r"),
            ("Vary", b"a"),
            ("vary", b"b"),
        ];
        let kept = stored_headers(h, &HeaderPolicy::default(), &["idempotent-replayed"]);
        assert_eq!(
            kept,
            vec![
                ("vary".into(), b"a".to_vec()),
                ("vary".into(), b"b".to_vec())
            ]
        );
        let allow = HeaderPolicy::allow(["Set-Cookie"]);
        let h: &[(&str, &[u8])] = &[("set-cookie", b"a=1"), ("vary", b"x")];
        assert_eq!(
            stored_headers(h, &allow, &[]),
            vec![("set-cookie".into(), b"a=1".to_vec())]
        );
        let h: &[(&str, &[u8])] = &[("x-bin", b"caf\xe9")];
        assert_eq!(
            stored_headers(h, &HeaderPolicy::default(), &[]),
            vec![("x-bin".into(), b"caf\xe9".to_vec())]
        );
    }
}
