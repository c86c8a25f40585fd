#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backoff;
mod config;
mod disposition;
#[cfg(feature = "sql")]
mod inbox;
mod process;

#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod nats;

#[cfg(feature = "rabbitmq")]
#[cfg_attr(docsrs, doc(cfg(feature = "rabbitmq")))]
pub mod rabbitmq;

#[cfg(feature = "sqs-lambda")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqs-lambda")))]
pub mod sqs;

pub use config::{
    Consumer, ConsumerBuilder, ConsumerConfigError, ConsumerPermanentFailure, FingerprintMode,
};
pub use disposition::{Cause, DeadLetterReason, Disposition, Processed};
pub use process::Delivered;
