//! Decoding, once for every SQL store: a stored record, an operator
//! listing's summary and the state counts, from the columns every dialect's
//! statements return under the same names.

use std::fmt::Display;

use idem_core::clock::Timestamp;
use idem_core::store::Fingerprint;
use idem_core::store::{OutcomeKind, RecordState, RecordSummary, StateCounts};
use idem_core::store::{StoreError, StoredRecord};
use idem_core::{IdempotencyKey, RecordId, Scope};
use sqlx::{ColumnIndex, Decode, Row, Type};

/// Why a row could not be decoded.
#[derive(Debug)]
pub enum RowError {
    /// The driver could not read a column.
    Sqlx(sqlx::Error),
    /// A value no record can hold (never the key or the body).
    Corrupt(String),
}

impl From<sqlx::Error> for RowError {
    fn from(e: sqlx::Error) -> Self {
        Self::Sqlx(e)
    }
}

/// Enough of a corrupted value to recognise it in a log, not more.
#[must_use]
pub fn truncate(s: &str) -> &str {
    s.char_indices().nth(32).map_or(s, |(i, _)| &s[..i])
}

/// The `attempt` column (of the dialect's integer type `A`), refusing one
/// a record cannot hold.
///
/// # Errors
///
/// The driver's, or [`RowError::Corrupt`] for a negative or too large value.
pub fn attempt_of<'r, R, A>(row: &'r R) -> Result<u32, RowError>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    A: Decode<'r, R::Database> + Type<R::Database> + TryInto<u32> + Display + Copy,
{
    let attempt: A = row.try_get("attempt")?;
    attempt
        .try_into()
        .map_err(|_| RowError::Corrupt(format!("attempt {attempt} out of range")))
}

/// A record from a row of the claim or `fetch` statements, refusing
/// anything a record cannot hold; `A` is the dialect's type of the
/// `attempt` column.
///
/// # Errors
///
/// The driver's, or [`RowError::Corrupt`].
pub fn decode_record<'r, R, A>(row: &'r R, backend: &'static str) -> Result<StoredRecord, RowError>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    A: Decode<'r, R::Database> + Type<R::Database> + TryInto<u32> + Display + Copy,
    Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
    String: Decode<'r, R::Database> + Type<R::Database>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let fp: Vec<u8> = row.try_get("fingerprint")?;
    let fingerprint = Fingerprint::from_slice(&fp)
        .map_err(|len| RowError::Corrupt(format!("fingerprint is {len} bytes, not 32")))?;
    let state = state_of(row)?;
    let outcome = match row.try_get::<Option<String>, _>("outcome")? {
        None => None,
        Some(o) => Some(
            OutcomeKind::parse(&o)
                .ok_or_else(|| RowError::Corrupt(format!("unknown outcome {:?}", truncate(&o))))?,
        ),
    };
    StoredRecord {
        fingerprint,
        state,
        attempt: attempt_of::<R, A>(row)?,
        lease_until: Timestamp::from_unix_millis(row.try_get("lease_until")?),
        resource_id: row.try_get("resource_id")?,
        outcome,
        response: row.try_get("response")?,
        response_expires_at: row
            .try_get::<Option<i64>, _>("response_expires_at")?
            .map(Timestamp::from_unix_millis),
        key_expires_at: Timestamp::from_unix_millis(row.try_get("key_expires_at")?),
    }
    .validate(backend)
    .map_err(|e| match e {
        StoreError::Corrupt { detail, .. } => RowError::Corrupt(detail),
        other => RowError::Corrupt(other.to_string()),
    })
}

/// The `state` column.
fn state_of<'r, R>(row: &'r R) -> Result<RecordState, RowError>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    String: Decode<'r, R::Database> + Type<R::Database>,
{
    let state: String = row.try_get("state")?;
    RecordState::parse(&state)
        .ok_or_else(|| RowError::Corrupt(format!("unknown state {:?}", truncate(&state))))
}

/// A record's summary from a row of the operator listing; `text` reads the
/// identity columns (`owner`, `operation`, `key`) as the dialect stores
/// them, and `A` is its type of the `attempt` column.
///
/// # Errors
///
/// The driver's, or [`RowError::Corrupt`].
pub fn decode_summary<'r, R, A>(
    row: &'r R,
    text: impl Fn(&'r R, &'static str) -> Result<String, RowError>,
) -> Result<RecordSummary, RowError>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    A: Decode<'r, R::Database> + Type<R::Database> + TryInto<u32> + Display + Copy,
    String: Decode<'r, R::Database> + Type<R::Database>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let corrupt = |what: &str, e: &dyn Display| RowError::Corrupt(format!("stored {what}: {e}"));
    let scope = Scope::new(text(row, "owner")?, text(row, "operation")?)
        .map_err(|e| corrupt("scope", &e))?;
    let key = IdempotencyKey::parse_exact(&text(row, "key")?).map_err(|e| corrupt("key", &e))?;
    Ok(RecordSummary {
        id: RecordId::new(scope, key),
        state: state_of(row)?,
        attempt: attempt_of::<R, A>(row)?,
        lease_until: Timestamp::from_unix_millis(row.try_get("lease_until")?),
        resource_id: row.try_get("resource_id")?,
        key_expires_at: Timestamp::from_unix_millis(row.try_get("key_expires_at")?),
    })
}

/// Checks that the row read by its primary key ([`record_key`](crate::record_key))
/// holds the identity `id`: its `owner`, `operation` and `key` columns, read
/// borrowed as `T` (`&str` for a text column, `&[u8]` for a binary one) and
/// compared byte for byte, with no copy.
///
/// # Errors
///
/// [`RowError::Corrupt`] when it holds another identity (two identities
/// sharing the first 16 bytes of their digest: never a wrong replay); the
/// driver's when a column cannot be read.
pub fn check_identity<'r, R, T>(row: &'r R, id: &RecordId) -> Result<(), RowError>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    T: Decode<'r, R::Database> + Type<R::Database> + AsRef<[u8]>,
{
    let holds = |col: &'static str, want: &str| -> Result<bool, RowError> {
        let stored: T = row.try_get(col)?;
        Ok(stored.as_ref() == want.as_bytes())
    };
    let same = holds("owner", id.owner())?
        && holds("operation", id.operation())?
        && holds("key", id.key().as_str())?;
    if same {
        Ok(())
    } else {
        Err(RowError::Corrupt(format!(
            "another record identity shares this one's 16-byte key ({})",
            id.log_hash()
        )))
    }
}

/// Which record of a batch a row names by its `id` column (its primary key,
/// [`record_key`](crate::record_key)), among the batch's `keys`.
///
/// # Errors
///
/// The driver's, or [`RowError::Corrupt`] when the row names no record of
/// the batch.
pub fn batch_position<'r, R>(row: &'r R, keys: &[[u8; 16]]) -> Result<usize, RowError>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
{
    let id: Vec<u8> = row.try_get("id")?;
    keys.iter().position(|k| k[..] == id[..]).ok_or_else(|| {
        RowError::Corrupt("a batch's statement returned a row of none of its records".to_owned())
    })
}

/// An identity column stored as text.
///
/// # Errors
///
/// The driver's.
pub fn text<'r, R>(row: &'r R, col: &'static str) -> Result<String, RowError>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    String: Decode<'r, R::Database> + Type<R::Database>,
{
    Ok(row.try_get(col)?)
}

/// The state counts from a row of the counting statement (one `BIGINT`
/// column per state; a negative count reads as 0).
///
/// # Errors
///
/// The driver's.
pub fn decode_counts<'r, R>(row: &'r R) -> Result<StateCounts, sqlx::Error>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
{
    let n = |col: &'static str| -> Result<u64, sqlx::Error> {
        let v: i64 = row.try_get(col)?;
        Ok(u64::try_from(v).unwrap_or(0))
    };
    Ok(StateCounts {
        in_flight: n("in_flight")?,
        stuck: n("stuck")?,
        released: n("released")?,
        completed: n("completed")?,
        expired: n("expired")?,
    })
}
