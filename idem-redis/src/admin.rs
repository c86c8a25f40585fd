//! The operator operations on Redis: listing and counting by a bounded `SCAN`
//! per primary, release and delete as a read and a `swap.lua` (the record is
//! replaced only if it still holds what was read; with
//! [`RedisStore::with_replica_ack`], `WAIT` follows the swap like any write).
//!
//! Redis has no index on lease ends, so a listing walks the keyspace: each
//! call runs at most [`SCAN_STEPS`] `SCAN … MATCH <prefix>{*}:r COUNT n`
//! steps (n = the page size, 10 to 1000) on one primary after the other,
//! then reads each matching record with one `GET` (pipelined on a
//! standalone server, one per key on a cluster, where keys of different
//! slots cannot share a pipeline). A page may therefore hold fewer records
//! than asked (even none) while more follow, or somewhat more (a `SCAN` step
//! returns about `COUNT` keys); a record may be listed twice if Redis
//! rehashes during the walk. The cursor names the primary by its position in
//! the sorted list of primaries: a resharding during a walk may skip or
//! repeat records. Counting walks everything the same way.
//!
//! Records written before the operator API (without the `io`, `ip`, `ik`
//! identity fields) are counted but not listed; they age out with their key.
//! A key of ours holding another type (a record of a layout before 0.1, or
//! a key written by hand) is a [`StoreError::Corrupt`], never read.

use idem_core::clock::Timestamp;
use idem_core::store::{AdminStore, CursorError, InFlightQuery, StoreError};
use idem_core::store::{Cursor, Page, RecordState, RecordSummary, StateCounts};
use idem_core::{IdempotencyKey, RecordId, Scope};
use redis::aio::ConnectionLike;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{RedisResult, Value};

use crate::conn::Connection;
use crate::error::{BACKEND, corrupt, store_error};
use crate::keys::RecordKeys;
use crate::record::Record;
use crate::store::{RedisStore, string};

/// The most `SCAN` steps one listing call runs.
pub const SCAN_STEPS: u32 = 16;

/// How many times an operator write reads again after the record changed
/// under it.
const SWAP_ROUNDS: u32 = 8;

/// One primary: the standalone server, or a cluster node's address.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Node {
    Standalone,
    Cluster { host: String, port: u16 },
}

impl Connection {
    /// The primaries, in a stable order.
    async fn primaries(&self) -> RedisResult<Vec<Node>> {
        let Self::Cluster(c) = self else {
            return Ok(vec![Node::Standalone]);
        };
        let slots: Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut c.clone())
            .await?;
        let mut nodes = Vec::new();
        if let Value::Array(ranges) = slots {
            for range in ranges {
                let Value::Array(parts) = range else { continue };
                let Some(Value::Array(primary)) = parts.get(2) else {
                    continue;
                };
                let host = match primary.first() {
                    Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                    Some(Value::SimpleString(s)) => s.clone(),
                    _ => continue,
                };
                let Some(Value::Int(port)) = primary.get(1) else {
                    continue;
                };
                let Ok(port) = u16::try_from(*port) else {
                    continue;
                };
                nodes.push(Node::Cluster { host, port });
            }
        }
        nodes.sort();
        nodes.dedup();
        Ok(nodes)
    }

    /// One `SCAN` step on one primary.
    async fn scan(
        &self,
        node: &Node,
        cursor: u64,
        pattern: &str,
        count: u32,
    ) -> RedisResult<(u64, Vec<String>)> {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(count);
        match (self, node) {
            (Self::Standalone(c, _), _) => cmd.query_async(&mut c.clone()).await,
            (Self::Cluster(c), Node::Cluster { host, port }) => {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                });
                let v = c.clone().route_command(cmd, routing).await?;
                Ok(redis::from_redis_value(v)?)
            }
            (Self::Cluster(_), Node::Standalone) => Ok((0, Vec::new())),
        }
    }

    /// `GET key` for each key, error replies kept as values.
    async fn read_all(&self, keys: &[String]) -> RedisResult<Vec<RedisResult<Value>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        match self {
            Self::Standalone(c, _) => {
                let mut pipe = redis::pipe();
                for key in keys {
                    pipe.cmd("GET").arg(key);
                }
                let replies = c.clone().req_packed_commands(&pipe, 0, keys.len()).await?;
                Ok(replies.into_iter().map(Value::extract_error).collect())
            }
            Self::Cluster(c) => {
                let mut out = Vec::with_capacity(keys.len());
                for key in keys {
                    let v = redis::cmd("GET").arg(key).query_async(&mut c.clone()).await;
                    match v {
                        Err(e) if e.code() != Some("WRONGTYPE") => return Err(e),
                        v => out.push(v),
                    }
                }
                Ok(out)
            }
        }
    }
}

/// A listing's view of a record; `None` when it has no stored identity
/// (written before the operator API).
fn summary(r: &Record) -> Result<Option<RecordSummary>, StoreError> {
    if r.owner.is_empty() && r.operation.is_empty() && r.key.is_empty() {
        return Ok(None);
    }
    let scope = Scope::new(r.owner.as_str(), r.operation.as_str())
        .map_err(|e| corrupt(format!("stored scope: {e}")))?;
    let key = IdempotencyKey::parse(&r.key).map_err(|e| corrupt(format!("stored key: {e}")))?;
    Ok(Some(RecordSummary {
        id: RecordId::new(scope, key),
        state: r.state,
        attempt: r.attempt,
        lease_until: Timestamp::from_unix_millis(r.lease_until),
        resource_id: r.resource_id.clone(),
        key_expires_at: Timestamp::from_unix_millis(r.key_expires_at),
    }))
}

/// `<node index>:<scan cursor>`; any other text is the caller's input
/// ([`StoreError::InvalidCursor`], as on every store), not a backend error.
fn parse_cursor(c: &Cursor) -> Result<(usize, u64), StoreError> {
    let bad = || StoreError::from(CursorError);
    let (node, scan) = c.as_str().split_once(':').ok_or_else(bad)?;
    Ok((
        node.parse().map_err(|_| bad())?,
        scan.parse().map_err(|_| bad())?,
    ))
}

impl RedisStore {
    fn record_pattern(&self) -> String {
        format!("{}{{*}}:r", self.prefix.as_str())
    }

    /// The records at `keys` (`None` for one gone since the scan). A key
    /// holding another type (e.g. a record of a layout before 0.1) is a
    /// [`StoreError::Corrupt`], never read.
    async fn records(&self, keys: &[String]) -> Result<Vec<Option<Record>>, StoreError> {
        let values = self.values(keys).await?;
        values
            .iter()
            .map(|v| v.as_deref().map(Record::decode).transpose())
            .collect()
    }

    /// The values of the records at `keys`, as [`Self::records`].
    async fn values(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let replies = self.conn.read_all(keys).await.map_err(store_error)?;
        let mut out = Vec::with_capacity(keys.len());
        for reply in replies {
            out.push(reply.map_err(store_error).and_then(string)?);
        }
        Ok(out)
    }

    /// Reads a record and lets `change` decide its replacement (`None`
    /// leaves it, with the answer to give); the swap happens only if the
    /// record still holds the bytes read, else it reads again.
    async fn operator_swap(
        &self,
        keys: &RecordKeys,
        change: impl Fn(&Record) -> Result<(Option<Vec<u8>>, bool), StoreError>,
    ) -> Result<bool, StoreError> {
        let key = [keys.record_key().to_string_lossy()];
        for _ in 0..SWAP_ROUNDS {
            let Some(Some(old)) = self.values(&key).await?.pop() else {
                return Ok(false);
            };
            let rec = Record::decode(&old)?;
            let (new, answer) = change(&rec)?;
            let Some(new) = new else { return Ok(answer) };
            let (swapped, acked) = self.swap(keys, &old, &new, "keep", "").await?;
            if swapped {
                acked?;
                return Ok(answer);
            }
            tracing::debug!("the record changed under an operator's write; reading again");
        }
        Err(StoreError::Unavailable {
            backend: BACKEND,
            source: "the record kept changing under the operator's write".into(),
        })
    }
}

/// See the crate docs ("Cost per transition") for what each operation costs.
impl AdminStore for RedisStore {
    async fn list_in_flight(&self, q: &InFlightQuery<'_>) -> Result<Page, StoreError> {
        let nodes = self.conn.primaries().await.map_err(store_error)?;
        let (mut node, mut cursor) = q.cursor.map(parse_cursor).transpose()?.unwrap_or((0, 0));
        let limit = q.limit.max(1);
        let pattern = self.record_pattern();
        let mut records = Vec::new();
        let mut steps = 0;
        while node < nodes.len() && steps < SCAN_STEPS && records.len() < limit as usize {
            let (next, keys) = self
                .conn
                .scan(&nodes[node], cursor, &pattern, limit.clamp(10, 1000))
                .await
                .map_err(store_error)?;
            steps += 1;
            for rec in self.records(&keys).await?.into_iter().flatten() {
                let Some(r) = summary(&rec)? else {
                    continue;
                };
                if r.state == RecordState::InFlight
                    && r.lease_until <= q.lease_before
                    && r.key_expires_at > q.now
                {
                    records.push(r);
                }
            }
            if next == 0 {
                node += 1;
                cursor = 0;
            } else {
                cursor = next;
            }
        }
        let next = (node < nodes.len()).then(|| Cursor::new(format!("{node}:{cursor}")));
        Ok(Page { records, next })
    }

    async fn release_in_flight(
        &self,
        id: &RecordId,
        attempt: Option<u32>,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let keys = RecordKeys::new(&self.prefix, id);
        let now = now.as_unix_millis();
        self.operator_swap(&keys, |r| {
            if r.state != RecordState::InFlight
                || r.key_expires_at <= now
                || attempt.is_some_and(|a| a != r.attempt)
            {
                return Ok((None, false));
            }
            if r.lease_until <= now {
                return Ok((None, true)); // already over: nothing to write
            }
            let mut ended = r.clone();
            ended.lease_until = now;
            Ok((Some(ended.encode()?), true))
        })
        .await
    }

    async fn delete_completed(&self, id: &RecordId, now: Timestamp) -> Result<bool, StoreError> {
        let keys = RecordKeys::new(&self.prefix, id);
        let now = now.as_unix_millis();
        self.operator_swap(&keys, |r| {
            if r.state == RecordState::Completed || r.key_expires_at <= now {
                Ok((Some(Vec::new()), true)) // '' deletes record and body
            } else {
                Ok((None, false))
            }
        })
        .await
    }

    /// Walks every record (a `SCAN` of each primary). `expired` is always
    /// 0: Redis drops a record when its own TTL fires, and nothing waits for
    /// a purge. A record whose key expired on the engine's clock before
    /// Redis's TTL fired (the engine's clock ahead of the server's, or a
    /// test clock) is counted in no state: the engine already treats it as
    /// absent (a fetch finds nothing, a claim starts a new operation), and
    /// Redis drops it by itself.
    async fn count_states(&self, now: Timestamp) -> Result<StateCounts, StoreError> {
        let nodes = self.conn.primaries().await.map_err(store_error)?;
        let pattern = self.record_pattern();
        let mut c = StateCounts::default();
        for node in &nodes {
            let mut cursor = 0;
            loop {
                let (next, keys) = self
                    .conn
                    .scan(node, cursor, &pattern, 1000)
                    .await
                    .map_err(store_error)?;
                for r in self.records(&keys).await?.into_iter().flatten() {
                    if r.key_expires_at <= now.as_unix_millis() {
                        // Expired on the engine's clock, not yet dropped by
                        // Redis (see `count_states` below): in no state.
                        continue;
                    }
                    match r.state {
                        RecordState::InFlight => {
                            c.in_flight += 1;
                            if r.lease_until <= now.as_unix_millis() {
                                c.stuck += 1;
                            }
                        }
                        RecordState::Released => c.released += 1,
                        RecordState::Completed => c.completed += 1,
                    }
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(c)
    }
}
