//! The HTTP conformance suite on every backend: a real axum server and a
//! real HTTP client per test, one isolated store each.

mod support;

mod memory {
    idem_http::http_conformance!(super::support::memory());
}

mod sqlite_memory {
    idem_http::http_conformance!(super::support::sqlite_memory());
}

mod sqlite_file {
    idem_http::http_conformance!(super::support::sqlite_file());
}

mod postgres {
    idem_http::http_conformance!(super::support::postgres());
}

mod redis {
    idem_http::http_conformance!(super::support::redis());
}
