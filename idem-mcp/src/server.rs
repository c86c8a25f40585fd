//! The server side: [`IdempotentTools`], what an rmcp server's
//! `ServerHandler::call_tool` runs its tools through.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idem_core::adapter::{ClaimExt, EngineExt, Settled};
use idem_core::store::Store;
use idem_core::{Attempt, Begin, Idem, IdempotencyKey, Outcome, Scope};
use rmcp::RoleServer;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ErrorData, JsonObject, MetaObject, ServerCapabilities,
};
use rmcp::service::RequestContext;
use serde_json::Value;
use tokio_util::task::TaskTracker;
use tracing::warn;

use crate::outcome::ToolOutcome;
use crate::vocab::{self, code};

/// Who owns a record: a closure over the request context (the session's
/// authenticated principal), `None` when there is none.
type OwnerFn = dyn Fn(&RequestContext<RoleServer>) -> Option<String> + Send + Sync;

/// Whether a tool is keyed, and where its key may come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolKeys {
    requirement: Requirement,
    argument: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Requirement {
    Optional,
    Required,
    Never,
}

impl Default for ToolKeys {
    fn default() -> Self {
        Self::optional()
    }
}

impl ToolKeys {
    /// A key is read when sent; without one the call runs unprotected (the
    /// default for every tool).
    #[must_use]
    pub const fn optional() -> Self {
        Self {
            requirement: Requirement::Optional,
            argument: false,
        }
    }

    /// A call without a key is refused (`missing_key`); nothing runs.
    #[must_use]
    pub const fn required() -> Self {
        Self {
            requirement: Requirement::Required,
            argument: false,
        }
    }

    /// Never keyed: a key sent to it is ignored and the tool runs each time
    /// (a read, a counter).
    #[must_use]
    pub const fn never() -> Self {
        Self {
            requirement: Requirement::Never,
            argument: false,
        }
    }

    /// The tool declares an `idempotency_key` argument: it is read when the
    /// request's `_meta` carries no key (a host that cannot set meta, or a
    /// model that carries the key of its intent itself), and it is left out
    /// of the arguments the tool sees and the fingerprint.
    #[must_use]
    pub const fn with_argument(mut self) -> Self {
        self.argument = true;
        self
    }

    /// Whether the tool reads the `idempotency_key` argument.
    #[must_use]
    pub const fn reads_argument(&self) -> bool {
        self.argument
    }
}

/// What a tool's work is handed: its arguments (without `idempotency_key`)
/// and, when the call is keyed, the key and the engine's attempt.
#[derive(Debug)]
pub struct ToolCall {
    name: String,
    arguments: JsonObject,
    key: Option<IdempotencyKey>,
    attempt: Option<Attempt>,
}

impl ToolCall {
    /// The tool's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The arguments, without `idempotency_key` on a tool that reads it.
    #[must_use]
    pub fn arguments(&self) -> &JsonObject {
        &self.arguments
    }

    /// The arguments, owned.
    #[must_use]
    pub fn into_arguments(self) -> JsonObject {
        self.arguments
    }

    /// The call's key, when it is keyed.
    #[must_use]
    pub fn key(&self) -> Option<&IdempotencyKey> {
        self.key.as_ref()
    }

    /// The engine's attempt, when keyed: its number, whether it recovers a
    /// crashed one, [`Attempt::set_resource_id`] for what it creates (sent
    /// back with `response_expired`, and [`Attempt::save_resource_id`] to
    /// write it before answering, so that a recovery can reconcile), and
    /// [`Attempt::extend_lease`] for a tool that knows when it makes
    /// progress (the lease is also renewed while the tool runs: see
    /// [`IdempotentTools::auto_renew_lease`]).
    #[must_use]
    pub fn attempt(&self) -> Option<&Attempt> {
        self.attempt.as_ref()
    }
}

/// Runs an rmcp server's tool calls through the engine: at most once per
/// (owner, tool, key), every retry answered with the first result.
///
/// Call [`IdempotentTools::call`] from `ServerHandler::call_tool` and
/// [`IdempotentTools::advertise`] from `ServerHandler::get_info`.
///
/// The work of a keyed call runs in a task of its own: a
/// `notifications/cancelled` or a dropped connection does not abandon it
/// half done, its outcome is stored for the retry.
pub struct IdempotentTools<S> {
    idem: Idem<S>,
    owner: Arc<OwnerFn>,
    tools: Arc<HashMap<String, ToolKeys>>,
    default_keys: ToolKeys,
    tracker: TaskTracker,
    auto_renew: Option<Duration>,
}

/// How long a keyed tool's lease is renewed while it runs, unless
/// configured otherwise ([`IdempotentTools::auto_renew_lease`]).
const DEFAULT_AUTO_RENEW: Duration = Duration::from_secs(300);

impl<S: Store> Clone for IdempotentTools<S> {
    fn clone(&self) -> Self {
        Self {
            idem: self.idem.clone(),
            owner: Arc::clone(&self.owner),
            tools: Arc::clone(&self.tools),
            default_keys: self.default_keys,
            tracker: self.tracker.clone(),
            auto_renew: self.auto_renew,
        }
    }
}

impl<S> fmt::Debug for IdempotentTools<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotentTools")
            .field("tools", &self.tools)
            .field("default_keys", &self.default_keys)
            .finish_non_exhaustive()
    }
}

impl<S: Store> IdempotentTools<S> {
    /// Tool calls on `idem`, owned by whom `owner` names from the request
    /// context (e.g. the principal an auth layer put in the HTTP request's
    /// extensions, which rmcp's streamable HTTP server hands over as
    /// `http::request::Parts`). A keyed call whose owner is `None` is
    /// refused (`owner_unavailable`).
    pub fn new(
        idem: Idem<S>,
        owner: impl Fn(&RequestContext<RoleServer>) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        Self {
            idem,
            owner: Arc::new(owner),
            tools: Arc::new(HashMap::new()),
            default_keys: ToolKeys::optional(),
            tracker: TaskTracker::new(),
            auto_renew: Some(DEFAULT_AUTO_RENEW),
        }
    }

    /// Tool calls with one configured owner (a stdio server: one user).
    pub fn with_owner(idem: Idem<S>, owner: impl Into<String>) -> Self {
        let owner = owner.into();
        Self::new(idem, move |_| Some(owner.clone()))
    }

    /// How the tool `name` is keyed (tools not named are
    /// [`ToolKeys::optional`], or what [`default_keys`](Self::default_keys) says).
    #[must_use]
    pub fn tool(mut self, name: impl Into<String>, keys: ToolKeys) -> Self {
        Arc::make_mut(&mut self.tools).insert(name.into(), keys);
        self
    }

    /// How the tools not named with [`tool`](Self::tool) are keyed.
    #[must_use]
    pub fn default_keys(mut self, keys: ToolKeys) -> Self {
        self.default_keys = keys;
        self
    }

    /// Renews the lease every third of it while a keyed tool runs, up to
    /// `ceiling` (default 5 min; [`Attempt::renewing`]): a tool that
    /// outlives one lease is not taken over by a retry while it still runs.
    /// `None` turns it off (a retry after the lease then recovers the
    /// record while the first call may still be running).
    #[must_use]
    pub fn auto_renew_lease(mut self, ceiling: Option<Duration>) -> Self {
        self.auto_renew = ceiling;
        self
    }

    /// The engine.
    #[must_use]
    pub fn idem(&self) -> &Idem<S> {
        &self.idem
    }

    fn keys_of(&self, tool: &str) -> ToolKeys {
        self.tools.get(tool).copied().unwrap_or(self.default_keys)
    }

    /// The `capabilities.experimental.idempotency` object: the locations a
    /// key is read from and the retention (SEP-3182's shape).
    #[must_use]
    pub fn capability(&self) -> JsonObject {
        let mut locations = vec![Value::from(format!("_meta.{}", vocab::META_KEY))];
        if self.default_keys.argument || self.tools.values().any(|k| k.argument) {
            locations.push(Value::from(format!("arguments.{}", vocab::ARGUMENT_KEY)));
        }
        let policy = self.idem.policy();
        let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let mut cap = JsonObject::new();
        cap.insert("keyLocations".to_owned(), Value::Array(locations));
        cap.insert(
            "responseTtlMs".to_owned(),
            Value::from(ms(policy.response_ttl())),
        );
        cap.insert("keyTtlMs".to_owned(), Value::from(ms(policy.key_ttl())));
        cap
    }

    /// Adds [`capability`](Self::capability) to a server's capabilities as
    /// `experimental.idempotency`.
    pub fn advertise(&self, capabilities: &mut ServerCapabilities) {
        capabilities
            .experimental
            .get_or_insert_with(Default::default)
            .insert(vocab::CAPABILITY.to_owned(), self.capability());
    }

    /// Stops taking keyed calls and waits for the work already started to
    /// finish and store its outcome (call before the process exits).
    pub async fn shutdown(&self) {
        self.tracker.close();
        self.tracker.wait().await;
    }

    /// Runs one `tools/call`: `work` at most once per (owner, tool, key),
    /// or the stored result again with `_meta.idempotentReplayed: true`.
    ///
    /// The key is the request's `_meta.idempotencyKey`, else (on a tool
    /// declared [`with_argument`](ToolKeys::with_argument)) its
    /// `idempotency_key` argument; the fingerprint is the RFC 8785 form of
    /// the arguments without `idempotency_key`. Without a key, `work` runs
    /// unprotected (or the call is refused on a [`ToolKeys::required`]
    /// tool).
    ///
    /// # Errors
    ///
    /// A JSON-RPC error whose `data.code` is the HTTP layer's problem code:
    /// `invalid_key`, `missing_key`, `fingerprint_mismatch`, `in_flight`
    /// (with `retryAfterMs`), `response_expired` (with `resourceId` when
    /// known), `store_unavailable` (with `retryAfterMs`), ...; nothing ran.
    /// Or the work's own [`ToolOutcome::error`].
    pub async fn call<F, Fut>(
        &self,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
        work: F,
    ) -> Result<CallToolResult, ErrorData>
    where
        F: FnOnce(ToolCall) -> Fut + Send + 'static,
        Fut: Future<Output = ToolOutcome> + Send + 'static,
    {
        let name = request.name.to_string();
        let keys = self.keys_of(&name);
        let mut arguments = request.arguments.clone().unwrap_or_default();
        let from_argument = if keys.argument {
            arguments.remove(vocab::ARGUMENT_KEY)
        } else {
            None
        };
        let unkeyed = |arguments| ToolCall {
            name: name.clone(),
            arguments,
            key: None,
            attempt: None,
        };
        if keys.requirement == Requirement::Never {
            return work(unkeyed(arguments)).await.into_answer();
        }
        let received = meta_key(&request, context).or(from_argument);
        let key = match received.as_ref().map(vocab::parse_key) {
            None if keys.requirement == Requirement::Required => {
                return Err(vocab::rpc_error(
                    code::MISSING_KEY,
                    format!("the tool {name} requires an idempotency key"),
                    None,
                    None,
                ));
            }
            None => return work(unkeyed(arguments)).await.into_answer(),
            Some(Err(why)) => return Err(vocab::rpc_error(code::INVALID_KEY, why, None, None)),
            Some(Ok(key)) => key,
        };
        let Some(owner) = (self.owner)(context) else {
            return Err(vocab::rpc_error(
                code::OWNER_UNAVAILABLE,
                "the caller's identity could not be determined".to_owned(),
                None,
                None,
            ));
        };
        let scope = Scope::new(owner, name.as_str())
            .map_err(|e| vocab::rpc_error(code::OWNER_UNAVAILABLE, e.to_string(), None, None))?;
        if self.tracker.is_closed() {
            return Err(shutting_down());
        }
        // A JSON object serializes as itself: the fingerprint is the RFC
        // 8785 form of these arguments.
        let prepared = self
            .idem
            .prepare(&scope, key.clone(), &arguments)
            .map_err(|e| vocab::engine_error(&e))?;
        let claim = match self.idem.begin_prepared::<Value, Value>(prepared).await {
            Err(e) => return Err(vocab::engine_error(&e)),
            Ok(Begin::Replay(reply)) => {
                let (Outcome::Success(stored)
                | Outcome::Failure(stored)
                | Outcome::Transient(stored)) = reply.into_outcome();
                return replayed(stored);
            }
            Ok(Begin::Run(claim)) => claim,
        };
        let call = ToolCall {
            name,
            arguments,
            key: Some(key),
            attempt: Some(claim.attempt().clone()),
        };
        // The work and its completion run in a task of their own: dropped by
        // a cancellation or a closed connection, this future lets go of the
        // answer, never of the outcome.
        // A panic in the work ends this task with the claim dropped: the
        // record stays in flight and the next attempt after the lease
        // recovers it.
        let lease = self.idem.policy().lease();
        let renew = self.auto_renew;
        let task = self.tracker.spawn(async move {
            let attempt = claim.attempt().clone();
            let outcome = attempt.renewing(lease, renew, work(call)).await;
            (claim.settle(outcome.verdict()).await, outcome)
        });
        match task.await {
            Ok((settled, outcome)) => {
                match settled {
                    Err(e @ idem_core::Error::LeaseLost { .. }) => {
                        return Err(vocab::engine_error(&e));
                    }
                    Ok(Settled::Hold(hold)) => {
                        // The outcome is not stored yet and nothing was
                        // saved to reconcile from: retry, and the retry
                        // replays it once the background write stored it.
                        warn!("outcome not stored yet: answered store_unavailable");
                        return Err(vocab::engine_error(&hold));
                    }
                    Err(e) => {
                        warn!(error = %e, "completion failed; left to lease expiry and recovery")
                    }
                    Ok(Settled::Released | Settled::Answer) => {}
                }
                outcome.into_answer()
            }
            Err(_) => Err(vocab::rpc_error(
                code::HANDLER_PANICKED,
                "the tool failed unexpectedly; retry after retryAfterMs".to_owned(),
                Some(lease),
                None,
            )),
        }
    }
}

/// The key in the request's `_meta` (rmcp moves it into the context).
fn meta_key(
    request: &CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> Option<Value> {
    context
        .meta
        .0
        .0
        .get(vocab::META_KEY)
        .or_else(|| {
            request
                .meta
                .as_ref()
                .and_then(|m| m.0.0.get(vocab::META_KEY))
        })
        .cloned()
}

/// A stored result, answered again with the replay marker.
fn replayed(stored: Value) -> Result<CallToolResult, ErrorData> {
    let mut result: CallToolResult = serde_json::from_value(stored).map_err(|e| {
        vocab::rpc_error(
            code::CORRUPT_RECORD,
            format!("the stored tool result cannot be read: {e}"),
            None,
            None,
        )
    })?;
    result
        .meta
        .get_or_insert_with(MetaObject::default)
        .0
        .insert(vocab::REPLAYED_MARKER.to_owned(), Value::Bool(true));
    Ok(result)
}

fn shutting_down() -> ErrorData {
    vocab::rpc_error(
        code::SHUTTING_DOWN,
        "the server is shutting down; retry shortly".to_owned(),
        Some(std::time::Duration::from_secs(1)),
        None,
    )
}
