//! idem-http's conformance suite on every backend: a real axum server and a
//! real HTTP client per test, one isolated store each; a smoke subset on a
//! throwaway Redis Cluster.
//!
//! It runs here, not in idem-http's tests: the kit needs idem-http's `axum`
//! feature, and a dev-dependency of idem-http on this crate's `http` feature
//! would turn that feature on in every test build of idem-http, including
//! the one CI runs without features to prove that record identity does not
//! depend on them (`idem-http/tests/record_identity.rs`).

use idem_test_support::fixtures as support;

/// The whole suite once per backend, in a module named after its fixture.
macro_rules! on_backends {
    ($($fixture:ident),+ $(,)?) => {$(
        mod $fixture {
            idem_test_support::http_conformance!(super::support::$fixture());
        }
    )+};
}

on_backends!(memory, sqlite_memory, sqlite_file, postgres, mysql, redis);

/// A smoke subset on a throwaway three-primary Redis Cluster (ports
/// 7340-7379): first call, replay, mismatch, in flight, wait-mode timeout,
/// recovery, transient release, the 64-request races, isolation.
mod redis_cluster {
    idem_test_support::http_conformance!(@each super::support::redis_cluster();
        row_08_first_request_executes,
        row_09_retry_is_a_byte_exact_replay,
        row_11_same_key_other_request_is_422,
        row_12_in_flight_is_409_with_retry_after,
        row_16_expired_lease_is_taken_over_as_recovery,
        row_17_transient_statuses_release_the_key,
        row_26_owners_are_isolated,
        race_64_reject_mode_runs_once,
        race_64_wait_mode_replays_to_all,
        wait_mode_timeout_is_409_with_retry_after,
        nested_router_names_the_full_route,
    );
}
