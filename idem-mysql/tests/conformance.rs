//! The shared conformance suite against the real server, one table per
//! test, with the statements of the detected server (MariaDB here: the
//! one-statement `INSERT … RETURNING` claim).

mod support;

async fn setup() -> support::MyFixture {
    use support::Dialect;
    support::MySql::DETECTED.open(16).await
}

idem_core::store_conformance!(idem_test_support::sql::conformance(setup()));
