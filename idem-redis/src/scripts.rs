//! The Lua scripts, one per transition, each run as one `EVALSHA`.
//!
//! [`redis::Script`] sends `EVALSHA` and, on `NOSCRIPT` (after a
//! `SCRIPT FLUSH`, a restart or a failover to a node that never saw the
//! script), loads it and retries, so no call depends on an earlier load.

use std::sync::LazyLock;

use redis::Script;

/// Insert, take over, or report the standing record.
pub(crate) static CLAIM: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/claim.lua")));
/// Store the outcome under the token.
pub(crate) static COMPLETE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/complete.lua")));
/// Release the key under the token.
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/release.lua")));
/// Set the resource id under the token.
pub(crate) static CHECKPOINT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/checkpoint.lua")));
/// Move the lease's end under the token.
pub(crate) static EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/extend.lua")));
/// Read a record as of the engine's `now`.
pub(crate) static FETCH: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/fetch.lua")));
/// End an in-flight record's lease now (operator).
pub(crate) static RELEASE_IN_FLIGHT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/release_in_flight.lua")));
/// Delete a completed record (operator).
pub(crate) static DELETE_COMPLETED: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/delete_completed.lua")));
