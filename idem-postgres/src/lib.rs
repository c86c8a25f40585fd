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

/// The statements a [`PgStore`] runs, exactly as it runs them, for review,
/// `EXPLAIN` or a raw-driver baseline (the benches use them). Not part of
/// the stable API.
#[doc(hidden)]
pub mod statements {
    use crate::PgStore;

    /// The claim (`$1` owner, `$2` operation, `$3` key, `$4` fingerprint,
    /// `$5` token, `$6` now, `$7` lease end, `$8` key expiry, Unix ms; `$9`
    /// the record's 16-byte key, `idem_sql::record_key`).
    #[must_use]
    pub fn claim(store: &PgStore) -> &str {
        &store.sql().claim
    }

    /// The completion (`$1` the record's key, `$2` token, `$3` outcome,
    /// `$4` body, `$5` response expiry, `$6` key expiry, `$7` resource id or
    /// NULL).
    #[must_use]
    pub fn complete(store: &PgStore) -> &str {
        store.sql().shared.complete.sql()
    }

    /// The read of a live record (`$1` the record's key, `$2` now).
    #[must_use]
    pub fn fetch(store: &PgStore) -> &str {
        store.sql().shared.fetch.sql()
    }

    /// The purge (`$1` now, `$2` the batch limit).
    #[must_use]
    pub fn purge(store: &PgStore) -> &str {
        &store.sql().purge
    }

    /// The operator listing of in-flight records, first page (`$1` lease
    /// bound, `$2` now, `$3` limit).
    #[must_use]
    pub fn list_in_flight(store: &PgStore) -> &str {
        store.sql().shared.list_in_flight.sql()
    }
}
