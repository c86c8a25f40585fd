//! The shared conformance suite against the real server, one schema per
//! test: a store with pools of its own (`PgStore::connect_with`, the calls on
//! idem-sqlx's pool) and a store over the caller's sqlx pool
//! (`PgStore::new`).

mod support;

mod own_pool {
    use idem_test_support::sql::Dialect;

    idem_core::store_conformance!(idem_test_support::sql::conformance(
        crate::support::Pg.open(16)
    ));
}

mod over_a_sqlx_pool {
    use idem_test_support::sql::ServerDialect;

    idem_core::store_conformance!(idem_test_support::sql::conformance(
        crate::support::Pg.fixture_over_pool(16, true)
    ));
}
