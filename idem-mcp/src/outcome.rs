//! What a tool's work answers, and how the engine remembers it.

use idem_core::Outcome;
use idem_core::adapter::Settle;
use rmcp::model::{CallToolResult, ErrorData};
use serde_json::Value;
use tracing::warn;

/// What a tool's work answers: a result (stored; with `isError: true` a
/// permanent failure, replayed like a success), a transient failure
/// (answered now, the key released so a retry runs the work again), or a
/// JSON-RPC error (the key released).
///
/// ```
/// use idem_mcp::ToolOutcome;
/// use rmcp::model::{CallToolResult, ContentBlock};
///
/// // Stored and replayed: the card was declined.
/// let declined: ToolOutcome =
///     CallToolResult::error(vec![ContentBlock::text("insufficient_funds")]).into();
/// // Not stored: the provider was down, a retry may succeed.
/// let down = ToolOutcome::transient(CallToolResult::error(vec![ContentBlock::text(
///     "provider_unavailable",
/// )]));
/// # let _ = (declined, down);
/// ```
#[derive(Debug)]
pub struct ToolOutcome(Kind);

#[derive(Debug)]
enum Kind {
    Result(CallToolResult),
    Transient(CallToolResult),
    Error(ErrorData),
}

impl ToolOutcome {
    /// A result to store and replay: `isError: true` makes it a permanent
    /// failure (a declined card), replayed as it is.
    #[must_use]
    pub fn result(result: CallToolResult) -> Self {
        Self(Kind::Result(result))
    }

    /// A failure a retry may not meet (a provider down): answered now, not
    /// stored, the key released.
    #[must_use]
    pub fn transient(result: CallToolResult) -> Self {
        Self(Kind::Transient(result))
    }

    /// A JSON-RPC error: answered now, not stored, the key released.
    #[must_use]
    pub fn error(error: ErrorData) -> Self {
        Self(Kind::Error(error))
    }

    /// Whether the outcome is stored (a result, not a transient failure or
    /// an error).
    #[must_use]
    pub fn is_stored(&self) -> bool {
        matches!(self.0, Kind::Result(_))
    }

    /// What the engine is told: release the key (transient, an error, or a
    /// result that cannot be encoded), or store it (a success, or a
    /// permanent failure).
    pub(crate) fn verdict(&self) -> Settle<Value, Value> {
        let Kind::Result(result) = &self.0 else {
            return Settle::Release;
        };
        match serde_json::to_value(result) {
            Ok(v) if result.is_error == Some(true) => Settle::Store(Outcome::Failure(v)),
            Ok(v) => Settle::Store(Outcome::Success(v)),
            Err(e) => {
                warn!(error = %e, "tool result cannot be encoded: key released");
                Settle::Release
            }
        }
    }

    pub(crate) fn into_answer(self) -> Result<CallToolResult, ErrorData> {
        match self.0 {
            Kind::Result(r) | Kind::Transient(r) => Ok(r),
            Kind::Error(e) => Err(e),
        }
    }
}

impl From<CallToolResult> for ToolOutcome {
    fn from(result: CallToolResult) -> Self {
        Self::result(result)
    }
}

impl From<Result<CallToolResult, ErrorData>> for ToolOutcome {
    fn from(answer: Result<CallToolResult, ErrorData>) -> Self {
        match answer {
            Ok(r) => Self::result(r),
            Err(e) => Self::error(e),
        }
    }
}
