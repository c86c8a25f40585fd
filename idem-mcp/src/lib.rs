//! Idempotent MCP tool calls for [rmcp](https://docs.rs/rmcp) servers, and
//! the client side for agent hosts.
//!
//! An agent host that loses a `tools/call` answer (a timeout, a dropped
//! stream) cannot tell "never arrived" from "ran, answer lost", and calls
//! again. [`IdempotentTools`] runs each keyed call at most once per
//! (owner, tool, key) and answers every retry with the first result,
//! marked `_meta.idempotentReplayed: true`.
//!
//! * **The key**: the request's `_meta.idempotencyKey`, else a tool
//!   argument `idempotency_key` on tools that declare one
//!   ([`ToolKeys::with_argument`]); `_meta` wins. A JSON string of 1 to 255
//!   printable ASCII characters, taken as is (`" k"` and `"k"` are two keys;
//!   no trimming, no unquoting); anything else is `invalid_key` and nothing
//!   runs. No key: the call runs unprotected, or is refused on a
//!   [`ToolKeys::required`] tool.
//! * **The scope**: the owner from the request context (a closure), the
//!   tool name as the operation; the fingerprint is the RFC 8785 form of the
//!   arguments without `idempotency_key`.
//! * **The answers**: the stored `CallToolResult` replayed exactly; a
//!   conflict (`fingerprint_mismatch`, `in_flight` with `retryAfterMs`,
//!   `response_expired`, `invalid_key`, `store_unavailable`) as a JSON-RPC
//!   error whose `data.code` is the HTTP layer's problem code.
//! * **Failures**: a result with `isError: true` is a permanent failure,
//!   stored and replayed; [`ToolOutcome::transient`] releases the key.
//! * **An outcome not stored yet** (the store failed after the tool ran; the
//!   engine writes it again in the background): the result goes out only if
//!   the tool saved a resource id (`attempt.save_resource_id`), which a
//!   recovery reconciles from; otherwise the host gets `store_unavailable`
//!   and its retry replays the result once it is stored.
//! * **Long tools**: the lease is renewed while a keyed tool runs, up to
//!   5 minutes ([`IdempotentTools::auto_renew_lease`]).
//!
//! ```no_run
//! use idem_core::{Idem, MemoryStore};
//! use idem_mcp::rmcp::model::{
//!     CallToolRequestParams, CallToolResponse, CallToolResult, ErrorData, ServerCapabilities,
//!     ServerConfig,
//! };
//! use idem_mcp::rmcp::service::RequestContext;
//! use idem_mcp::rmcp::{RoleServer, ServerHandler};
//! use idem_mcp::{IdempotentTools, ToolKeys, ToolOutcome};
//! use serde_json::json;
//!
//! #[derive(Clone)]
//! struct Payments {
//!     tools: IdempotentTools<MemoryStore>,
//! }
//!
//! impl ServerHandler for Payments {
//!     fn get_info(&self) -> ServerConfig {
//!         let mut caps = ServerCapabilities::builder().enable_tools().build();
//!         self.tools.advertise(&mut caps);
//!         ServerConfig::new(caps)
//!     }
//!
//!     async fn call_tool(
//!         &self,
//!         request: CallToolRequestParams,
//!         context: RequestContext<RoleServer>,
//!     ) -> Result<CallToolResponse, ErrorData> {
//!         self.tools
//!             .call(request, &context, |call| async move {
//!                 let amount = call.arguments().get("amount").cloned();
//!                 // ... charge the card, once per key ...
//!                 ToolOutcome::from(CallToolResult::structured(json!({ "charged": amount })))
//!             })
//!             .await
//!             .map(Into::into)
//!     }
//! }
//!
//! let tools = IdempotentTools::with_owner(Idem::new(MemoryStore::new()), "local")
//!     .tool("charge", ToolKeys::optional().with_argument());
//! let server = Payments { tools };
//! // server.serve(rmcp::transport::stdio()).await ...
//! # let _ = server;
//! ```
//!
//! The client side, [`ToolCaller`] (feature `client`), makes one key per
//! intended call, sends it in `_meta` and retries `in_flight` and transport
//! failures with it, under `idem::client`'s policy.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod vocab;

#[cfg(feature = "server")]
mod outcome;
#[cfg(feature = "server")]
mod server;

#[cfg(feature = "client")]
mod client;

#[cfg(feature = "client")]
pub use client::{Answer, CallReport, ToolCaller, error_code, is_replayed};
#[cfg(feature = "client")]
pub use idem_client::ReportKind;
#[cfg(feature = "server")]
pub use outcome::ToolOutcome;
#[cfg(feature = "server")]
pub use server::{IdempotentTools, ToolCall, ToolKeys};

pub use rmcp;
