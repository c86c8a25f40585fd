//! The SQL suite's fault, race and schema scenarios again, with every call
//! of every store this binary builds on a pool of its own sent through the
//! batched path (`Coalescing::Always`), with MariaDB's statements: a killed
//! connection, a restarted server, 64 racers, racing takeovers, a thousand keys,
//! hostile and corrupted values, each answered as the single calls answer
//! them.

mod support;

idem_test_support::sql_suite!(crate::support::MySql::MARIADB.batched();
    killed_connection_mid_statement,
    pool_recovers_after_connections_are_dropped,
    sixty_four_racers,
    racing_takeovers_have_exactly_one_winner,
    thousand_keys,
    hostile_values_go_through_bind_parameters_only,
    identities_are_byte_exact,
    binary_bodies_round_trip,
    corrupted_rows_are_typed_errors_not_panics,
);
