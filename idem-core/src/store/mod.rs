//! The `Store` trait: the atomic operations a backend performs.
//!
//! # Contract
//!
//! The engine decides; a store only performs atomic transitions. Every method
//! is **one** atomic operation on the backend (one statement, one script, one
//! critical section) and, for writes guarded by a [`Token`], changes nothing
//! unless the record is `in_flight` under exactly that token. Stores never read
//! a clock to decide: `now` and every deadline come in from the engine. A
//! native TTL may be set from those deadlines, purely as garbage collection.
//!
//! A record is addressed by its [`RecordId`] `(owner, operation, key)`; two ids
//! that differ in any part never share a record.
//!
//! Every backend proves this contract by running the conformance suite in
//! `testkit` (feature `testkit`) against a real server.
//!
//! # Implementing a Store
//!
//! [`MemoryStore`](crate::MemoryStore) (`store/memory.rs`) is the
//! reference implementation: read it first. A new backend (MySQL, DynamoDB,
//! ...) needs:
//!
//! 1. **An atomic claim.** One conditional write that inserts the record or
//!    takes it over, guarded by a unique key: `INSERT … ON CONFLICT`, a Lua
//!    script, a conditional `PutItem`. Never a read followed by a separate
//!    insert. The rule it implements is [`StoredRecord::is_expired`] (an
//!    expired key is a new operation, but never while a lease holds) and
//!    [`StoredRecord::takeover_reason`] (released, or lease expired, with the
//!    same fingerprint). Encode the reason with [`TakeoverReason::as_str`] if
//!    it travels as text.
//! 2. **Races.** A backend whose claim is "conditional write, then read the
//!    standing record" can lose a race between the two (the record changed in
//!    between, and is claimable after all). Run the claim again through
//!    [`retry_claim_race`], which bounds it and classifies exhaustion as
//!    [`StoreError::Unavailable`] like every other backend.
//! 3. **Token-guarded writes.** `complete`, `release`, `save_resource_id` and
//!    `extend_lease` change the record only if it is `in_flight` under the
//!    caller's [`Token`] (one conditional update each); otherwise
//!    [`StoreError::LeaseLost`].
//! 4. **Decoding.** Build each [`StoredRecord`] through
//!    [`StoredRecord::validate`], and parse states with
//!    [`RecordState::parse`] / [`OutcomeKind::parse`]: anything else is
//!    [`StoreError::Corrupt`], never a panic.
//! 5. **Errors.** [`StoreError::Unavailable`] only for what a retry can fix
//!    (connection lost, timeout, contention): the engine retries it and
//!    answers 503. Everything else is [`StoreError::Backend`] (500, not
//!    retried).
//! 6. **Proof.** Implement [`AdminStore`] too (the conformance suite, like
//!    [`AnyStore`](crate::AnyStore), runs the operator scenarios), then
//!    implement `testkit::Fixture` and expand
//!    `idem_core::store_conformance!(setup())` in the backend's tests, against
//!    a real server.
//!
//! The inputs ([`ClaimRequest`], [`Completion`]) are `#[non_exhaustive]`
//! (a field added later does not break a backend); the state enums
//! ([`RecordState`], [`OutcomeKind`], [`ClaimOutcome`], [`TakeoverReason`])
//! are exhaustive (a state added later must not compile silently).
//!
//! Wrappers (metrics, fault injection) forward every method; put
//! `#[deny(clippy::missing_trait_methods)]` on the impl so a method added
//! later cannot be forgotten. This one counts claims:
//!
//! ```
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use idem_core::store::*;
//! use idem_core::{Idem, MemoryStore, Outcome, RecordId, Scope};
//! use idem_core::clock::Timestamp;
//! use idem_core::store::PurgeReport;
//!
//! #[derive(Debug, Default)]
//! struct Counted { inner: MemoryStore, claims: AtomicU64 }
//!
//! impl Store for Counted {
//!     async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
//!         self.claims.fetch_add(1, Ordering::Relaxed);
//!         self.inner.claim(req).await
//!     }
//!     async fn complete(&self, id: &RecordId, t: Token, c: &Completion<'_>) -> Result<(), StoreError> {
//!         self.inner.complete(id, t, c).await
//!     }
//!     async fn release(&self, id: &RecordId, t: Token, now: Timestamp) -> Result<(), StoreError> {
//!         self.inner.release(id, t, now).await
//!     }
//!     async fn save_resource_id(&self, id: &RecordId, t: Token, r: &str) -> Result<(), StoreError> {
//!         self.inner.save_resource_id(id, t, r).await
//!     }
//!     async fn extend_lease(&self, id: &RecordId, t: Token, until: Timestamp) -> Result<(), StoreError> {
//!         self.inner.extend_lease(id, t, until).await
//!     }
//!     async fn fetch(&self, id: &RecordId, now: Timestamp) -> Result<Option<StoredRecord>, StoreError> {
//!         self.inner.fetch(id, now).await
//!     }
//!     async fn purge_expired(&self, now: Timestamp, limit: u32) -> Result<PurgeReport, StoreError> {
//!         self.inner.purge_expired(now, limit).await
//!     }
//!     fn capabilities(&self) -> Capabilities {
//!         self.inner.capabilities()
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
//! let idem = Idem::new(Counted::default());
//! let scope = Scope::new("acct", "POST /x")?;
//! for _ in 0..2 {
//!     idem.execute(&scope, "k", &1, |_| async { Outcome::<_, String>::Success(String::new()) }).await?;
//! }
//! assert_eq!(idem.store().claims.load(Ordering::Relaxed), 2); // one claim per call
//! # Ok(()) }
//! ```
//!
//! Then prove it: in the backend's tests, implement
//! `idem_core::testkit::Fixture` and expand `idem_core::store_conformance!`.

/// The methods of [`Store`] (`store { .. }`) and of [`AdminStore`]
/// (`admin { .. }`), but `capabilities`: each with its parameters after
/// `&self` and what it answers on success. Written once here and handed to
/// `$then!` (after the tokens `$pre`) by the impls that forward every call to
/// another store. `$a` is the lifetime of every borrow: `'_` for impls of the
/// traits themselves, a named one for the boxed mirror behind [`AnyStore`].
macro_rules! store_methods {
    ($then:ident { $($pre:tt)* } $a:lifetime) => {
        $then! {
            $($pre)*
            store {
                claim(req: &$a ClaimRequest<$a>) -> ClaimOutcome;
                complete(id: &$a RecordId, token: Token, completion: &$a Completion<$a>) -> ();
                release(id: &$a RecordId, token: Token, now: Timestamp) -> ();
                save_resource_id(id: &$a RecordId, token: Token, resource_id: &$a str) -> ();
                extend_lease(id: &$a RecordId, token: Token, lease_until: Timestamp) -> ();
                fetch(id: &$a RecordId, now: Timestamp) -> Option<StoredRecord>;
                purge_expired(now: Timestamp, limit: u32) -> PurgeReport;
            }
            admin {
                list_in_flight(query: &$a InFlightQuery<$a>) -> Page;
                release_in_flight(id: &$a RecordId, attempt: Option<u32>, now: Timestamp) -> bool;
                delete_completed(id: &$a RecordId, now: Timestamp) -> bool;
                count_states(now: Timestamp) -> StateCounts;
            }
        }
    };
}
pub(crate) use store_methods;

mod admin;
pub(crate) mod any;
pub(crate) mod memory;
mod race;
pub(crate) mod record;

pub use self::admin::{AdminStore, CursorError, InFlightQuery, KeysetPosition};
pub use self::race::{CLAIM_RACE_TRIES, retry_claim_race};
pub use self::record::{
    Cursor, OutcomeKind, Page, PurgeReport, RecordState, RecordSummary, StateCounts,
};
pub use crate::fingerprint::Fingerprint;
pub use crate::util::BoxDynError;

/// Whether a store coalesces concurrent calls: the SQL stores' claims and
/// completions (each store's `with_coalescing`), the commands a Redis store
/// sends on its standalone connection (`RedisStore::with_coalescing`). The
/// default is each store's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coalescing {
    /// Every call goes on its own.
    Off,
    /// A call goes at once, alone, while the store is not busy (a SQL store:
    /// a connection of its own pool is free and no more calls are under way
    /// than it has connections, or than two on SQLite, and a store on your
    /// sqlx pool never coalesces; Redis: at most 16 calls are under way on
    /// the connection); calls that find the store busy wait together
    /// and go as one batch (one statement, transaction or pipeline). While
    /// a store is busy, every call waits, so that batches grow with the
    /// load: a SQL store runs only a few batches at once, a Redis store
    /// sends whatever has gathered each time its gathering task runs.
    WhenBusy,
    /// Every call waits for a batch, even when the store is idle: a batch of
    /// one when nothing else waits. For tests that run every answer through
    /// the batched path; it adds a queue's hand-over to every call.
    Always,
}

/// Reports that one statement (or one transaction) of store `backend`
/// carried `calls` calls of kind `call` (`claim`, `complete`; `command` for a
/// Redis pipeline, which carries calls of every kind), and whether
/// they `waited` for a connection (a batch of calls that found the store's
/// pool busy) or went at once: the histogram `idem_store_batch_size` and
/// the counter `idem_store_calls_coalesced_total` under the `metrics`
/// feature, nothing without it. A store that coalesces concurrent calls
/// reports every statement it sends, 1 for a call that went alone.
pub fn record_batch(backend: &'static str, call: &'static str, calls: usize, waited: bool) {
    crate::metrics::record_batch(backend, call, calls, waited);
}

use std::fmt;
use std::future::Future;

use self::record::TakeoverReason;
use crate::RecordId;
use crate::clock::Timestamp;

/// A fencing token: whoever holds the record's current token may complete,
/// release or extend it or save its resource id; anybody else is refused.
///
/// Tokens are random 63-bit values (they fit a signed 64-bit column), made by
/// the engine for every claim and takeover.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token(u64);

impl Token {
    /// A fresh token in `1..2^63`.
    ///
    /// A 64-bit seed is read from the operating system once per process;
    /// each token is then the next step of a SplitMix64 sequence from that
    /// seed, cut to 63 bits. A token only has to differ from the one that
    /// held the record before, which this gives with probability
    /// 1 - 2^-63, without a system call per claim.
    #[must_use]
    pub fn random() -> Self {
        use std::sync::OnceLock;
        use std::sync::atomic::{AtomicU64, Ordering};
        static SEED: OnceLock<u64> = OnceLock::new();
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let seed = *SEED.get_or_init(|| u64::from_be_bytes(crate::util::random_bytes::<8>()));
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let mut z = seed.wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Self((z >> 1).max(1))
    }

    /// From a stored value. Backends store it as a signed 64-bit integer.
    #[must_use]
    pub const fn from_i64(v: i64) -> Self {
        Self(v.cast_unsigned())
    }

    /// As a signed 64-bit integer (always non-negative for engine-made tokens).
    #[must_use]
    pub const fn as_i64(self) -> i64 {
        self.0.cast_signed()
    }
}

#[cfg(test)]
mod tests {
    use super::Token;

    #[test]
    fn tokens_are_distinct_positive_and_spread() {
        let tokens: std::collections::HashSet<i64> =
            (0..100_000).map(|_| Token::random().as_i64()).collect();
        assert_eq!(tokens.len(), 100_000);
        assert!(tokens.iter().all(|&t| t > 0));
        let high = tokens.iter().filter(|&&t| t > i64::MAX / 2).count();
        assert!((40_000..60_000).contains(&high), "not spread: {high}");
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({:016x})", self.0)
    }
}

/// A claim as the engine asks for it.
///
/// Built by the engine, read by stores: `#[non_exhaustive]` so that a field
/// added later does not break a backend.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ClaimRequest<'a> {
    /// The record.
    pub id: &'a RecordId,
    /// The request's fingerprint.
    pub fingerprint: Fingerprint,
    /// The token this attempt will hold if it wins.
    pub token: Token,
    /// The engine's time.
    pub now: Timestamp,
    /// The lease's end if claimed.
    pub lease_until: Timestamp,
    /// When the key may be forgotten (garbage collection of a new record).
    pub key_expires_at: Timestamp,
}

impl<'a> ClaimRequest<'a> {
    /// A claim from its parts, for store tests and benches (the engine
    /// builds its own through
    /// [`EngineExt::ticket`](crate::adapter::EngineExt::ticket)).
    #[must_use]
    pub fn new(
        id: &'a RecordId,
        fingerprint: Fingerprint,
        token: Token,
        now: Timestamp,
        lease_until: Timestamp,
        key_expires_at: Timestamp,
    ) -> Self {
        Self {
            id,
            fingerprint,
            token,
            now,
            lease_until,
            key_expires_at,
        }
    }
}

/// The previous attempt, when a claim took a record over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Previous {
    /// Why the record could be taken over.
    pub reason: TakeoverReason,
    /// The resource id an earlier attempt saved.
    pub resource_id: Option<String>,
}

/// The claim was won.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// Attempt number: 1 for a new record, previous + 1 for a takeover.
    pub attempt: u32,
    /// Set when the claim took over a released or lease-expired record.
    pub previous: Option<Previous>,
}

/// The answer to a claim. Exhaustive, like [`RecordState`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The caller now holds the record under its token.
    Claimed(Claimed),
    /// Another record stands; the engine decides what the caller gets.
    Existing(StoredRecord),
}

/// A record as read back from a store.
#[derive(Clone, PartialEq, Eq)]
pub struct StoredRecord {
    /// The fingerprint of the request that created (or last claimed) it.
    pub fingerprint: Fingerprint,
    /// Its state.
    pub state: RecordState,
    /// Attempts so far.
    pub attempt: u32,
    /// End of the current lease (meaningful while `in_flight`).
    pub lease_until: Timestamp,
    /// Resource id: the last one saved, or the id given at completion.
    pub resource_id: Option<String>,
    /// The outcome, once completed.
    pub outcome: Option<OutcomeKind>,
    /// The stored body, only while `now < response_expires_at`.
    pub response: Option<Vec<u8>>,
    /// When the body is dropped (completed records).
    pub response_expires_at: Option<Timestamp>,
    /// When the key is forgotten.
    pub key_expires_at: Timestamp,
}

impl StoredRecord {
    /// Whether the record counts as absent at `now`: its key expired and no
    /// attempt holds a lease on it. An `in_flight` record whose lease still
    /// runs is never expired, whatever `key_expires_at` says (a lease is
    /// never outlived by its key).
    #[must_use]
    pub fn is_expired(&self, now: Timestamp) -> bool {
        self.key_expires_at <= now
            && !(self.state == RecordState::InFlight && self.lease_until > now)
    }

    /// The claim rule every backend implements, as a reference: why a claim
    /// for `fingerprint` at `now` may take this (unexpired) record over, or
    /// `None` when the record stands and the caller gets it back.
    ///
    /// * same fingerprint and `released` → [`TakeoverReason::Released`];
    /// * same fingerprint, `in_flight` and `lease_until <= now` →
    ///   [`TakeoverReason::LeaseExpired`];
    /// * anything else → `None`.
    #[must_use]
    pub fn takeover_reason(
        &self,
        fingerprint: &Fingerprint,
        now: Timestamp,
    ) -> Option<TakeoverReason> {
        if self.fingerprint != *fingerprint {
            return None;
        }
        match self.state {
            RecordState::Released => Some(TakeoverReason::Released),
            RecordState::InFlight if self.lease_until <= now => Some(TakeoverReason::LeaseExpired),
            RecordState::InFlight | RecordState::Completed => None,
        }
    }

    /// Checks the invariants a decoded record must hold, for backends that
    /// assemble one from columns or fields: a completed record has an
    /// outcome; a record that is not completed has none; the attempt count
    /// is at least 1; a `not_stored` outcome has no body.
    ///
    /// # Errors
    ///
    /// [`StoreError::Corrupt`] naming the broken invariant.
    pub fn validate(self, backend: &'static str) -> Result<Self, StoreError> {
        let corrupt = |detail: &str| StoreError::Corrupt {
            backend,
            detail: detail.to_owned(),
        };
        match (self.state, self.outcome) {
            (RecordState::Completed, None) => return Err(corrupt("completed without an outcome")),
            (RecordState::InFlight | RecordState::Released, Some(_)) => {
                return Err(corrupt("an outcome on a record that is not completed"));
            }
            _ => {}
        }
        if self.attempt == 0 {
            return Err(corrupt("attempt 0"));
        }
        if self.outcome == Some(OutcomeKind::NotStored) && self.response.is_some() {
            return Err(corrupt("a body on a not_stored outcome"));
        }
        Ok(self)
    }
}

impl fmt::Debug for StoredRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredRecord")
            .field("fingerprint", &self.fingerprint)
            .field("state", &self.state)
            .field("attempt", &self.attempt)
            .field("lease_until", &self.lease_until)
            .field("has_resource_id", &self.resource_id.is_some())
            .field("outcome", &self.outcome)
            .field("response_len", &self.response.as_ref().map(Vec::len))
            .field("response_expires_at", &self.response_expires_at)
            .field("key_expires_at", &self.key_expires_at)
            .finish()
    }
}

/// The outcome to store. Built by the engine, read by stores
/// (`#[non_exhaustive]`, like [`ClaimRequest`]).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Completion<'a> {
    /// What kind of outcome.
    pub outcome: OutcomeKind,
    /// The encoded response (`None` for [`OutcomeKind::NotStored`]).
    pub body: Option<&'a [u8]>,
    /// The resource id; `None` keeps the last one saved.
    pub resource_id: Option<&'a str>,
    /// The engine's time.
    pub now: Timestamp,
    /// When the body is dropped.
    pub response_expires_at: Timestamp,
    /// When the key is forgotten.
    pub key_expires_at: Timestamp,
}

impl<'a> Completion<'a> {
    /// A completion from its parts, for store tests and benches.
    #[must_use]
    pub fn new(
        outcome: OutcomeKind,
        body: Option<&'a [u8]>,
        resource_id: Option<&'a str>,
        now: Timestamp,
        response_expires_at: Timestamp,
        key_expires_at: Timestamp,
    ) -> Self {
        Self {
            outcome,
            body,
            resource_id,
            now,
            response_expires_at,
            key_expires_at,
        }
    }
}

/// A [`Completion`] that owns its body and resource id: what a caller keeps
/// to write later (the engine's completions written again in the
/// background, a SQL store's completions waiting for a batch).
#[derive(Debug, Clone)]
pub struct OwnedCompletion {
    outcome: OutcomeKind,
    body: Option<Vec<u8>>,
    resource_id: Option<String>,
    now: Timestamp,
    response_expires_at: Timestamp,
    key_expires_at: Timestamp,
}

impl OwnedCompletion {
    /// A copy of `c`.
    #[must_use]
    pub fn of(c: &Completion<'_>) -> Self {
        Self {
            outcome: c.outcome,
            body: c.body.map(<[u8]>::to_vec),
            resource_id: c.resource_id.map(str::to_owned),
            now: c.now,
            response_expires_at: c.response_expires_at,
            key_expires_at: c.key_expires_at,
        }
    }

    /// The completion, as [`Store::complete`] takes it.
    #[must_use]
    pub fn completion(&self) -> Completion<'_> {
        Completion {
            outcome: self.outcome,
            body: self.body.as_deref(),
            resource_id: self.resource_id.as_deref(),
            now: self.now,
            response_expires_at: self.response_expires_at,
            key_expires_at: self.key_expires_at,
        }
    }
}

/// What a backend can do beyond the contract.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Expired records vanish on their own (e.g. Redis TTLs);
    /// [`Store::purge_expired`] then has nothing to do and reports zero.
    pub native_expiry: bool,
}

impl Capabilities {
    /// No optional capability.
    #[must_use]
    pub const fn none() -> Self {
        Self {
            native_expiry: false,
        }
    }

    /// Expired records vanish on their own.
    #[must_use]
    pub const fn native_expiry() -> Self {
        Self {
            native_expiry: true,
        }
    }
}

/// A store failure, classified for the engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The token no longer holds the record: another attempt took it over,
    /// or it is no longer `in_flight`. Permanent for this attempt.
    #[error("the lease was lost to another attempt")]
    LeaseLost,
    /// The backend could not be reached or timed out (connection refused or
    /// reset, pool timeout). Temporary: the call may be retried.
    #[error("{backend} store unavailable")]
    Unavailable {
        /// Which backend.
        backend: &'static str,
        /// The driver's error.
        #[source]
        source: BoxDynError,
    },
    /// A stored record cannot be decoded (unknown state, wrong-length
    /// fingerprint, garbage). Permanent until repaired by hand.
    #[error("{backend} holds a corrupted record: {detail}")]
    Corrupt {
        /// Which backend.
        backend: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// A listing cursor this store did not write (see
    /// [`CursorError`]): the caller's input, answered 400 and not retried.
    #[error("the cursor is not one this store wrote")]
    InvalidCursor,
    /// Any other backend error: a failed statement, a missing table, a
    /// permission error. Not temporary: the engine does not retry it and
    /// answers 500 (not 503), since sending the request again will not help
    /// until somebody fixes the store.
    #[error("{backend} store error")]
    Backend {
        /// Which backend.
        backend: &'static str,
        /// The driver's error.
        #[source]
        source: BoxDynError,
    },
}

impl StoreError {
    /// Whether the same call may succeed if made again soon: only
    /// [`StoreError::Unavailable`]. The engine retries only these (with the
    /// policy's `store_retries`) and answers them with 503 + `Retry-After`.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }
}

/// The atomic operations of an idempotency store.
///
/// See the [module docs](self) for the contract. Each method's `# Behavior`
/// is checked by the conformance suite.
pub trait Store: Send + Sync + fmt::Debug + 'static {
    /// Claims `req.id` for `req.token`, atomically.
    ///
    /// # Behavior
    ///
    /// * absent, or expired (`key_expires_at <= now` and not `in_flight`
    ///   with `lease_until > now`: a lease is never outlived by its key):
    ///   insert a new `in_flight` record (attempt 1, no resource id, the new
    ///   fingerprint) → `Claimed`.
    /// * same fingerprint and `released`, or `in_flight` with
    ///   `lease_until <= now`: take over with the new token and lease,
    ///   attempt + 1, keeping the resource id → `Claimed` with `previous`.
    /// * whenever it claims, the key is kept at least until the new lease
    ///   ends: `key_expires_at = max(key_expires_at, lease_until)` (and a
    ///   native TTL to match).
    /// * anything else → `Existing(record)`, unchanged; its `response` is
    ///   `None` once `now >= response_expires_at`.
    fn claim(
        &self,
        req: &ClaimRequest<'_>,
    ) -> impl Future<Output = Result<ClaimOutcome, StoreError>> + Send;

    /// Stores the outcome.
    ///
    /// # Behavior
    ///
    /// Only if the record is `in_flight` under `token` (expired lease or not):
    /// state `completed`, the outcome, body and expiries set; the resource id
    /// replaced if given. A record already `completed` under `token` answers
    /// `Ok(())` with nothing changed: the engine retries a completion whose
    /// reply was lost (a timeout after the write), and that retry must not
    /// read as a lost lease. Otherwise [`StoreError::LeaseLost`], nothing
    /// changed.
    fn complete(
        &self,
        id: &RecordId,
        token: Token,
        completion: &Completion<'_>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Releases the key after a transient failure.
    ///
    /// # Behavior
    ///
    /// Only if `in_flight` under `token`: state `released`, the resource id and
    /// attempt count kept. Otherwise [`StoreError::LeaseLost`].
    fn release(
        &self,
        id: &RecordId,
        token: Token,
        now: Timestamp,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Saves the record's resource id, a recovery point (e.g. the id of a
    /// charge just created); what
    /// [`Attempt::save_resource_id`](crate::Attempt::save_resource_id) calls.
    ///
    /// # Behavior
    ///
    /// Only if `in_flight` under `token`: the resource id is set. Otherwise
    /// [`StoreError::LeaseLost`].
    fn save_resource_id(
        &self,
        id: &RecordId,
        token: Token,
        resource_id: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Moves the lease's end.
    ///
    /// # Behavior
    ///
    /// Only if `in_flight` under `token`: `lease_until` is set, and the key
    /// is kept at least as long (`key_expires_at = max(key_expires_at,
    /// lease_until)`, with any native TTL moved to match). Otherwise
    /// [`StoreError::LeaseLost`].
    fn extend_lease(
        &self,
        id: &RecordId,
        token: Token,
        lease_until: Timestamp,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Reads a record.
    ///
    /// # Behavior
    ///
    /// `None` when absent or expired (as for `claim`: `key_expires_at <= now`
    /// and no lease holds); the response only while
    /// `now < response_expires_at`.
    fn fetch(
        &self,
        id: &RecordId,
        now: Timestamp,
    ) -> impl Future<Output = Result<Option<StoredRecord>, StoreError>> + Send;

    /// Deletes up to `limit` expired records (as for `claim`), and drops up to
    /// `limit` bodies whose response expired (the key rows stay).
    ///
    /// # Behavior
    ///
    /// Bounded: never touches more than `limit` records of each kind per call,
    /// so callers loop until the report is zero. Stores with
    /// [`Capabilities::native_expiry`] report zero.
    fn purge_expired(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> impl Future<Output = Result<PurgeReport, StoreError>> + Send;

    /// What this backend can do beyond the contract.
    fn capabilities(&self) -> Capabilities;
}

/// A shared store is a store (and an admin store, when it is one):
/// `Idem::new(Arc::clone(&store))` lets other code keep its own handle.
macro_rules! shared_store {
    (
        store { $($m:ident($($p:ident: $t:ty),*) -> $o:ty;)* }
        admin { $($am:ident($($ap:ident: $at:ty),*) -> $ao:ty;)* }
    ) => {
        #[deny(clippy::missing_trait_methods)]
        impl<S: Store> Store for std::sync::Arc<S> {
            $(
                fn $m(&self, $($p: $t),*) -> impl Future<Output = Result<$o, StoreError>> + Send {
                    S::$m(self, $($p),*)
                }
            )*
            fn capabilities(&self) -> Capabilities {
                S::capabilities(self)
            }
        }

        impl<S: AdminStore> AdminStore for std::sync::Arc<S> {
            $(
                fn $am(
                    &self,
                    $($ap: $at),*
                ) -> impl Future<Output = Result<$ao, StoreError>> + Send {
                    S::$am(self, $($ap),*)
                }
            )*
        }
    };
}

store_methods!(shared_store {} '_);
