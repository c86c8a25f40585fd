//! The shared conformance suite, against standalone Redis and Redis Cluster,
//! with bodies in the body key (the default) and kept inside their record
//! (`with_inline_body_limit`, record layout 2).

mod support;

mod standalone {
    idem_core::store_conformance!(super::support::standalone());
}

mod cluster {
    idem_core::store_conformance!(super::support::cluster());
}

mod standalone_inline {
    idem_core::store_conformance!(super::support::standalone_inline());
}

mod cluster_inline {
    idem_core::store_conformance!(super::support::cluster_inline());
}
