//! The shared conformance suite against the real server, one schema per
//! test: a store with pools of its own (`PgStore::connect_with`, the calls on
//! idem-sqlx's pool) and a store over the caller's sqlx pool
//! (`PgStore::new`).

mod support;

mod own_pool {
    idem_core::store_conformance!(idem_test_support::sql::conformance(
        crate::support::PgFixture::new(16)
    ));
}

mod over_a_sqlx_pool {
    idem_core::store_conformance!(idem_test_support::sql::conformance(
        crate::support::PgFixture::over_pool(16)
    ));
}
