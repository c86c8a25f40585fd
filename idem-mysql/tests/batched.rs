//! The SQL suite's fault, race and schema scenarios again, with every call
//! of every store this binary builds on a pool of its own sent through the
//! batched path (`Coalescing::Always`), with MariaDB's statements: a killed
//! connection, a restarted server, 64 racers, racing takeovers, a thousand keys,
//! hostile and corrupted values, each answered as the single calls answer
//! them.

mod support;

idem_test_support::sql_suite!(crate::support::MySql::MARIADB.batched(); @races);
idem_test_support::sql_suite!(crate::support::MySql::MARIADB.batched(); @values);
idem_test_support::sql_suite!(crate::support::MySql::MARIADB.batched();
    killed_connection_mid_statement,
    pool_recovers_after_connections_are_dropped,
    corrupted_rows_are_typed_errors_not_panics,
);
