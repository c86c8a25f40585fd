//! Facade crate (docs written with the SQLite backend).
#![cfg_attr(docsrs, feature(doc_cfg))]

#[doc(inline)]
pub use idem_core::*;

/// The embedded SQLite backend.
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
#[doc(inline)]
pub use idem_sqlite as sqlite;

/// The PostgreSQL backend.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
#[doc(inline)]
pub use idem_postgres as postgres;
