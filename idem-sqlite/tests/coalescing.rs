//! Coalescing on a database file: the shared scenarios (a lone task never
//! waits for a batch; 96 mixed callers on a pool of two each get their own
//! answer), and the whole conformance suite with every call sent through
//! the batched path (`Coalescing::Always`).

mod support;

use idem_sql::Coalescing;

// The `@coalescing` group but its busy-store scenario: SQLite coalesces
// only when asked (its batches are write transactions on the file's one
// write lock), and how many statements a steady load takes there swings with
// that lock's waits (41 to 102 for 512 calls in this suite's runs, against
// 183 to 191 without the bound), too widely for the shared scenario's bound.
idem_test_support::sql_suite!(crate::support::Sqlite;
    a_lone_task_never_waits_for_a_batch,
    one_failing_call_fails_no_other_in_its_batch,
    coalesced_calls_keep_every_answer_when_busy,
    coalesced_calls_keep_every_answer_always,
);

mod always {
    async fn setup() -> crate::support::FileDb {
        let mut fx = crate::support::FileDb::new().await;
        fx.store = fx.store.with_coalescing_mode(super::Coalescing::Always);
        fx
    }

    idem_core::store_conformance!(idem_test_support::sql::conformance(setup()));
}
