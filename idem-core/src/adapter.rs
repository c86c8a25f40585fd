//! The adapter API: the engine's hooks for code that runs it on its own
//! terms, and the fingerprint it claims with.
//!
//! An application calls [`Idem::execute`](crate::Idem::execute) or
//! [`Idem::begin`](crate::Idem::begin) and never needs this module. An
//! adapter does, in two cases:
//!
//! * **Its own fingerprint.** An HTTP layer hashes the method, route, query
//!   and body itself: it builds a [`Prepared`] from its [`Fingerprint`](crate::store::Fingerprint) and
//!   calls [`EngineExt::begin_prepared`].
//! * **Its own connection.** A transactional mode claims and completes
//!   inside the caller's database transaction: [`EngineExt::ticket`] gives
//!   the claim to send, [`EngineExt::settle`] reads the store's answer, and
//!   [`ClaimExt::into_pending`] gives the completion to write before the
//!   commit.
//!
//! * **Its own answer.** An adapter that answers with its handler's result
//!   ends the claim with [`ClaimExt::settle`], which says whether that
//!   answer may go out, and lets
//!   [`Attempt::renewing`](crate::Attempt::renewing) keep the lease of a
//!   handler that outlives it.
//!
//! * **Its own builder.** The webhook receiver and the queue consumer
//!   collect a record scope with [`ScopeSetting`] and their answer to a
//!   permanent failure with [`PermanentFailurePolicy`].
//!
//! The hooks are methods of two sealed extension traits, [`EngineExt`] (on
//! [`Idem`](crate::Idem)) and [`ClaimExt`] (on [`Claim`](crate::Claim)),
//! in the way `object_store` keeps its conveniences on `ObjectStoreExt`:
//! import them on purpose; nothing outside this crate implements them.

pub use crate::builder::{PermanentFailurePolicy, ScopeSetting, ScopeSettingError};
pub use crate::engine::adapter::{
    ClaimExt, ClaimTicket, EngineExt, PendingCompletion, Prepared, Settle, Settled,
};
pub use crate::fingerprint::value::canonical_json;
pub use crate::fingerprint::{MAX_REQUEST_DEPTH, fingerprint, fingerprint_raw, sha256_hex};
