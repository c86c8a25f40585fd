//! The SQL suite's fault, race and schema scenarios again, with every call
//! of every store this binary builds on a pool of its own sent through the
//! batched path (`Coalescing::Always`): a killed connection, a dropped pool,
//! 64 racers over 8 pools, racing takeovers, a thousand keys, hostile and
//! corrupted values, each answered as the single calls answer them.

mod support;

idem_test_support::sql_suite!(crate::support::Pg::batched(); @races);
idem_test_support::sql_suite!(crate::support::Pg::batched(); @values);
idem_test_support::sql_suite!(crate::support::Pg::batched();
    killed_connection_mid_statement,
    pool_recovers_after_connections_are_dropped,
    corrupted_rows_are_typed_errors_not_panics,
);
