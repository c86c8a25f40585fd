//! Coalescing on the real server: the shared scenarios (a lone task never
//! waits for a batch; 96 mixed callers on a pool of two each get their own
//! answer), and the whole conformance suite with every call sent through
//! the batched path (`Coalescing::Always`, a pool of two).

mod support;

use idem_sql::Coalescing;

idem_test_support::sql_suite!(crate::support::MySql::MARIADB; @coalescing);

mod mysql_path {
    idem_test_support::sql_suite!(crate::support::MySql::MYSQL_PATH;
        a_lone_task_never_waits_for_a_batch,
        coalesced_calls_keep_every_answer_always,
    );
}

mod always {
    use crate::support::{MyFixture, MySql};
    use idem_test_support::sql::ServerDialect;

    async fn setup() -> MyFixture {
        let store = MySql::connect(2, MySql::options()).await;
        let store = store.with_coalescing_mode(super::Coalescing::Always);
        MySql::DETECTED.isolate(store, MySql::options(), true).await
    }

    idem_core::store_conformance!(idem_test_support::sql::conformance(setup()));
}
