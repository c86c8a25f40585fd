//! The shared conformance suite against the real server, one schema per test.

mod support;

async fn setup() -> support::PgFixture {
    support::PgFixture::new(16).await
}

idem_core::store_conformance!(setup());
