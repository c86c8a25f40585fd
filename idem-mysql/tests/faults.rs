//! Faults on a throwaway `mariadbd` (a free loopback port, its own data
//! directory), the SQL suite's (`idem_test_support::sql::faults`): a
//! connection killed with `KILL <id>` in the middle of a statement, on both
//! claim paths, and the server stopped and restarted under the store. Typed
//! retryable errors, nothing reported stored that was not, never a second
//! execution, and a store that recovers by itself.

mod support;

mod mariadb {
    idem_test_support::sql_suite!(crate::support::MySql::MARIADB;
        killed_connection_mid_statement,
        pool_recovers_after_connections_are_dropped,
        a_sqlx_pool_recovers_after_connections_are_dropped,
    );
}

mod mysql_path {
    idem_test_support::sql_suite!(crate::support::MySql::MYSQL_PATH;
        killed_connection_mid_statement,
    );
}
