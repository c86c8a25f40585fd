//! The test server: a hand-written tonic service (prost messages, no
//! protoc) behind the layer, on `127.0.0.1:0`, over a store with fault
//! switches and a manual clock; and a tonic client for it.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::request::Parts;
use idem_core::clock::ManualClock;
use idem_core::store::Store;
use idem_core::testkit::FailingStore;
use idem_core::{Idem, IdempotencyKey, Policy};
use idem_grpc::{GrpcIdempotencyLayer, GrpcIdempotencyLayerBuilder, IdemAttempt};
use tokio::sync::{Notify, Semaphore};
use tonic::body::Body;
use tonic::metadata::MetadataMap;
use tonic::server::{Grpc, NamedService};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;

pub const LEASE: Duration = Duration::from_secs(30);
pub const RESPONSE_TTL: Duration = Duration::from_secs(60);
pub const KEY_TTL: Duration = Duration::from_secs(3600);

/// The layer's request limit.
pub const MAX_REQUEST: usize = 1024;

/// How the test server's layer is set up.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub lease: Duration,
    pub optional_key: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            lease: LEASE,
            optional_key: false,
        }
    }
}

/// Covered, key in metadata.
pub const CREATE: &str = "/idem.test.v1.Svc/Create";
/// Covered, key in field 5 (`request_id`).
pub const BY_FIELD: &str = "/idem.test.v1.Svc/CreateByField";
/// Not covered (unary).
pub const OPEN: &str = "/idem.test.v1.Svc/Open";
/// Not covered (server streaming).
pub const WATCH: &str = "/idem.test.v1.Svc/Watch";
/// A unary method of a service declared without a package (`Bare`), the
/// same handler as `Create`; not covered by the suite's layer.
pub const BARE: &str = "/Bare/Create";

#[derive(Clone, PartialEq, prost::Message)]
pub struct Req {
    #[prost(string, tag = "1")]
    pub account: String,
    #[prost(int64, tag = "2")]
    pub amount: i64,
    #[prost(string, tag = "4")]
    pub note: String,
    #[prost(string, tag = "5")]
    pub request_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Resp {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(int64, tag = "2")]
    pub amount: i64,
    #[prost(int64, tag = "3")]
    pub execution: i64,
}

pub fn req(amount: i64) -> Req {
    Req {
        account: "acc".to_owned(),
        amount,
        ..Req::default()
    }
}

/// A `CreateOrder` request that waits on the gate.
pub fn gated() -> Req {
    Req {
        note: "gate".to_owned(),
        ..req(100)
    }
}

/// Executions, and the gate a `note: "gate"` call waits on.
#[derive(Debug)]
pub struct Counts {
    executions: AtomicU64,
    finished: AtomicU64,
    pub gate: Semaphore,
    pub started: Notify,
}

impl Default for Counts {
    fn default() -> Self {
        Self {
            executions: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            gate: Semaphore::new(0),
            started: Notify::new(),
        }
    }
}

impl Counts {
    pub fn executions(&self) -> u64 {
        self.executions.load(Ordering::SeqCst)
    }
    pub fn finished(&self) -> u64 {
        self.finished.load(Ordering::SeqCst)
    }
    pub fn open_gate(&self) {
        self.gate.add_permits(1);
    }
}

type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send>>;

#[derive(Clone)]
struct Svc {
    counts: Arc<Counts>,
}

impl NamedService for Svc {
    const NAME: &'static str = "idem.test.v1.Svc";
}

async fn create(counts: Arc<Counts>, request: Request<Req>) -> Result<Response<Resp>, Status> {
    let n = counts.executions.fetch_add(1, Ordering::SeqCst) + 1;
    let attempt = request.extensions().get::<IdemAttempt>().cloned();
    let r = request.into_inner();
    if r.note == "gate" {
        counts.started.notify_one();
        counts.gate.acquire().await.expect("gate").forget();
    }
    if let Some(a) = attempt {
        a.0.set_resource_id(format!("res_{n}"));
    }
    counts.finished.fetch_add(1, Ordering::SeqCst);
    match r.amount {
        13 => Err(Status::unavailable("provider_unavailable")),
        7 => Err(Status::failed_precondition("insufficient_funds")),
        400 => Err(Status::invalid_argument("bad_amount")),
        _ => {
            let mut res = Response::new(Resp {
                id: format!("ord_{}", IdempotencyKey::random().as_str()),
                amount: r.amount,
                execution: i64::try_from(n).unwrap_or(i64::MAX),
            });
            res.metadata_mut()
                .insert("x-execution", n.to_string().parse().expect("ascii"));
            // A trace id: never handed to a replay (the default policy).
            res.metadata_mut()
                .insert("traceparent", format!("00-{n}").parse().expect("ascii"));
            Ok(res)
        }
    }
}

impl tower::Service<http::Request<Body>> for Svc {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFut<Result<Self::Response, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let counts = Arc::clone(&self.counts);
        match req.uri().path() {
            CREATE | BY_FIELD | OPEN | BARE => Box::pin(async move {
                let svc = tower::service_fn(move |r| create(Arc::clone(&counts), r));
                Ok(Grpc::new(ProstCodec::<Resp, Req>::default())
                    .unary(svc, req)
                    .await)
            }),
            WATCH => Box::pin(async move {
                let svc = tower::service_fn(move |r: Request<Req>| {
                    let counts = Arc::clone(&counts);
                    async move {
                        counts.executions.fetch_add(1, Ordering::SeqCst);
                        let amount = r.into_inner().amount;
                        let items = (1..=3).map(move |i| {
                            Ok(Resp {
                                id: format!("w{i}"),
                                amount,
                                execution: i,
                            })
                        });
                        Ok::<_, Status>(Response::new(tokio_stream::iter(items)))
                    }
                });
                Ok(Grpc::new(ProstCodec::<Resp, Req>::default())
                    .server_streaming(svc, req)
                    .await)
            }),
            _ => Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}

/// The same handlers, served as the package-less service `Bare`.
#[derive(Clone)]
struct Bare(Svc);

impl NamedService for Bare {
    const NAME: &'static str = "Bare";
}

impl tower::Service<http::Request<Body>> for Bare {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFut<Result<Self::Response, Infallible>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        self.0.call(req)
    }
}

fn owner(parts: &Parts) -> Option<String> {
    Some(parts.headers.get("x-account-id")?.to_str().ok()?.to_owned())
}

pub type TestLayer<S> = GrpcIdempotencyLayer<FailingStore<S>, fn(&Parts) -> Option<String>>;

/// The test layer's builder, owner set, before the methods it covers.
pub type TestBuilder<S> =
    GrpcIdempotencyLayerBuilder<FailingStore<S>, fn(&Parts) -> Option<String>>;

/// The suite's coverage: `Create`, and `CreateByField` with its key in
/// field 5.
pub fn listed<S: Store>(b: TestBuilder<S>) -> TestBuilder<S> {
    b.method(CREATE).method(BY_FIELD).key_field(BY_FIELD, 5)
}

/// A running server.
pub struct App<S: Store> {
    pub addr: std::net::SocketAddr,
    pub clock: ManualClock,
    pub store: FailingStore<S>,
    pub counts: Arc<Counts>,
    pub layer: TestLayer<S>,
    server: tokio::task::JoinHandle<()>,
}

impl<S: Store> Drop for App<S> {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl<S: Store> App<S> {
    pub async fn start(store: Arc<S>) -> Self {
        Self::with(store, Options::default()).await
    }

    /// Starts it with these options.
    pub async fn with(store: Arc<S>, opts: Options) -> Self {
        Self::covering(store, opts, listed).await
    }

    /// Starts it with these options, covering the methods `cover` adds to
    /// the builder.
    pub async fn covering(
        store: Arc<S>,
        opts: Options,
        cover: impl FnOnce(TestBuilder<S>) -> TestBuilder<S>,
    ) -> Self {
        let lease = opts.lease;
        let clock = ManualClock::starting_now();
        let store = FailingStore::new(store);
        let policy = Policy::builder()
            .lease(lease)
            .response_ttl(RESPONSE_TTL)
            .key_ttl(KEY_TTL)
            .store_retries(1, Duration::from_millis(1))
            .build()
            .expect("policy");
        let idem = Idem::new(store.clone())
            .with_clock(clock.clone())
            .with_policy(policy);
        let layer =
            cover(GrpcIdempotencyLayer::builder(idem).owner(owner as fn(&Parts) -> Option<String>))
                .max_request_bytes(MAX_REQUEST);
        let layer = if opts.optional_key {
            layer.optional_key()
        } else {
            layer
        };
        let layer: TestLayer<S> = layer.build().expect("layer");
        let counts = Arc::new(Counts::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let svc = Svc {
            counts: Arc::clone(&counts),
        };
        let router = tonic::transport::Server::builder()
            .layer(layer.clone())
            .add_service(svc.clone())
            .add_service(Bare(svc));
        let server = tokio::spawn(async move {
            router
                .serve_with_incoming(
                    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
                )
                .await
                .expect("serve");
        });
        Self {
            addr,
            clock,
            store,
            counts,
            layer,
            server,
        }
    }

    pub async fn client(&self) -> Client {
        Client {
            grpc: tonic::client::Grpc::new(self.channel().await),
        }
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .expect("uri")
            .connect()
            .await
            .expect("connect")
    }

    /// Moves the engine's clock past the lease.
    pub fn expire_lease(&self) {
        self.clock.advance(LEASE + Duration::from_secs(1));
    }
}

/// A call started in the background ([`Client::spawn_gated`]).
pub type Gated = tokio::task::JoinHandle<Result<Response<Resp>, Status>>;

/// A tonic client of the test service.
#[derive(Clone)]
pub struct Client {
    grpc: tonic::client::Grpc<Channel>,
}

/// A call's metadata: the owner and the key entries, each optional.
#[derive(Default, Clone)]
pub struct Meta {
    pub account: Option<String>,
    pub keys: Vec<Vec<u8>>,
    pub timeout: Option<Duration>,
}

pub fn with(account: &str, key: &str) -> Meta {
    Meta {
        keys: vec![key.as_bytes().to_vec()],
        ..Meta::owned_by(account)
    }
}

impl Meta {
    /// The owner `account`, no key.
    pub fn owned_by(account: &str) -> Self {
        Self {
            account: Some(account.to_owned()),
            ..Self::default()
        }
    }
}

impl Client {
    /// Starts a [`gated`] `CreateOrder` as `a1` under `key`, in the background.
    pub fn spawn_gated(&self, key: &str) -> Gated {
        let (c, key) = (self.clone(), key.to_owned());
        tokio::spawn(async move { c.create(gated(), &key).await })
    }

    /// A `Create` of `msg` as `a1` under `key`.
    pub async fn create(&self, msg: Req, key: &str) -> Result<Response<Resp>, Status> {
        self.call(CREATE, msg, &with("a1", key)).await
    }

    pub fn request(msg: Req, meta: &Meta) -> Request<Req> {
        let mut r = Request::new(msg);
        if let Some(a) = &meta.account {
            r.metadata_mut()
                .insert("x-account-id", a.parse().expect("ascii"));
        }
        let headers = r.metadata_mut();
        for k in &meta.keys {
            let v = tonic::metadata::AsciiMetadataValue::try_from(k.as_slice())
                .expect("metadata value");
            headers.append("idempotency-key", v);
        }
        if let Some(t) = meta.timeout {
            r.set_timeout(t);
        }
        r
    }

    pub async fn call(
        &self,
        path: &'static str,
        msg: Req,
        meta: &Meta,
    ) -> Result<Response<Resp>, Status> {
        let mut grpc = self.grpc.clone();
        grpc.ready().await.expect("ready");
        grpc.unary(
            Self::request(msg, meta),
            http::uri::PathAndQuery::from_static(path),
            ProstCodec::<Req, Resp>::default(),
        )
        .await
    }

    pub async fn watch(&self, msg: Req) -> Result<Vec<Resp>, Status> {
        Ok(self.watch_with(msg, &Meta::default()).await?.1)
    }

    /// A `Watch` call with this metadata: the initial metadata, the
    /// messages and the trailers.
    pub async fn watch_with(
        &self,
        msg: Req,
        meta: &Meta,
    ) -> Result<(MetadataMap, Vec<Resp>, MetadataMap), Status> {
        let mut grpc = self.grpc.clone();
        grpc.ready().await.expect("ready");
        let response = grpc
            .server_streaming(
                Self::request(msg, meta),
                http::uri::PathAndQuery::from_static(WATCH),
                ProstCodec::<Req, Resp>::default(),
            )
            .await?;
        let initial = response.metadata().clone();
        let mut stream = response.into_inner();
        let mut out = Vec::new();
        while let Some(m) = stream.message().await? {
            out.push(m);
        }
        let trailers = stream.trailers().await?.unwrap_or_default();
        Ok((initial, out, trailers))
    }
}
