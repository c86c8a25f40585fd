//! The client side: [`ToolCaller`], for rmcp clients (agent hosts).

use std::future::Future;
use std::time::{Duration, Instant, SystemTime};

use http::{HeaderMap, HeaderValue, StatusCode};
use idem_client::policy::{
    AttemptView, RetryPolicy, SendOutcome, SendState, Step, TransportFailure, os_random,
};
use idem_client::{Problem, ReportKind, StopReason};
use idem_core::IdempotencyKey;
use rmcp::model::{CallToolRequestParams, CallToolResult, ErrorData, RequestMetaObject};
use rmcp::service::ServiceError;
use serde_json::Value;
use tracing::debug;

use crate::vocab;

/// One answer to a `tools/call`: the result, or the JSON-RPC error.
pub type Answer = Result<CallToolResult, ErrorData>;

/// How a call ended, with its key and the attempts it took.
#[derive(Debug)]
pub struct CallReport {
    /// What the call ended as, in `idem::client`'s words: `Fresh` (the
    /// tool ran now: its result or its own error), `Replayed`
    /// (`_meta.idempotentReplayed`), `AlreadyProcessed` (`response_expired`,
    /// `response_not_stored`), `Rejected` (`fingerprint_mismatch`,
    /// `invalid_key`, a server problem that will not pass; never retried),
    /// `Exhausted` (still "later", or no answer, at a limit).
    pub outcome: ReportKind,
    /// Attempts made (1 when the first answered).
    pub attempts: u32,
    /// The key every attempt carried.
    pub key: IdempotencyKey,
    /// The last answer, when one came.
    pub answer: Option<Answer>,
}

/// Makes one key per intended call, sends it as `_meta.idempotencyKey`,
/// and retries `in_flight` answers and transport failures (no answer, a
/// closed connection, an attempt timeout) with the same key, under
/// `idem::client`'s [`RetryPolicy`] (attempt cap, backoff, deadline,
/// `retryAfterMs`).
#[derive(Debug, Clone)]
pub struct ToolCaller {
    policy: RetryPolicy,
    attempt_timeout: Option<Duration>,
}

impl Default for ToolCaller {
    fn default() -> Self {
        Self::new(RetryPolicy::default())
    }
}

impl ToolCaller {
    /// The builder of `idem::client`'s policy (attempt cap, backoff,
    /// deadline, ...): `ToolCaller::new(ToolCaller::policy().deadline(d).build_policy()?)`.
    pub fn policy() -> idem_client::IdempotencyClientBuilder {
        idem_client::IdempotencyClientLayer::builder()
    }

    /// A caller under `policy` (build one with [`ToolCaller::policy`], i.e.
    /// `idem_client::IdempotencyClientLayer::builder()...build_policy()`, the one home of the policy's settings).
    #[must_use]
    pub fn new(policy: RetryPolicy) -> Self {
        Self {
            policy,
            attempt_timeout: Some(Duration::from_secs(30)),
        }
    }

    /// How long one attempt may wait for its answer before it counts as a
    /// lost answer and is retried (30 s by default; `None`: no limit).
    #[must_use]
    pub fn attempt_timeout(mut self, d: Option<Duration>) -> Self {
        self.attempt_timeout = d;
        self
    }

    /// Calls a tool on `peer` (an rmcp client's `Peer<RoleClient>` or
    /// `RunningService`), retried on the same connection.
    pub async fn call_peer(
        &self,
        peer: &rmcp::Peer<rmcp::RoleClient>,
        request: CallToolRequestParams,
        key: Option<IdempotencyKey>,
    ) -> CallReport {
        self.call(request, key, |r| peer.call_tool(r)).await
    }

    /// Calls a tool through `send`, which makes one attempt (and may open a
    /// new connection first, e.g. respawn a stdio server or reconnect to a
    /// URL, when the last one failed). `key` is the intent's key, made once
    /// and kept with the intent; `None` mints one.
    pub async fn call<F, Fut>(
        &self,
        mut request: CallToolRequestParams,
        key: Option<IdempotencyKey>,
        mut send: F,
    ) -> CallReport
    where
        F: FnMut(CallToolRequestParams) -> Fut,
        Fut: Future<Output = Result<CallToolResult, ServiceError>>,
    {
        let key = key.unwrap_or_else(IdempotencyKey::random);
        request
            .meta
            .get_or_insert_with(RequestMetaObject::default)
            .0
            .0
            .insert(vocab::META_KEY.to_owned(), Value::from(key.as_str()));
        let start = Instant::now();
        let mut attempts = 0u32;
        let mut random = os_random;
        loop {
            attempts += 1;
            let sent = send(request.clone());
            let got = match self.attempt_timeout {
                Some(d) => tokio::time::timeout(d, sent)
                    .await
                    .unwrap_or(Err(ServiceError::Timeout { timeout: d })),
                None => sent.await,
            };
            let answer = match got {
                Ok(r) => Some(Ok(r)),
                Err(ServiceError::McpError(e)) => Some(Err(e)),
                Err(e) => {
                    debug!(error = %e, attempts, "tools/call: no answer");
                    None
                }
            };
            let state = SendState {
                attempts,
                elapsed: start.elapsed(),
                key_age: None,
                now: SystemTime::now(),
            };
            let step = match &answer {
                None => self.policy.decide(
                    &AttemptView::Transport(TransportFailure::Ambiguous),
                    state,
                    &mut random,
                ),
                Some(a) => {
                    let (status, headers, problem) = http_view(a);
                    let view = AttemptView::Response {
                        status,
                        headers: &headers,
                        problem: problem.as_ref(),
                    };
                    self.policy.decide(&view, state, &mut random)
                }
            };
            let outcome = match step {
                Step::Retry { delay, .. } => {
                    tokio::time::sleep(delay).await;
                    continue;
                }
                Step::Return(SendOutcome::Fresh) => ReportKind::Fresh,
                Step::Return(SendOutcome::Replayed) => ReportKind::Replayed,
                Step::Return(SendOutcome::AlreadyProcessed) => ReportKind::AlreadyProcessed,
                Step::Return(_) => ReportKind::Rejected,
                Step::Stop(reason) => ReportKind::Exhausted(reason),
                _ => ReportKind::Exhausted(StopReason::MaxAttempts),
            };
            return CallReport {
                outcome,
                attempts,
                key,
                answer,
            };
        }
    }
}

/// The problem code of a JSON-RPC error (`data.code`), when it has one.
#[must_use]
pub fn error_code(e: &ErrorData) -> Option<&str> {
    e.data.as_ref()?.get("code")?.as_str()
}

/// Whether a result is a replay (`_meta.idempotentReplayed: true`).
#[must_use]
pub fn is_replayed(result: &CallToolResult) -> bool {
    result
        .meta
        .as_ref()
        .and_then(|m| m.0.get(vocab::REPLAYED_MARKER))
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

pub(crate) fn http_view(answer: &Answer) -> (StatusCode, HeaderMap, Option<Problem>) {
    let mut headers = HeaderMap::new();
    match answer {
        Ok(result) => {
            if is_replayed(result) {
                headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
            }
            (StatusCode::OK, headers, None)
        }
        Err(e) => {
            let Some(code) = error_code(e) else {
                // The tool's own error, not the adapter's: its answer.
                return (StatusCode::BAD_REQUEST, headers, None);
            };
            let data = e.data.as_ref();
            let retry_ms = data
                .and_then(|d| d.get("retryAfterMs"))
                .and_then(Value::as_u64);
            if let Some(ms) = retry_ms {
                headers.insert("retry-after-ms", HeaderValue::from(ms));
            }
            let mut problem = Problem::default();
            problem.code = Some(code.to_owned());
            problem.resource_id = data
                .and_then(|d| d.get("resourceId"))
                .and_then(Value::as_str)
                .map(str::to_owned);
            (vocab::status_of(code), headers, Some(problem))
        }
    }
}
