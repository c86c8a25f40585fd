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

/// The statements a [`SqliteStore`] runs, exactly as it runs them on its
/// table, for review, `EXPLAIN QUERY PLAN` or a raw-driver baseline (the
/// benches use them). Not part of the stable API, like the Postgres and
/// Redis crates' `statements`.
#[doc(hidden)]
pub mod statements {
    use crate::SqliteStore;

    /// The claim (`?1` owner, `?2` operation, `?3` key, `?4` fingerprint,
    /// `?5` token, `?6` lease end, `?7` key expiry, `?8` now, Unix ms; `?9`
    /// the record's 16-byte key, `idem_sql::record_key`).
    /// Returns a row only when the caller won.
    #[must_use]
    pub fn claim(store: &SqliteStore) -> &str {
        &store.sql().claim
    }

    /// The completion (`?1` the record's key, `?2` token, `?3` outcome, `?4`
    /// body, `?5` response expiry, `?6` key expiry, `?7` resource id or
    /// NULL).
    #[must_use]
    pub fn complete(store: &SqliteStore) -> &str {
        store.sql().shared.complete.sql()
    }

    /// The read of a live record (`?1` the record's key, `?2` now).
    #[must_use]
    pub fn fetch(store: &SqliteStore) -> &str {
        store.sql().shared.fetch.sql()
    }

    /// The three statements of one purge batch, in the order the store runs
    /// them (delete expired keys, drop expired bodies, re-file the rest; `?1`
    /// now, `?2` the batch limit).
    #[must_use]
    pub fn purge(store: &SqliteStore) -> [&str; 3] {
        let sql = store.sql();
        [&sql.purge_keys, &sql.purge_bodies, &sql.refile]
    }

    /// The operator listing of in-flight records: the first page (`?1`
    /// lease bound, `?2` now, `?3` limit) and the next ones (then `?4`, `?5`
    /// the keyset position: lease end, record key).
    #[must_use]
    pub fn list_in_flight(store: &SqliteStore) -> [&str; 2] {
        let sql = store.sql();
        [
            sql.shared.list_in_flight.sql(),
            sql.shared.list_in_flight_after.sql(),
        ]
    }
}
