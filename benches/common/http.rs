//! What the HTTP benches serve: a 256-byte JSON order, and a handler that
//! answers `201 Created` with the body it was sent.

/// A JSON order of exactly 256 bytes.
pub(crate) fn body_256() -> String {
    let pad = "x".repeat(256 - r#"{"item":"book","qty":1,"note":""}"#.len());
    let s = format!(r#"{{"item":"book","qty":1,"note":"{pad}"}}"#);
    assert_eq!(s.len(), 256);
    s
}

/// `201 Created`, `application/json`, the request's body.
pub(crate) async fn handler(
    body: axum::body::Bytes,
) -> (
    axum::http::StatusCode,
    [(&'static str, &'static str); 1],
    axum::body::Bytes,
) {
    (
        axum::http::StatusCode::CREATED,
        [("content-type", "application/json")],
        body,
    )
}
