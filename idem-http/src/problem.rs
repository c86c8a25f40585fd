//! RFC 9457 problem documents for every answer the layer gives on its own
//! (the README's "Problems"): the `type` URIs of the codes (one closed set,
//! [`ProblemCode`], idem-core's wire vocabulary), and the rendering to
//! `(status, headers, bytes)`.

use std::fmt;
use std::sync::Arc;

use idem_core::wire::{self, ProblemCode, header};

/// The draft every key rule comes from.
pub(crate) const DRAFT: &str =
    "https://datatracker.ietf.org/doc/html/draft-ietf-httpapi-idempotency-key-header-07";

/// How problem `type` URIs are formed.
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum ProblemTypes {
    /// The draft's section anchors for `missing_key`/`invalid_key` (§2.1),
    /// `fingerprint_mismatch` (§2.2) and `in_flight` (§2.6);
    /// `urn:idem:problem:<code>` for the others (the default).
    #[default]
    Draft,
    /// `base + code` for every code (your own docs).
    Base(String),
    /// Your own mapping from code to URI.
    Custom(Arc<dyn Fn(ProblemCode) -> String + Send + Sync>),
}

impl fmt::Debug for ProblemTypes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Draft => f.write_str("Draft"),
            Self::Base(b) => f.debug_tuple("Base").field(b).finish(),
            Self::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

impl ProblemTypes {
    /// The `type` of `code`.
    #[must_use]
    pub fn uri(&self, code: ProblemCode) -> String {
        match self {
            Self::Draft => match code {
                ProblemCode::MissingKey | ProblemCode::InvalidKey => {
                    format!("{DRAFT}#section-2.1")
                }
                ProblemCode::FingerprintMismatch => format!("{DRAFT}#section-2.2"),
                ProblemCode::InFlight => format!("{DRAFT}#section-2.6"),
                other => format!("urn:idem:problem:{other}"),
            },
            Self::Base(base) => format!("{base}{code}"),
            Self::Custom(f) => f(code),
        }
    }
}

/// One problem, before rendering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    /// The stable code.
    pub(crate) code: ProblemCode,
    /// The HTTP status.
    pub(crate) status: u16,
    /// A human sentence.
    pub(crate) detail: String,
    /// Whether the same request may succeed later, unchanged.
    pub(crate) retryable: bool,
    /// Whole seconds for `Retry-After` (≥ 1), when sent.
    pub(crate) retry_after: Option<u64>,
    /// The received key (after unquoting; lossy UTF-8; at most 300 bytes).
    pub(crate) idempotency_key: Option<String>,
    /// The resource the first attempt created.
    pub(crate) resource_id: Option<String>,
    /// The body limit (`request_too_large`).
    pub(crate) limit: Option<usize>,
}

/// A rendered problem: status, headers, body bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rendered {
    /// The status.
    pub(crate) status: u16,
    /// The headers, in order.
    pub(crate) headers: Vec<(&'static str, String)>,
    /// The `application/problem+json` body.
    pub(crate) body: Vec<u8>,
    /// The `instance` (`urn:uuid:<v4>`), for logs.
    pub(crate) instance: String,
}

impl Problem {
    /// Renders the problem: `Content-Type: application/problem+json`,
    /// `Cache-Control: no-store`, `Content-Language: en`, `Retry-After` when
    /// retryable, `Link rel="describedby"` when `docs_url` is set.
    #[must_use]
    pub(crate) fn render(&self, types: &ProblemTypes, docs_url: Option<&str>) -> Rendered {
        let instance = format!("urn:uuid:{}", uuid_v4());
        let mut body = wire::Problem::default();
        body.type_ = Some(types.uri(self.code));
        body.title = Some(self.code.title().to_owned());
        body.status = Some(self.status);
        body.detail = Some(self.detail.clone());
        body.instance = Some(instance.clone());
        body.code = Some(self.code.as_str().to_owned());
        body.retryable = Some(self.retryable);
        body.idempotency_key = self
            .idempotency_key
            .as_deref()
            .map(|k| truncate(k, 300).to_owned());
        body.resource_id.clone_from(&self.resource_id);
        body.retry_after = self.retry_after.map(|s| s.max(1));
        body.limit = self.limit.map(|l| u64::try_from(l).unwrap_or(u64::MAX));
        let mut headers = vec![
            ("content-type", wire::Problem::CONTENT_TYPE.to_owned()),
            ("cache-control", "no-store".to_owned()),
            ("content-language", "en".to_owned()),
        ];
        if let Some(s) = self.retry_after {
            headers.push((header::RETRY_AFTER, s.max(1).to_string()));
        }
        if let Some(url) = docs_url {
            headers.push((
                "link",
                format!("<{url}>; rel=\"describedby\"; type=\"text/html\""),
            ));
        }
        Rendered {
            status: self.status,
            headers,
            body: body.to_json().to_string().into_bytes(),
            instance,
        }
    }
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A random (version 4) UUID from the operating system's generator.
fn uuid_v4() -> String {
    let mut b = [0u8; 16];
    if getrandom::fill(&mut b).is_err() {
        // No entropy source: still unique enough for a support reference.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        b = t.to_be_bytes();
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_is_v4() {
        for _ in 0..100 {
            let u = uuid_v4();
            let b = u.as_bytes();
            assert_eq!(u.len(), 36);
            assert_eq!(b[14], b'4');
            assert!(matches!(b[19], b'8' | b'9' | b'a' | b'b'));
        }
    }

    #[test]
    fn truncates_on_char_boundary() {
        assert_eq!(truncate("ab", 300), "ab");
        assert_eq!(truncate("aé", 2), "a");
    }

    #[test]
    fn draft_types_name_the_draft_sections() {
        assert_eq!(
            ProblemTypes::Draft.uri(ProblemCode::InFlight),
            format!("{DRAFT}#section-2.6")
        );
        assert_eq!(
            ProblemTypes::Draft.uri(ProblemCode::LeaseLost),
            "urn:idem:problem:lease_lost"
        );
    }
}
