//! Assertions on responses.

use reqwest::Response;
use serde_json::Value;

/// A response, read whole.
#[derive(Debug, Clone)]
pub struct Got {
    /// The status.
    pub status: u16,
    /// The headers.
    pub headers: reqwest::header::HeaderMap,
    /// The body bytes.
    pub body: Vec<u8>,
}

impl Got {
    /// Reads `res` whole.
    pub async fn read(res: Response) -> Self {
        let status = res.status().as_u16();
        let headers = res.headers().clone();
        let body = res.bytes().await.expect("response body").to_vec();
        Self {
            status,
            headers,
            body,
        }
    }

    /// Reads the answer of a spawned request (`tokio::spawn(r.send())`).
    pub async fn joined(task: tokio::task::JoinHandle<reqwest::Result<Response>>) -> Self {
        Self::read(task.await.expect("join").expect("response")).await
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Every value of a header, in order.
    pub fn all(&self, name: &str) -> Vec<String> {
        self.headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect()
    }

    /// Whether both replay markers are present (and `true`).
    pub fn is_replay(&self) -> bool {
        let a = self.header("idempotent-replayed") == Some("true");
        let b = self.header("x-idempotent-replayed") == Some("true");
        assert_eq!(a, b, "the marker and its alias go together");
        a
    }

    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("JSON body")
    }

    /// Asserts a fresh execution: `status`, no marker.
    pub fn assert_executed(&self, status: u16) {
        assert_eq!(
            self.status,
            status,
            "{}",
            String::from_utf8_lossy(&self.body)
        );
        assert!(!self.is_replay(), "a first execution carries no marker");
    }

    /// Asserts a replay of `first`: same status, same bytes, stored headers,
    /// marker, exact `Content-Length`, a fresh `Date` (not the stored
    /// response's [`STALE_DATE`](super::STALE_DATE)).
    pub fn assert_replay_of(&self, first: &Got) {
        assert_eq!(self.status, first.status);
        assert_eq!(self.body, first.body, "byte-exact replay");
        assert!(self.is_replay(), "a replay carries the marker");
        assert_eq!(
            self.header("content-length"),
            Some(first.body.len().to_string().as_str())
        );
        // The handler's own Date is a fixed old value: a replay carrying it
        // would be a replayed Date, not the server's fresh one.
        assert_eq!(
            first.header("date"),
            Some(super::app::STALE_DATE),
            "the first response carries the handler's Date"
        );
        let date = self.header("date").expect("a replay carries a Date");
        assert_ne!(
            date,
            super::app::STALE_DATE,
            "the replay's Date is the replay time, not the stored one"
        );
        assert!(date.ends_with(" GMT"), "an HTTP date: {date}");
        assert_eq!(
            self.all("link"),
            first.all("link"),
            "repeated headers in order"
        );
        assert_eq!(self.header("content-type"), first.header("content-type"));
        assert_eq!(self.header("x-execution"), first.header("x-execution"));
        assert!(
            self.header("set-cookie").is_none(),
            "no Set-Cookie on replay"
        );
    }

    /// Asserts the problem shape (the README's "Problems") and returns the body.
    pub fn assert_problem(&self, status: u16, code: &str, key: Option<&str>) -> Value {
        assert_eq!(
            self.status,
            status,
            "{}",
            String::from_utf8_lossy(&self.body)
        );
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json")
        );
        assert_eq!(self.header("cache-control"), Some("no-store"));
        assert!(!self.is_replay());
        let p = self.json();
        assert_eq!(p["code"], code, "{p}");
        assert_eq!(p["status"], status);
        for m in ["type", "title", "detail", "instance"] {
            assert!(p[m].is_string(), "member {m}: {p}");
        }
        let retryable = p["retryable"].as_bool().expect("retryable is a boolean");
        assert_eq!(retryable, self.header("retry-after").is_some(), "{p}");
        if let Some(ra) = self.header("retry-after") {
            let secs: u64 = ra.parse().expect("Retry-After in whole seconds");
            assert!(secs >= 1);
            assert_eq!(p["retry_after"], secs);
        }
        assert!(
            is_urn_uuid_v4(p["instance"].as_str().unwrap_or_default()),
            "{p}"
        );
        match key {
            Some(k) => assert_eq!(p["idempotency_key"], k, "{p}"),
            None => assert!(p.get("idempotency_key").is_none(), "{p}"),
        }
        p
    }
}

/// Sends `r` and reads the answer whole.
pub(super) async fn send(r: reqwest::RequestBuilder) -> Got {
    Got::read(r.send().await.expect("request sent")).await
}

/// Sends `r` and asserts that it ran (`status`, no marker).
pub(super) async fn executed(r: reqwest::RequestBuilder, status: u16) -> Got {
    let g = send(r).await;
    g.assert_executed(status);
    g
}

/// A fresh random key, as text.
pub(super) fn key() -> String {
    idem_core::IdempotencyKey::random().as_str().to_owned()
}

/// Asserts that problem `p`'s `type` links to `section` of the draft
/// (`"#section-2.1"`).
pub(super) fn assert_section(p: &Value, section: &str) {
    assert!(
        p["type"].as_str().unwrap_or_default().ends_with(section),
        "{p}"
    );
}

/// `^urn:uuid:[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`
pub fn is_urn_uuid_v4(s: &str) -> bool {
    let Some(u) = s.strip_prefix("urn:uuid:") else {
        return false;
    };
    let b = u.as_bytes();
    let hex = |c: &u8| matches!(c, b'0'..=b'9' | b'a'..=b'f');
    b.len() == 36
        && [8, 13, 18, 23].iter().all(|&i| b[i] == b'-')
        && b.iter()
            .enumerate()
            .all(|(i, c)| [8, 13, 18, 23].contains(&i) || hex(c))
        && b[14] == b'4'
        && matches!(b[19], b'8' | b'9' | b'a' | b'b')
}
