//! The store's own vocabulary: record states and outcomes, why a record was
//! taken over, listings, counts and purge reports. The store SPI
//! ([`Store`](super::Store), [`AdminStore`](super::AdminStore)) builds them;
//! the engine and the operator API ([`Admin`](crate::ops::Admin)) read them.
//! They live here, below both, so that neither `engine` nor `ops` is needed
//! to implement a store.

use std::fmt;

use super::admin::{CursorError, KeysetPosition};
use crate::RecordId;
use crate::clock::Timestamp;

/// Where a record stands.
///
/// Exhaustive on purpose: a state added to the machine must fail to compile
/// in every backend that branches on it, not slip through a `_ =>` arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordState {
    /// An attempt holds the lease (or held it and vanished: the lease tells).
    InFlight,
    /// The last attempt failed transiently; the same fingerprint may claim again.
    Released,
    /// The outcome is stored (the body may already be dropped).
    Completed,
}

impl RecordState {
    /// The stable text backends store (`in_flight`, `released`, `completed`).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::InFlight => "in_flight",
            Self::Released => "released",
            Self::Completed => "completed",
        }
    }

    /// Parses [`RecordState::as_str`]; `None` for anything else.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "in_flight" => Some(Self::InFlight),
            "released" => Some(Self::Released),
            "completed" => Some(Self::Completed),
            _ => None,
        }
    }
}

/// What a completed record holds. Exhaustive, like [`RecordState`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutcomeKind {
    /// The work succeeded; the body is its encoded value.
    Success,
    /// The work failed permanently; the body is its encoded error.
    Failure,
    /// The work finished but its response could not be stored (larger than
    /// `max_response_bytes`, or not encodable): no body, only the key.
    NotStored,
}

impl OutcomeKind {
    /// The stable text backends store (`success`, `failure`, `not_stored`).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Failure => "failure",
            Self::NotStored => "not_stored",
        }
    }

    /// Parses [`OutcomeKind::as_str`]; `None` for anything else.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "success" => Some(Self::Success),
            "failure" => Some(Self::Failure),
            "not_stored" => Some(Self::NotStored),
            _ => None,
        }
    }
}

/// Why an attempt took a record over ([`Attempt::recovery_reason`](crate::Attempt::recovery_reason)).
/// Exhaustive, like [`RecordState`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TakeoverReason {
    /// The previous attempt's lease ended without an outcome: its fate is
    /// *unknown*, so the work must reconcile before acting.
    LeaseExpired,
    /// The previous attempt failed transiently and released the key.
    Released,
}

impl TakeoverReason {
    /// The stable text a backend may store or return (`lease_expired`,
    /// `released`).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::LeaseExpired => "lease_expired",
            Self::Released => "released",
        }
    }

    /// Parses [`TakeoverReason::as_str`]; `None` for anything else.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "lease_expired" => Some(Self::LeaseExpired),
            "released" => Some(Self::Released),
            _ => None,
        }
    }
}

/// What a purge removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeReport {
    /// Records whose key expired and that were deleted.
    pub keys_removed: u64,
    /// Records whose body expired and was dropped (the key stays).
    pub bodies_dropped: u64,
}

impl PurgeReport {
    /// Adds `other` to this total (saturating).
    pub(crate) fn add(&mut self, other: Self) {
        self.keys_removed = self.keys_removed.saturating_add(other.keys_removed);
        self.bodies_dropped = self.bodies_dropped.saturating_add(other.bodies_dropped);
    }
}

/// Where a listing stopped; pass it back to get the next page.
///
/// Opaque: each backend writes its own position into it (a keyset position
/// on SQL, a `SCAN` cursor per node on Redis). It is plain text, so a script
/// can carry it between runs of the command-line tool.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Cursor(String);

impl Cursor {
    /// A cursor from its text (as printed by [`Cursor::as_str`]).
    #[must_use]
    pub fn new(text: impl Into<String>) -> Self {
        Self(text.into())
    }

    /// The cursor's text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A keyset position after the record `(lease_until, id)`: the cursor of
    /// the SQL backends and of [`MemoryStore`](crate::MemoryStore), which list
    /// in `(lease_until, owner, operation, key)` order.
    #[must_use]
    pub fn keyset(lease_until: Timestamp, id: &RecordId) -> Self {
        let position = serde_json::json!([
            lease_until.as_unix_millis(),
            id.owner(),
            id.operation(),
            id.key().as_str()
        ]);
        Self(position.to_string())
    }

    /// Reads a position written by [`Cursor::keyset`].
    ///
    /// # Errors
    ///
    /// [`CursorError`] when the text is not such a position.
    pub fn keyset_position(&self) -> Result<KeysetPosition, CursorError> {
        let (lease, owner, operation, key): (i64, String, String, String) =
            serde_json::from_str(&self.0).map_err(|_| CursorError)?;
        Ok(KeysetPosition {
            lease_until: Timestamp::from_unix_millis(lease),
            owner,
            operation,
            key,
        })
    }
}

impl fmt::Debug for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Cursor").field(&self.0).finish()
    }
}

/// A record as an operator sees it in a listing (never its body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordSummary {
    /// Its identity.
    pub id: RecordId,
    /// Its state.
    pub state: RecordState,
    /// Attempts so far.
    pub attempt: u32,
    /// When its lease ends (or ended).
    pub lease_until: Timestamp,
    /// Its resource id (saved by an attempt, or given at completion).
    pub resource_id: Option<String>,
    /// When its key is forgotten.
    pub key_expires_at: Timestamp,
}

/// One page of a listing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Page {
    /// The records of this page.
    pub records: Vec<RecordSummary>,
    /// Where to continue; `None` when the listing is complete.
    pub next: Option<Cursor>,
}

impl Page {
    /// A page of a keyset listing, for stores that list in
    /// `(lease_until, owner, operation, key)` order: `records` are up to
    /// `limit + 1` records fetched from where the cursor stopped; one past
    /// `limit` is dropped and only says that the listing goes on, from the
    /// last record kept ([`Cursor::keyset`]).
    #[must_use]
    pub fn keyset(mut records: Vec<RecordSummary>, limit: u32) -> Self {
        let limit = usize::try_from(limit.max(1)).unwrap_or(usize::MAX);
        let next = if records.len() > limit {
            records.truncate(limit);
            records
                .last()
                .map(|last| Cursor::keyset(last.lease_until, &last.id))
        } else {
            None
        };
        Self { records, next }
    }
}

/// How many live records a store holds, by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateCounts {
    /// In flight (including `stuck`).
    pub in_flight: u64,
    /// In flight with a lease that has ended: a crash nobody retried yet.
    pub stuck: u64,
    /// Released after a transient failure.
    pub released: u64,
    /// Completed.
    pub completed: u64,
    /// Whose key expired but that are still stored, waiting for a purge.
    /// Always 0 on a store with native expiry: there, a record whose key
    /// expired on the engine's clock but that the server has not dropped yet
    /// is counted in no state (the engine already treats it as absent).
    pub expired: u64,
}
