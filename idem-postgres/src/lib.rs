#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod dialect;
mod error;
mod replication;
mod schema;
mod sql;
mod store;

pub use config::{
    DEFAULT_SCHEMA, DEFAULT_TABLE, DEFAULT_TX_LOCK_TIMEOUT, MAX_SCHEMA_NAME_LEN, MAX_TABLE_NAME_LEN,
};
pub use dialect::PgDialect;
pub use error::Error;
/// [`Idem`](idem_core::Idem) methods that only a SQL store has: the
/// transactional mode ([`execute_in_tx`](PgIdemExt::execute_in_tx)), one
/// implementation for every SQL dialect. On Postgres the wait for a
/// concurrent duplicate is bounded with `SET LOCAL lock_timeout` (see
/// [`PgStore::with_tx_lock_timeout`]), the replication check runs first,
/// and [`PgStore::with_call_timeout`] bounds the commit.
pub use idem_sql::SqlIdemExt as PgIdemExt;
pub use idem_sql::TxFuture;
pub use replication::{Replication, refuse_without_synchronous_standby};
pub use schema::MIGRATION;
pub use sqlx;
pub use store::PgStore;

/// The text of a statement a [`PgStore`] runs, by name, exactly as it runs
/// it, for review, `EXPLAIN` or a raw-driver baseline (the benches use
/// them). Not part of the stable API.
#[doc(hidden)]
pub use idem_sql::statement;
