//! The operator operations on Redis: listing and counting by a bounded `SCAN`
//! per primary, release and delete as one script each.
//!
//! Redis has no index on lease ends, so a listing walks the keyspace: each
//! call runs at most [`SCAN_STEPS`] `SCAN … MATCH <prefix>{*}:r COUNT n`
//! steps (n = the page size, 10 to 1000) on one primary after the other,
//! then reads each matching record with one `HMGET` (pipelined on a
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

use idem_core::admin::{AdminStore, Cursor, InFlightQuery, Page, RecordSummary, StateCounts};
use idem_core::store::{RecordState, StoreError};
use idem_core::{IdempotencyKey, RecordId, Scope, Timestamp};
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{RedisResult, Value};

use crate::error::{BACKEND, corrupt, store_error};
use crate::keys::RecordKeys;
use crate::scripts;
use crate::store::{Connection, RedisStore, unexpected};

/// The most `SCAN` steps one listing call runs.
pub const SCAN_STEPS: u32 = 16;

/// The fields a listing reads.
const SUMMARY_FIELDS: [&str; 8] = ["s", "a", "l", "x", "k", "io", "ip", "ik"];

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
            (Self::Standalone(c), _) => cmd.query_async(&mut c.clone()).await,
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

    /// `HMGET key fields…` for each key.
    async fn read_all(&self, keys: &[String], fields: &[&str]) -> RedisResult<Vec<Vec<Value>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        match self {
            Self::Standalone(c) => {
                let mut pipe = redis::pipe();
                for key in keys {
                    pipe.cmd("HMGET").arg(key).arg(fields);
                }
                pipe.query_async(&mut c.clone()).await
            }
            Self::Cluster(c) => {
                let mut out = Vec::with_capacity(keys.len());
                for key in keys {
                    let v: Vec<Value> = redis::cmd("HMGET")
                        .arg(key)
                        .arg(fields)
                        .query_async(&mut c.clone())
                        .await?;
                    out.push(v);
                }
                Ok(out)
            }
        }
    }
}

fn text(v: &Value) -> Option<&str> {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        v => text(v)?.parse().ok(),
    }
}

/// Decodes the [`SUMMARY_FIELDS`] of one record; `Ok(None)` when it has no
/// stored identity (written before the operator API).
fn decode_summary(fields: &[Value]) -> Result<Option<RecordSummary>, StoreError> {
    let [s, a, l, x, k, io, ip, ik] = fields else {
        return Err(corrupt("a record listing has the wrong number of fields"));
    };
    let (Some(owner), Some(operation), Some(key)) = (text(io), text(ip), text(ik)) else {
        return Ok(None);
    };
    let scope = Scope::new(owner, operation).map_err(|e| corrupt(format!("stored scope: {e}")))?;
    let key = IdempotencyKey::parse(key).map_err(|e| corrupt(format!("stored key: {e}")))?;
    let state = text(s)
        .and_then(RecordState::parse)
        .ok_or_else(|| corrupt("a record has no valid state"))?;
    let attempt = int(a)
        .and_then(|a| u32::try_from(a).ok())
        .ok_or_else(|| corrupt("a record has no valid attempt"))?;
    Ok(Some(RecordSummary {
        id: RecordId::new(scope, key),
        state,
        attempt,
        lease_until: Timestamp::from_unix_millis(
            int(l).ok_or_else(|| corrupt("a record has no lease"))?,
        ),
        resource_id: text(x).map(str::to_owned),
        key_expires_at: Timestamp::from_unix_millis(
            int(k).ok_or_else(|| corrupt("a record has no key expiry"))?,
        ),
    }))
}

/// `<node index>:<scan cursor>`.
fn parse_cursor(c: &Cursor) -> Result<(usize, u64), StoreError> {
    let bad = || StoreError::Backend {
        backend: BACKEND,
        source: "the cursor is not one this store wrote".into(),
    };
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
            let rows = self
                .conn
                .read_all(&keys, &SUMMARY_FIELDS)
                .await
                .map_err(store_error)?;
            for row in rows {
                let Some(r) = decode_summary(&row)? else {
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
        let mut inv = scripts::RELEASE_IN_FLIGHT.key(&keys.record);
        inv.arg(now.as_unix_millis())
            .arg(attempt.map(|a| a.to_string()).unwrap_or_default());
        match self.run(&inv).await? {
            Value::Int(n) => Ok(n == 1),
            other => Err(unexpected(&other)),
        }
    }

    async fn delete_completed(&self, id: &RecordId, now: Timestamp) -> Result<bool, StoreError> {
        let keys = RecordKeys::new(&self.prefix, id);
        let mut inv = scripts::DELETE_COMPLETED.key(&keys.record);
        inv.key(&keys.body).arg(now.as_unix_millis());
        match self.run(&inv).await? {
            Value::Int(n) => Ok(n == 1),
            other => Err(unexpected(&other)),
        }
    }

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
                let rows = self
                    .conn
                    .read_all(&keys, &["s", "l", "k"])
                    .await
                    .map_err(store_error)?;
                for row in rows {
                    let [s, l, k] = row.as_slice() else { continue };
                    let Some(kexp) = int(k) else { continue };
                    if kexp <= now.as_unix_millis() {
                        c.expired += 1;
                        continue;
                    }
                    match text(s).and_then(RecordState::parse) {
                        Some(RecordState::InFlight) => {
                            c.in_flight += 1;
                            if int(l).is_some_and(|l| l <= now.as_unix_millis()) {
                                c.stuck += 1;
                            }
                        }
                        Some(RecordState::Released) => c.released += 1,
                        Some(RecordState::Completed) => c.completed += 1,
                        _ => {}
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
