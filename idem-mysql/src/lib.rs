#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod dialect;
mod error;
mod schema;
mod sql;
mod store;

pub use config::{DEFAULT_TABLE, DEFAULT_TX_LOCK_TIMEOUT, MAX_TABLE_NAME_LEN, Server};
pub use dialect::MySqlDialect;
pub use error::Error;
/// [`Idem`](idem_core::Idem) methods that only a SQL store has: the
/// transactional mode ([`execute_in_tx`](MySqlIdemExt::execute_in_tx)), one
/// implementation for every SQL dialect. On MySQL and MariaDB the wait for a
/// concurrent duplicate is bounded with `innodb_lock_wait_timeout` (see
/// [`MySqlStore::with_tx_lock_timeout`]), and only InnoDB tables take part
/// in the transaction.
pub use idem_sql::SqlIdemExt as MySqlIdemExt;
pub use idem_sql::TxFuture;
pub use schema::MIGRATION;
pub use sqlx;
pub use store::MySqlStore;

/// The text of a statement a [`MySqlStore`] runs, by name, exactly as it runs
/// it, for review, `EXPLAIN` or a raw-driver baseline (the benches use
/// them). Not part of the stable API.
#[doc(hidden)]
pub use idem_sql::statement;
