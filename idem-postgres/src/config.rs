//! Building a [`PgStore`]: the pool, and validated table and schema names.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::error::Error;
use crate::store::{PgStore, Statements};

/// The default schema.
pub const DEFAULT_SCHEMA: &str = "public";
/// The default table.
pub const DEFAULT_TABLE: &str = "idem_records";
/// Longest accepted table name: Postgres keeps 63 bytes of an identifier,
/// and index and constraint names append up to 23 bytes to the table name.
pub const MAX_TABLE_NAME_LEN: usize = 40;
/// Longest accepted schema name (Postgres' identifier limit).
pub const MAX_SCHEMA_NAME_LEN: usize = 63;
/// The default `lock_timeout` of the transactional mode.
pub const DEFAULT_TX_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the records live: a validated schema and table name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableName {
    pub(crate) schema: String,
    pub(crate) table: String,
}

impl TableName {
    /// `"schema"."table"`, safe to splice into SQL: both parts were
    /// validated as plain identifiers, so quoting cannot be escaped.
    pub(crate) fn qualified(&self) -> String {
        format!("\"{}\".\"{}\"", self.schema, self.table)
    }
}

/// Accepts `[A-Za-z_][A-Za-z0-9_]*` up to `max` bytes: no quoting tricks,
/// no `;`, nothing that needs escaping. The name is used quoted (so its case
/// is kept as given).
pub(crate) fn validate_identifier(
    what: &'static str,
    name: &str,
    max: usize,
) -> Result<String, Error> {
    let invalid = |reason| Err(Error::InvalidIdentifier { what, reason });
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return invalid("it is empty");
    };
    if name.len() > max {
        return invalid("it is too long");
    }
    if !(first.is_ascii_alphabetic() || first == '_') {
        return invalid("it must start with an ASCII letter or '_'");
    }
    if !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return invalid("only ASCII letters, digits and '_' are allowed");
    }
    if name.starts_with("pg_") {
        return invalid("the pg_ prefix is reserved by PostgreSQL");
    }
    Ok(name.to_owned())
}

impl PgStore {
    /// A store over an existing pool, using `public.idem_records`.
    ///
    /// The pool is used as given. If you build it yourself, consider
    /// [`PgPoolOptions::test_before_acquire(false)`](PgPoolOptions::test_before_acquire):
    /// otherwise sqlx pings every connection before handing it out, which
    /// doubles the round trips of every call. A dead connection then fails
    /// one call with [`StoreError::Unavailable`](idem_core::StoreError) and
    /// is replaced.
    ///
    /// Run [`PgStore::migrate`] (or apply [`MIGRATION`](crate::MIGRATION)
    /// yourself) before the first call.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), idem_postgres::Error> {
    /// use idem_postgres::{PgStore, sqlx::postgres::PgPoolOptions};
    ///
    /// let pool = PgPoolOptions::new()
    ///     .test_before_acquire(false)
    ///     .connect("postgres://postgres@127.0.0.1:5432/test")
    ///     .await?;
    /// let store = PgStore::new(pool).with_table_name("payments_idem")?;
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn new(pool: PgPool) -> Self {
        let name = TableName {
            schema: DEFAULT_SCHEMA.to_owned(),
            table: DEFAULT_TABLE.to_owned(),
        };
        Self::build(pool, name, DEFAULT_TX_LOCK_TIMEOUT)
    }

    /// Connects a pool of its own to `url` and returns a store over it.
    ///
    /// The pool is built with `test_before_acquire(false)`: no ping before
    /// each call, so a claim or a replay is one round trip. The price: a
    /// connection that died while idle fails the one call that picks it up
    /// (a typed [`StoreError::Unavailable`](idem_core::StoreError), HTTP 503),
    /// and the pool replaces it. Use [`PgStore::new`] with your own
    /// [`PgPoolOptions`] to choose otherwise.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlx`] when the URL is invalid or the server unreachable.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let options: PgConnectOptions = url.parse()?;
        Self::connect_with(PgPoolOptions::new(), options).await
    }

    /// Like [`PgStore::connect`], with your pool and connect options;
    /// `test_before_acquire(false)` is still set.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlx`] when the server is unreachable.
    pub async fn connect_with(
        pool: PgPoolOptions,
        options: PgConnectOptions,
    ) -> Result<Self, Error> {
        let pool = pool
            .test_before_acquire(false)
            .connect_with(options)
            .await?;
        Ok(Self::new(pool))
    }

    /// Uses another table name (default `idem_records`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidIdentifier`] unless the name is 1 to 40 ASCII letters,
    /// digits and `_`, not starting with a digit or `pg_`.
    pub fn with_table_name(self, table: &str) -> Result<Self, Error> {
        let table = validate_identifier("table", table, MAX_TABLE_NAME_LEN)?;
        let name = TableName {
            table,
            ..self.name().clone()
        };
        Ok(Self::build(
            self.pool().clone(),
            name,
            self.tx_lock_timeout(),
        ))
    }

    /// Uses another schema (default `public`); [`PgStore::migrate`] creates
    /// it if missing.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidIdentifier`] unless the name is 1 to 63 ASCII letters,
    /// digits and `_`, not starting with a digit or `pg_`.
    pub fn with_schema_name(self, schema: &str) -> Result<Self, Error> {
        let schema = validate_identifier("schema", schema, MAX_SCHEMA_NAME_LEN)?;
        let name = TableName {
            schema,
            ..self.name().clone()
        };
        Ok(Self::build(
            self.pool().clone(),
            name,
            self.tx_lock_timeout(),
        ))
    }

    /// How long the transactional mode waits for a concurrent duplicate's
    /// transaction to finish before answering 409 (default 5 s; it sets
    /// `lock_timeout` for its own transaction only).
    #[must_use]
    pub fn with_tx_lock_timeout(self, timeout: Duration) -> Self {
        Self::build(self.pool().clone(), self.name().clone(), timeout)
    }

    fn build(pool: PgPool, name: TableName, tx_lock_timeout: Duration) -> Self {
        let sql = Arc::new(Statements::new(&name));
        Self::from_parts(pool, Arc::new(name), sql, tx_lock_timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_validated() {
        for ok in ["idem_records", "_t", "T1", "a".repeat(40).as_str()] {
            assert!(
                validate_identifier("table", ok, MAX_TABLE_NAME_LEN).is_ok(),
                "{ok}"
            );
        }
        for bad in [
            "",
            "1abc",
            "a-b",
            "a b",
            "x\"; DROP TABLE y; --",
            "t;",
            "é",
            "pg_catalog",
            "a\0",
            "a".repeat(41).as_str(),
        ] {
            assert!(
                matches!(
                    validate_identifier("table", bad, MAX_TABLE_NAME_LEN),
                    Err(Error::InvalidIdentifier { what: "table", .. })
                ),
                "{bad:?}"
            );
        }
    }
}
