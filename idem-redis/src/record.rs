//! The record's encoding (layout version 1): one Redis string per record,
//! one per stored body, both read and written whole by native commands, and
//! spliced at fixed offsets by the few Lua scripts that must check a token.
//!
//! Record value (`<prefix>{D}:r`), big-endian integers, offsets from 0 (the
//! scripts use Lua's 1-based positions, one more):
//!
//! | bytes | field |
//! |---|---|
//! | 0 | layout version, `1` |
//! | 1 | state: `f` in flight, `r` released, `c` completed |
//! | 2..10 | fencing token (i64) |
//! | 10..14 | attempt (u32) |
//! | 14..22 | lease end (ms since the epoch, i64) |
//! | 22..30 | key expiry (ms, i64) |
//! | 30..38 | response expiry (ms, i64; meaningful once completed) |
//! | 38..70 | request fingerprint (32 bytes) |
//! | 70 | outcome: `0` none, `s` success, `f` failure, `n` not stored |
//! | 71..73, 73..75, 75..77 | lengths of owner, operation, key (u16) |
//! | 77 | `1` if a resource id follows, else `0` |
//! | 78.. | owner, operation, key (UTF-8), then the resource id (the rest) |
//!
//! Body value (`<prefix>{D}:v`): version `1`, the token of the completion
//! that wrote it (8 bytes), then the body. A body whose token differs from
//! its record's belongs to another completion and is never returned.

use idem_core::RecordId;
use idem_core::adapter::Fingerprint;
use idem_core::clock::Timestamp;
use idem_core::ops::{OutcomeKind, RecordState};
use idem_core::store::{StoreError, StoredRecord, Token};

use crate::error::{BACKEND, corrupt};

/// The layout version, the first byte of every record and body value.
pub(crate) const VERSION: u8 = 1;
/// Bytes before the variable part of a record.
pub(crate) const HEADER: usize = 78;
/// Bytes before the body in a body value.
pub(crate) const BODY_HEADER: usize = 9;

const STATE: usize = 1;
const TOKEN: usize = 2;
const ATTEMPT: usize = 10;
const LEASE: usize = 14;
const KEY_EXPIRY: usize = 22;
const RESPONSE_EXPIRY: usize = 30;
const FINGERPRINT: usize = 38;
const OUTCOME: usize = 70;
const LENGTHS: usize = 71;
const HAS_RESOURCE: usize = 77;

/// The state byte.
pub(crate) const fn state_byte(s: RecordState) -> u8 {
    match s {
        RecordState::InFlight => b'f',
        RecordState::Released => b'r',
        RecordState::Completed => b'c',
    }
}

/// The outcome byte.
pub(crate) const fn outcome_byte(o: OutcomeKind) -> u8 {
    match o {
        OutcomeKind::Success => b's',
        OutcomeKind::Failure => b'f',
        OutcomeKind::NotStored => b'n',
    }
}

/// A record decoded from its value: the [`StoredRecord`] fields plus what
/// only the store needs (the token, the identity).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) state: RecordState,
    pub(crate) token: i64,
    pub(crate) attempt: u32,
    pub(crate) lease_until: i64,
    pub(crate) key_expires_at: i64,
    pub(crate) response_expires_at: i64,
    pub(crate) fingerprint: [u8; 32],
    pub(crate) outcome: Option<OutcomeKind>,
    pub(crate) owner: String,
    pub(crate) operation: String,
    pub(crate) key: String,
    pub(crate) resource_id: Option<String>,
}

fn be_i64(v: &[u8], at: usize) -> i64 {
    let mut b = [0; 8];
    b.copy_from_slice(&v[at..at + 8]);
    i64::from_be_bytes(b)
}

fn be_u16(v: &[u8], at: usize) -> usize {
    usize::from(u16::from_be_bytes([v[at], v[at + 1]]))
}

fn utf8(b: &[u8], field: &str) -> Result<String, StoreError> {
    std::str::from_utf8(b)
        .map(str::to_owned)
        .map_err(|_| corrupt(format!("the {field} is not UTF-8")))
}

fn len16(s: &str, field: &str) -> Result<[u8; 2], StoreError> {
    u16::try_from(s.len())
        .map(u16::to_be_bytes)
        .map_err(|_| StoreError::Backend {
            backend: BACKEND,
            source: format!("the {field} is longer than 65,535 bytes").into(),
        })
}

impl Record {
    /// A new in-flight record, attempt 1.
    pub(crate) fn in_flight(
        id: &RecordId,
        fingerprint: &Fingerprint,
        token: Token,
        lease_until: Timestamp,
        key_expires_at: Timestamp,
    ) -> Self {
        Self {
            state: RecordState::InFlight,
            token: token.as_i64(),
            attempt: 1,
            lease_until: lease_until.as_unix_millis(),
            key_expires_at: key_expires_at.as_unix_millis(),
            response_expires_at: 0,
            fingerprint: *fingerprint.as_bytes(),
            outcome: None,
            owner: id.owner().to_owned(),
            operation: id.operation().to_owned(),
            key: id.key().as_str().to_owned(),
            resource_id: None,
        }
    }

    /// The value stored in Redis.
    pub(crate) fn encode(&self) -> Result<Vec<u8>, StoreError> {
        let (lo, lp, lk) = (
            len16(&self.owner, "owner")?,
            len16(&self.operation, "operation")?,
            len16(&self.key, "key")?,
        );
        let x = self.resource_id.as_deref().unwrap_or_default();
        let mut v = Vec::with_capacity(
            HEADER + self.owner.len() + self.operation.len() + self.key.len() + x.len(),
        );
        v.push(VERSION);
        v.push(state_byte(self.state));
        v.extend_from_slice(&self.token.to_be_bytes());
        v.extend_from_slice(&self.attempt.to_be_bytes());
        v.extend_from_slice(&self.lease_until.to_be_bytes());
        v.extend_from_slice(&self.key_expires_at.to_be_bytes());
        v.extend_from_slice(&self.response_expires_at.to_be_bytes());
        v.extend_from_slice(&self.fingerprint);
        v.push(self.outcome.map_or(0, outcome_byte));
        v.extend_from_slice(&lo);
        v.extend_from_slice(&lp);
        v.extend_from_slice(&lk);
        v.push(u8::from(self.resource_id.is_some()));
        v.extend_from_slice(self.owner.as_bytes());
        v.extend_from_slice(self.operation.as_bytes());
        v.extend_from_slice(self.key.as_bytes());
        v.extend_from_slice(x.as_bytes());
        Ok(v)
    }

    /// Decodes a record value; anything off is [`StoreError::Corrupt`]
    /// (and a warning in the log).
    pub(crate) fn decode(v: &[u8]) -> Result<Self, StoreError> {
        Self::decode_fields(v).inspect_err(log_refused)
    }

    fn decode_fields(v: &[u8]) -> Result<Self, StoreError> {
        if v.len() < HEADER {
            return Err(corrupt(format!(
                "a record is {} bytes long, shorter than its header",
                v.len()
            )));
        }
        if v[0] != VERSION {
            return Err(corrupt(format!("unknown record layout version {}", v[0])));
        }
        let state = match v[STATE] {
            b'f' => RecordState::InFlight,
            b'r' => RecordState::Released,
            b'c' => RecordState::Completed,
            s => return Err(corrupt(format!("unknown state byte {s}"))),
        };
        let outcome = match v[OUTCOME] {
            0 => None,
            b's' => Some(OutcomeKind::Success),
            b'f' => Some(OutcomeKind::Failure),
            b'n' => Some(OutcomeKind::NotStored),
            o => return Err(corrupt(format!("unknown outcome byte {o}"))),
        };
        if state == RecordState::Completed && outcome.is_none() {
            return Err(corrupt("a completed record has no outcome"));
        }
        let (lo, lp, lk) = (
            be_u16(v, LENGTHS),
            be_u16(v, LENGTHS + 2),
            be_u16(v, LENGTHS + 4),
        );
        let rest = &v[HEADER..];
        if rest.len() < lo + lp + lk {
            return Err(corrupt("a record's identity is cut short"));
        }
        let resource_id = match v[HAS_RESOURCE] {
            0 if rest.len() == lo + lp + lk => None,
            1 => Some(utf8(&rest[lo + lp + lk..], "resource id")?),
            _ => return Err(corrupt("a record's resource id is malformed")),
        };
        let attempt =
            u32::from_be_bytes([v[ATTEMPT], v[ATTEMPT + 1], v[ATTEMPT + 2], v[ATTEMPT + 3]]);
        if attempt == 0 {
            return Err(corrupt("attempt 0 is out of range"));
        }
        let mut fingerprint = [0; 32];
        fingerprint.copy_from_slice(&v[FINGERPRINT..FINGERPRINT + 32]);
        Ok(Self {
            state,
            token: be_i64(v, TOKEN),
            attempt,
            lease_until: be_i64(v, LEASE),
            key_expires_at: be_i64(v, KEY_EXPIRY),
            response_expires_at: be_i64(v, RESPONSE_EXPIRY),
            fingerprint,
            outcome,
            owner: utf8(&rest[..lo], "owner")?,
            operation: utf8(&rest[lo..lo + lp], "operation")?,
            key: utf8(&rest[lo + lp..lo + lp + lk], "key")?,
            resource_id,
        })
    }

    /// Whether the record counts as absent at `now` (see
    /// [`StoredRecord::is_expired`]).
    pub(crate) fn is_expired(&self, now: i64) -> bool {
        self.key_expires_at <= now
            && !(self.state == RecordState::InFlight && self.lease_until > now)
    }

    /// Whether `body` (the body key's value) would be returned but belongs
    /// to another completion: a read that fell between the writes of a
    /// record and of its body, to be read again.
    pub(crate) fn has_foreign_body(
        &self,
        body: Option<&[u8]>,
        now: i64,
    ) -> Result<bool, StoreError> {
        match body {
            Some(b) if self.state == RecordState::Completed && now < self.response_expires_at => {
                Ok(body_of(b, self.token)?.is_none())
            }
            _ => Ok(false),
        }
    }

    /// The record as the engine sees it, with `body` (the body key's value,
    /// if read) returned only while `now < response_expires_at` and only if
    /// it belongs to this record's completion.
    pub(crate) fn to_stored(
        &self,
        body: Option<&[u8]>,
        now: i64,
    ) -> Result<StoredRecord, StoreError> {
        let completed = self.state == RecordState::Completed;
        let response = match body {
            Some(b) if completed && now < self.response_expires_at => {
                body_of(b, self.token)?.map(<[u8]>::to_vec)
            }
            _ => None,
        };
        StoredRecord {
            fingerprint: Fingerprint::from_slice(&self.fingerprint)
                .map_err(|len| corrupt(format!("the fingerprint is {len} bytes long")))?,
            state: self.state,
            attempt: self.attempt,
            lease_until: Timestamp::from_unix_millis(self.lease_until),
            resource_id: self.resource_id.clone(),
            outcome: self.outcome,
            response,
            response_expires_at: completed
                .then(|| Timestamp::from_unix_millis(self.response_expires_at)),
            key_expires_at: Timestamp::from_unix_millis(self.key_expires_at),
        }
        .validate(BACKEND)
        .inspect_err(log_refused)
    }
}

/// Logs a record refused as corrupt: the engine answers such a call with a
/// non-retryable error and never runs the work, so an operator must repair
/// or delete the record. The detail names the broken field, never the key
/// or the body.
fn log_refused(e: &StoreError) {
    if let StoreError::Corrupt { detail, .. } = e {
        tracing::warn!(%detail, "a stored record is corrupt: refused");
    }
}

/// The body in a body value if it was written under `token`; `None` for
/// another completion's body.
pub(crate) fn body_of(v: &[u8], token: i64) -> Result<Option<&[u8]>, StoreError> {
    if v.len() < BODY_HEADER || v[0] != VERSION {
        return Err(corrupt("a stored body has no valid header"));
    }
    Ok((be_i64(v, 1) == token).then(|| &v[BODY_HEADER..]))
}

/// A body value: the header for `token`, then `body`.
pub(crate) fn encode_body(token: i64, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(BODY_HEADER + body.len());
    v.push(VERSION);
    v.extend_from_slice(&token.to_be_bytes());
    v.extend_from_slice(body);
    v
}

#[cfg(test)]
mod tests {
    use idem_core::{IdempotencyKey, Scope};

    use super::*;

    fn sample() -> Record {
        let id = RecordId::new(
            Scope::new("owner é", "POST /x").unwrap(),
            IdempotencyKey::parse("k-1").unwrap(),
        );
        let fp = Fingerprint::from_slice(&[9; 32]).unwrap();
        Record::in_flight(
            &id,
            &fp,
            Token::random(),
            Timestamp::from_unix_millis(-5),
            Timestamp::from_unix_millis(i64::MAX),
        )
    }

    #[test]
    fn records_round_trip() {
        let mut r = sample();
        assert_eq!(Record::decode(&r.encode().unwrap()).unwrap(), r);
        r.state = RecordState::Completed;
        r.outcome = Some(OutcomeKind::NotStored);
        r.resource_id = Some(String::new());
        r.attempt = u32::MAX;
        assert_eq!(Record::decode(&r.encode().unwrap()).unwrap(), r);
        r.resource_id = Some("ch_1 \u{1F600}".into());
        assert_eq!(Record::decode(&r.encode().unwrap()).unwrap(), r);
    }

    #[test]
    fn damaged_records_are_corrupt() {
        let good = sample().encode().unwrap();
        let mut cases: Vec<Vec<u8>> = vec![Vec::new(), good[..HEADER - 1].to_vec()];
        for (at, byte) in [(0, 2), (STATE, b'x'), (OUTCOME, b'?'), (HAS_RESOURCE, 7)] {
            let mut v = good.clone();
            v[at] = byte;
            cases.push(v);
        }
        let mut completed_without_outcome = good.clone();
        completed_without_outcome[STATE] = b'c';
        cases.push(completed_without_outcome);
        let mut zero_attempt = good.clone();
        zero_attempt[ATTEMPT..ATTEMPT + 4].copy_from_slice(&[0; 4]);
        cases.push(zero_attempt);
        cases.push(good[..good.len() - 1].to_vec()); // identity cut short
        let mut trailing = good.clone();
        trailing.push(b'x'); // bytes after the identity without the flag
        cases.push(trailing);
        let mut bad_utf8 = good.clone();
        bad_utf8[HEADER] = 0xff;
        cases.push(bad_utf8);
        for (i, v) in cases.iter().enumerate() {
            assert!(
                matches!(Record::decode(v), Err(StoreError::Corrupt { .. })),
                "case {i}"
            );
        }
    }

    /// What the layout can hold but the engine's invariants refuse is
    /// refused by `StoredRecord::validate`, as on the other backends.
    #[test]
    fn decoded_records_are_validated() {
        let with_outcome = Record {
            outcome: Some(OutcomeKind::Success),
            ..sample()
        };
        let decoded = Record::decode(&with_outcome.encode().unwrap()).unwrap();
        assert!(matches!(
            decoded.to_stored(None, 0),
            Err(StoreError::Corrupt { backend: "redis", ref detail })
                if detail.contains("not completed")
        ));
        let rec = Record {
            state: RecordState::Completed,
            outcome: Some(OutcomeKind::NotStored),
            response_expires_at: 100,
            token: 42,
            ..sample()
        };
        assert!(matches!(
            rec.to_stored(Some(&encode_body(42, b"x")), 99),
            Err(StoreError::Corrupt { ref detail, .. }) if detail.contains("not_stored")
        ));
        assert!(rec.to_stored(None, 99).is_ok());
    }

    #[test]
    fn bodies_belong_to_their_completion() {
        let v = encode_body(42, b"hello");
        assert_eq!(body_of(&v, 42).unwrap(), Some(b"hello".as_slice()));
        assert_eq!(body_of(&v, 43).unwrap(), None);
        assert!(body_of(b"short", 42).is_err());
        let rec = Record {
            state: RecordState::Completed,
            outcome: Some(OutcomeKind::Success),
            response_expires_at: 100,
            token: 42,
            ..sample()
        };
        let stored = rec.to_stored(Some(&v), 99).unwrap();
        assert_eq!(stored.response.as_deref(), Some(b"hello".as_slice()));
        assert_eq!(rec.to_stored(Some(&v), 100).unwrap().response, None);
        assert_eq!(
            rec.to_stored(Some(&encode_body(7, b"x")), 99)
                .unwrap()
                .response,
            None
        );
    }
}
