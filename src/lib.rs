#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The application API, the three other tiers of idem-core and its wire
// vocabulary (`wire`), named one by
// one rather than by a glob: a glob would also re-export idem-core's
// `testkit` whenever anything in the build turns that feature on (a
// workspace build does), so the facade's surface would depend on its
// neighbours. The conformance suite for authors of a store stays in
// idem-core (feature `testkit`), its one home.
#[doc(inline)]
pub use idem_core::{
    AnyStore, Attempt, Begin, Claim, Error, Failure, FieldFilter, HttpResponse, Idem,
    IdempotencyKey, InFlightMode, IntoKey, Json, MemoryStore, Outcome, Policy, PolicyBuilder,
    RawJson, RecordId, Reply, Scope, Storable, TakeoverReason, adapter, clock, error, ops,
    storable_as_json, store, wire,
};

mod connect;
pub use connect::{ConnectError, ConnectOptions, connect};

/// The embedded SQLite backend (feature `sqlite`, on by default).
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
#[doc(inline)]
pub use idem_sqlite as sqlite;

/// The PostgreSQL backend.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
#[doc(inline)]
pub use idem_postgres as postgres;

/// The MySQL and MariaDB backend (feature `mysql`).
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
#[doc(inline)]
pub use idem_mysql as mysql;

/// The Redis backend (standalone and Redis Cluster).
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
#[doc(inline)]
pub use idem_redis as redis;

/// The HTTP adapter (feature `http`): a tower layer that puts the engine in
/// front of POST/PATCH handlers (`Idempotency-Key`, problem+json,
/// `Idempotent-Replayed`); axum integration with feature `axum`, the
/// OpenAPI components (`idem::http::openapi`) with feature `openapi`, the
/// webhook receiver (`idem::http::webhook`) with feature `webhook`.
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
#[doc(inline)]
pub use idem_http as http;

/// The queue consumer (feature `consumer`): [`Consumer::process`](idem_consumer::Consumer::process)
/// runs each message's work once per consumer group and answers with the
/// broker action (ack, retry after a delay, dead letter).
#[cfg(feature = "consumer")]
#[cfg_attr(docsrs, doc(cfg(feature = "consumer")))]
#[doc(inline)]
pub use idem_consumer as consumer;

/// The gRPC adapter (feature `grpc`): a tower layer for tonic servers that
/// makes unary methods safe to retry (`idempotency-key` metadata,
/// `google.rpc` error details, `idempotent-replayed` on replays).
#[cfg(feature = "grpc")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
#[doc(inline)]
pub use idem_grpc as grpc;

/// The client side (feature `client`): a `reqwest-middleware` middleware that
/// keeps one `Idempotency-Key` per intent across its retries, retries only what
/// is safe, and reads the server's answers (replayed, in flight, already done).
#[cfg(feature = "client")]
#[cfg_attr(docsrs, doc(cfg(feature = "client")))]
#[doc(inline)]
pub use idem_client as client;

/// MCP tool calls (feature `mcp`): [`IdempotentTools`](idem_mcp::IdempotentTools)
/// runs an rmcp server's `tools/call` at most once per key (from
/// `_meta.idempotencyKey` or an `idempotency_key` argument) and replays the
/// first result; [`ToolCaller`](idem_mcp::ToolCaller) is the agent host's side.
#[cfg(feature = "mcp")]
#[cfg_attr(docsrs, doc(cfg(feature = "mcp")))]
#[doc(inline)]
pub use idem_mcp as mcp;
