//! Framework-free HTTP mapping: what an adapter sends for a reply or an error.

use crate::codec::HttpResponse;
use crate::error::Error;
use crate::key::REPLAYED_HEADER;
use crate::outcome::{Outcome, Reply};

/// Whether a request with this method needs an idempotency key. GET, HEAD,
/// PUT, DELETE, OPTIONS and TRACE are idempotent already (RFC 9110 §9.2.2)
/// and pass through untouched unless a route opts in; POST, PATCH and any
/// other method do.
///
/// ```
/// assert!(idem_core::method_needs_key("POST"));
/// assert!(!idem_core::method_needs_key("put"));
/// ```
#[must_use]
pub fn method_needs_key(method: &str) -> bool {
    !["GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"]
        .iter()
        .any(|m| m.eq_ignore_ascii_case(method))
}

impl Reply<HttpResponse, HttpResponse> {
    /// The response to send: the work's (or the stored) status, headers and
    /// bytes, plus `Idempotent-Replayed: true` on a replay.
    ///
    /// ```
    /// use idem_core::{HttpResponse, Idem, MemoryStore, Outcome, Scope};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
    /// let idem = Idem::new(MemoryStore::new());
    /// let scope = Scope::new("acct", "POST /charges")?;
    /// for replayed in [false, true] {
    ///     let http = idem
    ///         .execute(&scope, "k", &idem_core::RawJson(br#"{"amount":1}"#), |_| async {
    ///             Outcome::Success(HttpResponse::new(201, vec![], br#"{"id":"ch_1"}"#.to_vec()))
    ///         })
    ///         .await?
    ///         .into_http();
    ///     assert_eq!(http.status, 201);
    ///     assert_eq!(http.header_values("idempotent-replayed").any(|v| v == b"true"), replayed);
    /// }
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn into_http(self) -> HttpResponse {
        let replayed = self.is_replay();
        let mut response = match self.into_outcome() {
            Outcome::Success(r) | Outcome::Failure(r) | Outcome::Transient(r) => r,
        };
        if replayed {
            response
                .headers
                .push((REPLAYED_HEADER.to_owned(), b"true".to_vec()));
        }
        response
    }
}

impl Error {
    /// The response to send for this error: its status, an RFC 9457
    /// `application/problem+json` body, and `Retry-After` (whole seconds,
    /// at least 1) where it applies.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem_core::Error;
    ///
    /// let http = Error::InFlight { retry_after: Duration::from_millis(2500) }.to_http();
    /// assert_eq!(http.status, 409);
    /// assert!(http.header_values("retry-after").eq([b"3".as_slice()]));
    /// ```
    #[must_use]
    pub fn to_http(&self) -> HttpResponse {
        let mut headers = vec![(
            "Content-Type".to_owned(),
            b"application/problem+json".to_vec(),
        )];
        if let Some(d) = self.retry_after() {
            headers.push((
                "Retry-After".to_owned(),
                crate::error::retry_after_secs(d).to_string().into_bytes(),
            ));
        }
        HttpResponse::new(
            self.http_status(),
            headers,
            self.problem_json().into_bytes(),
        )
    }
}
