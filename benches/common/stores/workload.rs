//! The workload every store bench runs, through the library and through the
//! raw driver alike: fresh keys, replays, and 64 tasks on 16 hot keys.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem_core::store::Store;
use idem_core::{Error, HttpResponse, Idem, Outcome, Scope};
use serde_json::{Value, json};

/// Owner and operation of every bench record.
pub(crate) const OWNER: &str = "bench-owner";
pub(crate) const OPERATION: &str = "POST /payments";

/// The primary key the SQL stores give the bench record `key`: the first
/// 16 bytes of its identity's digest (`idem_sql::record_key`), for the raw
/// baselines that run the stores' own statements.
pub(crate) fn record_key(key: &str) -> Vec<u8> {
    let scope = Scope::new(OWNER, OPERATION).expect("the bench scope");
    let key = idem_core::IdempotencyKey::parse_exact(key).expect("a bench key");
    idem_core::RecordId::new(scope, key).digest()[..16].to_vec()
}

/// What every raw SQL baseline holds besides its statements: the store's
/// pool, the fingerprint and body it writes, and its claims' tokens.
#[derive(Debug)]
pub(crate) struct RawParts<P> {
    pub(crate) pool: P,
    pub(crate) fingerprint: [u8; 32],
    pub(crate) body: Vec<u8>,
    tokens: AtomicI64,
}

impl<P> RawParts<P> {
    pub(crate) fn new(pool: P, body_len: usize) -> Self {
        Self {
            pool,
            fingerprint: [7; 32],
            body: body(body_len),
            tokens: AtomicI64::new(1),
        }
    }

    /// The next claim's token.
    pub(crate) fn token(&self) -> i64 {
        self.tokens.fetch_add(1, Ordering::Relaxed)
    }
}

/// A statement's text, as the store names it (`idem_postgres::statement`
/// and its twins): the benches name only statements their store runs.
pub(crate) fn text(statement: Option<&str>) -> String {
    statement.expect("a statement the store runs").to_owned()
}

/// What a raw SQL baseline's claim answers for a record it did not win,
/// from the record's row: the body once completed, `None` while in flight.
/// A macro: each driver's row type is its own (the caller imports `Row`).
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
macro_rules! standing {
    ($row:expr) => {{
        let row = &$row;
        let state: String = row.get("state");
        Err((state == "completed").then(|| row.get("response")))
    }};
}
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) use standing;

/// A raw SQL baseline's completion of `$key` under `$token` with the bench
/// body, for a completion statement that names the record first (its key,
/// then the token), then the outcome, body, expiries and resource id: the
/// PostgreSQL and SQLite stores'. A macro: each driver's pool is its own
/// (the caller's scope provides `sqlx`, `AssertSqlSafe`, `record_key`,
/// `now_ms` and `TTL_MS`).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
macro_rules! complete_key_first {
    ($self:ident, $key:expr, $token:expr) => {{
        let now = now_ms();
        let done = sqlx::query(AssertSqlSafe($self.complete.as_str()))
            .bind(record_key($key))
            .bind($token)
            .bind("success")
            .bind($self.raw.body.as_slice())
            .bind(now + TTL_MS)
            .bind(now + TTL_MS)
            .bind(None::<&str>)
            .execute(&$self.raw.pool)
            .await
            .expect("complete");
        assert_eq!(done.rows_affected(), 1, "lease lost");
    }};
}
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) use complete_key_first;

/// Records kept completed for the replay scenario, per target.
pub(crate) const REPLAY_KEYS: u64 = 256;
/// Hot keys of the contention scenario.
pub(crate) const HOT_KEYS: u64 = 16;
/// Calls per hot key before the scenario moves to 16 new keys, so claims,
/// conflicts (409 in flight) and replays keep mixing.
pub(crate) const CALLS_PER_HOT_KEY: u64 = 16;

/// What one call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scenario {
    /// A new key: claim, work (a no-op returning the body), complete.
    Fresh,
    /// A completed key: the stored body comes back.
    Replay,
    /// Hot keys shared by all tasks: claims, conflicts and replays mixed.
    Contended,
}

impl Scenario {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Fresh => "fresh",
            Self::Replay => "replay",
            Self::Contended => "contended",
        }
    }
}

/// How a contended call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// It claimed the key and ran the work.
    Executed,
    /// It got the stored body back.
    Replayed,
    /// The first attempt was still in flight (409).
    Conflict,
}

/// One side of a comparison: the library, or the same statements without it.
pub(crate) trait Target: Send + Sync + 'static {
    /// Claim, no-op work, complete.
    fn fresh(&self, key: &str) -> impl Future<Output = ()> + Send;
    /// Read back a completed key's body.
    fn replay(&self, key: &str) -> impl Future<Output = ()> + Send;
    /// A call on a hot key.
    fn contended(&self, key: &str) -> impl Future<Output = Ended> + Send;
}

/// A store's own statements (or scripts) run without the engine: the
/// "store-stmts" side of every backend is these two calls, and the one
/// [`Target`] impl below runs every scenario on them.
pub(crate) trait Statements: Send + Sync + 'static {
    /// `Ok(token)` if claimed, else the standing record's body (`None`
    /// while it is in flight).
    fn claim(&self, key: &str) -> impl Future<Output = Result<i64, Option<Vec<u8>>>> + Send;
    /// Completes a claimed key with the bench body.
    fn complete(&self, key: &str, token: i64) -> impl Future<Output = ()> + Send;
}

impl<S: Statements> Target for S {
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

/// A run-unique prefix, so fresh keys never collide with earlier runs on a
/// persistent server.
pub(crate) fn run_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{:x}-{}", nanos & 0xffff_ffff_ffff, std::process::id())
}

/// The request every call sends (the library fingerprints it each time).
pub(crate) fn request() -> Value {
    json!({
        "amount": 1000,
        "currency": "eur",
        "customer": "cus_4QFpXhT2",
        "description": "Order #1234, 2 items",
        "metadata": {"cart": "c_8812", "channel": "web"},
    })
}

/// The response body: `len` bytes of JSON-ish text.
pub(crate) fn body(len: usize) -> Vec<u8> {
    let pattern = br#"{"id":"ch_3MqLiJ","object":"charge","amount":1000,"status":"succeeded"}"#;
    pattern.iter().copied().cycle().take(len).collect()
}

/// The library side: `Idem::execute` over a store.
#[derive(Debug)]
pub(crate) struct Lib<S> {
    idem: Idem<S>,
    scope: Scope,
    request: Value,
    response: HttpResponse,
}

impl<S: Store> Lib<S> {
    pub(crate) fn new(store: S, body_len: usize) -> Self {
        Self {
            idem: Idem::new(store).with_policy(super::policy()),
            scope: Scope::new(OWNER, OPERATION).expect("valid scope"),
            request: request(),
            response: HttpResponse::new(200, Vec::new(), body(body_len)),
        }
    }

    async fn call(&self, key: &str) -> Result<idem_core::Reply<HttpResponse, HttpResponse>, Error> {
        let response = self.response.clone();
        self.idem
            .execute(&self.scope, key, &self.request, move |_attempt| async move {
                Outcome::<HttpResponse, HttpResponse>::Success(response)
            })
            .await
    }
}

impl<S: Store> Target for Lib<S> {
    async fn fresh(&self, key: &str) {
        let reply = self.call(key).await.expect("fresh call");
        assert!(!reply.is_replay(), "a fresh key was a replay");
    }

    async fn replay(&self, key: &str) {
        let reply = self.call(key).await.expect("replay call");
        assert!(reply.is_replay(), "a completed key ran again");
        std::hint::black_box(reply);
    }

    async fn contended(&self, key: &str) -> Ended {
        match self.call(key).await {
            Ok(r) if r.is_replay() => Ended::Replayed,
            Ok(_) => Ended::Executed,
            Err(Error::InFlight { .. }) => Ended::Conflict,
            Err(e) => panic!("contended call failed: {e}"),
        }
    }
}

/// Counts of how contended calls ended.
#[derive(Debug, Default)]
pub(crate) struct Mix {
    pub(crate) executed: AtomicU64,
    pub(crate) replayed: AtomicU64,
    pub(crate) conflicts: AtomicU64,
}

/// One target, one scenario: the keys it uses and the calls it makes.
#[derive(Debug)]
pub(crate) struct Plan<T> {
    target: T,
    prefix: String,
    next: AtomicU64,
    pub(crate) mix: Mix,
}

impl<T: Target> Plan<T> {
    /// A plan whose keys start with `prefix` (make it unique per target and
    /// run: `{run_id}-{backend}-{lib|raw}-{body}`).
    pub(crate) fn new(target: T, prefix: String) -> Self {
        Self {
            target,
            prefix,
            next: AtomicU64::new(0),
            mix: Mix::default(),
        }
    }

    /// Completes the replay scenario's keys.
    pub(crate) async fn prepare_replays(&self) {
        for j in 0..REPLAY_KEYS {
            self.target.fresh(&format!("{}-r{j}", self.prefix)).await;
        }
    }

    /// Makes call number `n` (numbers never repeat within a plan).
    pub(crate) async fn call(&self, scenario: Scenario, n: u64) {
        match scenario {
            Scenario::Fresh => self.target.fresh(&format!("{}-f{n}", self.prefix)).await,
            Scenario::Replay => {
                let key = format!("{}-r{}", self.prefix, n % REPLAY_KEYS);
                self.target.replay(&key).await;
            }
            Scenario::Contended => {
                let round = n / (HOT_KEYS * CALLS_PER_HOT_KEY);
                let key = format!("{}-c{round}-{}", self.prefix, n % HOT_KEYS);
                let counter = match self.target.contended(&key).await {
                    Ended::Executed => &self.mix.executed,
                    Ended::Replayed => &self.mix.replayed,
                    Ended::Conflict => &self.mix.conflicts,
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// What a run measured.
#[derive(Debug)]
pub(crate) struct Run {
    /// Wall time for all calls.
    pub(crate) elapsed: Duration,
    /// Per-call latencies in nanoseconds, when asked for.
    pub(crate) latencies: Vec<u64>,
}

/// Makes `calls` calls of `scenario` from `tasks` tasks sharing the work,
/// and measures the wall time (and each call's latency if `record`).
pub(crate) async fn run<T: Target>(
    plan: &Arc<Plan<T>>,
    scenario: Scenario,
    tasks: usize,
    calls: u64,
    record: bool,
) -> Run {
    let start_n = plan.next.fetch_add(calls, Ordering::Relaxed);
    let issued = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks.max(1))
        .map(|_| {
            let plan = Arc::clone(plan);
            let issued = Arc::clone(&issued);
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                loop {
                    let i = issued.fetch_add(1, Ordering::Relaxed);
                    if i >= calls {
                        break;
                    }
                    let t = Instant::now();
                    plan.call(scenario, start_n + i).await;
                    if record {
                        latencies.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
                    }
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for h in handles {
        latencies.extend(h.await.expect("bench task panicked"));
    }
    Run {
        elapsed: start.elapsed(),
        latencies,
    }
}
