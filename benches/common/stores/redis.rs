//! The "store scripts without the engine" baseline of `RedisStore`: the
//! store's own command plan, built by `idem_redis::statements` (the same
//! functions the store calls, so it cannot drift), through a clone of the
//! store's multiplexed connection, without the engine, with bodies of up to
//! [`INLINE_LIMIT`] kept inside their record as the bench's store does. A
//! claim is one `SET <record> <in-flight record> NX PX <ttl> GET`: nil means
//! claimed, a completed record holding its body is a replay; a completion is
//! one `EVALSHA` of `complete.lua`.
//!
//! One difference, on the raw side's favour: the store names a record
//! `{prefix}{<hex SHA-256 of owner, operation, key>}:r` (a hash tag that is
//! safe for any key); the baseline uses the key itself as the tag.

use std::sync::atomic::{AtomicI64, Ordering};

use idem_redis::redis::aio::{ConnectionLike, ConnectionManager};
use idem_redis::redis::{self, Value};
use idem_redis::statements;

use super::workload::{Statements, body};
use super::{LEASE_MS, TTL_MS, now_ms};

/// The largest body the bench's Redis store keeps inside its record
/// (`RedisStore::with_inline_body_limit`): 8 KiB, so that both bench bodies
/// (256 B and 4 KiB, plus the 10 bytes of an `HttpResponse`) are, and a
/// replay is one command as in the minimal pattern, which also keeps its
/// body for the key's whole TTL.
pub(crate) const INLINE_LIMIT: usize = 8192;

/// The store's command plan on its connection.
#[derive(Debug)]
pub(crate) struct RawRedis {
    conn: ConnectionManager,
    prefix: String,
    fingerprint: [u8; 32],
    body: Vec<u8>,
    tokens: AtomicI64,
}

impl RawRedis {
    pub(crate) fn new(conn: ConnectionManager, prefix: &str, body_len: usize) -> Self {
        Self {
            conn,
            prefix: prefix.to_owned(),
            fingerprint: [7; 32],
            body: body(body_len),
            tokens: AtomicI64::new(1),
        }
    }

    fn record_key(&self, key: &str) -> String {
        format!("{}{{{key}}}:r", self.prefix)
    }
}

impl Statements for RawRedis {
    /// `Ok(token)` if claimed, else the standing record's body (`None` while
    /// it is in flight).
    async fn claim(&self, key: &str) -> Result<i64, Option<Vec<u8>>> {
        let token = self.tokens.fetch_add(1, Ordering::Relaxed);
        let now = now_ms();
        let record = self.record_key(key);
        let fresh = statements::in_flight_record(
            ("bench", "POST /bench", key),
            self.fingerprint,
            token,
            now + LEASE_MS,
            now + TTL_MS,
        )
        .expect("a record of the bench's sizes encodes");
        let cmd = statements::claim(&record, &fresh, TTL_MS);
        let reply = self
            .conn
            .clone()
            .req_packed_command(&cmd)
            .await
            .expect("claim");
        match reply {
            Value::Nil => Ok(token),
            Value::BulkString(rec) => Err(statements::replayed(rec, None)),
            other => panic!("unexpected claim reply {other:?}"),
        }
    }

    async fn complete(&self, key: &str, token: i64) {
        let now = now_ms();
        let record = self.record_key(key);
        let pipe = statements::complete(
            &record,
            token,
            [now + TTL_MS, now + TTL_MS],
            [TTL_MS, TTL_MS],
            &self.body,
            INLINE_LIMIT,
        );
        let n = pipe.len();
        for _ in 0..2 {
            let replies = self
                .conn
                .clone()
                .req_packed_commands(&pipe, 0, n)
                .await
                .expect("complete");
            match &replies[n - 1] {
                Value::Int(1) => return,
                Value::ServerError(e) if e.code() == "NOSCRIPT" => {
                    let _: String = redis::cmd("SCRIPT")
                        .arg("LOAD")
                        .arg(statements::COMPLETE)
                        .query_async(&mut self.conn.clone())
                        .await
                        .expect("SCRIPT LOAD");
                }
                other => panic!("complete: {other:?}"),
            }
        }
        panic!("complete: NOSCRIPT after SCRIPT LOAD");
    }
}

/// Deletes every key under `prefix` (the bench's own; never a flush).
pub(crate) async fn clean(conn: &ConnectionManager, prefix: &str) {
    idem_test_support::redis_admin::unlink_all(&mut conn.clone(), prefix).await;
}
