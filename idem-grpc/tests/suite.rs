//! The gRPC layer's behaviour suite on every backend: a real tonic server
//! and a real tonic client per test, one isolated store each; a smoke
//! subset on a throwaway Redis Cluster.

#![allow(missing_docs, clippy::unwrap_used, unreachable_pub)]

#[path = "suite/app.rs"]
mod app;
#[path = "suite/scenarios.rs"]
mod scenarios;

use idem_test_support::fixtures as support;

macro_rules! grpc_suite {
    ($setup:expr) => {
        grpc_suite!(@each $setup;
            replay_is_byte_exact,
            mismatch_is_failed_precondition,
            in_flight_is_aborted_with_retry_info,
            transient_status_releases_the_key,
            permanent_status_is_replayed,
            expired_body_is_response_expired,
            store_down_is_unavailable,
            missing_owner_is_unauthenticated,
            missing_and_invalid_keys_are_invalid_argument,
            key_from_a_request_field,
            uncovered_and_streaming_methods_pass_through,
            cancelled_call_completes_and_is_replayed,
            expired_lease_is_recovered,
            optional_key_runs_unprotected,
            request_over_the_limit_is_resource_exhausted,
            a_handler_that_outlives_its_lease_is_not_run_twice,
            an_outcome_not_stored_yet_is_unavailable_then_replayed,
        );
    };
    (@each $setup:expr; $($name:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                idem_core::testkit::run($setup, |store| crate::scenarios::$name(store)).await;
            }
        )+
    };
}

mod memory {
    grpc_suite!(super::support::memory());
}

mod sqlite_file {
    grpc_suite!(super::support::sqlite_file());
}

mod postgres {
    grpc_suite!(super::support::postgres());
}

mod mysql {
    grpc_suite!(super::support::mysql());
}

mod redis {
    grpc_suite!(super::support::redis());
}

/// A smoke subset on this binary's throwaway three-primary Redis Cluster
/// (stopped without saving by its watchdog once the binary ends).
mod redis_cluster {
    grpc_suite!(@each super::support::redis_cluster();
        replay_is_byte_exact,
        mismatch_is_failed_precondition,
        in_flight_is_aborted_with_retry_info,
        transient_status_releases_the_key,
        permanent_status_is_replayed,
        cancelled_call_completes_and_is_replayed,
    );
}
