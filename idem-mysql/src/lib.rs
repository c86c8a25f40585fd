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

/// The statements a [`MySqlStore`] runs, exactly as it runs them, for
/// review, `EXPLAIN` or a raw-driver baseline (the benches use them). Not
/// part of the stable API. Placeholders are positional (`?`).
#[doc(hidden)]
pub mod statements {
    use crate::MySqlStore;

    /// MariaDB's claim: `INSERT … ON DUPLICATE KEY UPDATE token = token
    /// RETURNING …` (binds: the record's 16-byte key, `idem_sql::record_key`;
    /// owner, operation, key, fingerprint, token, lease end, key expiry,
    /// lease end, lease end, now; Unix ms).
    #[must_use]
    pub fn claim_returning(store: &MySqlStore) -> &str {
        &store.sql().claim_returning
    }

    /// MySQL's claim: the plain insert (the first ten binds of
    /// [`claim_returning`]).
    #[must_use]
    pub fn insert(store: &MySqlStore) -> &str {
        &store.sql().insert
    }

    /// MySQL's read after a duplicate key (binds: now, the record's key).
    #[must_use]
    pub fn read(store: &MySqlStore) -> &str {
        &store.sql().read
    }

    /// The completion (binds: outcome, body, response expiry, key expiry,
    /// resource id or NULL; the record's key, token).
    #[must_use]
    pub fn complete(store: &MySqlStore) -> &str {
        store.sql().shared.complete.sql()
    }

    /// The read of a live record (binds: now; the record's key; now, now).
    #[must_use]
    pub fn fetch(store: &MySqlStore) -> &str {
        store.sql().shared.fetch.sql()
    }

    /// The purge's first statement, the deletion of expired keys (binds:
    /// now ×3, the batch limit).
    #[must_use]
    pub fn purge_delete(store: &MySqlStore) -> &str {
        &store.sql().purge_delete
    }

    /// The purge's second statement, the dropping of expired bodies (binds:
    /// now ×3, the batch limit).
    #[must_use]
    pub fn purge_drop_bodies(store: &MySqlStore) -> &str {
        &store.sql().purge_drop_bodies
    }

    /// The purge's third statement, the re-filing of the other records due
    /// (binds: now ×3, the batch limit).
    #[must_use]
    pub fn purge_refile(store: &MySqlStore) -> &str {
        &store.sql().purge_refile
    }

    /// The operator listing of in-flight records, first page (binds: lease
    /// bound ×2, now, limit).
    #[must_use]
    pub fn list_in_flight(store: &MySqlStore) -> &str {
        store.sql().shared.list_in_flight.sql()
    }
}
