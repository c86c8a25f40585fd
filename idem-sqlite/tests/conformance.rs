//! The shared conformance suite, against a SQLite file, a memory database and
//! a file whose table is not the default one.

mod support;

mod file {
    idem_core::store_conformance!(idem_test_support::sql::conformance(
        crate::support::FileDb::new()
    ));
}

mod memory {
    idem_core::store_conformance!(crate::support::memory());
}

mod named_table {
    idem_core::store_conformance!(idem_test_support::sql::conformance(
        crate::support::FileDb::with_table("billing_idem")
    ));
}
