#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod error;
mod schema;
mod store;
mod transactional;

pub use config::{
    DEFAULT_SCHEMA, DEFAULT_TABLE, DEFAULT_TX_LOCK_TIMEOUT, MAX_SCHEMA_NAME_LEN, MAX_TABLE_NAME_LEN,
};
pub use error::Error;
pub use schema::MIGRATION;
pub use sqlx;
pub use store::PgStore;
pub use transactional::{PgIdemExt, TxFuture};
