//! The shared conformance suite against the real server, one schema per test.

mod common;

async fn setup() -> common::PgFixture {
    common::PgFixture::new(16).await
}

idem_core::store_conformance!(setup());
