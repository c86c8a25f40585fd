#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod error;
mod schema;
mod store;

pub use config::{DEFAULT_BUSY_TIMEOUT, DEFAULT_MAX_CONNECTIONS};
pub use schema::MIGRATION;
pub use sqlx;
pub use store::SqliteStore;
