//! The claim: `SET <record> <in-flight record> NX PX <key TTL> GET`, one
//! native command, and everything else decided by the client from the
//! record it got back.
//!
//! With bodies kept inside their record
//! ([`RedisStore::with_inline_body_limit`]) that command is the whole claim,
//! replays included; a record whose body is in the body key (a body over the
//! limit, or a record written without the option) is followed by a `GET` of
//! it, one more round trip. Without the option the claim pipelines that
//! `GET` with the `SET` (one round trip, two commands), as before.

use idem_core::store::{ClaimOutcome, ClaimRequest, Claimed, Previous, StoreError};
use redis::{Cmd, ToRedisArgs, Value};
use tracing::warn;

use crate::error::{corrupt, store_error};
use crate::keys::RecordKeys;
use crate::record::{InFlight, Parsed, validated};
use crate::store::{RedisStore, string, ttl_ms};

/// The claim's command: `SET <record> <fresh> NX PX <ttl> GET` (`fresh` is
/// `len` bytes long). Its reply is nil when the record was written, else the
/// standing record.
pub(crate) fn command(record: &[u8], fresh: impl ToRedisArgs, len: usize, ttl: i64) -> Cmd {
    let mut cmd = Cmd::with_capacity(7, record.len() + len + 48);
    cmd.arg("SET")
        .arg(record)
        .arg(fresh)
        .arg("NX")
        .arg("PX")
        .arg(ttl)
        .arg("GET");
    cmd
}

/// The replies of a claim: the `SET`'s, the body key's if it was read along,
/// and whether enough replicas confirmed.
type Sent = (Value, Option<Value>, Result<(), StoreError>);

impl RedisStore {
    /// Sends the claim: the lone `SET`, or a pipeline with the body key's
    /// `GET` (without inline bodies) and `WAIT` (with an acknowledgement).
    async fn send_claim(
        &self,
        keys: &RecordKeys,
        fresh: &InFlight<'_>,
        ttl: i64,
    ) -> Result<Sent, StoreError> {
        let set = command(keys.record(), fresh, fresh.len(), ttl);
        let read_body = self.inline_limit == 0;
        if !read_body && self.ack.is_none() {
            let v = match self.conn.command(&set).await {
                Ok(v) => v,
                Err(e) => return Err(store_error(e)),
            };
            return Ok((v, None, Ok(())));
        }
        let mut pipe = redis::pipe();
        pipe.add_command(set);
        if read_body {
            pipe.cmd("GET").arg(keys.body().as_bytes());
        }
        let n = 1 + usize::from(read_body);
        let (replies, acked) = self.pipeline(&mut pipe, keys.record(), n).await?;
        let mut replies = replies.into_iter();
        let (Some(set), body, None) = (replies.next(), replies.next(), replies.next()) else {
            return Err(corrupt("a claim gave the wrong number of replies"));
        };
        if read_body && body.is_none() {
            return Err(corrupt("a claim gave the wrong number of replies"));
        }
        Ok((set, body, acked))
    }

    /// `GET` of the body key.
    async fn read_body(&self, keys: &RecordKeys) -> Result<Option<Vec<u8>>, StoreError> {
        let mut get = Cmd::with_capacity(2, 160);
        get.arg("GET").arg(keys.body().as_bytes());
        match self.conn.command(&get).await {
            Ok(v) => string(v),
            Err(e) => Err(store_error(e)),
        }
    }

    /// A claim, once (see [`Store::claim`](idem_core::store::Store::claim));
    /// `Ok(None)` when a race was lost and the claim must read again.
    pub(crate) async fn claim_once(
        &self,
        req: &ClaimRequest<'_>,
        keys: &RecordKeys,
        fresh: &InFlight<'_>,
        ttl: i64,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        let (set, body, acked) = self.send_claim(keys, fresh, ttl).await?;
        let Some(old) = string(set)? else {
            // Absent: the in-flight record is written.
            return self.claimed(keys, req, acked, 1, None).await.map(Some);
        };
        let rec = Parsed::parse(&old)?;
        let now = req.now.as_unix_millis();
        if rec.is_expired(now) {
            // Expired on the engine's clock, still in Redis: a new operation.
            let (reply, acked) = self
                .swap(keys, &old, &fresh.to_vec(), "new", &ttl.to_string())
                .await?;
            return if reply {
                self.claimed(keys, req, acked, 1, None).await.map(Some)
            } else {
                Ok(None)
            };
        }
        let mut stored = validated(rec.stored(&old)?)?;
        if let Some(reason) = stored.takeover_reason(&req.fingerprint, req.now) {
            let attempt = rec
                .attempt
                .checked_add(1)
                .ok_or_else(|| corrupt("the attempt count overflows"))?;
            let lease = req.lease_until.as_unix_millis();
            // Keep the key (and its native TTL) at least until the lease ends.
            let (key_expires_at, raise) = if lease > rec.key_expires_at {
                (lease, ttl_ms(req.lease_until, req.now).to_string())
            } else {
                (rec.key_expires_at, String::new())
            };
            let next = rec.taken_over(&old, req.token.as_i64(), attempt, lease, key_expires_at)?;
            let (reply, acked) = self.swap(keys, &old, &next, "keep", &raise).await?;
            return if reply {
                let previous = Previous {
                    reason,
                    resource_id: stored.resource_id.take(),
                };
                self.claimed(keys, req, acked, attempt, Some(previous))
                    .await
                    .map(Some)
            } else {
                Ok(None)
            };
        }
        let body = match body {
            Some(v) => string(v)?,
            None if rec.body_in_key(now) => self.read_body(keys).await?,
            None => None,
        };
        if rec.has_foreign_body(body.as_deref(), now)? {
            // Another completion's body: the record moved meanwhile.
            return Ok(None);
        }
        stored.response = rec.take_response(old, body, now)?;
        Ok(Some(ClaimOutcome::Existing(validated(stored)?)))
    }

    /// The claim is written; not acknowledged, it is given back.
    async fn claimed(
        &self,
        keys: &RecordKeys,
        req: &ClaimRequest<'_>,
        acked: Result<(), StoreError>,
        attempt: u32,
        previous: Option<Previous>,
    ) -> Result<ClaimOutcome, StoreError> {
        if let Err(e) = acked {
            // Not acknowledged: the work must not run. Give the key back so
            // the next retry need not wait for the lease (a lost release only
            // delays it).
            warn!(error = %e, "claim not acknowledged by the replicas: given back, work not run");
            if let Err(release) = self.release_keys(keys, req.token, req.now).await {
                warn!(error = %release, "giving the claim back failed; left to its lease");
            }
            return Err(e);
        }
        Ok(ClaimOutcome::Claimed(Claimed { attempt, previous }))
    }
}
