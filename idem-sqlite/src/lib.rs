#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod dialect;
mod error;
mod schema;
mod sql;
mod store;

pub use config::{
    DEFAULT_BUSY_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_TABLE, MAX_TABLE_NAME_LEN,
};
pub use dialect::SqliteDialect;
pub use error::Error;
pub use schema::MIGRATION;
pub use sqlx;
pub use store::SqliteStore;

/// [`Idem`](idem_core::Idem) methods that only a SQL store has: the
/// transactional mode ([`execute_in_tx`](SqliteIdemExt::execute_in_tx)), one
/// implementation for every SQL dialect. On SQLite the transaction begins
/// with `BEGIN IMMEDIATE`: it holds the database's one write lock from the
/// claim to the commit, and a concurrent writer waits for it up to the busy
/// timeout.
pub use idem_sql::SqlIdemExt as SqliteIdemExt;
pub use idem_sql::TxFuture;

/// The text of a statement a [`SqliteStore`] runs, by name, exactly as it runs
/// it, for review, `EXPLAIN` or a raw-driver baseline (the benches use
/// them). Not part of the stable API.
#[doc(hidden)]
pub use idem_sql::statement;
