//! The minimal Redis pattern a user would hand-write with redis-rs for the
//! same job, independent of `idem-redis`'s record layout: one string per key
//! holding `I<token>` while in flight and `D<body>` once done.
//!
//! * claim: `SET key I<token> NX PX lease`; when that answers nil, `GET key`;
//! * completion: a token-checked script (`GET` = `I<token>` → `SET key
//!   D<body> PX ttl`);
//! * replay: one `GET`.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicI64, Ordering};

use idem_redis::redis::aio::ConnectionManager;
use idem_redis::redis::{self, Script};

use super::workload::{Ended, Target, body};
use super::{LEASE_MS, TTL_MS};

static COMPLETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then \
           redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 \
         end return 0",
    )
});

/// The hand-written pattern on the store's connection.
#[derive(Debug)]
pub(crate) struct MinRedis {
    conn: ConnectionManager,
    prefix: String,
    done: Vec<u8>,
    tokens: AtomicI64,
}

impl MinRedis {
    pub(crate) fn new(conn: ConnectionManager, prefix: &str, body_len: usize) -> Self {
        let mut done = Vec::with_capacity(body_len + 1);
        done.push(b'D');
        done.extend_from_slice(&body(body_len));
        Self {
            conn,
            prefix: prefix.to_owned(),
            done,
            tokens: AtomicI64::new(1),
        }
    }

    /// `Ok(marker)` if claimed, else the standing value (`D<body>` or
    /// `I<token>`).
    async fn claim(&self, key: &str) -> Result<String, Vec<u8>> {
        let mut conn = self.conn.clone();
        let marker = format!("I{}", self.tokens.fetch_add(1, Ordering::Relaxed));
        let set: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(&marker)
            .arg("NX")
            .arg("PX")
            .arg(LEASE_MS)
            .query_async(&mut conn)
            .await
            .expect("SET NX");
        if set.is_some() {
            return Ok(marker);
        }
        let v: Option<Vec<u8>> = redis::cmd("GET")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("GET");
        Err(v.unwrap_or_default())
    }

    async fn complete(&self, key: &str, marker: &str) {
        let mut conn = self.conn.clone();
        let done: i64 = COMPLETE
            .key(key)
            .arg(marker)
            .arg(self.done.as_slice())
            .arg(TTL_MS)
            .invoke_async(&mut conn)
            .await
            .expect("complete");
        assert_eq!(done, 1, "token lost");
    }

    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }
}

impl Target for MinRedis {
    async fn fresh(&self, key: &str) {
        let key = self.key(key);
        let marker = self.claim(&key).await.expect("fresh key");
        self.complete(&key, &marker).await;
    }

    async fn replay(&self, key: &str) {
        let mut conn = self.conn.clone();
        let v: Vec<u8> = redis::cmd("GET")
            .arg(self.key(key))
            .query_async(&mut conn)
            .await
            .expect("GET");
        assert_eq!(v.first(), Some(&b'D'), "completed key");
        std::hint::black_box(v);
    }

    async fn contended(&self, key: &str) -> Ended {
        let key = self.key(key);
        match self.claim(&key).await {
            Ok(marker) => {
                self.complete(&key, &marker).await;
                Ended::Executed
            }
            Err(v) if v.first() == Some(&b'D') => {
                std::hint::black_box(v);
                Ended::Replayed
            }
            Err(_) => Ended::Conflict,
        }
    }
}
