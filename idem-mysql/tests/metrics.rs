//! The transactional mode records the metrics every other path records: a
//! scripted run through `execute_in_tx`, read back with exact counts, on
//! both claim paths.

mod support;

mod mariadb {
    idem_test_support::sql_suite!(crate::support::MySql::MARIADB;
        the_transactional_mode_counts_exactly,
    );
}

mod mysql_path {
    idem_test_support::sql_suite!(crate::support::MySql::MYSQL_PATH;
        the_transactional_mode_counts_exactly,
    );
}
