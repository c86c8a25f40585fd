//! Coalescing on a database file: the shared scenarios (a lone task never
//! waits for a batch; 96 mixed callers on a pool of two each get their own
//! answer), and the whole conformance suite with every call sent through
//! the batched path (`Coalescing::Always`).

mod support;

use idem_sql::Coalescing;

idem_test_support::sql_suite!(crate::support::Sqlite; a_lone_task_never_waits_for_a_batch,
    one_failing_call_fails_no_other_in_its_batch,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn coalesced_calls_keep_every_answer_when_busy() {
    idem_test_support::sql::coalesced_calls_keep_every_answer(
        support::Sqlite,
        Coalescing::WhenBusy,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn coalesced_calls_keep_every_answer_always() {
    idem_test_support::sql::coalesced_calls_keep_every_answer(support::Sqlite, Coalescing::Always)
        .await;
}

mod always {
    async fn setup() -> crate::support::FileDb {
        let mut fx = crate::support::FileDb::new().await;
        fx.store = fx.store.with_coalescing_mode(super::Coalescing::Always);
        fx
    }

    idem_core::store_conformance!(setup());
}
