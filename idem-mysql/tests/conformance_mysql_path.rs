//! The shared conformance suite once more, running the portable MySQL
//! statements (plain `INSERT`, then a `SELECT` when the key exists; no
//! `RETURNING`) on whatever server `IDEM_MYSQL_URL` names. MySQL itself is
//! not installed here: on MariaDB this proves the MySQL path's logic and
//! that its SQL is the common dialect both servers run.

mod support;

async fn setup() -> support::MyFixture {
    use support::Dialect;
    support::MySql::MYSQL_PATH.open(16).await
}

idem_core::store_conformance!(idem_test_support::sql::conformance(setup()));
