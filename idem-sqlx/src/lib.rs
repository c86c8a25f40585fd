#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod conn;
mod pool;

pub use conn::{Conn, ConnectionError};
pub use pool::{Pool, PoolConfig, Stats};
