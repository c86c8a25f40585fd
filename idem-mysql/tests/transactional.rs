//! The transactional mode (`MySqlIdemExt::execute_in_tx`) against the real
//! server, on both claim paths: the claim, the caller's writes and the
//! response commit or roll back together, and duplicates wait for the
//! winner's transaction (seen on the server, in `PROCESSLIST`, not by
//! timing). The SQL suite's scenarios, `idem_test_support::sql::transactional`.

mod support;

mod mariadb {
    idem_test_support::sql_suite!(crate::support::MySql::MARIADB;
        tx_commits_claim_writes_and_response_together,
        tx_transient_failure_or_dropped_future_leaves_nothing,
        tx_duplicate_waits_for_the_winner_then_replays,
        tx_duplicate_runs_after_a_rollback_and_plain_calls_wait_too,
        tx_duplicate_gets_409_after_the_lock_timeout,
    );
}

mod mysql_path {
    idem_test_support::sql_suite!(crate::support::MySql::MYSQL_PATH;
        tx_commits_claim_writes_and_response_together,
        tx_transient_failure_or_dropped_future_leaves_nothing,
        tx_duplicate_waits_for_the_winner_then_replays,
        tx_duplicate_runs_after_a_rollback_and_plain_calls_wait_too,
        tx_duplicate_gets_409_after_the_lock_timeout,
    );
}
