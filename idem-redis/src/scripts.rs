//! The Lua scripts, only for the transitions that must check a token or swap
//! a record atomically; each runs as one `EVALSHA`. Claims, replays and
//! fetches are native commands (see the [crate docs](crate)).
//!
//! [`redis::Script`] sends `EVALSHA` and, on `NOSCRIPT` (after a
//! `SCRIPT FLUSH`, a restart or a failover to a node that never saw the
//! script), loads it and retries, so no call depends on an earlier load.

use std::sync::LazyLock;

use redis::Script;

/// The script sources, exactly as the store runs them (for review, or a
/// raw-driver baseline such as the benches' "store scripts without the
/// engine" side).
pub(crate) mod sources {
    /// A script that acts only on a record in flight under the caller's
    /// token: `scripts/held.lua` (that check, the one copy of it), then the
    /// script itself.
    macro_rules! held {
        ($script:literal) => {
            concat!(include_str!("../scripts/held.lua"), include_str!($script))
        };
    }

    /// Store the outcome under the token.
    pub const COMPLETE: &str = include_str!("../scripts/complete.lua");
    /// Release the key under the token.
    pub const RELEASE: &str = held!("../scripts/release.lua");
    /// Set the resource id under the token.
    pub const SAVE_RESOURCE_ID: &str = held!("../scripts/save_resource_id.lua");
    /// Move the lease's end under the token.
    pub const EXTEND: &str = held!("../scripts/extend.lua");
    /// Replace a record if it still holds what the client read.
    pub const SWAP: &str = include_str!("../scripts/swap.lua");
}

/// Store the outcome under the token.
pub(crate) static COMPLETE: LazyLock<Script> = LazyLock::new(|| Script::new(sources::COMPLETE));
/// Release the key under the token.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(sources::RELEASE));
/// Set the resource id under the token.
pub(crate) static SAVE_RESOURCE_ID: LazyLock<Script> =
    LazyLock::new(|| Script::new(sources::SAVE_RESOURCE_ID));
/// Move the lease's end under the token.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(sources::EXTEND));
/// Replace a record if it still holds what the client read.
pub(crate) static SWAP: LazyLock<Script> = LazyLock::new(|| Script::new(sources::SWAP));
