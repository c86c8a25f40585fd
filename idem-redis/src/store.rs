//! [`RedisStore`]: the [`Store`] trait as native commands for claims, replays
//! and fetches, and one Lua script call per token-checked write.

use std::fmt;
use std::time::Duration;

use idem_core::RecordId;
use idem_core::clock::Timestamp;
use idem_core::store::PurgeReport;
use idem_core::store::{
    Capabilities, ClaimOutcome, ClaimRequest, Coalescing, Completion, Store, StoreError,
    StoredRecord, Token,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Client, Cmd, Script, Value};
use tracing::debug;

use crate::ack::ReplicaAck;
use crate::combine::Combiner;
use crate::config::KeyPrefix;
use crate::conn::{Connection, evalsha};
use crate::error::{BACKEND, Error, corrupt, store_error};
use crate::keys::RecordKeys;
use crate::record::{InFlight, Parsed};
use crate::scripts;

/// An idempotency store in Redis or Redis Cluster.
///
/// A claim (and so a replay) is one native `SET … NX GET` (with the body's
/// `GET` pipelined beside it unless bodies are kept inside their record, see
/// [`RedisStore::with_inline_body_limit`]); a completion, release, saved
/// resource id or lease extension is one `EVALSHA` of a small Lua script that
/// checks the fencing token (see the [crate docs](crate) for the record
/// layout and the commands of each transition). Every call is one round
/// trip, except a takeover (the claim, then a swap) and, with inline bodies,
/// the replay of a body kept in the body key (the claim, then its `GET`).
/// The store holds one multiplexed, reconnecting connection: cloning it is
/// cheap and clones share the connection, which pipelines the calls of many
/// tasks.
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
    pub(crate) ack: Option<ReplicaAck>,
    /// Bodies up to this many bytes are kept inside their record; 0: never.
    pub(crate) inline_limit: usize,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.conn {
            Connection::Standalone(..) => "standalone",
            Connection::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisStore")
            .field("connection", &kind)
            .field("prefix", &self.prefix)
            .field("replica_ack", &self.ack)
            .field("inline_body_limit", &self.inline_limit)
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
            conn: Connection::Standalone(manager, Combiner::new(Coalescing::WhenBusy)),
            prefix: KeyPrefix::default(),
            ack: None,
            inline_limit: 0,
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
            inline_limit: 0,
        }
    }

    /// Does nothing and returns `Ok(())`: Redis has no schema to create.
    /// It exists so that code written for any backend (a deployment step, the
    /// command-line tool) can call `migrate()` on every store alike.
    ///
    /// Nothing of another layout is read or rewritten: a record written by a
    /// build before 0.1 fails the call that meets it with
    /// [`StoreError::Corrupt`](idem_core::store::StoreError) (see the crate
    /// docs).
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
        RecordKeys::new(&self.prefix, id)
            .record_key()
            .to_string_lossy()
    }

    /// The Redis key holding a record's stored response body (`…:v`, in the
    /// record's slot), which expires natively at the response TTL while the
    /// record stays until the key TTL. A body kept inside its record (see
    /// [`RedisStore::with_inline_body_limit`]) is not there. For the same
    /// uses as [`RedisStore::record_key`], with the same caveats.
    #[must_use]
    pub fn body_key(&self, id: &RecordId) -> String {
        RecordKeys::new(&self.prefix, id).body().to_string_lossy()
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

    /// Keeps a response body of up to `bytes` bytes inside its record
    /// (record layout 2), so that a replay is the claim's one
    /// `SET … NX GET` and nothing else, and a fresh key costs Redis four
    /// commands instead of six. `0` (the default) turns it off: every body
    /// goes to the body key, and the claim reads it in the same pipeline.
    /// A body over 512 bytes kept inside is appended by the completion's
    /// script rather than copied in Lua, but still costs Redis more to
    /// write than one staged in the body key (at 4 KiB, 109,500
    /// instructions per completion against 87,800).
    ///
    /// **Retention stays tiered.** A body kept inside the record is never
    /// returned at or after its `response_expires_at` (the reader compares
    /// the engine's clock with the deadline in the record, as for a body in
    /// the body key), and a later rewrite of the record (a completion
    /// retried by its attempt) drops it. The key itself lives to
    /// `key_expires_at`, as before. What changes is the memory: Redis cannot
    /// expire part of a string, so a body kept inside its record occupies
    /// memory until the *key* expires, where a body in the body key is freed
    /// at the response TTL. Measured with the default policy (response 24 h,
    /// key 30 days), a key costs Redis 1.7 times the memory over its life
    /// with 256-byte bodies inside, 3.7 times at 1 KiB; with `response_ttl`
    /// equal to `key_ttl` the option saves memory instead (one key per
    /// record). Hence the default, off; `1024` is a good limit when memory
    /// allows. The numbers, and the CPU and commands saved, are in the
    /// [crate docs](crate#bodies-kept-inside-their-record).
    ///
    /// A body over the limit goes to the body key as before; replaying it
    /// costs one more round trip (the claim, then a `GET` of the body key),
    /// and so does replaying a record written without the option.
    ///
    /// **Mixed settings.** Every build of idem 0.1 reads both forms of a
    /// record (body inside, body in the body key) whatever its own limit,
    /// so instances with different limits may share one Redis.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_redis::RedisStore;
    ///
    /// let store = RedisStore::connect("redis://127.0.0.1:6379/")
    ///     .await?
    ///     .with_inline_body_limit(1024);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn with_inline_body_limit(mut self, bytes: usize) -> Self {
        self.inline_limit = bytes;
        self
    }

    /// The largest body kept inside its record, in bytes (0: none).
    #[must_use]
    pub fn inline_body_limit(&self) -> usize {
        self.inline_limit
    }

    /// Whether the store sends the commands of concurrent calls together
    /// (on by default, standalone Redis only). While at most 16 calls are
    /// under way, each goes at once, alone, as without coalescing; above
    /// that, calls queue, and one task takes every call queued each time it
    /// runs and sends them as one pipeline (one write and one read on each
    /// side of the socket instead of one per call; no call waits for another
    /// call's reply), so that pipelines grow with the load. No answer
    /// changes: Redis runs the commands in the order they arrive on the
    /// connection, as it did when they were written one by one, and an
    /// error reply answers its own command only. The pipeline
    /// sizes are the `idem_store_batch_size` metric (`call="command"`).
    ///
    /// A cluster store sends each call to its slot's node and never
    /// coalesces; the setting does nothing there. Every clone of a store
    /// shares its connection: turning coalescing off or on makes a new
    /// queue for this store and the clones made from it afterwards. What it
    /// saves under load is in the repository's `benches/README.md`.
    #[must_use]
    pub fn with_coalescing(self, on: bool) -> Self {
        self.with_coalescing_mode(if on {
            Coalescing::WhenBusy
        } else {
            Coalescing::Off
        })
    }

    /// [`with_coalescing`](Self::with_coalescing) with any
    /// [`Coalescing`], for tests.
    #[doc(hidden)]
    #[must_use]
    pub fn with_coalescing_mode(mut self, mode: Coalescing) -> Self {
        if let Connection::Standalone(manager, _) = self.conn {
            self.conn = Connection::Standalone(manager, Combiner::new(mode));
        }
        self
    }

    /// Runs a script that may write to the record at `record_key`; with the
    /// acknowledgement option, `WAIT` follows on the same connection. Returns
    /// the script's reply and whether enough replicas confirmed (always `Ok`
    /// without the option). The caller decides whether the confirmation
    /// matters (it does not when the script wrote nothing).
    pub(crate) async fn write(
        &self,
        script: &Script,
        call: Cmd,
        record_key: &[u8],
    ) -> Result<(Value, Result<(), StoreError>), StoreError> {
        self.write_after(script, None, call, record_key).await
    }

    /// [`Self::write`] after the command `pre`, if any, in the same pipeline
    /// (see [`Conn::eval`](crate::conn::Conn::eval)).
    pub(crate) async fn write_after(
        &self,
        script: &Script,
        pre: Option<Cmd>,
        call: Cmd,
        record_key: &[u8],
    ) -> Result<(Value, Result<(), StoreError>), StoreError> {
        let (reply, waited) = self
            .conn
            .eval(script, pre, call, record_key, self.ack)
            .await
            .map_err(store_error)?;
        let acked = match (self.ack, waited) {
            (None, _) => Ok(()),
            (Some(ack), Some(Value::Int(n))) => ack.check(n),
            (Some(_), other) => Err(corrupt(format!("unexpected WAIT reply {other:?}"))),
        };
        Ok((reply, acked))
    }

    /// Runs a token-guarded write that must be acknowledged: `1` done, `0`
    /// lease lost.
    async fn guarded(
        &self,
        script: &Script,
        call: Cmd,
        record_key: &[u8],
    ) -> Result<(), StoreError> {
        let (reply, acked) = self.write(script, call, record_key).await?;
        match reply {
            Value::Int(1) => acked,
            Value::Int(0) => Err(StoreError::LeaseLost),
            other => Err(unexpected(&other)),
        }
    }

    /// Releases under `token` without `WAIT` (see [`Self::with_replica_ack`]).
    pub(crate) async fn release_keys(
        &self,
        keys: &RecordKeys,
        token: Token,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let mut call = evalsha(&scripts::RELEASE, &[keys.record()], 2, 16);
        call.arg(&be8(token.as_i64())[..])
            .arg(&be8(now.as_unix_millis())[..]);
        let (reply, _) = self
            .conn
            .eval(&scripts::RELEASE, None, call, keys.record(), None)
            .await
            .map_err(store_error)?;
        match reply {
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
pub(crate) fn ttl_ms(deadline: Timestamp, now: Timestamp) -> i64 {
    deadline
        .as_unix_millis()
        .saturating_sub(now.as_unix_millis())
        .clamp(1, MAX_TTL_MS)
}

/// How many times a claim reads again after losing a race (a swap that
/// found the record changed, a body written by another completion): each
/// lost race means another caller moved the record on.
const CLAIM_ROUNDS: u32 = 8;

fn be8(ms: i64) -> [u8; 8] {
    ms.to_be_bytes()
}

impl RedisStore {
    /// Sends `pipe` (commands on the keys of one record) in one round trip;
    /// with the acknowledgement option `WAIT` follows in the same pipeline
    /// and the second value tells whether enough replicas confirmed.
    pub(crate) async fn pipeline(
        &self,
        pipe: &mut redis::Pipeline,
        record_key: &[u8],
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

    /// Reads a record and its body key: `GET` of both keys, one round trip.
    async fn read(
        &self,
        keys: &RecordKeys,
    ) -> Result<Option<(Vec<u8>, Option<Vec<u8>>)>, StoreError> {
        let mut pipe = redis::pipe();
        pipe.cmd("GET")
            .arg(keys.record())
            .cmd("GET")
            .arg(keys.body().as_bytes());
        let replies = self
            .conn
            .packed(&pipe, keys.record(), 2)
            .await
            .map_err(store_error)?;
        let [rec, body]: [Value; 2] = replies
            .try_into()
            .map_err(|_| corrupt("a read gave the wrong number of replies"))?;
        let Some(rec) = string(rec)? else {
            return Ok(None);
        };
        Ok(Some((rec, string(body)?)))
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
        let body = keys.body();
        let mut call = evalsha(
            &scripts::SWAP,
            &[keys.record(), body.as_bytes()],
            4,
            old.len() + new.len() + 32,
        );
        call.arg(old).arg(new).arg(mode).arg(ttl);
        let (reply, acked) = self.write(&scripts::SWAP, call, keys.record()).await?;
        match reply {
            Value::Int(1) => Ok((true, acked)),
            Value::Int(0) => Ok((false, acked)),
            other => Err(unexpected(&other)),
        }
    }
}

impl Store for RedisStore {
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let keys = RecordKeys::new(&self.prefix, req.id);
        // A lease is never outlived by its key.
        let key_expires_at = req.key_expires_at.max(req.lease_until);
        let fresh = InFlight::new(
            (req.id.owner(), req.id.operation(), req.id.key().as_str()),
            req.fingerprint.as_bytes(),
            req.token.as_i64(),
            req.lease_until.as_unix_millis(),
            key_expires_at.as_unix_millis(),
        )?;
        let ttl = ttl_ms(key_expires_at, req.now);
        for _ in 0..CLAIM_ROUNDS {
            let once = self.claim_once(req, &keys, &fresh, ttl).await;
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
        self.complete_once(&keys, token, c).await
    }

    async fn release(&self, id: &RecordId, token: Token, now: Timestamp) -> Result<(), StoreError> {
        let keys = RecordKeys::new(&self.prefix, id);
        self.release_keys(&keys, token, now).await
    }

    async fn save_resource_id(
        &self,
        id: &RecordId,
        token: Token,
        resource_id: &str,
    ) -> Result<(), StoreError> {
        let keys = RecordKeys::new(&self.prefix, id);
        let mut call = evalsha(
            &scripts::SAVE_RESOURCE_ID,
            &[keys.record()],
            2,
            8 + resource_id.len(),
        );
        call.arg(&be8(token.as_i64())[..]).arg(resource_id);
        self.guarded(&scripts::SAVE_RESOURCE_ID, call, keys.record())
            .await
    }

    async fn extend_lease(
        &self,
        id: &RecordId,
        token: Token,
        lease_until: Timestamp,
    ) -> Result<(), StoreError> {
        let keys = RecordKeys::new(&self.prefix, id);
        let mut call = evalsha(&scripts::EXTEND, &[keys.record()], 3, 40);
        call.arg(&be8(token.as_i64())[..])
            .arg(&be8(lease_until.as_unix_millis())[..])
            .arg(lease_until.as_unix_millis());
        self.guarded(&scripts::EXTEND, call, keys.record()).await
    }

    async fn fetch(
        &self,
        id: &RecordId,
        now: Timestamp,
    ) -> Result<Option<StoredRecord>, StoreError> {
        let keys = RecordKeys::new(&self.prefix, id);
        let now = now.as_unix_millis();
        for _ in 0..CLAIM_ROUNDS {
            let Some((value, body)) = self.read(&keys).await? else {
                return Ok(None);
            };
            let rec = Parsed::parse(&value)?;
            if rec.is_expired(now) {
                return Ok(None);
            }
            if rec.has_foreign_body(body.as_deref(), now)? {
                // Read between a record's and its body's writes.
                debug!("fetch read a body of another completion; reading again");
                continue;
            }
            return rec.stored_at(value, body, now).map(Some);
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

/// A string reply's bytes (the reply's own buffer), `None` for nil; an
/// error reply becomes its [`StoreError`].
pub(crate) fn string(v: Value) -> Result<Option<Vec<u8>>, StoreError> {
    match v.extract_error().map_err(store_error)? {
        Value::Nil => Ok(None),
        Value::BulkString(b) => Ok(Some(b)),
        Value::SimpleString(s) => Ok(Some(s.into_bytes())),
        other => Err(unexpected(&other)),
    }
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
