//! The shared conformance suite, against a SQLite file and a memory database.

mod support;

mod file {
    idem_core::store_conformance!(crate::support::FileDb::new());
}

mod memory {
    idem_core::store_conformance!(crate::support::memory());
}
