//! The shared conformance suite, against standalone Redis and Redis Cluster.

mod support;

mod standalone {
    idem_core::store_conformance!(super::support::standalone());
}

mod cluster {
    idem_core::store_conformance!(super::support::cluster());
}
