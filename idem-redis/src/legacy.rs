//! Records of the hash layout (before layout 1): read with `HMGET` and
//! rewritten in layout 1 by `migrate.lua` the first time a call meets one
//! (its `WRONGTYPE` reply).

use idem_core::store::StoreError;
use idem_core::store::{OutcomeKind, RecordState};
use redis::Value;

use crate::conn::evalsha;
use crate::error::{corrupt, store_error};
use crate::keys::{body_for, legacy_body};
use crate::record::{BODY_HEADER, Record, encode_body};
use crate::scripts;
use crate::store::{RedisStore, unexpected};

/// How many times an operation is retried after rewriting a record of the
/// hash layout.
pub(crate) const MIGRATE_TRIES: u32 = 3;

/// Runs `$op` (an expression giving `Result<_, StoreError>`) again after
/// rewriting a record of the hash layout found at `$record` (a `&str`).
macro_rules! migrating {
    ($self:ident, $record:expr, $op:expr) => {{
        let mut tries = 1;
        loop {
            match $op {
                Err(e)
                    if tries < $crate::legacy::MIGRATE_TRIES
                        && $crate::error::is_wrong_type(&e) =>
                {
                    if !$self.migrate_record($record).await? {
                        break Err(e);
                    }
                    tracing::info!("rewrote a record of the hash layout in layout 1");
                    tries += 1;
                }
                other => break other,
            }
        }
    }};
}
pub(crate) use migrating;

impl RedisStore {
    /// Rewrites a record of the hash layout in layout 1. `true` when the
    /// operation may run again: migrated, or changed or gone meanwhile (a
    /// retry reads it afresh); `false` when the record is not a hash, so the
    /// `WRONGTYPE` came from something else.
    pub(crate) async fn migrate_record(&self, record_key: &[u8]) -> Result<bool, StoreError> {
        const FIELDS: [&str; 12] = [
            "f", "s", "t", "a", "l", "k", "x", "o", "e", "io", "ip", "ik",
        ];
        let fields: Vec<Value> = match self
            .conn
            .query(redis::cmd("HMGET").arg(record_key).arg(&FIELDS[..]))
            .await
        {
            Ok(Value::Array(v)) => v,
            Ok(other) => return Err(unexpected(&other)),
            Err(e) if e.code() == Some("WRONGTYPE") => return Ok(false),
            Err(e) => return Err(store_error(e)),
        };
        if fields.len() != FIELDS.len() {
            return Err(corrupt("HMGET gave the wrong number of fields"));
        }
        if fields.iter().all(|v| *v == Value::Nil) {
            return Ok(true); // gone since: the retry finds it absent
        }
        let record = legacy_record(&fields)?;
        let record_key = String::from_utf8_lossy(record_key);
        let (old_body, body) = (legacy_body(&record_key), body_for(&record_key));
        let keys = [record_key.as_bytes(), old_body.as_bytes(), body.as_bytes()];
        let mut call = evalsha(&scripts::MIGRATE, &keys, 14, 512);
        for v in &fields {
            match v {
                Value::Nil => call.arg(""),
                v => {
                    let mut seen = b"=".to_vec();
                    seen.extend_from_slice(bytes(v, "field")?.unwrap_or_default());
                    call.arg(seen)
                }
            };
        }
        call.arg(record.encode()?)
            .arg(&encode_body(record.token, b"")[..BODY_HEADER]);
        // Written with `WAIT` like any other write, but the operation that
        // follows confirms what matters; the migration itself needs none.
        match self.write(&scripts::MIGRATE, call, keys[0]).await?.0 {
            Value::Int(_) => Ok(true),
            other => Err(unexpected(&other)),
        }
    }
}

/// A record of the hash layout (`f s t a l k x o e io ip ik`) in layout 1.
fn legacy_record(f: &[Value]) -> Result<Record, StoreError> {
    let [fp, s, t, a, l, k, x, o, e, io, ip, ik] = f else {
        return Err(corrupt("a hash record has the wrong number of fields"));
    };
    let fingerprint: [u8; 32] = bytes(fp, "fingerprint")?
        .ok_or_else(|| missing("fingerprint"))?
        .try_into()
        .map_err(|_| corrupt("the fingerprint is not 32 bytes long"))?;
    let state = text(s, "state")?;
    let state =
        RecordState::parse(state).ok_or_else(|| corrupt(format!("unknown state {state:?}")))?;
    let outcome = match opt_text(o, "outcome")? {
        None => None,
        Some(o) => {
            Some(OutcomeKind::parse(&o).ok_or_else(|| corrupt(format!("unknown outcome {o:?}")))?)
        }
    };
    let attempt = int(a, "attempt")?;
    Ok(Record {
        state,
        token: int(t, "token")?,
        attempt: u32::try_from(attempt)
            .ok()
            .filter(|a| *a > 0)
            .ok_or_else(|| corrupt(format!("attempt {attempt} is out of range")))?,
        lease_until: int(l, "lease")?,
        key_expires_at: int(k, "key expiry")?,
        response_expires_at: match e {
            Value::Nil => 0,
            v => int(v, "response expiry")?,
        },
        fingerprint,
        outcome,
        owner: opt_text(io, "owner")?.unwrap_or_default(),
        operation: opt_text(ip, "operation")?.unwrap_or_default(),
        key: opt_text(ik, "key")?.unwrap_or_default(),
        resource_id: opt_text(x, "resource id")?,
    })
}

fn bytes<'a>(v: &'a Value, field: &str) -> Result<Option<&'a [u8]>, StoreError> {
    match v {
        Value::Nil => Ok(None),
        Value::BulkString(b) => Ok(Some(b)),
        Value::SimpleString(s) => Ok(Some(s.as_bytes())),
        _ => Err(corrupt(format!("the {field} is not a string"))),
    }
}

fn text<'a>(v: &'a Value, field: &str) -> Result<&'a str, StoreError> {
    let b = bytes(v, field)?.ok_or_else(|| missing(field))?;
    std::str::from_utf8(b).map_err(|_| corrupt(format!("the {field} is not UTF-8")))
}

fn opt_text(v: &Value, field: &str) -> Result<Option<String>, StoreError> {
    match v {
        Value::Nil => Ok(None),
        v => text(v, field).map(|t| Some(t.to_owned())),
    }
}

fn int(v: &Value, field: &str) -> Result<i64, StoreError> {
    match v {
        Value::Int(i) => Ok(*i),
        v => {
            let t = text(v, field)?;
            t.parse()
                .map_err(|_| corrupt(format!("the {field} {t:?} is not an integer")))
        }
    }
}

fn missing(field: &str) -> StoreError {
    corrupt(format!("the {field} is missing"))
}
