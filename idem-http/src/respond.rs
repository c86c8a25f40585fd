//! The last step of a request the layer answers on its own: one renderer
//! from a [`Rejection`] to a response, used by the service (with the
//! layer's problem types, docs link and owner status) and by
//! `IntoResponse for Rejection` (feature `axum`, with the defaults).

use http::{HeaderValue, Response, StatusCode};
use tracing::{info, warn};

use crate::body::IdemBody;
use crate::problem::Rendered;
use crate::rejection::Rejection;
use crate::state::Shared;

/// Renders a rejection with the layer's settings, records it on the
/// request's span and logs its instance. `key` is the received key.
pub(crate) fn reject<S, O, B>(
    shared: &Shared<S, O>,
    r: &Rejection,
    key: Option<&str>,
) -> Response<IdemBody<B>> {
    let cfg = &shared.cfg;
    let mut problem = r.problem(key);
    if matches!(r, Rejection::OwnerUnavailable) {
        problem.status = cfg.missing_owner_status.as_u16();
    }
    if let (Rejection::Engine(idem_core::Error::InFlight { .. }), Some(s)) =
        (r, cfg.in_flight_status)
    {
        problem.status = s.as_u16();
    }
    let rendered = problem.render(&cfg.problem_types, cfg.docs_url.as_deref());
    let code = r.code().as_str();
    let span = tracing::Span::current();
    span.record("outcome", "rejected");
    span.record("code", code);
    span.record("status", rendered.status);
    if rendered.status >= 500 {
        warn!(code, instance = %rendered.instance, "idempotency rejection");
    } else {
        info!(code, instance = %rendered.instance, "idempotency rejection");
    }
    response(rendered, IdemBody::full)
}

/// Status, headers and body of a rendered problem. A header value that is
/// not valid HTTP (a `docs_url` with a line break) is dropped with a
/// warning, never sent.
fn response<T>(rendered: Rendered, body: impl FnOnce(Vec<u8>) -> T) -> Response<T> {
    let mut res = Response::new(body(rendered.body));
    *res.status_mut() =
        StatusCode::from_u16(rendered.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    for (name, value) in rendered.headers {
        match HeaderValue::from_str(&value) {
            Ok(v) => {
                res.headers_mut().append(name, v);
            }
            Err(_) => warn!(header = name, "problem header is not valid HTTP: dropped"),
        }
    }
    res
}

#[cfg(feature = "axum")]
impl axum::response::IntoResponse for Rejection {
    /// The problem with the default problem types, as the layer would
    /// render it without `docs_url` or `missing_owner_status`.
    fn into_response(self) -> axum::response::Response {
        let rendered = self
            .problem(None)
            .render(&crate::problem::ProblemTypes::Draft, None);
        response(rendered, axum::body::Body::from)
    }
}
