//! The transactional mode records the metrics every other path records: a
//! scripted run through `execute_in_tx`, read back with exact counts.

mod support;

idem_test_support::sql_suite!(crate::support::Pg; the_transactional_mode_counts_exactly);
