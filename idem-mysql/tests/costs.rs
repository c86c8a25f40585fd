//! What each transition costs on the wire: statements and round trips,
//! counted through a proxy on a warm connection, for both claim paths
//! (MariaDB's `INSERT … RETURNING`, and the portable MySQL statements), and
//! sqlx's ping per checkout for a store over a sqlx pool. The expected
//! numbers are `support::MySql::expected_costs`.

mod support;

mod mariadb {
    idem_test_support::sql_suite!(crate::support::MySql::MARIADB;
        one_statement_per_transition,
        a_store_over_a_sqlx_pool_pays_its_ping_per_checkout,
    );
}

mod mysql_path {
    idem_test_support::sql_suite!(crate::support::MySql::MYSQL_PATH;
        one_statement_per_transition,
        a_store_over_a_sqlx_pool_pays_its_ping_per_checkout,
    );
}
