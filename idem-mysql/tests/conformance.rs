//! The shared conformance suite against the real server, one table per
//! test, with the statements of the detected server (MariaDB here: the
//! one-statement `INSERT … RETURNING` claim).

mod support;

async fn setup() -> support::MyFixture {
    support::MyFixture::new(16).await
}

idem_core::store_conformance!(idem_test_support::sql::conformance(setup()));
