//! [`RedisStore`]: the [`Store`] trait as native commands for claims, replays
//! and fetches, and one Lua script call per token-checked write.

use std::fmt;
use std::time::Duration;

use idem_core::RecordId;
use idem_core::clock::Timestamp;
use idem_core::ops::{OutcomeKind, PurgeReport, RecordState};
use idem_core::store::{
    Capabilities, ClaimOutcome, ClaimRequest, Claimed, Completion, Previous, Store, StoreError,
    StoredRecord, Token,
};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use redis::{Client, ErrorKind, RedisError, RedisResult, ScriptInvocation, Value};
use tracing::{debug, info, warn};

use crate::ack::ReplicaAck;
use crate::config::KeyPrefix;
use crate::error::{BACKEND, Error, corrupt, is_wrong_type, store_error};
use crate::keys::{RecordKeys, body_for, legacy_body};
use crate::record::{BODY_HEADER, Record, encode_body, outcome_byte};
use crate::scripts;

/// An idempotency store in Redis or Redis Cluster.
///
/// A claim (and so a replay) is one pipeline of two native commands; a
/// completion, release, saved resource id or lease extension is one `EVALSHA` of a
/// small Lua script that checks the fencing token (see the
/// [crate docs](crate) for the record layout and the commands of each
/// transition). Every call is one round trip, except a takeover (the claim,
/// then a swap). The store holds one multiplexed, reconnecting connection:
/// cloning it is cheap and clones share the connection, which pipelines the
/// calls of many tasks.
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
    pub(crate) conn: Connection,
    pub(crate) prefix: KeyPrefix,
    ack: Option<ReplicaAck>,
}

/// The connection behind a store: standalone (reconnecting) or cluster.
#[derive(Clone)]
pub(crate) enum Connection {
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
                    debug!(
                        tries,
                        "script not loaded on the server (NOSCRIPT): calling again"
                    );
                    tries += 1;
                }
                other => return other,
            }
        }
    }

    /// Sends `pipe` in one round trip and returns its `n` replies, error
    /// replies included as [`Value::ServerError`]. In a cluster the pipeline
    /// goes to the primary of `key`'s slot (every key of a record shares it,
    /// and a `WAIT` in the pipeline must reach the node that wrote).
    pub(crate) async fn packed(
        &self,
        pipe: &redis::Pipeline,
        key: &str,
        n: usize,
    ) -> RedisResult<Vec<Value>> {
        match self {
            Self::Standalone(c) => c.clone().req_packed_commands(pipe, 0, n).await,
            Self::Cluster(c) => {
                let route = Route::with_key(key, SlotAddr::Master);
                c.clone()
                    .route_pipeline(
                        pipe.clone(),
                        0,
                        n,
                        SingleNodeRoutingInfo::SpecificNode(route),
                    )
                    .await
            }
        }
    }

    /// One command on the keys of one record.
    pub(crate) async fn query(&self, cmd: &redis::Cmd) -> RedisResult<Value> {
        match self {
            Self::Standalone(c) => cmd.query_async(&mut c.clone()).await,
            Self::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        }
    }

    /// Sends the commands of `pre`, the script `inv` and, with `ack`,
    /// `WAIT`, in one pipeline routed like [`Self::packed`]; returns the
    /// script's reply and `WAIT`'s. An error reply to a command of `pre` is
    /// the call's error. After `NOSCRIPT` the script is loaded and the whole
    /// pipeline sent again (the script did not run; `pre` must be safe to
    /// repeat).
    pub(crate) async fn script_pipeline(
        &self,
        pre: &redis::Pipeline,
        inv: &ScriptInvocation<'_>,
        key: &str,
        ack: Option<ReplicaAck>,
    ) -> RedisResult<(Value, Option<Value>)> {
        let n_pre = pre.len();
        let mut pipe = pre.clone();
        pipe.invoke_script(inv);
        if let Some(ack) = ack {
            pipe.cmd("WAIT").arg(ack.replicas()).arg(ack.timeout_ms());
        }
        let n = n_pre + 1 + usize::from(ack.is_some());
        let mut tries = 1;
        loop {
            let mut replies = self.packed(&pipe, key, n).await?.into_iter();
            for _ in 0..n_pre {
                if let Some(v) = replies.next() {
                    v.extract_error()?;
                }
            }
            let script = replies.next().unwrap_or(Value::Nil);
            match script.extract_error() {
                Err(e)
                    if tries < NOSCRIPT_TRIES
                        && e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    debug!(
                        tries,
                        "script not loaded on the server (NOSCRIPT): loading it"
                    );
                    match self {
                        Self::Standalone(c) => inv.load_async(&mut c.clone()).await?,
                        Self::Cluster(c) => inv.load_async(&mut c.clone()).await?,
                    };
                    tries += 1;
                }
                Err(e) => return Err(e),
                Ok(script) => {
                    let wait = replies.next().map(Value::extract_error).transpose()?;
                    return Ok((script, wait));
                }
            }
        }
    }

    /// Runs a script and `WAIT <replicas> <timeout>` in one pipeline on the
    /// connection to the primary of `key`'s slot; returns both replies.
    ///
    /// `WAIT` counts the replicas holding every write made so far *on its own
    /// connection*, so it must follow the script on the same connection with
    /// no reconnection in between: one pipeline gives both (a dropped
    /// connection fails the pair). In a cluster redis-rs would send a lone
    /// `WAIT` to every primary and keep the smallest answer, so the pipeline
    /// is routed explicitly to the slot's primary.
    async fn invoke_then_wait(
        &self,
        inv: &ScriptInvocation<'_>,
        key: &str,
        ack: ReplicaAck,
    ) -> RedisResult<(Value, Value)> {
        let mut pipe = redis::pipe();
        pipe.invoke_script(inv)
            .cmd("WAIT")
            .arg(ack.replicas())
            .arg(ack.timeout_ms());
        let mut tries = 1;
        loop {
            let replies = match self {
                Self::Standalone(c) => c.clone().req_packed_commands(&pipe, 0, 2).await?,
                Self::Cluster(c) => {
                    let route = Route::with_key(key, SlotAddr::Master);
                    c.clone()
                        .route_pipeline(
                            pipe.clone(),
                            0,
                            2,
                            SingleNodeRoutingInfo::SpecificNode(route),
                        )
                        .await?
                }
            };
            let [script, wait]: [Value; 2] = replies.try_into().map_err(|r: Vec<Value>| {
                RedisError::from((
                    ErrorKind::UnexpectedReturnType,
                    "script and WAIT",
                    format!("{} replies instead of 2", r.len()),
                ))
            })?;
            match script.extract_error() {
                Err(e)
                    if tries < NOSCRIPT_TRIES
                        && e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    debug!(
                        tries,
                        "script not loaded on the server (NOSCRIPT): loading it"
                    );
                    match self {
                        Self::Standalone(c) => inv.load_async(&mut c.clone()).await?,
                        Self::Cluster(c) => inv.load_async(&mut c.clone()).await?,
                    };
                    tries += 1;
                }
                Err(e) => return Err(e),
                Ok(script) => return Ok((script, wait.extract_error()?)),
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
            .field("replica_ack", &self.ack)
            .finish()
    }
}

impl RedisStore {
    /// A store over your reconnecting [`ConnectionManager`] (the Redis
    /// counterpart of the SQL backends' pool), with the default prefix
    /// `idem:`. Clones of the manager share its connection; so do clones of
    /// the store.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_redis::RedisStore;
    ///
    /// let manager = redis::Client::open("redis://127.0.0.1:6379/")?
    ///     .get_connection_manager()
    ///     .await?;
    /// let store = RedisStore::new(manager).with_prefix("shop:idem:")?;
    /// store.migrate().await?; // nothing to do on Redis, see `migrate`
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn new(manager: ConnectionManager) -> Self {
        Self {
            conn: Connection::Standalone(manager),
            prefix: KeyPrefix::default(),
            ack: None,
        }
    }

    /// Connects to a standalone Redis (`redis://host:port/db`,
    /// `rediss://…` for TLS) with a reconnecting connection and redis-rs's
    /// default timeouts, and the default prefix `idem:`.
    ///
    /// # Errors
    ///
    /// [`Error::Connect`] when the URL is invalid or the server unreachable.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::connect_with(ConnectionManagerConfig::new(), Client::open(url)?).await
    }

    /// Connects to a standalone Redis through your `client` (its address,
    /// credentials, TLS) with your connection settings (`config`: response
    /// and connection timeouts, reconnection backoff), and the default prefix
    /// `idem:`.
    ///
    /// With [`RedisStore::with_replica_ack`], give the connection a response
    /// timeout longer than the acknowledgement's, or the client gives up
    /// before `WAIT` answers.
    ///
    /// # Errors
    ///
    /// [`Error::Connect`] when the server is unreachable.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    ///
    /// use idem_redis::RedisStore;
    /// use redis::aio::ConnectionManagerConfig;
    ///
    /// let config = ConnectionManagerConfig::new().set_response_timeout(Some(Duration::from_secs(2)));
    /// let client = redis::Client::open("redis://127.0.0.1:6379/")?;
    /// let store = RedisStore::connect_with(config, client).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_with(
        config: ConnectionManagerConfig,
        client: Client,
    ) -> Result<Self, Error> {
        let manager = client.get_connection_manager_with_config(config).await?;
        debug!(
            server = %client.get_connection_info().addr(),
            "connected to redis"
        );
        Ok(Self::new(manager))
    }

    /// Connects to a Redis Cluster through any of its nodes, with the
    /// default prefix `idem:`.
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
        let client = ClusterClient::new(urls.clone())?;
        let conn = client.get_async_connection().await?;
        // The URLs may carry passwords: only their number is logged.
        debug!(nodes = urls.len(), "connected to redis cluster");
        Ok(Self::new_cluster(conn))
    }

    /// A store over your cluster connection (built with your
    /// [`ClusterClientBuilder`](redis::cluster::ClusterClientBuilder)
    /// settings), with the default prefix `idem:`.
    #[must_use]
    pub fn new_cluster(conn: ClusterConnection) -> Self {
        Self {
            conn: Connection::Cluster(conn),
            prefix: KeyPrefix::default(),
            ack: None,
        }
    }

    /// Does nothing and returns `Ok(())`: Redis has no schema to create.
    /// It exists so that code written for any backend (a deployment step, the
    /// command-line tool) can call `migrate()` on every store alike.
    ///
    /// Records of an older layout are not rewritten here, all at once (that
    /// would walk the keyspace); each is rewritten in the current layout when
    /// a call first meets it (one `WRONGTYPE` reply, then `migrate.lua`), and
    /// the rest age out with their keys.
    ///
    /// # Errors
    ///
    /// None today; the `Result` keeps the signature of the other backends.
    pub async fn migrate(&self) -> Result<(), Error> {
        Ok(())
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

    /// The prefix every key of this store starts with (`SCAN MATCH
    /// <prefix>*` finds them all).
    #[must_use]
    pub fn prefix(&self) -> &KeyPrefix {
        &self.prefix
    }

    /// The Redis key holding a record (`<prefix>{<hex>}:r`, `<hex>` the
    /// SHA-256 of owner, operation and key, so every key of the record
    /// shares one cluster slot), for an operator who wants `TTL`, `OBJECT` or
    /// `DEBUG` on it, or a test that damages it by hand. Reading or writing
    /// it directly bypasses the fencing token: the operator API
    /// ([`AdminStore`](idem_core::store::AdminStore)) is the safe way to
    /// change a record. The layout of its value is internal and may change.
    #[must_use]
    pub fn record_key(&self, id: &RecordId) -> String {
        RecordKeys::new(&self.prefix, id).record
    }

    /// The Redis key holding a record's stored response body (`…:v`, in the
    /// record's slot), which expires natively at the response TTL while the
    /// record stays until the key TTL. For the same uses as
    /// [`RedisStore::record_key`], with the same caveats.
    #[must_use]
    pub fn body_key(&self, id: &RecordId) -> String {
        RecordKeys::new(&self.prefix, id).body
    }

    /// Reports a claim, completion, saved resource id or lease extension done only
    /// once `replicas` replicas have received it: each of those scripts is
    /// followed by `WAIT <replicas> <timeout>` in one pipeline, on the
    /// connection that wrote. When fewer replicas confirm within `timeout`,
    /// the call fails with [`StoreError::Unavailable`] (HTTP 503, retryable)
    /// whose source is a [`NotAcknowledged`](crate::NotAcknowledged): the
    /// write is on the primary but a failover may lose it, so it is never
    /// reported as done. `replicas == 0` turns the option off.
    ///
    /// * A claim not acknowledged is released again (best effort) and the
    ///   work does not run; the caller gets the 503.
    /// * A completion not acknowledged is retried by the engine
    ///   ([`Policy`](idem_core::Policy)'s `store_retries`; a retry by the
    ///   same attempt re-confirms instead of answering "lease lost"), then the
    ///   caller gets the work's outcome with
    ///   [`Reply::is_stored`](idem_core::Reply::is_stored) `false` and the
    ///   record is left to its lease and a recovery.
    /// * A release is sent without `WAIT`: losing it in a failover leaves the
    ///   record `in_flight` until its lease ends, which delays the next
    ///   attempt but never lets the work run twice.
    /// * An operator's release or delete
    ///   ([`AdminStore`](idem_core::store::AdminStore)) not acknowledged is the
    ///   same error: on the primary, not confirmed.
    /// * A replay carries the claim's `WAIT` (the claim's `SET … NX` cannot
    ///   know beforehand whether it writes); a fetch sends none.
    ///
    /// The connection's own response timeout must be longer than `timeout`,
    /// or the client gives up first and the write is reported as
    /// [`StoreError::Unavailable`] ("timed out") before `WAIT` could answer.
    /// [`RedisStore::connect`] keeps redis-rs's default of 500 ms; for a
    /// longer acknowledgement, build the store with
    /// [`RedisStore::connect_with`] and a
    /// [`ConnectionManagerConfig`](redis::aio::ConnectionManagerConfig) with a
    /// larger `set_response_timeout`.
    ///
    /// `WAIT` confirms the write reached the replicas' memory, not their
    /// disks, and Redis still promotes whichever replica it likes: see the
    /// durability table in the [crate docs](crate). Every write then costs a
    /// replica round trip more (measured in the crate docs).
    #[must_use]
    pub fn with_replica_ack(mut self, replicas: u32, timeout: Duration) -> Self {
        self.ack = (replicas > 0).then(|| ReplicaAck::new(replicas, timeout));
        self
    }

    /// The replication acknowledgement required, if any.
    #[must_use]
    pub fn replica_ack(&self) -> Option<ReplicaAck> {
        self.ack
    }

    pub(crate) async fn run(&self, inv: &ScriptInvocation<'_>) -> Result<Value, StoreError> {
        self.conn.invoke(inv).await.map_err(store_error)
    }

    /// Runs a script that may write to the record at `record_key`; with the
    /// acknowledgement option, `WAIT` follows on the same connection. Returns
    /// the script's reply and whether enough replicas confirmed (always `Ok`
    /// without the option). The caller decides whether the confirmation
    /// matters (it does not when the script wrote nothing).
    async fn write(
        &self,
        inv: &ScriptInvocation<'_>,
        record_key: &str,
    ) -> Result<(Value, Result<(), StoreError>), StoreError> {
        let Some(ack) = self.ack else {
            return Ok((self.run(inv).await?, Ok(())));
        };
        let (reply, waited) = self
            .conn
            .invoke_then_wait(inv, record_key, ack)
            .await
            .map_err(store_error)?;
        let acked = match waited {
            Value::Int(n) => ack.check(n),
            other => Err(unexpected(&other)),
        };
        Ok((reply, acked))
    }

    /// Runs a token-guarded write that must be acknowledged: `1` done, `0`
    /// lease lost.
    async fn guarded(
        &self,
        inv: &ScriptInvocation<'_>,
        record_key: &str,
    ) -> Result<(), StoreError> {
        let (reply, acked) = self.write(inv, record_key).await?;
        match reply {
            Value::Int(1) => acked,
            Value::Int(0) => Err(StoreError::LeaseLost),
            other => Err(unexpected(&other)),
        }
    }

    /// Releases under `token` without `WAIT` (see [`Self::with_replica_ack`]).
    async fn release_keys(
        &self,
        keys: &RecordKeys,
        token: Token,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let mut inv = scripts::RELEASE.key(&keys.record);
        inv.arg(&be8(token.as_i64())[..])
            .arg(&be8(now.as_unix_millis())[..]);
        match self.run(&inv).await? {
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

/// How many times a claim reads again after losing a race (a swap that
/// found the record changed, a body written by another completion): each
/// lost race means another caller moved the record on.
const CLAIM_ROUNDS: u32 = 8;

/// How many times an operation is retried after rewriting a record of the
/// hash layout.
const MIGRATE_TRIES: u32 = 3;

fn be8(ms: i64) -> [u8; 8] {
    ms.to_be_bytes()
}

impl RedisStore {
    /// Sends `pipe` (commands on the keys of one record) in one round trip;
    /// with the acknowledgement option `WAIT` follows in the same pipeline
    /// and the second value tells whether enough replicas confirmed.
    async fn pipeline(
        &self,
        pipe: &mut redis::Pipeline,
        record_key: &str,
        n: usize,
    ) -> Result<(Vec<Value>, Result<(), StoreError>), StoreError> {
        let Some(ack) = self.ack else {
            let replies = self
                .conn
                .packed(pipe, record_key, n)
                .await
                .map_err(store_error)?;
            return Ok((replies, Ok(())));
        };
        pipe.cmd("WAIT").arg(ack.replicas()).arg(ack.timeout_ms());
        let mut replies = self
            .conn
            .packed(pipe, record_key, n + 1)
            .await
            .map_err(store_error)?;
        let acked = match replies.pop().map(Value::extract_error) {
            Some(Ok(Value::Int(n))) => ack.check(n),
            Some(Err(e)) => Err(store_error(e)),
            other => Err(corrupt(format!("unexpected WAIT reply {other:?}"))),
        };
        Ok((replies, acked))
    }

    /// Reads a record and its body: `GET` of both keys, one round trip.
    async fn read(
        &self,
        keys: &RecordKeys,
    ) -> Result<Option<(Record, Option<Vec<u8>>)>, StoreError> {
        let mut pipe = redis::pipe();
        pipe.cmd("GET").arg(&keys.record).cmd("GET").arg(&keys.body);
        let replies = self
            .conn
            .packed(&pipe, &keys.record, 2)
            .await
            .map_err(store_error)?;
        let [rec, body]: [Value; 2] = replies
            .try_into()
            .map_err(|_| corrupt("a read gave the wrong number of replies"))?;
        let Some(rec) = string(rec)? else {
            return Ok(None);
        };
        Ok(Some((Record::decode(&rec)?, string(body)?)))
    }

    /// Rewrites a record of the hash layout in layout 1. `true` when the
    /// operation may run again: migrated, or changed or gone meanwhile (a
    /// retry reads it afresh); `false` when the record is not a hash, so the
    /// `WRONGTYPE` came from something else.
    pub(crate) async fn migrate_record(&self, record_key: &str) -> Result<bool, StoreError> {
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
        let mut inv = scripts::MIGRATE.key(record_key);
        inv.key(legacy_body(record_key)).key(body_for(record_key));
        for v in &fields {
            match v {
                Value::Nil => inv.arg(""),
                v => {
                    let mut seen = b"=".to_vec();
                    seen.extend_from_slice(bytes(v, "field")?.unwrap_or_default());
                    inv.arg(seen)
                }
            };
        }
        inv.arg(record.encode()?)
            .arg(&encode_body(record.token, b"")[..BODY_HEADER]);
        // Written with `WAIT` like any other write, but the operation that
        // follows confirms what matters; the migration itself needs none.
        match self.write(&inv, record_key).await?.0 {
            Value::Int(_) => Ok(true),
            other => Err(unexpected(&other)),
        }
    }

    /// A claim, once (see [`Store::claim`]); `Ok(None)` when a race was lost
    /// and the claim must read again.
    async fn claim_once(
        &self,
        req: &ClaimRequest<'_>,
        keys: &RecordKeys,
        fresh: &[u8],
        ttl: i64,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        let mut pipe = claim_pipeline(&keys.record, &keys.body, fresh, ttl);
        let (replies, acked) = self.pipeline(&mut pipe, &keys.record, 2).await?;
        let [set, body]: [Value; 2] = replies
            .try_into()
            .map_err(|_| corrupt("a claim gave the wrong number of replies"))?;
        let Some(old) = string(set)? else {
            // Absent: the in-flight record is written.
            return self.claimed(keys, req, acked, 1, None).await.map(Some);
        };
        let rec = Record::decode(&old)?;
        let now = req.now.as_unix_millis();
        if rec.is_expired(now) {
            // Expired on the engine's clock, still in Redis: a new operation.
            let (reply, acked) = self
                .swap(keys, &old, fresh, "new", &ttl.to_string())
                .await?;
            return if reply {
                self.claimed(keys, req, acked, 1, None).await.map(Some)
            } else {
                Ok(None)
            };
        }
        let stored = rec.to_stored(None, now)?;
        if let Some(reason) = stored.takeover_reason(&req.fingerprint, req.now) {
            let attempt = rec
                .attempt
                .checked_add(1)
                .ok_or_else(|| corrupt("the attempt count overflows"))?;
            let lease = req.lease_until.as_unix_millis();
            let mut next = Record {
                state: RecordState::InFlight,
                token: req.token.as_i64(),
                attempt,
                lease_until: lease,
                ..rec.clone()
            };
            // Keep the key (and its native TTL) at least until the lease ends.
            let raise = if lease > rec.key_expires_at {
                next.key_expires_at = lease;
                ttl_ms(req.lease_until, req.now).to_string()
            } else {
                String::new()
            };
            let (reply, acked) = self
                .swap(keys, &old, &next.encode()?, "keep", &raise)
                .await?;
            return if reply {
                let previous = Previous {
                    reason,
                    resource_id: rec.resource_id,
                };
                self.claimed(keys, req, acked, attempt, Some(previous))
                    .await
                    .map(Some)
            } else {
                Ok(None)
            };
        }
        let body = string(body)?;
        if rec.has_foreign_body(body.as_deref(), now)? {
            // Another completion's body: the record moved meanwhile.
            return Ok(None);
        }
        Ok(Some(ClaimOutcome::Existing(
            rec.to_stored(body.as_deref(), now)?,
        )))
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

    /// Runs `swap.lua`: `true` when the record still held `old` and was
    /// replaced, with the acknowledgement's result.
    pub(crate) async fn swap(
        &self,
        keys: &RecordKeys,
        old: &[u8],
        new: &[u8],
        mode: &str,
        ttl: &str,
    ) -> Result<(bool, Result<(), StoreError>), StoreError> {
        let mut inv = scripts::SWAP.key(&keys.record);
        inv.key(&keys.body).arg(old).arg(new).arg(mode).arg(ttl);
        let (reply, acked) = self.write(&inv, &keys.record).await?;
        match reply {
            Value::Int(1) => Ok((true, acked)),
            Value::Int(0) => Ok((false, acked)),
            other => Err(unexpected(&other)),
        }
    }

    async fn complete_once(
        &self,
        keys: &RecordKeys,
        token: Token,
        c: &Completion<'_>,
    ) -> Result<(), StoreError> {
        let body = c.body.map(|b| encode_body(token.as_i64(), b));
        let (pre, inv) = complete_pipeline(
            keys,
            token.as_i64(),
            c.outcome,
            [c.key_expires_at, c.response_expires_at].map(Timestamp::as_unix_millis),
            [
                ttl_ms(c.key_expires_at, c.now),
                ttl_ms(c.response_expires_at, c.now),
            ],
            body.as_deref(),
            c.resource_id,
        );
        let (reply, waited) = self
            .conn
            .script_pipeline(&pre, &inv, &keys.record, self.ack)
            .await
            .map_err(store_error)?;
        let acked = match (self.ack, waited) {
            (None, _) => Ok(()),
            (Some(ack), Some(Value::Int(n))) => ack.check(n),
            (Some(_), other) => Err(corrupt(format!("unexpected WAIT reply {other:?}"))),
        };
        match reply {
            // 2: already completed under this token, a retry after a lost
            // reply or a missing acknowledgement: done, not a lost lease. The
            // script rewrote the record unchanged, so the `WAIT` after it
            // covers the completion: with the option, a confirmation now is
            // the confirmation the first call lacked.
            Value::Int(1 | 2) => acked,
            Value::Int(0) => Err(StoreError::LeaseLost),
            other => Err(unexpected(&other)),
        }
    }
}

/// The claim: `SET <record> <in-flight record> NX PX <key TTL> GET` and
/// `GET <body>`, one pipeline. The first reply is nil when the record was
/// written, else the standing record; the second its body, if any.
pub(crate) fn claim_pipeline(record: &str, body: &str, fresh: &[u8], ttl: i64) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.cmd("SET")
        .arg(record)
        .arg(fresh)
        .arg("NX")
        .arg("PX")
        .arg(ttl)
        .arg("GET")
        .cmd("GET")
        .arg(body);
    pipe
}

/// Bodies (with their header) up to this size go to `complete.lua` as an
/// argument; larger ones are staged by a native `SET` and moved into place by
/// the script. Measured with the server under callgrind: passing a body
/// through Lua costs about 13 instructions per byte (copies in and out of
/// Lua, and the garbage collector's work for them), staging it a flat
/// 10,500 (one more command and a `RENAME`): even at about 800 bytes.
pub(crate) const INLINE_BODY_MAX: usize = 1024;

/// The completion, one pipeline: `SET <staging> <body value> PX <body TTL>`
/// for a large body (see [`INLINE_BODY_MAX`]), then `complete.lua`,
/// returned apart so that the caller can reload it after `NOSCRIPT`.
/// `expiries` are the key's and the response's (ms since the epoch), `ttls`
/// the same as native TTLs, `body` the body value ([`encode_body`]),
/// `resource_id` the id replacing the record's, if any.
pub(crate) fn complete_pipeline<'a>(
    keys: &RecordKeys,
    token: i64,
    outcome: OutcomeKind,
    expiries: [i64; 2],
    ttls: [i64; 2],
    body: Option<&[u8]>,
    resource_id: Option<&str>,
) -> (redis::Pipeline, ScriptInvocation<'a>) {
    let staging = keys.staging(token);
    let mut pre = redis::pipe();
    let mode = match body {
        None => "0",
        Some(b) if b.len() > INLINE_BODY_MAX => {
            pre.cmd("SET").arg(&staging).arg(b).arg("PX").arg(ttls[1]);
            "1"
        }
        Some(_) => "2",
    };
    let mut both = [0; 16];
    both[..8].copy_from_slice(&be8(expiries[0]));
    both[8..].copy_from_slice(&be8(expiries[1]));
    let mut inv = scripts::COMPLETE.key(&keys.record);
    inv.key(&keys.body);
    if mode == "1" {
        inv.key(staging);
    }
    inv.arg(&be8(token)[..])
        .arg(&both[..])
        .arg(&[outcome_byte(outcome)][..])
        .arg(ttls[0])
        .arg(mode)
        .arg(if resource_id.is_some() { "1" } else { "0" })
        .arg(resource_id.unwrap_or_default());
    if let (Some(b), "2") = (body, mode) {
        inv.arg(b).arg(ttls[1]);
    }
    (pre, inv)
}

/// Runs `$op` (an expression giving `Result<_, StoreError>`) again after
/// rewriting a record of the hash layout found at `$record`.
macro_rules! migrating {
    ($self:ident, $record:expr, $op:expr) => {{
        let mut tries = 1;
        loop {
            match $op {
                Err(e) if tries < MIGRATE_TRIES && is_wrong_type(&e) => {
                    if !$self.migrate_record($record).await? {
                        break Err(e);
                    }
                    info!("rewrote a record of the hash layout in layout 1");
                    tries += 1;
                }
                other => break other,
            }
        }
    }};
}

impl Store for RedisStore {
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let keys = RecordKeys::new(&self.prefix, req.id);
        // A lease is never outlived by its key.
        let key_expires_at = req.key_expires_at.max(req.lease_until);
        let fresh = Record::in_flight(
            req.id,
            &req.fingerprint,
            req.token,
            req.lease_until,
            key_expires_at,
        )
        .encode()?;
        let ttl = ttl_ms(key_expires_at, req.now);
        for _ in 0..CLAIM_ROUNDS {
            let once = migrating!(
                self,
                &keys.record,
                self.claim_once(req, &keys, &fresh, ttl).await
            );
            if let Some(outcome) = once? {
                return Ok(outcome);
            }
            debug!("claim lost a race; reading the record again");
        }
        Err(StoreError::Unavailable {
            backend: BACKEND,
            source: format!("the record changed under {CLAIM_ROUNDS} claims in a row").into(),
        })
    }

    async fn complete(
        &self,
        id: &RecordId,
        token: Token,
        c: &Completion<'_>,
    ) -> Result<(), StoreError> {
        let keys = RecordKeys::new(&self.prefix, id);
        migrating!(
            self,
            &keys.record,
            self.complete_once(&keys, token, c).await
        )
    }

    async fn release(&self, id: &RecordId, token: Token, now: Timestamp) -> Result<(), StoreError> {
        let keys = RecordKeys::new(&self.prefix, id);
        migrating!(
            self,
            &keys.record,
            self.release_keys(&keys, token, now).await
        )
    }

    async fn save_resource_id(
        &self,
        id: &RecordId,
        token: Token,
        resource_id: &str,
    ) -> Result<(), StoreError> {
        let keys = RecordKeys::new(&self.prefix, id);
        let mut inv = scripts::SAVE_RESOURCE_ID.key(&keys.record);
        inv.arg(&be8(token.as_i64())[..]).arg(resource_id);
        migrating!(self, &keys.record, self.guarded(&inv, &keys.record).await)
    }

    async fn extend_lease(
        &self,
        id: &RecordId,
        token: Token,
        lease_until: Timestamp,
    ) -> Result<(), StoreError> {
        let keys = RecordKeys::new(&self.prefix, id);
        let mut inv = scripts::EXTEND.key(&keys.record);
        inv.arg(&be8(token.as_i64())[..])
            .arg(&be8(lease_until.as_unix_millis())[..])
            .arg(lease_until.as_unix_millis());
        migrating!(self, &keys.record, self.guarded(&inv, &keys.record).await)
    }

    async fn fetch(
        &self,
        id: &RecordId,
        now: Timestamp,
    ) -> Result<Option<StoredRecord>, StoreError> {
        let keys = RecordKeys::new(&self.prefix, id);
        let now = now.as_unix_millis();
        for _ in 0..CLAIM_ROUNDS {
            let Some((rec, body)) = migrating!(self, &keys.record, self.read(&keys).await)? else {
                return Ok(None);
            };
            if rec.is_expired(now) {
                return Ok(None);
            }
            if rec.has_foreign_body(body.as_deref(), now)? {
                // Read between a record's and its body's writes.
                debug!("fetch read a body of another completion; reading again");
                continue;
            }
            return rec.to_stored(body.as_deref(), now).map(Some);
        }
        Err(StoreError::Unavailable {
            backend: BACKEND,
            source: "the record kept changing while read".into(),
        })
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

/// A string reply's bytes, `None` for nil; an error reply becomes its
/// [`StoreError`].
pub(crate) fn string(v: Value) -> Result<Option<Vec<u8>>, StoreError> {
    match v.extract_error().map_err(store_error)? {
        Value::Nil => Ok(None),
        Value::BulkString(b) => Ok(Some(b)),
        Value::SimpleString(s) => Ok(Some(s.into_bytes())),
        other => Err(unexpected(&other)),
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

pub(crate) fn unexpected(v: &Value) -> StoreError {
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
}
