//! The record's encoding: one Redis string per record (layout 1 or 2), and
//! one per body kept outside its record; read and written whole by native
//! commands, spliced at fixed offsets by the few Lua scripts that must check
//! a token.
//!
//! Record value (`<prefix>{D}:r`), big-endian integers, offsets from 0 (the
//! scripts use Lua's 1-based positions, one more):
//!
//! | bytes | field |
//! |---|---|
//! | 0 | layout version: `1`, or `2` for a completed record holding its body |
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
//! | 78.. | owner, operation, key (UTF-8), then the resource id (layout 1: the rest) |
//! | layout 2 only, after the resource id | the body, then its length (u32, the last 4 bytes) |
//!
//! Layout 2 is layout 1 with the body appended (and the version byte `2`),
//! and only ever a completed record whose body is kept inside it (see
//! [`RedisStore::with_inline_body_limit`](crate::RedisStore::with_inline_body_limit)):
//! claims, releases, takeovers and completions without an inline body write
//! layout 1, and a completion rewritten after its response expiry drops the
//! body and goes back to layout 1. Both layouts share every offset.
//!
//! Body value (`<prefix>{D}:v`, layout 1 only): version `1`, the token of the
//! completion that wrote it (8 bytes), then the body. A body whose token
//! differs from its record's belongs to another completion and is never
//! returned.
//!
//! Reading a record allocates nothing but what the engine keeps: the fields
//! are decoded in place ([`Parsed`]), the body is the reply's own buffer with
//! the record's bytes cut off, and the identity is only copied out for the
//! operator API.

use std::io::Write;

use idem_core::store::Fingerprint;
use idem_core::store::{OutcomeKind, RecordState};
use idem_core::store::{StoreError, StoredRecord};
use redis::{RedisWrite, ToRedisArgs};

use crate::error::{BACKEND, corrupt};

/// The layout version of a record without its body, and of a body value.
pub(crate) const VERSION: u8 = 1;
/// The layout version of a completed record holding its body.
pub(crate) const VERSION_INLINE: u8 = 2;
/// Bytes before the variable part of a record.
pub(crate) const HEADER: usize = 78;
/// Bytes after the body of a layout-2 record: its length.
pub(crate) const TRAILER: usize = 4;
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

fn be_i64(v: &[u8], at: usize) -> i64 {
    let mut b = [0; 8];
    b.copy_from_slice(&v[at..at + 8]);
    i64::from_be_bytes(b)
}

fn be_u16(v: &[u8], at: usize) -> usize {
    usize::from(u16::from_be_bytes([v[at], v[at + 1]]))
}

fn be_u32(v: &[u8], at: usize) -> usize {
    let n = u32::from_be_bytes([v[at], v[at + 1], v[at + 2], v[at + 3]]);
    usize::try_from(n).unwrap_or(usize::MAX)
}

fn utf8<'a>(b: &'a [u8], field: &str) -> Result<&'a str, StoreError> {
    std::str::from_utf8(b).map_err(|_| corrupt(format!("the {field} is not UTF-8")))
}

fn len16(s: &str, field: &str) -> Result<[u8; 2], StoreError> {
    u16::try_from(s.len())
        .map(u16::to_be_bytes)
        .map_err(|_| StoreError::Backend {
            backend: BACKEND,
            source: format!("the {field} is longer than 65,535 bytes").into(),
        })
}

/// A new in-flight record (attempt 1, layout 1), written straight into the
/// command that stores it (no buffer of its own).
#[derive(Debug, Clone, Copy)]
pub(crate) struct InFlight<'a> {
    identity: [&'a str; 3],
    lengths: [[u8; 2]; 3],
    fingerprint: &'a [u8; 32],
    token: i64,
    lease_until: i64,
    key_expires_at: i64,
}

impl<'a> InFlight<'a> {
    /// # Errors
    ///
    /// An owner, operation or key longer than 65,535 bytes.
    pub(crate) fn new(
        (owner, operation, key): (&'a str, &'a str, &'a str),
        fingerprint: &'a [u8; 32],
        token: i64,
        lease_until: i64,
        key_expires_at: i64,
    ) -> Result<Self, StoreError> {
        Ok(Self {
            identity: [owner, operation, key],
            lengths: [
                len16(owner, "owner")?,
                len16(operation, "operation")?,
                len16(key, "key")?,
            ],
            fingerprint,
            token,
            lease_until,
            key_expires_at,
        })
    }

    /// The value's length in bytes.
    pub(crate) fn len(&self) -> usize {
        HEADER + self.identity.iter().map(|s| s.len()).sum::<usize>()
    }

    fn write(&self, out: &mut impl Write) -> std::io::Result<()> {
        let mut h = [0; HEADER];
        h[0] = VERSION;
        h[STATE] = state_byte(RecordState::InFlight);
        h[TOKEN..TOKEN + 8].copy_from_slice(&self.token.to_be_bytes());
        h[ATTEMPT..ATTEMPT + 4].copy_from_slice(&1u32.to_be_bytes());
        h[LEASE..LEASE + 8].copy_from_slice(&self.lease_until.to_be_bytes());
        h[KEY_EXPIRY..KEY_EXPIRY + 8].copy_from_slice(&self.key_expires_at.to_be_bytes());
        h[FINGERPRINT..FINGERPRINT + 32].copy_from_slice(self.fingerprint);
        for (i, l) in self.lengths.iter().enumerate() {
            h[LENGTHS + 2 * i..LENGTHS + 2 * i + 2].copy_from_slice(l);
        }
        out.write_all(&h)?;
        for s in &self.identity {
            out.write_all(s.as_bytes())?;
        }
        Ok(())
    }

    /// The value in a buffer of its own (for a swap, off the common path).
    pub(crate) fn to_vec(self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        self.write(&mut v).expect("writing to a Vec never fails");
        v
    }
}

impl ToRedisArgs for InFlight<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        self.write(&mut out.writer_for_next_arg())
            .expect("writing to a command never fails");
    }
}

/// A body value written straight into a command: the header for `token`,
/// then the body.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyValue<'a> {
    pub(crate) token: i64,
    pub(crate) body: &'a [u8],
}

impl BodyValue<'_> {
    /// The value's length in bytes.
    pub(crate) fn len(&self) -> usize {
        BODY_HEADER + self.body.len()
    }
}

impl ToRedisArgs for BodyValue<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        let mut header = [VERSION; BODY_HEADER];
        header[1..].copy_from_slice(&self.token.to_be_bytes());
        let mut w = out.writer_for_next_arg();
        w.write_all(&header)
            .and_then(|()| w.write_all(self.body))
            .expect("writing to a command never fails");
    }
}

/// The fixed fields of a record value: what both views of a decoded record
/// ([`Parsed`] in place, [`Record`] with its identity copied out) hold, and
/// what they give to read (and a [`Record`] to change) as their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fixed {
    pub(crate) state: RecordState,
    pub(crate) token: i64,
    pub(crate) attempt: u32,
    pub(crate) lease_until: i64,
    pub(crate) key_expires_at: i64,
    pub(crate) response_expires_at: i64,
    pub(crate) fingerprint: [u8; 32],
    pub(crate) outcome: Option<OutcomeKind>,
}

/// A record value decoded in place: its fixed fields, and where its
/// variable ones lie in the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Parsed {
    pub(crate) version: u8,
    pub(crate) fixed: Fixed,
    /// Where the owner, operation, key and the end of the identity lie.
    identity: [usize; 4],
    /// Where the resource id lies, if any.
    resource: Option<(usize, usize)>,
    /// Where the body lies (layout 2).
    inline: Option<(usize, usize)>,
}

impl Parsed {
    /// Decodes a record value; anything off is [`StoreError::Corrupt`]
    /// (and a warning in the log).
    pub(crate) fn parse(v: &[u8]) -> Result<Self, StoreError> {
        Self::parse_fields(v).inspect_err(log_refused)
    }

    fn parse_fields(v: &[u8]) -> Result<Self, StoreError> {
        let version = v.first().copied().unwrap_or(0);
        let least = match version {
            VERSION => HEADER,
            VERSION_INLINE => HEADER + TRAILER,
            _ if v.len() < HEADER => HEADER,
            other => return Err(corrupt(format!("unknown record layout version {other}"))),
        };
        if v.len() < least {
            return Err(corrupt(format!(
                "a record is {} bytes long, shorter than its header",
                v.len()
            )));
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
        if version == VERSION_INLINE && state != RecordState::Completed {
            return Err(corrupt("a record of layout 2 is not completed"));
        }
        let (lo, lp, lk) = (
            be_u16(v, LENGTHS),
            be_u16(v, LENGTHS + 2),
            be_u16(v, LENGTHS + 4),
        );
        let ident_end = HEADER + lo + lp + lk;
        // Layout 2: the body and its length end the value.
        let (body_len, tail) = if version == VERSION_INLINE {
            (be_u32(v, v.len() - TRAILER), TRAILER)
        } else {
            (0, 0)
        };
        let end = (v.len() - tail)
            .checked_sub(body_len)
            .filter(|end| *end >= ident_end)
            .ok_or_else(|| corrupt("a record's identity is cut short"))?;
        let resource = match v[HAS_RESOURCE] {
            0 if end == ident_end => None,
            1 => {
                utf8(&v[ident_end..end], "resource id")?;
                Some((ident_end, end))
            }
            _ => return Err(corrupt("a record's resource id is malformed")),
        };
        let identity = [HEADER, HEADER + lo, HEADER + lo + lp, ident_end];
        utf8(&v[identity[0]..identity[1]], "owner")?;
        utf8(&v[identity[1]..identity[2]], "operation")?;
        utf8(&v[identity[2]..identity[3]], "key")?;
        let attempt =
            u32::from_be_bytes([v[ATTEMPT], v[ATTEMPT + 1], v[ATTEMPT + 2], v[ATTEMPT + 3]]);
        if attempt == 0 {
            return Err(corrupt("attempt 0 is out of range"));
        }
        let mut fingerprint = [0; 32];
        fingerprint.copy_from_slice(&v[FINGERPRINT..FINGERPRINT + 32]);
        Ok(Self {
            version,
            fixed: Fixed {
                state,
                token: be_i64(v, TOKEN),
                attempt,
                lease_until: be_i64(v, LEASE),
                key_expires_at: be_i64(v, KEY_EXPIRY),
                response_expires_at: be_i64(v, RESPONSE_EXPIRY),
                fingerprint,
                outcome,
            },
            identity,
            resource,
            inline: (version == VERSION_INLINE).then_some((end, end + body_len)),
        })
    }

    /// Whether the record counts as absent at `now` (see
    /// [`StoredRecord::is_expired`]).
    pub(crate) fn is_expired(&self, now: i64) -> bool {
        self.key_expires_at <= now
            && !(self.state == RecordState::InFlight && self.lease_until > now)
    }

    /// Whether a body would be returned at `now`.
    fn body_returned(&self, now: i64) -> bool {
        self.state == RecordState::Completed && now < self.response_expires_at
    }

    /// Whether a body returned at `now` would be in the body key (so a
    /// replay must read it): a completed record of layout 1 whose outcome
    /// has a body.
    pub(crate) fn body_in_key(&self, now: i64) -> bool {
        self.inline.is_none()
            && self.outcome != Some(OutcomeKind::NotStored)
            && self.body_returned(now)
    }

    /// Whether `body` (the body key's value) would be returned but belongs
    /// to another completion: a read that fell between the writes of a
    /// record and of its body, to be read again. Never for a record holding
    /// its body.
    pub(crate) fn has_foreign_body(
        &self,
        body: Option<&[u8]>,
        now: i64,
    ) -> Result<bool, StoreError> {
        match body {
            Some(b) if self.inline.is_none() && self.body_returned(now) => {
                Ok(body_of(b, self.token)?.is_none())
            }
            _ => Ok(false),
        }
    }

    /// The identity's parts (owner, operation, key) in `v`, the value this
    /// was parsed from.
    pub(crate) fn identity<'a>(&self, v: &'a [u8]) -> [&'a str; 3] {
        let [a, b, c, d] = self.identity;
        // Checked by `parse`.
        [&v[a..b], &v[b..c], &v[c..d]].map(|s| std::str::from_utf8(s).unwrap_or_default())
    }

    /// The resource id in `v`, the value this was parsed from.
    pub(crate) fn resource_id<'a>(&self, v: &'a [u8]) -> Option<&'a str> {
        self.resource
            .map(|(a, b)| std::str::from_utf8(&v[a..b]).unwrap_or_default())
    }

    /// The record as the engine sees it, without its body (see
    /// [`Self::take_response`]); not yet validated.
    pub(crate) fn stored(&self, v: &[u8]) -> Result<StoredRecord, StoreError> {
        let completed = self.state == RecordState::Completed;
        Ok(StoredRecord {
            fingerprint: Fingerprint::from_slice(&self.fingerprint)
                .map_err(|len| corrupt(format!("the fingerprint is {len} bytes long")))?,
            state: self.state,
            attempt: self.attempt,
            lease_until: idem_core::clock::Timestamp::from_unix_millis(self.lease_until),
            resource_id: self.resource_id(v).map(str::to_owned),
            outcome: self.outcome,
            response: None,
            response_expires_at: completed
                .then(|| idem_core::clock::Timestamp::from_unix_millis(self.response_expires_at)),
            key_expires_at: idem_core::clock::Timestamp::from_unix_millis(self.key_expires_at),
        })
    }

    /// The body returned at `now`, taken from `value` (the record, layout 2)
    /// or from `body` (the body key's value, if read, layout 1) without a
    /// copy: only while `now < response_expires_at`, and from the body key
    /// only if it belongs to this record's completion.
    pub(crate) fn take_response(
        &self,
        mut value: Vec<u8>,
        body: Option<Vec<u8>>,
        now: i64,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        if !self.body_returned(now) {
            return Ok(None);
        }
        if let Some((start, end)) = self.inline {
            value.truncate(end);
            value.drain(..start);
            return Ok(Some(value));
        }
        match body {
            Some(mut b) if body_of(&b, self.token)?.is_some() => {
                b.drain(..BODY_HEADER);
                Ok(Some(b))
            }
            _ => Ok(None),
        }
    }

    /// The record as the engine sees it at `now`, body included (see
    /// [`Self::take_response`]), validated.
    pub(crate) fn stored_at(
        &self,
        value: Vec<u8>,
        body: Option<Vec<u8>>,
        now: i64,
    ) -> Result<StoredRecord, StoreError> {
        let mut stored = self.stored(&value)?;
        stored.response = self.take_response(value, body, now)?;
        validated(stored)
    }

    /// `v` (a layout-1 record this was parsed from) taken over: in flight
    /// under `token`, the given attempt, lease end and key expiry, every
    /// other byte kept.
    pub(crate) fn taken_over(
        &self,
        v: &[u8],
        token: i64,
        attempt: u32,
        lease_until: i64,
        key_expires_at: i64,
    ) -> Result<Vec<u8>, StoreError> {
        if self.version != VERSION {
            return Err(corrupt("a record holding its body cannot be taken over"));
        }
        let mut next = v.to_vec();
        next[STATE] = state_byte(RecordState::InFlight);
        next[TOKEN..TOKEN + 8].copy_from_slice(&token.to_be_bytes());
        next[ATTEMPT..ATTEMPT + 4].copy_from_slice(&attempt.to_be_bytes());
        next[LEASE..LEASE + 8].copy_from_slice(&lease_until.to_be_bytes());
        next[KEY_EXPIRY..KEY_EXPIRY + 8].copy_from_slice(&key_expires_at.to_be_bytes());
        Ok(next)
    }
}

/// Checks a decoded record against the engine's invariants
/// ([`StoredRecord::validate`]), logging a refusal.
pub(crate) fn validated(stored: StoredRecord) -> Result<StoredRecord, StoreError> {
    stored.validate(BACKEND).inspect_err(log_refused)
}

/// A record decoded with its identity copied out: what the operator API
/// lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) fixed: Fixed,
    pub(crate) owner: String,
    pub(crate) operation: String,
    pub(crate) key: String,
    pub(crate) resource_id: Option<String>,
}

impl Record {
    /// The record `p` was parsed from `v`, identity copied out; an inline
    /// body is left behind.
    pub(crate) fn from_parsed(p: &Parsed, v: &[u8]) -> Self {
        let [owner, operation, key] = p.identity(v).map(str::to_owned);
        Self {
            fixed: p.fixed,
            owner,
            operation,
            key,
            resource_id: p.resource_id(v).map(str::to_owned),
        }
    }

    /// Decodes a record value (see [`Parsed::parse`]).
    pub(crate) fn decode(v: &[u8]) -> Result<Self, StoreError> {
        Parsed::parse(v).map(|p| Self::from_parsed(&p, v))
    }

    /// The value stored in Redis, in layout 1 (no body).
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
}

impl std::ops::Deref for Parsed {
    type Target = Fixed;
    fn deref(&self) -> &Fixed {
        &self.fixed
    }
}

impl std::ops::Deref for Record {
    type Target = Fixed;
    fn deref(&self) -> &Fixed {
        &self.fixed
    }
}

impl std::ops::DerefMut for Record {
    fn deref_mut(&mut self) -> &mut Fixed {
        &mut self.fixed
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
#[cfg(test)]
pub(crate) fn encode_body(token: i64, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(BODY_HEADER + body.len());
    v.push(VERSION);
    v.extend_from_slice(&token.to_be_bytes());
    v.extend_from_slice(body);
    v
}

/// A completed record of layout 2: `record` (layout 1, completed) with
/// `body` inside it, as `complete.lua` writes it.
#[cfg(test)]
pub(crate) fn with_inline_body(record: &[u8], body: &[u8]) -> Vec<u8> {
    let len = u32::try_from(body.len()).expect("an inline body fits in 4 GiB");
    let mut v = Vec::with_capacity(record.len() + body.len() + TRAILER);
    v.push(VERSION_INLINE);
    v.extend_from_slice(&record[1..]);
    v.extend_from_slice(body);
    v.extend_from_slice(&len.to_be_bytes());
    v
}

#[cfg(test)]
mod tests {
    use idem_core::store::Token;
    use idem_core::{IdempotencyKey, RecordId, Scope};

    use super::*;

    fn sample() -> Record {
        let id = RecordId::new(
            Scope::new("owner é", "POST /x").unwrap(),
            IdempotencyKey::parse("k-1").unwrap(),
        );
        let fp = [9; 32];
        let v = InFlight::new(
            (id.owner(), id.operation(), id.key().as_str()),
            &fp,
            Token::random().as_i64(),
            -5,
            i64::MAX,
        )
        .unwrap()
        .to_vec();
        Record::decode(&v).unwrap()
    }

    fn completed(token: i64, response_expires_at: i64) -> Record {
        let mut r = sample();
        r.state = RecordState::Completed;
        r.outcome = Some(OutcomeKind::Success);
        r.response_expires_at = response_expires_at;
        r.token = token;
        r
    }

    #[test]
    fn records_round_trip() {
        let mut r = sample();
        assert_eq!(r.attempt, 1);
        assert_eq!(r.owner, "owner é");
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
    fn the_in_flight_record_is_what_the_owned_record_encodes() {
        let r = sample();
        let v = r.encode().unwrap();
        let fresh = InFlight::new(
            (&r.owner, &r.operation, &r.key),
            &r.fingerprint,
            r.token,
            r.lease_until,
            r.key_expires_at,
        )
        .unwrap();
        assert_eq!(fresh.to_vec(), v);
        assert_eq!(fresh.len(), v.len());
        let mut cmd = redis::Cmd::new();
        cmd.arg(fresh);
        assert_eq!(cmd.args_iter().count(), 1);
        assert!(matches!(cmd.args_iter().next(), Some(redis::Arg::Simple(a)) if a == v));
    }

    #[test]
    fn inline_bodies_round_trip_and_share_every_offset() {
        for resource in [None, Some("ch_1".to_owned())] {
            let rec = Record {
                resource_id: resource.clone(),
                ..completed(42, 100)
            };
            let v1 = rec.encode().unwrap();
            for body in [&b""[..], b"hello", &[0xff; 3000]] {
                let v2 = with_inline_body(&v1, body);
                assert_eq!(v2[1..v1.len()], v1[1..]);
                let p = Parsed::parse(&v2).unwrap();
                assert_eq!(p.version, VERSION_INLINE);
                assert_eq!(Record::from_parsed(&p, &v2), rec);
                assert_eq!(p.resource_id(&v2), resource.as_deref());
                assert!(!p.body_in_key(99), "read from the record");
                let stored = p.stored_at(v2.clone(), None, 99).unwrap();
                assert_eq!(stored.response.as_deref(), Some(body));
                assert_eq!(stored.resource_id, resource);
                // A body key is never read for it, nor taken as foreign.
                let foreign = encode_body(7, b"x");
                assert!(!p.has_foreign_body(Some(&foreign), 99).unwrap());
                let stored = p.stored_at(v2.clone(), Some(foreign), 99).unwrap();
                assert_eq!(stored.response.as_deref(), Some(body));
                // Never returned at or after its response expiry.
                let late = p.stored_at(v2, None, 100).unwrap();
                assert_eq!(late.response, None);
                assert_eq!(late.outcome, Some(OutcomeKind::Success));
            }
        }
    }

    #[test]
    fn damaged_records_are_corrupt() {
        let good = sample().encode().unwrap();
        let mut cases: Vec<Vec<u8>> = vec![Vec::new(), good[..HEADER - 1].to_vec()];
        for (at, byte) in [(0, 3), (STATE, b'x'), (OUTCOME, b'?'), (HAS_RESOURCE, 7)] {
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
        // Layout 2: only completed, and its body length within the value.
        let mut in_flight_inline = with_inline_body(&good, b"x");
        in_flight_inline[STATE] = b'f';
        cases.push(in_flight_inline);
        let done = completed(1, 10).encode().unwrap();
        let mut too_long = with_inline_body(&done, b"abc");
        let n = too_long.len();
        too_long[n - TRAILER..].copy_from_slice(&1000u32.to_be_bytes());
        cases.push(too_long);
        let short = with_inline_body(&done, b"abc");
        cases.push(short[..short.len() - 1].to_vec()); // its length cut short
        let mut v2 = with_inline_body(&done, b"");
        v2.truncate(HEADER + TRAILER - 1);
        cases.push(v2);
        for (i, v) in cases.iter().enumerate() {
            assert!(
                matches!(Parsed::parse(v), Err(StoreError::Corrupt { .. })),
                "case {i}"
            );
        }
    }

    /// What the layout can hold but the engine's invariants refuse is
    /// refused by `StoredRecord::validate`, as on the other backends.
    #[test]
    fn decoded_records_are_validated() {
        let mut with_outcome = sample();
        with_outcome.outcome = Some(OutcomeKind::Success);
        let with_outcome = with_outcome.encode().unwrap();
        let p = Parsed::parse(&with_outcome).unwrap();
        assert!(matches!(
            p.stored_at(with_outcome.clone(), None, 0),
            Err(StoreError::Corrupt { backend: "redis", ref detail })
                if detail.contains("not completed")
        ));
        let mut rec = completed(42, 100);
        rec.outcome = Some(OutcomeKind::NotStored);
        let rec = rec.encode().unwrap();
        let p = Parsed::parse(&rec).unwrap();
        let inline = with_inline_body(&rec, b"x");
        assert!(matches!(
            Parsed::parse(&inline).unwrap().stored_at(inline.clone(), None, 99),
            Err(StoreError::Corrupt { ref detail, .. }) if detail.contains("not_stored")
        ));
        assert!(p.stored_at(rec.clone(), None, 99).is_ok());
        assert!(
            !p.body_in_key(99),
            "a not_stored outcome has no body to read"
        );
    }

    #[test]
    fn bodies_belong_to_their_completion() {
        let v = encode_body(42, b"hello");
        assert_eq!(body_of(&v, 42).unwrap(), Some(b"hello".as_slice()));
        assert_eq!(body_of(&v, 43).unwrap(), None);
        assert!(body_of(b"short", 42).is_err());
        let rec = completed(42, 100).encode().unwrap();
        let p = Parsed::parse(&rec).unwrap();
        assert!(p.body_in_key(99));
        assert!(!p.body_in_key(100));
        let stored = p.stored_at(rec.clone(), Some(v.clone()), 99).unwrap();
        assert_eq!(stored.response.as_deref(), Some(b"hello".as_slice()));
        assert_eq!(
            p.stored_at(rec.clone(), Some(v.clone()), 100)
                .unwrap()
                .response,
            None
        );
        assert!(p.has_foreign_body(Some(&encode_body(7, b"x")), 99).unwrap());
        assert_eq!(
            p.stored_at(rec, Some(encode_body(7, b"x")), 99)
                .unwrap()
                .response,
            None
        );
    }

    #[test]
    fn a_takeover_rewrites_only_its_fields() {
        let mut r = Record {
            resource_id: Some("ch_9".into()),
            ..sample()
        };
        r.state = RecordState::Released;
        let v = r.encode().unwrap();
        let next = Parsed::parse(&v)
            .unwrap()
            .taken_over(&v, 77, 2, 1_000, 2_000)
            .unwrap();
        r.state = RecordState::InFlight;
        r.token = 77;
        r.attempt = 2;
        r.lease_until = 1_000;
        r.key_expires_at = 2_000;
        assert_eq!(next, r.encode().unwrap());
        let done = completed(1, 10).encode().unwrap();
        let inline = with_inline_body(&done, b"b");
        assert!(
            Parsed::parse(&inline)
                .unwrap()
                .taken_over(&inline, 1, 2, 3, 4)
                .is_err()
        );
    }
}
