#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod error;
mod schema;
mod store;

pub use config::{DEFAULT_BUSY_TIMEOUT, DEFAULT_MAX_CONNECTIONS};
pub use error::Error;
pub use schema::MIGRATION;

/// The statements the store runs, exactly, for review, `EXPLAIN QUERY PLAN`
/// or a raw-driver baseline (the benches use them). Not part of the stable
/// API, like the Postgres and Redis crates' `statements`.
#[doc(hidden)]
pub mod statements {
    pub use crate::schema::{
        CLAIM, COMPLETE, FETCH, LIST_IN_FLIGHT, LIST_IN_FLIGHT_AFTER, PURGE_BODIES, PURGE_KEYS,
        REFILE,
    };
}
pub use sqlx;
pub use store::SqliteStore;
