//! Steps 2 to 6 of a covered request, before anything is claimed: the key
//! (`key.rs`), the owner and the operation (the record's scope), the body
//! (bounded), and the fingerprint (`envelope.rs`). The result is a
//! [`Prepared`] record for `exec.rs`, a pass-through, or a rejection.

use std::future::Future;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Method, Request, Response, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use idem_core::IdempotencyKey;
use idem_core::store::BoxDynError;

use idem_core::adapter::Prepared;
use idem_core::error::ScopeError;
use idem_core::store::Store;
use idem_core::{RecordId, Scope};
use tracing::{Span, error, info_span};

use crate::body::IdemBody;
use crate::config::{Config, KeyNamespace, KeyRequirement, OperationSource};
use crate::envelope::{
    BodyFingerprint, FingerprintSpec, PathSource, RequestView, fingerprint_request,
};
use crate::exec::Answer;
use crate::owner::OwnerSource;
use crate::rejection::Rejection;
use crate::respond::reject;
use crate::service::{Mode, Step};
use crate::state::Shared;
use idem_core::wire::{KeyHeaderError, parse_key_field};

/// The `Idempotency-Key` layer's mode is its owner source: the key comes
/// from the key header, the scope from the owner and the operation, and
/// the handler's response (or a replay) goes out as it is.
impl<O: OwnerSource> Mode for O {
    /// The received key, for the problem of a later rejection.
    type Context = String;

    fn span(&self, method: &Method) -> Span {
        info_span!(
            "idem.http",
            method = %method,
            route = tracing::field::Empty,
            record = tracing::field::Empty,
            outcome = tracing::field::Empty,
            code = tracing::field::Empty,
            status = tracing::field::Empty,
        )
    }

    fn covers(&self, cfg: &Config, method: &Method) -> bool {
        cfg.methods.contains(method)
    }

    fn prepare<S, ReqB>(
        shared: &Shared<S, Self>,
        req: Request<ReqB>,
    ) -> impl Future<Output = Step<ReqB, String>> + Send
    where
        S: Store,
        ReqB: http_body::Body<Data = Bytes> + From<Bytes> + Send + 'static,
        ReqB::Error: Into<BoxDynError>,
    {
        prepare(shared, req)
    }

    fn answer<S, B>(
        shared: &Shared<S, Self>,
        key: String,
        answer: Answer<B>,
    ) -> Response<IdemBody<B>> {
        match answer {
            Answer::Response(r) | Answer::Replayed { response: r, .. } => r,
            Answer::Reject(r) => reject(shared, &r, Some(&key)),
        }
    }
}

/// Steps 2 to 6: key, scope, body, fingerprint.
async fn prepare<S, O, ReqB>(shared: &Shared<S, O>, req: Request<ReqB>) -> Step<ReqB, String>
where
    ReqB: http_body::Body<Data = Bytes> + From<Bytes> + Send + 'static,
    ReqB::Error: Into<BoxDynError>,
    S: Store,
    O: OwnerSource,
{
    let cfg = &shared.cfg;
    let (parts, body) = req.into_parts();

    // Step 2: the key.
    let key = match read_key(cfg, &parts) {
        Ok(Some(k)) => k,
        Ok(None) => {
            return match cfg.key {
                KeyRequirement::Required => Step::Reject(Rejection::MissingKey, None),
                KeyRequirement::Optional => {
                    tracing::Span::current().record("outcome", "passthrough");
                    Step::PassThrough(Request::from_parts(parts, body))
                }
            };
        }
        Err(r) => return Step::Reject(r, None),
    };
    let key_text = || Some(key.as_str().to_owned());
    if shared.is_closed() {
        return Step::Reject(Rejection::ShuttingDown, key_text());
    }

    // Steps 3 and 4: owner and operation, the record's scope.
    let named = match name_operation(cfg, &parts) {
        Ok(n) => n,
        Err(r) => return Step::Reject(r, key_text()),
    };
    tracing::Span::current().record("route", named.route.as_str());
    let Some(owner) = shared.mode.owner(&parts) else {
        error!(
            "owner unavailable: is the auth layer missing or placed inside the idempotency layer?"
        );
        return Step::Reject(Rejection::OwnerUnavailable, key_text());
    };
    let scope = match Scope::new(owner, named.operation.as_str()) {
        Ok(s) if named.from_path => s.with_metrics_label(path_label(&parts)),
        Ok(s) => s,
        Err(e) => return Step::Reject(scope_refused(&e, named.from_path), key_text()),
    };

    // Step 5: the body, bounded.
    let (bytes, body) = match read_body(cfg, &parts, body).await {
        Ok(b) => b,
        Err(r) => return Step::Reject(r, key_text()),
    };

    // Step 6: the fingerprint.
    let names = cfg.fingerprint.header_names();
    let headers: Vec<(&str, &[u8])> = if names.is_empty() {
        Vec::new()
    } else {
        parts
            .headers
            .iter()
            .filter(|(n, _)| names.iter().any(|h| h == n.as_str()))
            .map(|(n, v)| (n.as_str(), v.as_bytes()))
            .collect()
    };
    let view = RequestView {
        method: parts.method.as_str(),
        route: &named.route,
        path: fingerprinted_path(&cfg.fingerprint, &parts),
        query: parts.uri.query(),
        headers: &headers,
        content_type: parts
            .headers
            .get(header::CONTENT_TYPE)
            .map(HeaderValue::as_bytes),
        body: &bytes,
    };
    let fingerprint = match fingerprint_request(scope.operation(), &view, &cfg.fingerprint) {
        Ok(fp) => fp,
        Err(e) => {
            let r = Rejection::Engine(idem_core::Error::InvalidRequest(e));
            return Step::Reject(r, key_text());
        }
    };
    drop(headers);
    let id = RecordId::new(scope, key.clone());
    tracing::Span::current().record("record", id.log_hash().as_str());
    let body = body.unwrap_or_else(|| ReqB::from(bytes));
    Step::Run {
        req: Request::from_parts(parts, body),
        prepared: Prepared { id, fingerprint },
        context: key.as_str().to_owned(),
        key,
    }
}

/// The key header through `parse_key_field` and the layer's validator.
fn read_key(cfg: &Config, parts: &Parts) -> Result<Option<IdempotencyKey>, Rejection> {
    let lines: Vec<&HeaderValue> = parts.headers.get_all(&cfg.key_header).iter().collect();
    let raw: Vec<&[u8]> = lines.iter().map(|v| v.as_bytes()).collect();
    let key = match parse_key_field(&raw, cfg.key_syntax) {
        Ok(Some(k)) => k,
        Ok(None) => return Ok(None),
        Err(reason) => {
            return Err(Rejection::InvalidKey {
                reason,
                received: received(&lines),
                message: None,
            });
        }
    };
    if let Some(validate) = &cfg.key_validator
        && let Err(message) = validate(&key)
    {
        return Err(Rejection::InvalidKey {
            reason: KeyHeaderError::RejectedByValidator,
            received: Some(key.as_str().to_owned()),
            message: Some(message),
        });
    }
    Ok(Some(key))
}

/// The received key of a refused field, unquoted when it looks quoted.
fn received(lines: &[&HeaderValue]) -> Option<String> {
    let first = lines.first()?;
    let text = String::from_utf8_lossy(first.as_bytes());
    let t = text.trim_matches([' ', '\t']);
    Some(
        t.strip_prefix('"')
            .and_then(|s| s.strip_suffix('"'))
            .unwrap_or(t)
            .to_owned(),
    )
}

/// The operation of a request and the route that enters its fingerprint.
struct Named {
    route: String,
    operation: String,
    /// The operation is the client's path ([`OperationSource::Path`]).
    from_path: bool,
}

/// Steps 3 and 4: the operation, exactly as the [`OperationSource`] says,
/// the same in every build.
fn name_operation(cfg: &Config, parts: &Parts) -> Result<Named, Rejection> {
    let method = &parts.method;
    let by_path = || Named {
        route: parts.uri.path().to_owned(),
        operation: format!("{method} {}", parts.uri.path()),
        from_path: true,
    };
    let mut named = match &cfg.operation {
        OperationSource::Path => by_path(),
        OperationSource::Route(template) => Named {
            route: template.clone().into_owned(),
            operation: format!("{method} {template}"),
            from_path: false,
        },
        OperationSource::Fixed(name) => Named {
            route: name.clone().into_owned(),
            operation: name.clone().into_owned(),
            from_path: false,
        },
        OperationSource::Fn(f) => match f(parts) {
            Some(name) => Named {
                route: name.clone(),
                operation: name,
                from_path: false,
            },
            None => by_path(),
        },
        #[cfg(feature = "axum")]
        OperationSource::MatchedPath => {
            let Some(m) = parts.extensions.get::<axum::extract::MatchedPath>() else {
                error!(
                    "OperationSource::MatchedPath, but the request has no MatchedPath: \
                     is the layer outside axum's router?"
                );
                return Err(Rejection::OperationUnavailable);
            };
            Named {
                route: m.as_str().to_owned(),
                operation: format!("{method} {}", m.as_str()),
                from_path: false,
            }
        }
    };
    if cfg.namespace == KeyNamespace::PerOwner {
        "http".clone_into(&mut named.operation);
        named.from_path = false;
    }
    Ok(named)
}

/// The `operation` metrics label of an operation named by the client's path:
/// a bounded value whatever the paths. The record keeps the concrete path;
/// the label is the matched route template where the framework knows it
/// (axum's `MatchedPath`, `"{METHOD} {template}"`), else the method alone.
/// Neither changes the record a request maps to.
fn path_label(parts: &Parts) -> String {
    #[cfg(feature = "axum")]
    if let Some(m) = parts.extensions.get::<axum::extract::MatchedPath>() {
        return format!("{} {}", parts.method, m.as_str());
    }
    parts.method.as_str().to_owned()
}

/// A scope refused: the owner source's fault (500 `owner_unavailable`),
/// the client's path (414 `path_too_long`), or the operation source's (500
/// `operation_unavailable`); each logged for what it is.
fn scope_refused(e: &ScopeError, from_path: bool) -> Rejection {
    let part = match e {
        ScopeError::Empty { part }
        | ScopeError::TooLong { part, .. }
        | ScopeError::ControlCharacter { part, .. } => *part,
        _ => "operation",
    };
    if part == "owner" {
        error!(error = %e, "the owner source named an owner a record scope cannot hold");
        Rejection::OwnerUnavailable
    } else if from_path && matches!(e, ScopeError::TooLong { .. }) {
        Rejection::PathTooLong {
            limit: Scope::MAX_PART_LEN,
        }
    } else {
        error!(error = %e, "the operation source named an operation a record scope cannot hold");
        Rejection::OperationUnavailable
    }
}

/// The path that enters the fingerprint, as the [`PathSource`] says.
fn fingerprinted_path<'a>(spec: &FingerprintSpec, parts: &'a Parts) -> &'a str {
    match spec.path_source() {
        PathSource::Uri => parts.uri.path(),
        #[cfg(feature = "axum")]
        PathSource::OriginalUri => parts
            .extensions
            .get::<axum::extract::OriginalUri>()
            .map_or(parts.uri.path(), |o| o.0.path()),
    }
}

/// Step 5: the body up to `max_request_body` (the bytes, and the body
/// itself when it was not read: [`BodyFingerprint::Ignore`]).
async fn read_body<ReqB>(
    cfg: &Config,
    parts: &Parts,
    body: ReqB,
) -> Result<(Bytes, Option<ReqB>), Rejection>
where
    ReqB: http_body::Body<Data = Bytes> + Send,
    ReqB::Error: Into<BoxDynError>,
{
    if cfg.fingerprint.body_mode() == BodyFingerprint::Ignore {
        return Ok((Bytes::new(), Some(body)));
    }
    read_limited(cfg.max_request_body, parts, body)
        .await
        .map(|b| (b, None))
}

/// The whole body up to `limit` bytes: a declared or hinted length over the
/// limit is refused before reading (413), and so is a body that grows past
/// it; a body that fails is 400 `request_body_unreadable`. Shared by the
/// idempotency layer and the webhook receiver.
pub(crate) async fn read_limited<ReqB>(
    limit: usize,
    parts: &Parts,
    body: ReqB,
) -> Result<Bytes, Rejection>
where
    ReqB: http_body::Body<Data = Bytes> + Send,
    ReqB::Error: Into<BoxDynError>,
{
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let too_large = Rejection::RequestTooLarge { limit };
    if declared.is_some_and(|n| n > limit as u64)
        || http_body::Body::size_hint(&body).lower() > limit as u64
    {
        return Err(too_large);
    }
    match Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large),
        Err(_) => Err(Rejection::RequestBodyUnreadable),
    }
}
