//! The answers the layer gives on its own: a [`Rejection`] (the HTTP
//! layer's vocabulary) rendered as a `google.rpc.Status` with an
//! `ErrorInfo` (domain `idem`, reason the problem code in upper case) and a
//! `RetryInfo` where the same call may succeed later.

use http::{HeaderValue, Response};
use tonic::Code;
use tonic::body::Body;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic_types::{ErrorDetails, StatusExt};

use crate::vocab::{DOMAIN, ProblemCode, RESOURCE_ID, Rejection, reason};

/// The gRPC code of a problem: the status a gRPC client would expect for
/// the same situation the HTTP layer answers with its problem status.
#[must_use]
pub fn code_of(code: ProblemCode) -> Code {
    match code {
        ProblemCode::MissingKey
        | ProblemCode::InvalidKey
        | ProblemCode::InvalidRequest
        | ProblemCode::RequestBodyUnreadable
        | ProblemCode::MalformedWebhook
        | ProblemCode::MissingEventId => Code::InvalidArgument,
        ProblemCode::FingerprintMismatch
        | ProblemCode::ResponseExpired
        | ProblemCode::ResponseNotStored => Code::FailedPrecondition,
        ProblemCode::InFlight | ProblemCode::LeaseLost => Code::Aborted,
        ProblemCode::RequestTooLarge => Code::ResourceExhausted,
        ProblemCode::OwnerUnavailable
        | ProblemCode::InvalidSignature
        | ProblemCode::StaleWebhook => Code::Unauthenticated,
        ProblemCode::StoreUnavailable | ProblemCode::ShuttingDown => Code::Unavailable,
        _ => Code::Internal,
    }
}

/// `rejection` as a [`tonic::Status`]: its code ([`code_of`]), its words
/// as the message, an `ErrorInfo` and, when retrying makes sense, a
/// `RetryInfo` with the exact delay (no rounding: a protobuf `Duration`
/// carries nanoseconds). An "already done" answer carries the first
/// attempt's resource id in the `idempotency-resource-id` metadata.
#[must_use]
pub fn status_of(rejection: &Rejection) -> tonic::Status {
    let problem = rejection.code();
    let mut details = ErrorDetails::with_error_info(
        reason(problem),
        DOMAIN,
        std::collections::HashMap::<String, String>::new(),
    );
    if let Some(delay) = rejection.retry_after() {
        details.set_retry_info(Some(delay));
    }
    let mut metadata = MetadataMap::new();
    if let Rejection::Engine(e) = rejection
        && let Some(id) = e.resource_id()
        && let Ok(v) = MetadataValue::try_from(id)
    {
        metadata.insert(RESOURCE_ID, v);
    }
    tonic::Status::with_error_details_and_metadata(
        code_of(problem),
        rejection.to_string(),
        details,
        metadata,
    )
}

/// The trailers-only HTTP response of `rejection`.
pub(crate) fn reject(rejection: &Rejection) -> Response<Body> {
    let mut res: Response<Body> = status_of(rejection).into_http();
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    res
}
