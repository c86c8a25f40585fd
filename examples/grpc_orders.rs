//! An orders service over gRPC behind the idempotency layer (`idem::grpc`).
//!
//! Run with: `cargo run --example grpc_orders --features grpc`
//!
//! The service is `examples/proto/orders.proto` (package
//! `idem.examples.orders.v1`, service `Orders`); its messages and service
//! are written by hand below with prost and tonic (no `protoc` needed), and
//! server reflection serves the `.proto`, compiled at start by protox (pure
//! Rust).
//!
//! Environment:
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `IDEM_GRPC_ADDR` | `127.0.0.1:50051` | where to listen |
//! | `IDEM_STORE` | `sqlite` | `sqlite`, `memory`, `postgres` (feature `postgres`), `redis` (feature `redis`), `mysql` (feature `mysql`) |
//! | `IDEM_SQLITE_PATH` | a file in a temp dir | the SQLite database |
//! | `IDEM_POSTGRES_URL` | `postgres://postgres@127.0.0.1:5432/test` | schema `idem_grpc_orders` |
//! | `IDEM_REDIS_URL` | `redis://127.0.0.1:6379/` | prefix `idem-grpc-orders:` |
//! | `IDEM_MYSQL_URL` | `mysql://root@127.0.0.1:3306/test` | table `idem_grpc_orders` |
//! | `IDEM_LEASE_MS`, `IDEM_RESPONSE_TTL_MS`, `IDEM_KEY_TTL_MS` | 60 s, 24 h, 30 days | the policy |
//!
//! It prints `listening on ADDR` once it accepts calls.
//!
//! `CreateOrder` needs the owner in the `x-account-id` metadata and a key in
//! `idempotency-key`; `GetStats` needs neither (and ignores a malformed
//! key). Each execution of `CreateOrder` counts in `Stats.executions` (per
//! process) and returns a new `id` (`ord_` and a counter, unique across
//! restarts) and `created_at_ms`. `amount` 13 fails `UNAVAILABLE`
//! (`provider_unavailable`, transient: the key is released); `amount` 7
//! fails `FAILED_PRECONDITION` (`insufficient_funds`, permanent: stored and
//! replayed); `note` `"slow"` answers after 2 s: the work takes the first
//! second (the call is in flight), its outcome is stored, and the answer is
//! held one more second outside the idempotency layer (a server killed then
//! has done the work and stored it, but not answered).
//!
//! Try it (grpcurl uses the reflection):
//!
//! ```text
//! grpcurl -plaintext -H 'x-account-id: acme' -H 'idempotency-key: order-1' \
//!   -d '{"account":"acme","amount":250,"currency":"EUR"}' \
//!   127.0.0.1:50051 idem.examples.orders.v1.Orders/CreateOrder
//! ```

#[path = "support/orders_proto.rs"]
mod orders_proto;
#[path = "support/store_from_env.rs"]
mod store_from_env;

use std::convert::Infallible;
use std::error::Error;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem::grpc::{GrpcIdempotencyLayer, IdemAttempt};
use idem::{Idem, Policy};
use orders_proto::{CREATE_ORDER, CreateOrderRequest, Order};
use store_from_env::{log_warnings_to_stderr, policy_from_env, store_from_env};
use tonic::body::Body;
use tonic::server::{Grpc, NamedService};
use tonic::{Request, Response, Status};
use tonic_prost::ProstCodec;

type BoxError = Box<dyn Error + Send + Sync>;

const GET_STATS: &str = "/idem.examples.orders.v1.Orders/GetStats";

/// `GetStatsRequest` of orders.proto.
#[derive(Clone, PartialEq, prost::Message)]
struct GetStatsRequest {}

/// `Stats` of orders.proto.
#[derive(Clone, PartialEq, prost::Message)]
struct Stats {
    #[prost(int64, tag = "1")]
    executions: i64,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

struct State {
    executions: AtomicI64,
    /// The last order number: starts at the start time in microseconds, so
    /// a restarted server never hands out an id again.
    next: AtomicI64,
}

/// A response extension (never stored, never replayed): hold the answer
/// this long outside the idempotency layer.
#[derive(Clone, Copy)]
struct Hold(Duration);

async fn create_order(
    state: Arc<State>,
    request: Request<CreateOrderRequest>,
) -> Result<Response<Order>, Status> {
    state.executions.fetch_add(1, Ordering::SeqCst);
    let attempt = request.extensions().get::<IdemAttempt>().cloned();
    let req = request.into_inner();
    let slow = req.note == "slow";
    if slow {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    match req.amount {
        13 => return Err(Status::unavailable("provider_unavailable")),
        7 => return Err(Status::failed_precondition("insufficient_funds")),
        _ => {}
    }
    let id = format!("ord_{}", state.next.fetch_add(1, Ordering::SeqCst) + 1);
    if let Some(a) = attempt {
        a.0.set_resource_id(&id);
    }
    let mut res = Response::new(Order {
        id,
        account: req.account,
        amount: req.amount,
        currency: req.currency,
        created_at_ms: now_ms(),
    });
    if slow {
        res.extensions_mut().insert(Hold(Duration::from_secs(1)));
    }
    Ok(res)
}

/// The `Orders` service, routed by method path as tonic's generated code
/// does.
#[derive(Clone)]
struct OrdersServer(Arc<State>);

impl NamedService for OrdersServer {
    const NAME: &'static str = "idem.examples.orders.v1.Orders";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl tower::Service<http::Request<Body>> for OrdersServer {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let state = Arc::clone(&self.0);
        match req.uri().path() {
            CREATE_ORDER => Box::pin(async move {
                let svc = tower::service_fn(move |r| create_order(Arc::clone(&state), r));
                let codec = ProstCodec::<Order, CreateOrderRequest>::default();
                Ok(Grpc::new(codec).unary(svc, req).await)
            }),
            GET_STATS => Box::pin(async move {
                let svc = tower::service_fn(move |_: Request<GetStatsRequest>| {
                    let executions = state.executions.load(Ordering::SeqCst);
                    async move { Ok::<_, Status>(Response::new(Stats { executions })) }
                });
                let codec = ProstCodec::<Stats, GetStatsRequest>::default();
                Ok(Grpc::new(codec).unary(svc, req).await)
            }),
            _ => Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}

/// The reflection service, serving orders.proto compiled by protox.
fn reflection() -> Result<
    tonic_reflection::server::v1::ServerReflectionServer<
        impl tonic_reflection::server::v1::ServerReflection,
    >,
    BoxError,
> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/proto");
    let set = protox::compile(["orders.proto"], [dir])?;
    // The reflection service keeps the descriptor for the process's life.
    let bytes: &'static [u8] = Box::leak(prost::Message::encode_to_vec(&set).into_boxed_slice());
    Ok(tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(bytes)
        .build_v1()?)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    log_warnings_to_stderr();
    let policy = policy_from_env(Policy::builder())?;
    let store = store_from_env("grpc-orders", "grpc").await?;
    let idem = Idem::new(store).with_policy(policy);
    let layer = GrpcIdempotencyLayer::builder(idem)
        .owner(|parts: &http::request::Parts| {
            let account = parts.headers.get("x-account-id")?.to_str().ok()?;
            (!account.is_empty()).then(|| account.to_owned())
        })
        .method(CREATE_ORDER)
        .build()?;
    let start_us = SystemTime::now().duration_since(UNIX_EPOCH)?.as_micros();
    let state = Arc::new(State {
        executions: AtomicI64::new(0),
        next: AtomicI64::new(i64::try_from(start_us)?),
    });
    // Outside the idempotency layer: a `Hold` answer waits before it goes out.
    let hold = tower::util::MapFutureLayer::new(|fut| async move {
        let res: http::Response<Body> = fut.await?;
        if let Some(Hold(d)) = res.extensions().get::<Hold>().copied() {
            tokio::time::sleep(d).await;
        }
        Ok::<_, Infallible>(res)
    });
    let addr = std::env::var("IDEM_GRPC_ADDR").unwrap_or_else(|_| "127.0.0.1:50051".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let local = listener.local_addr()?;
    let router = tonic::transport::Server::builder()
        .layer(hold)
        .layer(layer.clone())
        .add_service(OrdersServer(state))
        .add_service(reflection()?);
    println!("listening on {local}");
    router
        .serve_with_incoming_shutdown(
            // No Nagle delay on the answers (tonic sets it only on listeners it binds).
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            async {
                let _ = tokio::signal::ctrl_c().await;
            },
        )
        .await?;
    // Calls whose clients gave up still finish and store their outcomes.
    layer.drain().await;
    Ok(())
}
