//! What each transition costs on the wire: statements and round trips,
//! counted through a proxy on a warm connection, and what goes on the wire
//! between the calls (sqlx's pool pings each connection it takes back; the
//! store's own pool does not). The expected numbers are
//! `support::Pg::expected_costs`.

mod support;

idem_test_support::sql_suite!(crate::support::Pg;
    one_statement_per_transition,
    a_store_over_a_sqlx_pool_pays_its_ping_per_checkout,
);
