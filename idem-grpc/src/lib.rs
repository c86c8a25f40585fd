#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The wire vocabulary shared with the HTTP adapter, in one place.
mod vocab;

// The server layer: its builder, the service, the gRPC framing, the answers.
mod layer;

// Which methods a service's schema (a FileDescriptorSet) says are unary.
mod descriptor;

// The decoded, canonical fingerprint those descriptors make possible.
mod canonical;

mod service;

mod wire;

mod status;

// The client side: a layer for a tonic channel, on idem-client's policy.
mod client;

pub use client::{BoxError, GrpcClientLayer, GrpcClientService, GrpcReport, ReportSlot};
pub use descriptor::DescriptorSetError;
pub use idem_http::{
    Class, ExtensionOwner, FixedOwner, HeaderPolicy, IdemAttempt, IdemKey, NoOwner, OwnerId,
    OwnerSource,
};
pub use layer::{
    ClassifyFn, GrpcConfigError, GrpcIdempotencyLayer, GrpcIdempotencyLayerBuilder, default_class,
};
pub use service::{GrpcIdempotencyService, ResponseFuture};
pub use status::{code_of, status_of};
