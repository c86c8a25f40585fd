//! The messages of `examples/proto/orders.proto` that `grpc_orders` and
//! `grpc_order_client` exchange, written by hand with prost (no `protoc`):
//! the field names and numbers of the `.proto`.

/// `CreateOrderRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct CreateOrderRequest {
    #[prost(string, tag = "1")]
    pub(crate) account: String,
    #[prost(int64, tag = "2")]
    pub(crate) amount: i64,
    #[prost(string, tag = "3")]
    pub(crate) currency: String,
    #[prost(string, tag = "4")]
    pub(crate) note: String,
}

/// `Order`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Order {
    #[prost(string, tag = "1")]
    pub(crate) id: String,
    #[prost(string, tag = "2")]
    pub(crate) account: String,
    #[prost(int64, tag = "3")]
    pub(crate) amount: i64,
    #[prost(string, tag = "4")]
    pub(crate) currency: String,
    #[prost(int64, tag = "5")]
    pub(crate) created_at_ms: i64,
}

/// The full path of `Orders.CreateOrder`.
pub(crate) const CREATE_ORDER: &str = "/idem.examples.orders.v1.Orders/CreateOrder";
