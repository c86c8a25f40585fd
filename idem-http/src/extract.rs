//! axum integration: `IntoResponse` for [`Rejection`] and the extractors.

use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::response::{IntoResponse, Response};
use http::request::Parts;
use http::{HeaderValue, StatusCode};

use crate::pipeline::ProblemTypes;
use crate::rejection::Rejection;
use crate::service::{IdemAttempt, IdemKey};

impl IntoResponse for Rejection {
    /// The problem (spec 2.11) with the default problem types.
    fn into_response(self) -> Response {
        let rendered = self.problem(None).render(&ProblemTypes::Draft, None);
        let mut res = Response::new(axum::body::Body::from(rendered.body));
        *res.status_mut() =
            StatusCode::from_u16(rendered.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        for (name, value) in rendered.headers {
            if let Ok(v) = HeaderValue::from_str(&value) {
                res.headers_mut().append(name, v);
            }
        }
        res
    }
}

/// The extractor's rejection: the route is not behind the idempotency layer.
#[derive(Debug, Clone, Copy)]
pub struct NotCovered;

impl IntoResponse for NotCovered {
    fn into_response(self) -> Response {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "this route is not covered by the idempotency layer",
        )
            .into_response()
    }
}

impl<St: Send + Sync> FromRequestParts<St> for IdemAttempt {
    type Rejection = NotCovered;
    async fn from_request_parts(parts: &mut Parts, _: &St) -> Result<Self, NotCovered> {
        parts.extensions.get::<Self>().cloned().ok_or(NotCovered)
    }
}

impl<St: Send + Sync> OptionalFromRequestParts<St> for IdemAttempt {
    type Rejection = std::convert::Infallible;
    async fn from_request_parts(
        parts: &mut Parts,
        _: &St,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<Self>().cloned())
    }
}

impl<St: Send + Sync> FromRequestParts<St> for IdemKey {
    type Rejection = NotCovered;
    async fn from_request_parts(parts: &mut Parts, _: &St) -> Result<Self, NotCovered> {
        parts.extensions.get::<Self>().cloned().ok_or(NotCovered)
    }
}

impl<St: Send + Sync> OptionalFromRequestParts<St> for IdemKey {
    type Rejection = std::convert::Infallible;
    async fn from_request_parts(
        parts: &mut Parts,
        _: &St,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<Self>().cloned())
    }
}
