//! What the handler receives from the layer: the request extensions
//! [`IdemKey`] and [`IdemAttempt`], inserted before a claimed request runs,
//! and (feature `axum`) their extractors.

use idem_core::{Attempt, IdempotencyKey};

/// The validated key of a covered request, in the request's extensions.
#[derive(Debug, Clone)]
pub struct IdemKey(pub IdempotencyKey);

/// The handler's [`Attempt`] (recovery information, saved resource id,
/// downstream keys), in the request's extensions.
#[derive(Debug, Clone)]
pub struct IdemAttempt(pub Attempt);

#[cfg(feature = "axum")]
pub use self::axum_impls::NotCovered;

#[cfg(feature = "axum")]
mod axum_impls {
    use axum::extract::{FromRequestParts, OptionalFromRequestParts};
    use axum::response::{IntoResponse, Response};
    use http::StatusCode;
    use http::request::Parts;

    use super::{IdemAttempt, IdemKey};

    /// The extractors' rejection: the route is not behind the idempotency
    /// layer (500). Extract `Option<IdemAttempt>` on a route that may be.
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

    /// Every extension the layers insert is read the same way: present
    /// behind the layer, [`NotCovered`] (or `None` when optional)
    /// elsewhere.
    macro_rules! extension_extractor {
        ($t:ty) => {
            impl<St: Send + Sync> FromRequestParts<St> for $t {
                type Rejection = NotCovered;
                async fn from_request_parts(parts: &mut Parts, _: &St) -> Result<Self, NotCovered> {
                    parts.extensions.get::<Self>().cloned().ok_or(NotCovered)
                }
            }

            impl<St: Send + Sync> OptionalFromRequestParts<St> for $t {
                type Rejection = std::convert::Infallible;
                async fn from_request_parts(
                    parts: &mut Parts,
                    _: &St,
                ) -> Result<Option<Self>, Self::Rejection> {
                    Ok(parts.extensions.get::<Self>().cloned())
                }
            }
        };
    }

    extension_extractor!(IdemAttempt);
    extension_extractor!(IdemKey);
    #[cfg(feature = "webhook")]
    extension_extractor!(crate::webhook::WebhookDelivery);
}
