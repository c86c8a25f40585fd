//! This backend's error, and the one place that decides what a sqlx error
//! means to the engine.

use idem_core::store::StoreError;

pub(crate) const BACKEND: &str = "sqlite";

idem_sql::sql_error! {
    /// An error of the SQLite backend: opening, migrating or configuring a
    /// store. Converts into [`StoreError`] and [`idem_core::Error`], so `?`
    /// works in a `main` returning either.
    pub enum Error {}
}

impl From<Error> for StoreError {
    fn from(e: Error) -> Self {
        match e {
            Error::Sqlx(e) => map(e),
            refused @ (Error::InvalidIdentifier { .. } | Error::Layout(_)) => StoreError::Backend {
                backend: BACKEND,
                source: Box::new(refused),
            },
        }
    }
}

/// Maps a sqlx error to the engine's classification: could not reach the
/// database, or it is busy past the busy timeout, is unavailable (a retry
/// may succeed); a value edited by hand into the wrong type (SQLite is
/// dynamically typed) is corrupt.
pub(crate) fn map(e: sqlx::Error) -> StoreError {
    let class = idem_sql::classify(
        &e,
        |e| matches!(e, sqlx::Error::Database(db) if is_busy(db.code().as_deref())),
    );
    idem_sql::to_store_error(BACKEND, class, e)
}

/// SQLITE_BUSY (5) and SQLITE_LOCKED (6), including their extended codes.
fn is_busy(code: Option<&str>) -> bool {
    code.and_then(|c| c.parse::<i32>().ok())
        .is_some_and(|c| matches!(c & 0xff, 5 | 6))
}

/// A row that could not be decoded, as a [`StoreError`].
pub(crate) fn row_error(e: idem_sql::RowError) -> StoreError {
    match e {
        idem_sql::RowError::Sqlx(e) => map(e),
        idem_sql::RowError::Corrupt(detail) => corrupt(detail),
    }
}

pub(crate) fn corrupt(detail: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        backend: BACKEND,
        detail: detail.into(),
    }
}
