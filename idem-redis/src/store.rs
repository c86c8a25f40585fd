//! [`RedisStore`]: the [`Store`] trait as one Lua script call per transition.

use std::fmt;

use idem_core::store::{
    Capabilities, ClaimOutcome, ClaimRequest, Claimed, Completion, OutcomeKind, Previous,
    PurgeReport, RecordState, Store, StoreError, StoredRecord, TakeoverReason, Token,
};
use idem_core::{Fingerprint, RecordId, Timestamp};
use redis::aio::ConnectionManager;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Client, RedisResult, ScriptInvocation, Value};

use crate::config::KeyPrefix;
use crate::error::{BACKEND, Error, corrupt, store_error};
use crate::keys::RecordKeys;
use crate::scripts;

/// An idempotency store in Redis or Redis Cluster.
///
/// Every [`Store`] method is exactly one `EVALSHA` of a small Lua script (see
/// the [crate docs](crate) for the key layout and the scripts). The store
/// holds one multiplexed, reconnecting connection: cloning it is cheap and
/// clones share the connection, which pipelines the calls of many tasks.
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_core::Idem;
/// use idem_redis::RedisStore;
///
/// let store = RedisStore::connect("redis://127.0.0.1:6379/").await?.with_prefix("shop:idem:")?;
/// let idem = Idem::new(store);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    conn: Connection,
    prefix: KeyPrefix,
}

/// The connection behind a store: standalone (reconnecting) or cluster.
#[derive(Clone)]
enum Connection {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

/// How many times a script call is made when Redis answers NOSCRIPT.
///
/// `invoke_async` already loads the script once after a NOSCRIPT; a
/// `SCRIPT FLUSH` or a failover landing between that load and the second
/// `EVALSHA` answers NOSCRIPT again. A NOSCRIPT reply means the script did not
/// run, so calling again can never apply a transition twice.
const NOSCRIPT_TRIES: u32 = 3;

impl Connection {
    async fn invoke(&self, inv: &ScriptInvocation<'_>) -> RedisResult<Value> {
        let mut tries = 1;
        loop {
            let result = match self {
                Self::Standalone(c) => inv.invoke_async(&mut c.clone()).await,
                Self::Cluster(c) => inv.invoke_async(&mut c.clone()).await,
            };
            match result {
                Err(e)
                    if tries < NOSCRIPT_TRIES
                        && e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    tries += 1;
                }
                other => return other,
            }
        }
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.conn {
            Connection::Standalone(_) => "standalone",
            Connection::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisStore")
            .field("connection", &kind)
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl RedisStore {
    /// Connects to a standalone Redis (`redis://host:port/db`) with a
    /// reconnecting connection and the default prefix `idem:`.
    ///
    /// # Errors
    ///
    /// [`Error::Connect`] when the URL is invalid or the server unreachable.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::from_client(Client::open(url)?).await
    }

    /// Builds a store over a reconnecting [`ConnectionManager`] made from
    /// `client`.
    ///
    /// # Errors
    ///
    /// [`Error::Connect`] when the server is unreachable.
    pub async fn from_client(client: Client) -> Result<Self, Error> {
        Ok(Self::from_manager(ConnectionManager::new(client).await?))
    }

    /// Builds a store over an existing [`ConnectionManager`] (for custom
    /// timeouts or retry settings).
    #[must_use]
    pub fn from_manager(manager: ConnectionManager) -> Self {
        Self {
            conn: Connection::Standalone(manager),
            prefix: KeyPrefix::default(),
        }
    }

    /// Connects to a Redis Cluster through any of its nodes.
    ///
    /// # Errors
    ///
    /// [`Error::Connect`] when a URL is invalid or no node answers.
    pub async fn connect_cluster<I, U>(nodes: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = U>,
        U: AsRef<str>,
    {
        let urls: Vec<String> = nodes.into_iter().map(|u| u.as_ref().to_owned()).collect();
        let client = ClusterClient::new(urls)?;
        Ok(Self::from_cluster(client.get_async_connection().await?))
    }

    /// Builds a store over an existing cluster connection.
    #[must_use]
    pub fn from_cluster(conn: ClusterConnection) -> Self {
        Self {
            conn: Connection::Cluster(conn),
            prefix: KeyPrefix::default(),
        }
    }

    /// Sets the key prefix (default `idem:`).
    ///
    /// # Errors
    ///
    /// [`Error::Prefix`] when the prefix is refused (see [`KeyPrefix`]).
    pub fn with_prefix(self, prefix: &str) -> Result<Self, Error> {
        Ok(self.with_key_prefix(KeyPrefix::new(prefix)?))
    }

    /// Sets an already validated key prefix.
    #[must_use]
    pub fn with_key_prefix(mut self, prefix: KeyPrefix) -> Self {
        self.prefix = prefix;
        self
    }

    /// The key prefix.
    #[must_use]
    pub fn prefix(&self) -> &KeyPrefix {
        &self.prefix
    }

    /// The Redis key of a record's hash (for operators and tests).
    #[must_use]
    pub fn record_key(&self, id: &RecordId) -> String {
        RecordKeys::new(&self.prefix, id).record
    }

    /// The Redis key of a record's response body (for operators and tests).
    #[must_use]
    pub fn body_key(&self, id: &RecordId) -> String {
        RecordKeys::new(&self.prefix, id).body
    }

    async fn run(&self, inv: &ScriptInvocation<'_>) -> Result<Value, StoreError> {
        self.conn.invoke(inv).await.map_err(store_error)
    }

    /// Runs a token-guarded write: `1` done, `0` lease lost.
    async fn guarded(&self, inv: &ScriptInvocation<'_>) -> Result<(), StoreError> {
        match self.run(inv).await? {
            Value::Int(1) => Ok(()),
            Value::Int(0) => Err(StoreError::LeaseLost),
            other => Err(unexpected(&other)),
        }
    }
}

/// The longest native TTL set (about 31,700 years): Redis refuses a
/// `PEXPIRE` whose deadline overflows, and a saturated deadline would.
const MAX_TTL_MS: i64 = 1_000_000_000_000_000;

/// Milliseconds from `now` to `deadline` for `PEXPIRE`, from 1 to
/// [`MAX_TTL_MS`].
fn ttl_ms(deadline: Timestamp, now: Timestamp) -> i64 {
    deadline
        .as_unix_millis()
        .saturating_sub(now.as_unix_millis())
        .clamp(1, MAX_TTL_MS)
}

impl Store for RedisStore {
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let keys = RecordKeys::new(&self.prefix, req.id);
        let mut inv = scripts::CLAIM.key(&keys.record);
        inv.key(&keys.body)
            .arg(req.fingerprint.as_bytes().as_slice())
            .arg(req.token.as_i64())
            .arg(req.now.as_unix_millis())
            .arg(req.lease_until.as_unix_millis())
            .arg(req.key_expires_at.as_unix_millis())
            .arg(ttl_ms(req.key_expires_at, req.now));
        let reply = self.run(&inv).await?;
        let Value::Array(items) = reply else {
            return Err(unexpected(&reply));
        };
        match items.split_first() {
            Some((Value::Int(0), [attempt, reason, checkpoint])) => {
                let attempt = int(attempt, "attempt").and_then(|a| {
                    u32::try_from(a).map_err(|_| corrupt(format!("attempt {a} is out of range")))
                })?;
                let reason = match reason {
                    Value::Int(0) => None,
                    Value::Int(1) => Some(TakeoverReason::LeaseExpired),
                    Value::Int(2) => Some(TakeoverReason::Released),
                    other => return Err(unexpected(other)),
                };
                let checkpoint = opt_text(checkpoint, "resource id")?;
                Ok(ClaimOutcome::Claimed(Claimed {
                    attempt,
                    previous: reason.map(|reason| Previous {
                        reason,
                        resource_id: checkpoint,
                    }),
                }))
            }
            Some((Value::Int(1), fields)) => Ok(ClaimOutcome::Existing(decode_record(fields)?)),
            _ => Err(corrupt("the claim script gave an unexpected reply")),
        }
    }

    async fn complete(
        &self,
        id: &RecordId,
        token: Token,
        c: &Completion<'_>,
    ) -> Result<(), StoreError> {
        let keys = RecordKeys::new(&self.prefix, id);
        let mut inv = scripts::COMPLETE.key(&keys.record);
        inv.key(&keys.body)
            .arg(token.as_i64())
            .arg(c.outcome.as_str())
            .arg(c.response_expires_at.as_unix_millis())
            .arg(c.key_expires_at.as_unix_millis())
            .arg(ttl_ms(c.response_expires_at, c.now))
            .arg(ttl_ms(c.key_expires_at, c.now))
            .arg(if c.body.is_some() { "1" } else { "0" })
            .arg(c.body.unwrap_or_default())
            .arg(if c.resource_id.is_some() { "1" } else { "0" })
            .arg(c.resource_id.unwrap_or_default());
        self.guarded(&inv).await
    }

    async fn release(&self, id: &RecordId, token: Token, now: Timestamp) -> Result<(), StoreError> {
        let keys = RecordKeys::new(&self.prefix, id);
        let mut inv = scripts::RELEASE.key(&keys.record);
        inv.arg(token.as_i64()).arg(now.as_unix_millis());
        self.guarded(&inv).await
    }

    async fn checkpoint(
        &self,
        id: &RecordId,
        token: Token,
        resource_id: &str,
    ) -> Result<(), StoreError> {
        let keys = RecordKeys::new(&self.prefix, id);
        let mut inv = scripts::CHECKPOINT.key(&keys.record);
        inv.arg(token.as_i64()).arg(resource_id);
        self.guarded(&inv).await
    }

    async fn extend_lease(
        &self,
        id: &RecordId,
        token: Token,
        lease_until: Timestamp,
    ) -> Result<(), StoreError> {
        let keys = RecordKeys::new(&self.prefix, id);
        let mut inv = scripts::EXTEND.key(&keys.record);
        inv.arg(token.as_i64()).arg(lease_until.as_unix_millis());
        self.guarded(&inv).await
    }

    async fn fetch(
        &self,
        id: &RecordId,
        now: Timestamp,
    ) -> Result<Option<StoredRecord>, StoreError> {
        let keys = RecordKeys::new(&self.prefix, id);
        let mut inv = scripts::FETCH.key(&keys.record);
        inv.key(&keys.body).arg(now.as_unix_millis());
        match self.run(&inv).await? {
            Value::Nil => Ok(None),
            Value::Array(fields) => decode_record(&fields).map(Some),
            other => Err(unexpected(&other)),
        }
    }

    /// Redis drops expired bodies and keys itself (`PEXPIRE` set from the
    /// engine's deadlines), so there is nothing to purge: always zero.
    async fn purge_expired(&self, _now: Timestamp, _limit: u32) -> Result<PurgeReport, StoreError> {
        Ok(PurgeReport::default())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::native_expiry()
    }
}

/// Decodes `{f, s, a, l, k, x, o, e, body}`; anything off is `Corrupt`.
fn decode_record(fields: &[Value]) -> Result<StoredRecord, StoreError> {
    let [f, s, a, l, k, x, o, e, body] = fields else {
        return Err(corrupt(format!(
            "a record has {} fields instead of 9",
            fields.len()
        )));
    };
    let fingerprint =
        Fingerprint::from_slice(bytes(f, "fingerprint")?.ok_or_else(|| missing("fingerprint"))?)
            .map_err(|len| corrupt(format!("the fingerprint is {len} bytes long")))?;
    let state = text(s, "state")?;
    let state =
        RecordState::parse(state).ok_or_else(|| corrupt(format!("unknown state {state:?}")))?;
    let attempt = int(a, "attempt")?;
    let attempt = u32::try_from(attempt)
        .map_err(|_| corrupt(format!("attempt {attempt} is out of range")))?;
    let outcome = match opt_text(o, "outcome")? {
        None => None,
        Some(o) => {
            Some(OutcomeKind::parse(&o).ok_or_else(|| corrupt(format!("unknown outcome {o:?}")))?)
        }
    };
    if state == RecordState::Completed && outcome.is_none() {
        return Err(corrupt("a completed record has no outcome"));
    }
    Ok(StoredRecord {
        fingerprint,
        state,
        attempt,
        lease_until: Timestamp::from_unix_millis(int(l, "lease")?),
        resource_id: opt_text(x, "resource id")?,
        outcome,
        response: bytes(body, "body")?.map(<[u8]>::to_vec),
        response_expires_at: match e {
            Value::Nil => None,
            v => Some(Timestamp::from_unix_millis(int(v, "response expiry")?)),
        },
        key_expires_at: Timestamp::from_unix_millis(int(k, "key expiry")?),
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

fn unexpected(v: &Value) -> StoreError {
    StoreError::Backend {
        backend: BACKEND,
        source: format!("unexpected reply from a script: {v:?}").into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_ttls_stay_within_what_pexpire_accepts() {
        let now = Timestamp::from_unix_millis(1_700_000_000_000);
        assert_eq!(
            ttl_ms(Timestamp::from_unix_millis(1_700_000_000_500), now),
            500
        );
        assert_eq!(ttl_ms(now, now), 1, "a deadline reached still gets 1 ms");
        assert_eq!(ttl_ms(Timestamp::from_unix_millis(0), now), 1);
        assert_eq!(
            ttl_ms(Timestamp::from_unix_millis(i64::MAX), now),
            MAX_TTL_MS
        );
    }

    #[test]
    fn records_decode_defensively() {
        let s = |b: &[u8]| Value::BulkString(b.to_vec());
        let good = [
            s(&[1; 32]),
            s(b"completed"),
            s(b"2"),
            s(b"10"),
            s(b"99"),
            Value::Nil,
            s(b"success"),
            s(b"50"),
            s(b"body"),
        ];
        let rec = decode_record(&good).expect("decodes");
        assert_eq!(rec.state, RecordState::Completed);
        assert_eq!(rec.attempt, 2);
        assert_eq!(rec.response.as_deref(), Some(b"body".as_slice()));
        assert_eq!(
            rec.response_expires_at,
            Some(Timestamp::from_unix_millis(50))
        );
        for (i, bad) in [
            s(b""),
            s(b"?"),
            s(b"-1"),
            s(b"x"),
            s(b"1.5"),
            Value::Nil,
            s(b"no"),
            s(b"x"),
            Value::Int(1),
        ]
        .into_iter()
        .enumerate()
        {
            let mut fields = good.clone();
            fields[i] = bad;
            if i == 5 {
                continue; // a missing resource id is fine
            }
            assert!(
                matches!(decode_record(&fields), Err(StoreError::Corrupt { .. })),
                "field {i}"
            );
        }
        assert!(matches!(
            decode_record(&good[..8]),
            Err(StoreError::Corrupt { .. })
        ));
    }
}
