#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod conns;
mod pool;
mod tx;

pub use conns::{Conns, Judged};
pub use pool::{Conn, ConnectionError, Pool, PoolConfig, Stats};
pub use tx::{SqlIdemExt, TxConnection, TxFuture, TxStore};
