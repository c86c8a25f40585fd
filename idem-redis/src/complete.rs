//! The completion: one `EVALSHA` of `complete.lua` (after a native `SET`
//! staging a large body kept in the body key), built as commands written
//! straight into their buffers.

use idem_core::store::OutcomeKind;
use idem_core::store::{Completion, StoreError, Token};
use std::io::Write;

use redis::{Cmd, RedisWrite, ToRedisArgs, Value};

use crate::conn::evalsha;
use crate::keys::RecordKeys;
use crate::record::{BodyValue, outcome_byte};
use crate::scripts;
use crate::store::{RedisStore, ttl_ms, unexpected};

/// Bodies kept in the body key whose value (with its header) is up to this
/// size go to `complete.lua` as an argument; larger ones are staged by a
/// native `SET` and moved into place by the script. Measured with the server
/// under callgrind: passing a body through Lua costs about 13 instructions
/// per byte (copies in and out of Lua, and the garbage collector's work for
/// them), staging it a flat 10,500 (one more command and a `RENAME`): even
/// at about 800 bytes. (A body kept inside its record always passes through
/// the script, which writes the record.)
pub(crate) const SCRIPT_ARG_MAX: usize = 1024;

/// A body kept inside its record, as `complete.lua` appends it to the
/// record: the body, then its length (u32, big-endian).
#[derive(Debug, Clone, Copy)]
struct InlineBody<'a>(&'a [u8]);

impl ToRedisArgs for InlineBody<'_> {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + RedisWrite,
    {
        let len = u32::try_from(self.0.len()).unwrap_or(u32::MAX);
        let mut w = out.writer_for_next_arg();
        w.write_all(self.0)
            .and_then(|()| w.write_all(&len.to_be_bytes()))
            .expect("writing to a command never fails");
    }
}

/// What a completion writes, as `complete.lua` takes it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Args<'a> {
    pub(crate) token: i64,
    pub(crate) outcome: OutcomeKind,
    /// The key's and the response's expiries (ms).
    pub(crate) expiries: [i64; 2],
    /// The key's and the response's native TTLs (ms, at least 1).
    pub(crate) ttls: [i64; 2],
    pub(crate) body: Option<&'a [u8]>,
    pub(crate) resource_id: Option<&'a str>,
    /// Keep a body of up to this many bytes inside the record (0: never).
    pub(crate) inline_limit: usize,
}

/// The completion's commands: a native `SET <staging> <body value> PX <body
/// TTL>` for a large body kept in the body key, then the `EVALSHA` of
/// `complete.lua` (returned apart, so that it can be sent again after
/// `NOSCRIPT`).
pub(crate) fn commands(keys: &RecordKeys, a: &Args<'_>) -> (Option<Cmd>, Cmd) {
    let (body_key, staging) = (keys.body(), keys.staging(a.token));
    let inline = a.body.filter(|b| {
        a.inline_limit > 0 && b.len() <= a.inline_limit && u32::try_from(b.len()).is_ok()
    });
    let value = a.body.map(|body| BodyValue {
        token: a.token,
        body,
    });
    let (mode, pre) = match (inline, value) {
        (Some(_), _) => ("i", None),
        (None, None) => ("0", None),
        (None, Some(v)) if v.len() > SCRIPT_ARG_MAX => {
            let mut set = Cmd::with_capacity(5, staging.as_bytes().len() + v.len() + 32);
            set.arg("SET")
                .arg(staging.as_bytes())
                .arg(v)
                .arg("PX")
                .arg(a.ttls[1]);
            ("1", Some(set))
        }
        (None, Some(_)) => ("2", None),
    };
    let record = keys.record();
    let all = [record, body_key.as_bytes(), staging.as_bytes()];
    let keys = match mode {
        "i" => &all[..1],
        "1" => &all[..],
        _ => &all[..2],
    };
    let body_len = match mode {
        "2" | "i" => a.body.map_or(0, <[u8]>::len) + 16,
        _ => 0,
    };
    let resource = a.resource_id.unwrap_or_default();
    let mut call = evalsha(&scripts::COMPLETE, keys, 8, 200 + body_len + resource.len());
    let mut expiries = [0; 16];
    expiries[..8].copy_from_slice(&a.expiries[0].to_be_bytes());
    expiries[8..].copy_from_slice(&a.expiries[1].to_be_bytes());
    call.arg(&a.token.to_be_bytes()[..])
        .arg(&expiries[..])
        .arg(&[outcome_byte(a.outcome)][..])
        .arg(a.ttls[0]);
    match (mode, inline, value) {
        // One key tells the script the body goes inside the record.
        ("i", Some(body), _) => {
            call.arg(InlineBody(body));
        }
        ("2", _, Some(v)) => {
            call.arg(mode).arg(v).arg(a.ttls[1]);
        }
        _ => {
            call.arg(mode).arg("").arg("");
        }
    }
    if let Some(r) = a.resource_id {
        call.arg(r);
    }
    (pre, call)
}

impl RedisStore {
    pub(crate) async fn complete_once(
        &self,
        keys: &RecordKeys,
        token: Token,
        c: &Completion<'_>,
    ) -> Result<(), StoreError> {
        let args = Args {
            token: token.as_i64(),
            outcome: c.outcome,
            expiries: [
                c.key_expires_at.as_unix_millis(),
                c.response_expires_at.as_unix_millis(),
            ],
            ttls: [
                ttl_ms(c.key_expires_at, c.now),
                ttl_ms(c.response_expires_at, c.now),
            ],
            body: c.body,
            resource_id: c.resource_id,
            inline_limit: self.inline_limit,
        };
        let (pre, call) = commands(keys, &args);
        let (reply, acked) = self
            .write_after(&scripts::COMPLETE, pre, call, keys.record())
            .await?;
        match reply {
            // 2: already completed under this token, a retry after a lost
            // reply or a missing acknowledgement: done, not a lost lease. The
            // script rewrote the record (unchanged, or without a body kept
            // inside it past its response expiry), so the `WAIT` after it
            // covers the completion: with the option, a confirmation now is
            // the confirmation the first call lacked.
            Value::Int(1 | 2) => acked,
            Value::Int(0) => Err(StoreError::LeaseLost),
            other => Err(unexpected(&other)),
        }
    }
}
