#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod ack;
mod admin;
mod config;
mod error;
mod keys;
mod scripts;
mod store;

pub use ack::{NotAcknowledged, ReplicaAck};
pub use admin::SCAN_STEPS;
pub use config::{KeyPrefix, MAX_PREFIX_LEN, PrefixError};
pub use error::Error;
pub use redis;
pub use store::RedisStore;
