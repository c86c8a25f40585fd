//! The raw baseline of `RedisStore`: the same Lua scripts (read from
//! `idem-redis/scripts/`, so they cannot drift) with the same arguments,
//! through a clone of the store's multiplexed connection, without the engine.
//!
//! One difference, on the raw side's favour: the store names a record
//! `{prefix}{<hex SHA-256 of owner, operation, key>}:r` (a hash tag that is
//! safe for any key); the baseline uses the key itself as the tag.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicI64, Ordering};

use idem_redis::redis::aio::ConnectionManager;
use idem_redis::redis::{self, Script, Value};

use super::workload::{Ended, Target, body};
use super::{LEASE_MS, TTL_MS, now_ms};

static CLAIM: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../idem-redis/scripts/claim.lua")));
static COMPLETE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../idem-redis/scripts/complete.lua")));

/// The scripts of `RedisStore` on its connection.
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

    fn keys(&self, key: &str) -> (String, String) {
        let p = &self.prefix;
        (format!("{p}{{{key}}}:r"), format!("{p}{{{key}}}:b"))
    }

    /// `Ok(token)` if claimed, else the standing record's body (`None` while
    /// it is in flight).
    async fn claim(&self, key: &str) -> Result<i64, Option<Vec<u8>>> {
        let token = self.tokens.fetch_add(1, Ordering::Relaxed);
        let now = now_ms();
        let (record, body) = self.keys(key);
        let mut inv = CLAIM.key(&record);
        inv.key(&body)
            .arg(self.fingerprint.as_slice())
            .arg(token)
            .arg(now)
            .arg(now + LEASE_MS)
            .arg(now + TTL_MS)
            .arg(TTL_MS);
        let reply: Value = inv
            .invoke_async(&mut self.conn.clone())
            .await
            .expect("claim");
        let Value::Array(items) = reply else {
            panic!("unexpected claim reply {reply:?}")
        };
        match items.as_slice() {
            [Value::Int(0), ..] => Ok(token),
            [Value::Int(1), _, state, .., body] => {
                let completed =
                    matches!(state, Value::BulkString(s) if s.as_slice() == b"completed");
                Err(match (completed, body) {
                    (true, Value::BulkString(b)) => Some(b.clone()),
                    _ => None,
                })
            }
            other => panic!("unexpected claim reply {other:?}"),
        }
    }

    async fn complete(&self, key: &str, token: i64) {
        let now = now_ms();
        let (record, body) = self.keys(key);
        let mut inv = COMPLETE.key(&record);
        inv.key(&body)
            .arg(token)
            .arg("success")
            .arg(now + TTL_MS)
            .arg(now + TTL_MS)
            .arg(TTL_MS)
            .arg(TTL_MS)
            .arg("1")
            .arg(self.body.as_slice())
            .arg("0")
            .arg("");
        let done: i64 = inv
            .invoke_async(&mut self.conn.clone())
            .await
            .expect("complete");
        assert_eq!(done, 1, "lease lost");
    }
}

/// Deletes every key under `prefix` (the bench's own; never a flush).
pub(crate) async fn clean(conn: &ConnectionManager, prefix: &str) {
    let mut conn = conn.clone();
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .expect("SCAN");
        if !keys.is_empty() {
            let _: i64 = redis::cmd("UNLINK")
                .arg(&keys)
                .query_async(&mut conn)
                .await
                .expect("UNLINK");
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
}

impl Target for RawRedis {
    async fn fresh(&self, key: &str) {
        let token = self.claim(key).await.expect("fresh key");
        self.complete(key, token).await;
    }

    async fn replay(&self, key: &str) {
        let body = self.claim(key).await.expect_err("completed key");
        std::hint::black_box(body.expect("stored body"));
    }

    async fn contended(&self, key: &str) -> Ended {
        match self.claim(key).await {
            Ok(token) => {
                self.complete(key, token).await;
                Ended::Executed
            }
            Err(Some(body)) => {
                std::hint::black_box(body);
                Ended::Replayed
            }
            Err(None) => Ended::Conflict,
        }
    }
}
