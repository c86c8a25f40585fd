//! The end-to-end harness (client.md §11): a real `idem-http` server on
//! loopback over a durable store (a SQLite file, a Postgres schema or a Redis
//! key prefix of the test's own), handlers that count their runs in that same
//! database, a recording layer, and a fault proxy.
//!
//! The server runs on a tokio runtime of its own, so that stopping it is
//! shutting that runtime down: every listener, connection and store pool dies
//! with it, as in a process exit. Starting it again opens the store anew at the
//! same place, on the same port, so a record (and a run count) survives only
//! if the backend kept it.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{
    Router,
    extract::{Request, State},
    http::{HeaderMap, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::post,
};
use idem_core::{
    Idem, IdempotencyKey, Policy, clock::ManualClock, store::Store, testkit::FailingStore,
};
use idem_http::{ExtensionOwner, IdemAttempt, IdempotencyLayer, OwnerId};
use idem_postgres::{
    PgStore,
    sqlx::{self as pg_sqlx, Executor as _, postgres::PgPoolOptions},
};
use idem_redis::{
    RedisStore,
    redis::{self, AsyncCommands},
};
use idem_sqlite::{
    SqliteStore,
    sqlx::{
        self as sqlite_sqlx,
        sqlite::{SqliteConnectOptions, SqlitePoolOptions},
    },
};
use tokio::sync::Notify;

/// The lease of the test policy: `Retry-After` of an in-flight 409.
pub const LEASE: Duration = Duration::from_secs(3);
/// The response TTL of the test policy.
pub const RESPONSE_TTL: Duration = Duration::from_secs(3_600);
/// The key TTL of the test policy.
pub const KEY_TTL: Duration = Duration::from_secs(86_400);
/// How long the `/slow` handler works.
pub const SLOW: Duration = Duration::from_millis(1_500);

/// The durable backends the end-to-end suite runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A SQLite file.
    SqliteFile,
    /// A schema of its own on the shared Postgres.
    Postgres,
    /// A key prefix of its own on the shared Redis.
    Redis,
}

fn pg_url() -> String {
    std::env::var("IDEM_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

fn redis_url() -> String {
    std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned())
}

/// A pool of at most `max` connections to the test server (10 s to get
/// one).
async fn pg_pool(max: u32) -> pg_sqlx::PgPool {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&pg_url())
        .await
        .unwrap_or_else(|e| pg_down(&e))
}

fn pg_down(e: &dyn std::fmt::Display) -> ! {
    panic!(
        "cannot reach PostgreSQL at {}: {e}\nStart it with:\n    pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start\n\
         or point IDEM_POSTGRES_URL at a server (these tests never skip).",
        pg_url()
    )
}

fn redis_down(e: &dyn std::fmt::Display) -> ! {
    panic!(
        "cannot reach Redis at {}: {e}. Start it with `redis-server --daemonize yes --bind 127.0.0.1 \
         --port 6379 --save \"\" --appendonly no` or point IDEM_REDIS_URL at a server (these tests never skip).",
        redis_url()
    )
}

/// Where one test's records and run counts live: every server start reopens it.
#[derive(Debug, Clone)]
pub struct Place {
    pub backend: Backend,
    /// Lower-case, unique per test.
    id: String,
}

impl Place {
    fn new(backend: Backend) -> Self {
        let id = IdempotencyKey::random().as_str().to_ascii_lowercase();
        Self { backend, id }
    }
    fn sqlite_path(&self) -> PathBuf {
        std::env::temp_dir().join(format!("idem-client-e2e-{}.db", self.id))
    }
    fn schema(&self) -> String {
        format!("idem_client_e2e_{}", self.id)
    }
    fn prefix(&self) -> String {
        format!("idem-client-e2e:{}:", self.id)
    }

    /// Removes the file, schema or keys.
    async fn cleanup(&self) {
        match self.backend {
            Backend::SqliteFile => idem_test_support::remove_sqlite(&self.sqlite_path()),
            Backend::Postgres => {
                let pool = PgPoolOptions::new()
                    .max_connections(1)
                    .connect(&pg_url())
                    .await
                    .unwrap_or_else(|e| pg_down(&e));
                let drop = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.schema());
                pool.execute(pg_sqlx::AssertSqlSafe(drop))
                    .await
                    .expect("drop schema");
                pool.close().await;
            }
            Backend::Redis => {
                let client = redis::Client::open(redis_url()).expect("redis url");
                let mut conn = client
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap_or_else(|e| redis_down(&e));
                idem_test_support::redis_admin::unlink_all(&mut conn, &self.prefix()).await;
            }
        }
    }

    /// A handle on the run counts, bound to the current runtime.
    pub async fn runs(&self) -> Runs {
        match self.backend {
            Backend::SqliteFile => {
                let opts = SqliteConnectOptions::new()
                    .filename(self.sqlite_path())
                    .create_if_missing(true)
                    .busy_timeout(Duration::from_secs(5));
                let pool = SqlitePoolOptions::new()
                    .max_connections(2)
                    .connect_with(opts)
                    .await
                    .expect("SQLite file");
                Runs::Sqlite(pool)
            }
            Backend::Postgres => {
                let pool = pg_pool(2).await;
                Runs::Pg(pool, self.schema())
            }
            Backend::Redis => {
                let client = redis::Client::open(redis_url()).expect("redis url");
                let conn = client
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap_or_else(|e| redis_down(&e));
                Runs::Redis(conn, format!("{}runs", self.prefix()))
            }
        }
    }
}

/// Handler runs, counted in a table (or key) of the store's own database.
#[derive(Clone)]
pub enum Runs {
    Sqlite(sqlite_sqlx::SqlitePool),
    Pg(pg_sqlx::PgPool, String),
    Redis(redis::aio::MultiplexedConnection, String),
}

impl std::fmt::Debug for Runs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Runs")
    }
}

impl Runs {
    async fn create(&self) {
        match self {
            Self::Sqlite(pool) => {
                sqlite_sqlx::query("CREATE TABLE IF NOT EXISTS e2e_runs (route TEXT NOT NULL)")
                    .execute(pool)
                    .await
                    .expect("create e2e_runs");
            }
            Self::Pg(pool, schema) => {
                let sql = format!(
                    "CREATE TABLE IF NOT EXISTS \"{schema}\".e2e_runs (route TEXT NOT NULL)"
                );
                pool.execute(pg_sqlx::AssertSqlSafe(sql))
                    .await
                    .expect("create e2e_runs");
            }
            Self::Redis(..) => {}
        }
    }

    /// Counts one run of `route`; returns the runs so far.
    pub async fn bump(&self, route: &str) -> usize {
        self.insert(route).await;
        self.get().await
    }

    async fn insert(&self, route: &str) {
        match self {
            Self::Sqlite(pool) => {
                sqlite_sqlx::query("INSERT INTO e2e_runs (route) VALUES (?)")
                    .bind(route)
                    .execute(pool)
                    .await
                    .expect("count a run");
            }
            Self::Pg(pool, schema) => {
                let sql = format!("INSERT INTO \"{schema}\".e2e_runs (route) VALUES ($1)");
                pg_sqlx::query(pg_sqlx::AssertSqlSafe(sql))
                    .bind(route)
                    .execute(pool)
                    .await
                    .expect("count a run");
            }
            Self::Redis(conn, key) => {
                let _: i64 = conn.clone().incr(key, 1).await.expect("count a run");
            }
        }
    }

    /// Runs so far, every route.
    pub async fn get(&self) -> usize {
        let n: i64 = match self {
            Self::Sqlite(pool) => sqlite_sqlx::query_scalar("SELECT COUNT(*) FROM e2e_runs")
                .fetch_one(pool)
                .await
                .expect("read the runs"),
            Self::Pg(pool, schema) => {
                let sql = format!("SELECT COUNT(*) FROM \"{schema}\".e2e_runs");
                pg_sqlx::query_scalar(pg_sqlx::AssertSqlSafe(sql))
                    .fetch_one(pool)
                    .await
                    .expect("read the runs")
            }
            Self::Redis(conn, key) => {
                let n: Option<i64> = conn.clone().get(key).await.expect("read the runs");
                n.unwrap_or(0)
            }
        };
        usize::try_from(n).unwrap()
    }
}

/// What the test controls on the server; it outlives a restart.
#[derive(Debug)]
pub struct Knobs {
    /// Every `Idempotency-Key` field value received, in order.
    keys: Mutex<Vec<String>>,
    /// The first `fail` runs of `/flaky` answer 503.
    pub fail: AtomicUsize,
    /// The store fails every call of the next `fail_claims` requests (503 `store_unavailable`).
    pub fail_claims: AtomicUsize,
    /// The next request's response is held once its outcome is stored (and
    /// `stored` notified): the server never answers it.
    pub hold_after_store: AtomicBool,
    /// Notified when a held response's outcome is stored.
    pub stored: Notify,
    /// The engine's clock.
    pub clock: ManualClock,
}

impl Default for Knobs {
    fn default() -> Self {
        Self {
            keys: Mutex::new(Vec::new()),
            fail: AtomicUsize::new(0),
            fail_claims: AtomicUsize::new(0),
            hold_after_store: AtomicBool::new(false),
            stored: Notify::new(),
            clock: ManualClock::starting_now(),
        }
    }
}

impl Knobs {
    /// The key field values received so far.
    pub fn keys(&self) -> Vec<String> {
        self.keys.lock().unwrap().clone()
    }
}

/// One test's world: its place, its knobs, and the server while it runs.
#[derive(Debug)]
pub struct World {
    pub place: Place,
    pub knobs: Arc<Knobs>,
    pub runs: Runs,
    server: Option<Server>,
    addr: SocketAddr,
}

impl World {
    /// `http://127.0.0.1:PORT`.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base())
    }
    /// Handler runs so far, read from the database.
    pub async fn runs(&self) -> usize {
        self.runs.get().await
    }
    pub fn keys(&self) -> Vec<String> {
        self.knobs.keys()
    }
    /// Asserts that the handler ran `runs` times and the server saw `sends`
    /// requests, all with one key; returns that key as sent.
    pub async fn ran_with_one_key(&self, runs: usize, sends: usize) -> String {
        assert_eq!(self.runs().await, runs, "handler runs");
        let keys = self.keys();
        assert_eq!(keys.len(), sends, "requests seen: {keys:?}");
        one_key(&keys).to_owned()
    }
    /// Stops the server as a process exit would: listener, connections and
    /// store handles all dropped, nothing answered.
    pub fn stop(&mut self) {
        if let Some(s) = self.server.take() {
            s.stop();
        }
    }
    /// Starts the server again on the same port, over a store opened anew at
    /// the same place.
    pub async fn restart(&mut self) {
        assert!(self.server.is_none(), "stop it first");
        let server = Server::start(&self.place, &self.knobs, Some(self.addr)).await;
        self.server = Some(server);
    }
}

/// Runs one scenario in a world of its own on `backend`, cleaning the
/// place up even when the scenario fails, then re-raises the failure. The
/// scenario runs on the caller's task (a current-thread test can hold a
/// thread-local tracing subscriber).
pub async fn run<F, Fut>(backend: Backend, scenario: F)
where
    F: FnOnce(World) -> Fut,
    Fut: Future<Output = ()>,
{
    use futures_util::FutureExt;
    quiet_global_subscriber();
    let place = Place::new(backend);
    let knobs = Arc::new(Knobs::default());
    let server = Server::start(&place, &knobs, None).await;
    let runs = place.runs().await;
    let world = World {
        addr: server.addr,
        place: place.clone(),
        knobs,
        runs,
        server: Some(server),
    };
    let result = std::panic::AssertUnwindSafe(scenario(world))
        .catch_unwind()
        .await;
    place.cleanup().await;
    if let Err(payload) = result {
        std::panic::resume_unwind(payload);
    }
}

/// A running server, on its own runtime.
struct Server {
    addr: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("addr", &self.addr).finish()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl Server {
    fn stop(mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }

    async fn start(place: &Place, knobs: &Arc<Knobs>, addr: Option<SocketAddr>) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("e2e-server")
            .enable_all()
            .build()
            .expect("server runtime");
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (place, knobs) = (place.clone(), Arc::clone(knobs));
        runtime.spawn(async move {
            let runs = place.runs().await;
            match place.backend {
                Backend::SqliteFile => {
                    let store = SqliteStore::open(place.sqlite_path())
                        .await
                        .expect("SQLite store");
                    runs.create().await;
                    serve(store, runs, knobs, addr, tx).await;
                }
                Backend::Postgres => {
                    let pool = pg_pool(4).await;
                    let store = PgStore::new(pool)
                        .with_schema_name(&place.schema())
                        .expect("schema name");
                    store.migrate().await.expect("migrate");
                    // The runs table sits in the store's schema: create it after.
                    runs.create().await;
                    serve(store, runs, knobs, addr, tx).await;
                }
                Backend::Redis => {
                    let store = RedisStore::connect(&redis_url())
                        .await
                        .unwrap_or_else(|e| redis_down(&e))
                        .with_prefix(&place.prefix())
                        .expect("prefix");
                    runs.create().await;
                    serve(store, runs, knobs, addr, tx).await;
                }
            }
        });
        let addr = tokio::time::timeout(Duration::from_secs(30), rx)
            .await
            .expect("the server started in time")
            .expect("the server started");
        Self {
            addr,
            runtime: Some(runtime),
        }
    }
}

#[derive(Clone)]
struct AppState {
    runs: Runs,
    knobs: Arc<Knobs>,
}

/// The owner, from `X-Account` (default `tenant`).
#[derive(Debug, Clone)]
struct Account(String);

impl OwnerId for Account {
    fn owner_id(&self) -> std::borrow::Cow<'_, str> {
        std::borrow::Cow::Borrowed(&self.0)
    }
}

async fn serve<S: Store>(
    store: S,
    runs: Runs,
    knobs: Arc<Knobs>,
    addr: Option<SocketAddr>,
    ready: tokio::sync::oneshot::Sender<SocketAddr>,
) {
    let store = FailingStore::new(Arc::new(store));
    let policy = Policy::builder()
        .lease(LEASE)
        .response_ttl(RESPONSE_TTL)
        .key_ttl(KEY_TTL)
        .store_retries(1, Duration::from_millis(1))
        .build()
        .unwrap();
    let idem = Idem::new(store.clone())
        .with_clock(knobs.clock.clone())
        .with_policy(policy);
    let layer = IdempotencyLayer::builder(idem)
        .owner(ExtensionOwner::<Account>::new())
        .build()
        .unwrap();
    let state = AppState {
        runs,
        knobs: Arc::clone(&knobs),
    };
    let app = Router::new()
        .route("/orders", post(orders))
        .route("/flaky", post(flaky))
        .route("/slow", post(slow))
        .route("/validate", post(validate))
        .route("/busy", post(busy))
        .route_layer(layer)
        .layer(middleware::from_fn_with_state(
            (state.clone(), store),
            record::<S>,
        ))
        .with_state(state);
    // On a restart the port was just released: try for a while.
    let want = addr.unwrap_or_else(|| "127.0.0.1:0".parse().unwrap());
    let mut listener = None;
    for _ in 0..50 {
        match tokio::net::TcpListener::bind(want).await {
            Ok(l) => {
                listener = Some(l);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let listener = listener.unwrap_or_else(|| panic!("cannot bind {want}"));
    let _ = ready.send(listener.local_addr().unwrap());
    let _ = axum::serve(listener, app).await;
}

/// Outside the idempotency layer: the owner, the key recorded, the store's
/// outage switch, and the held response.
async fn record<S: Store>(
    State((st, store)): State<(AppState, FailingStore<S>)>,
    mut req: Request,
    next: Next,
) -> Response {
    let account = req
        .headers()
        .get("x-account")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("tenant")
        .to_owned();
    req.extensions_mut().insert(Account(account));
    if let Some(v) = req.headers().get("idempotency-key") {
        st.knobs
            .keys
            .lock()
            .unwrap()
            .push(v.to_str().unwrap_or("?").to_owned());
    }
    let fail = st
        .knobs
        .fail_claims
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    store.fail_all(fail);
    let hold = st.knobs.hold_after_store.swap(false, Ordering::SeqCst);
    let resp = next.run(req).await;
    if hold {
        // The layer returns only once the outcome is stored.
        st.knobs.stored.notify_one();
        std::future::pending::<()>().await;
    }
    resp
}

async fn orders(
    State(st): State<AppState>,
    attempt: IdemAttempt,
    headers: HeaderMap,
    body: String,
) -> Response {
    let n = st.runs.bump("/orders").await;
    if let Some(r) = headers.get("x-resource").and_then(|v| v.to_str().ok()) {
        attempt.0.set_resource_id(r);
    }
    (
        StatusCode::CREATED,
        format!(r#"{{"id":"ord_{n}","body":{body}}}"#),
    )
        .into_response()
}

async fn flaky(State(st): State<AppState>) -> Response {
    let n = st.runs.bump("/flaky").await;
    if st
        .knobs
        .fail
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |f| f.checked_sub(1))
        .is_ok()
    {
        return (StatusCode::SERVICE_UNAVAILABLE, "try later").into_response();
    }
    (StatusCode::CREATED, format!(r#"{{"id":"ord_{n}"}}"#)).into_response()
}

async fn slow(State(st): State<AppState>) -> Response {
    tokio::time::sleep(SLOW).await;
    let n = st.runs.bump("/slow").await;
    (StatusCode::CREATED, format!(r#"{{"id":"ord_{n}"}}"#)).into_response()
}

async fn validate(State(st): State<AppState>) -> Response {
    st.runs.bump("/validate").await;
    (
        StatusCode::UNPROCESSABLE_ENTITY,
        r#"{"error":"amount must be positive"}"#,
    )
        .into_response()
}

async fn busy(State(st): State<AppState>) -> Response {
    st.runs.bump("/busy").await;
    let mut h = HeaderMap::new();
    h.insert("retry-after", "30".parse().unwrap());
    (StatusCode::SERVICE_UNAVAILABLE, h, "busy").into_response()
}

/// What the fault proxy does with one accepted connection.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// Forward both ways.
    Pass,
    /// Forward the request, wait for the server's first response byte
    /// (`idem-http` sends it only after the outcome is stored), then reset
    /// the client's socket: the client sees no response head.
    DropResponse,
    /// Hold the connection, then forward what the client sent (even if it
    /// has given up and closed meanwhile) and the server's answer.
    Delay(Duration),
}

/// A TCP proxy in front of `upstream` (`http://…`) with a script per
/// accepted connection (then `Pass`). Returns its base URL; it stops when the
/// handle is dropped.
pub async fn fault_proxy(upstream: String, script: Vec<Fault>) -> Proxy {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let up = upstream.trim_start_matches("http://").to_owned();
    let task = tokio::spawn(async move {
        let mut script = script.into_iter();
        loop {
            let Ok((mut client, _)) = listener.accept().await else {
                return;
            };
            let fault = script.next().unwrap_or(Fault::Pass);
            let up = up.clone();
            tokio::spawn(async move {
                if let Fault::Delay(d) = fault {
                    tokio::time::sleep(d).await;
                }
                let Ok(mut server) = tokio::net::TcpStream::connect(&up).await else {
                    return;
                };
                match fault {
                    Fault::Pass => {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        return;
                    }
                    Fault::Delay(_) => {
                        // The client may be gone by now: forward what it
                        // sent without passing its EOF on (the server would
                        // drop a request whose sender half-closed), and
                        // let the server answer into the void.
                        let (mut cr, mut cw) = client.into_split();
                        let (mut sr, mut sw) = server.into_split();
                        let fwd = tokio::spawn(async move {
                            let _ = tokio::io::copy(&mut cr, &mut sw).await;
                            sw
                        });
                        let _ = tokio::time::timeout(
                            Duration::from_secs(5),
                            tokio::io::copy(&mut sr, &mut cw),
                        )
                        .await;
                        fwd.abort();
                        return;
                    }
                    Fault::DropResponse => {}
                }
                let _ = client.set_zero_linger();
                let (mut cr, cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let fwd = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut cr, &mut sw).await;
                });
                let mut first = [0u8; 1];
                let _ = tokio::time::timeout(Duration::from_secs(5), sr.read(&mut first)).await;
                fwd.abort();
                let _ = fwd.await;
                // Both halves gone: with zero linger, the client gets a reset.
                drop(cw);
            });
        }
    });
    Proxy {
        base: format!("http://{addr}"),
        task,
    }
}

/// A running fault proxy.
#[derive(Debug)]
pub struct Proxy {
    pub base: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A client: one connection per attempt, short backoff, a 10 s deadline.
pub fn client() -> reqwest_middleware::ClientWithMiddleware {
    client_with(
        idem_client::IdempotencyMiddleware::builder()
            .backoff(Duration::from_millis(10), Duration::from_millis(50))
            .deadline(Duration::from_secs(10)),
    )
}

/// A client with these settings; one connection per attempt.
pub fn client_with(
    b: idem_client::IdempotencyClientBuilder,
) -> reqwest_middleware::ClientWithMiddleware {
    quiet_global_subscriber();
    let inner = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    reqwest_middleware::ClientBuilder::new(inner)
        .with(b.build().unwrap())
        .build()
}

/// Every recorded key field is the same; returns it.
/// Sends and returns the response with its report.
pub async fn sent(
    request: reqwest_middleware::RequestBuilder,
) -> (reqwest::Response, idem_client::Report) {
    use idem_client::IdemResponseExt;
    let resp = request.send().await.unwrap();
    let report = resp.idem_report().unwrap().clone();
    (resp, report)
}

/// Asserts that the send stopped at its deadline after a 503 (the key
/// returned for the caller to resume with) and returns that key.
pub fn exhausted_at_deadline(
    result: Result<idem_client::Sent, idem_client::Error>,
) -> IdempotencyKey {
    match result {
        Err(idem_client::Error::Exhausted {
            key,
            reason,
            last_status,
            ..
        }) => {
            assert_eq!(reason, idem_client::StopReason::Deadline);
            assert_eq!(last_status, Some(StatusCode::SERVICE_UNAVAILABLE));
            key
        }
        other => panic!("expected Exhausted, got {other:?}"),
    }
}

pub fn one_key(keys: &[String]) -> &str {
    assert!(!keys.is_empty(), "no key was recorded");
    assert!(keys.iter().all(|k| k == &keys[0]), "keys differ: {keys:?}");
    &keys[0]
}

/// Installs, once per test binary and before any test reaches a tracing
/// callsite, a global subscriber that records nothing but answers every
/// callsite's interest with "sometimes". Tests that read what the client
/// logs install a subscriber on their own thread; without this, another
/// test's thread (global `NoSubscriber`) that registers a callsite while
/// that subscriber is being installed can cache "never" for it, and the
/// event is lost (tracing's cache is per callsite and process-wide).
/// "Sometimes" makes every hit ask the thread's subscriber instead.
pub fn quiet_global_subscriber() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Another global subscriber of this binary is just as good.
        let _ = tracing::subscriber::set_global_default(Quiet);
    });
}

/// See [`quiet_global_subscriber`].
struct Quiet;

impl tracing::Subscriber for Quiet {
    fn register_callsite(
        &self,
        _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::sometimes()
    }
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        false
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {}
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}
