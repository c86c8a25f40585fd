//! Coalescing on the real server: the shared scenarios (a lone task never
//! waits for a batch; 96 mixed callers on a pool of two each get their own
//! answer), and the whole conformance suite with every call sent through
//! the batched path (`Coalescing::Always`, a pool of two).

mod support;

use idem_sql::Coalescing;

idem_test_support::sql_suite!(crate::support::MySql::MARIADB; a_lone_task_never_waits_for_a_batch,
    one_failing_call_fails_no_other_in_its_batch,
);

mod mysql_path {
    idem_test_support::sql_suite!(crate::support::MySql::MYSQL_PATH;
        a_lone_task_never_waits_for_a_batch,
    );

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn coalesced_calls_keep_every_answer_always() {
        let d = crate::support::MySql::MYSQL_PATH;
        idem_test_support::sql::coalesced_calls_keep_every_answer(d, super::Coalescing::Always)
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn coalesced_calls_keep_every_answer_when_busy() {
    let d = support::MySql::MARIADB;
    idem_test_support::sql::coalesced_calls_keep_every_answer(d, Coalescing::WhenBusy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn coalesced_calls_keep_every_answer_always() {
    let d = support::MySql::MARIADB;
    idem_test_support::sql::coalesced_calls_keep_every_answer(d, Coalescing::Always).await;
}

mod always {
    async fn setup() -> crate::support::MyFixture {
        let store = crate::support::connect(2, crate::support::options()).await;
        let store = store.with_coalescing_mode(super::Coalescing::Always);
        crate::support::MyFixture::migrated(store, crate::support::options()).await
    }

    idem_core::store_conformance!(setup());
}
