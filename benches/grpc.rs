//! The gRPC adapter's cost, in one run: a 256-byte unary call over loopback
//! HTTP/2 to a bare tonic service, and to the same service behind
//! `GrpcIdempotencyLayer` (fresh key, and replay of a stored one), on
//! `MemoryStore` and SQLite memory. Client and servers are tonic, in
//! process, on one current-thread runtime.
//!
//! Run with: `cargo bench --bench grpc --features grpc`
//! (`IDEM_BENCH_QUICK=1` for a short run).

#[allow(dead_code, reason = "each bench uses a part of the shared helpers")]
mod common;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use criterion::{BenchmarkId, Criterion, Throughput};
use idem::grpc::{FixedOwner, GrpcIdempotencyLayer};
use idem::store::Store;
use idem::{Idem, IdempotencyKey};
use tokio::runtime::Runtime;
use tonic::body::Body;
use tonic::server::{Grpc, NamedService};
use tonic::transport::Channel;
use tonic_prost::ProstCodec;

const ECHO: &str = "/idem.bench.v1.Echo/Echo";

#[derive(Clone, PartialEq, prost::Message)]
struct Msg {
    #[prost(bytes = "vec", tag = "1")]
    payload: Vec<u8>,
}

/// Echoes the request message.
#[derive(Clone)]
struct Echo;

impl NamedService for Echo {
    const NAME: &'static str = "idem.bench.v1.Echo";
}

impl tower::Service<http::Request<Body>> for Echo {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        Box::pin(async move {
            let svc = tower::service_fn(|r: tonic::Request<Msg>| async move {
                Ok::<_, tonic::Status>(tonic::Response::new(r.into_inner()))
            });
            Ok(Grpc::new(ProstCodec::<Msg, Msg>::default())
                .unary(svc, req)
                .await)
        })
    }
}

/// Serves `Echo` behind `$server` (a `Server` builder) on a loopback
/// port; its address. A macro: the serving bounds of a layer stack are long
/// to name and the same for both servers.
macro_rules! serve {
    ($rt:expr, $server:expr) => {{
        let listener = $rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr: SocketAddr = listener.local_addr().expect("addr");
        let router = $server.add_service(Echo);
        $rt.spawn(async move {
            let incoming =
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
            router.serve_with_incoming(incoming).await.expect("serve");
        });
        addr
    }};
}

fn client(rt: &Runtime, addr: SocketAddr) -> tonic::client::Grpc<Channel> {
    let channel = rt
        .block_on(
            Channel::from_shared(format!("http://{addr}"))
                .expect("uri")
                .connect(),
        )
        .expect("connect");
    tonic::client::Grpc::new(channel)
}

async fn call(grpc: &tonic::client::Grpc<Channel>, key: Option<&str>) -> usize {
    let mut grpc = grpc.clone();
    grpc.ready().await.expect("ready");
    let mut req = tonic::Request::new(Msg {
        payload: vec![b'x'; 256],
    });
    if let Some(k) = key {
        req.metadata_mut()
            .insert("idempotency-key", k.parse().expect("ascii key"));
    }
    let res = grpc
        .unary(
            req,
            http::uri::PathAndQuery::from_static(ECHO),
            ProstCodec::<Msg, Msg>::default(),
        )
        .await
        .expect("OK");
    res.into_inner().payload.len()
}

fn bench_store<S: Store>(c: &mut Criterion, rt: &Runtime, name: &str, store: S) {
    let layer = GrpcIdempotencyLayer::builder(Idem::new(store))
        .owner(FixedOwner::new("bench"))
        .method(ECHO)
        .build()
        .expect("layer");
    let bare = client(rt, serve!(rt, tonic::transport::Server::builder()));
    let layered = client(
        rt,
        serve!(rt, tonic::transport::Server::builder().layer(layer)),
    );
    let replay_key = IdempotencyKey::random();
    assert_eq!(rt.block_on(call(&layered, Some(replay_key.as_str()))), 256);

    let mut g = c.benchmark_group(format!("grpc-{name}"));
    g.throughput(Throughput::Elements(1));
    g.bench_function(BenchmarkId::new("bare-tonic", "256B"), |b| {
        b.iter(|| rt.block_on(call(&bare, None)));
    });
    g.bench_function(BenchmarkId::new("layer-fresh", "256B"), |b| {
        b.iter(|| {
            let k = IdempotencyKey::random();
            rt.block_on(call(&layered, Some(k.as_str())))
        });
    });
    g.bench_function(BenchmarkId::new("layer-replay", "256B"), |b| {
        b.iter(|| rt.block_on(call(&layered, Some(replay_key.as_str()))));
    });
    g.finish();
}

common::adapter_bench_main!(bench_store);
