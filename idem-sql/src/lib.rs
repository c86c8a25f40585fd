#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod pool;

pub use pool::{Conn, ConnectionError, Pool, PoolConfig, Stats};
