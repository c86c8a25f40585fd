//! Coalescing on a database file: the shared scenarios (a lone task never
//! waits for a batch; 96 mixed callers on a pool of two each get their own
//! answer), and the whole conformance suite with every call sent through
//! the batched path (`Coalescing::Always`).

mod support;

use idem_sql::Coalescing;

idem_test_support::sql_suite!(crate::support::Sqlite; @coalescing);

mod always {
    async fn setup() -> crate::support::FileDb {
        let mut fx = crate::support::FileDb::new().await;
        fx.store = fx.store.with_coalescing_mode(super::Coalescing::Always);
        fx
    }

    idem_core::store_conformance!(idem_test_support::sql::conformance(setup()));
}
