//! idem-http's conformance suite (feature `http`): one scenario per row of
//! the behaviour table and per cross-cutting promise, each driving a real
//! axum server on `127.0.0.1:0` with a real HTTP client, over any store.
//!
//! A test reuses a core [`Fixture`](idem_core::testkit::Fixture) and
//! expands [`http_conformance!`](crate::http_conformance):
//!
//! ```
//! use idem_core::MemoryStore;
//! use idem_core::testkit::Fixture;
//!
//! struct Memory(MemoryStore);
//! impl Fixture for Memory {
//!     type Store = MemoryStore;
//!     fn store(&self) -> MemoryStore { self.0.clone() }
//!     async fn teardown(self) {}
//! }
//! async fn setup() -> Memory { Memory(MemoryStore::new()) }
//!
//! // In a test file (needs `tokio` with `macros` and `rt-multi-thread`):
//! // idem_test_support::http_conformance!(setup());
//! ```
//!
//! Time moves through the engine's [`ManualClock`](idem_core::clock::ManualClock);
//! a handler is held in flight with a gate, not a sleep.
//!
//! The kit lives in this unpublished crate, not in idem-http: only the
//! workspace's own tests run it. It drives idem-http through its public API
//! only, so the idem-http its scenarios build layers with is the one the
//! calling test links (an integration test of idem-http links the library
//! once, and this crate builds on that same library).

mod app;
mod check;
mod extra;
mod rows;

pub use app::{
    App, Counts, KEY_TTL, LEASE, MAX_REQUEST, MAX_RESPONSE, Options, Owner, RESPONSE_TTL,
    STALE_DATE, TestLayer, WAIT_TIMEOUT, engine, engine_waiting, streamed_body,
};
pub use check::{Got, is_urn_uuid_v4};
pub use extra::*;
pub use rows::*;

/// Expands one `#[tokio::test]` per HTTP scenario, each calling `$setup` (a
/// future of an [`idem_core::testkit::Fixture`]) for a fresh, isolated store:
/// the same shape as `idem_core::store_conformance!` (this list is the
/// kit's one registry; `@each setup(); name, …` runs a subset).
///
/// The calling crate needs `tokio` (features `macros`, `rt-multi-thread`).
#[macro_export]
macro_rules! http_conformance {
    ($setup:expr) => {
        $crate::http_conformance!(@each $setup;
            row_01_uncovered_methods_pass_through,
            row_02_missing_key_is_400,
            row_03_optional_key_passes_through,
            row_04_invalid_keys_are_400,
            row_05_quoted_and_bare_key_are_one_record,
            row_06_owner_unavailable_is_500,
            row_07_request_body_over_limit_is_413,
            row_08_first_request_executes,
            row_09_retry_is_a_byte_exact_replay,
            row_10_stored_failure_is_replayed,
            row_11_same_key_other_request_is_422,
            row_12_in_flight_is_409_with_retry_after,
            row_13_wait_mode_replays_when_the_first_finishes,
            row_14_expired_response_is_409_with_resource_id,
            row_15_unstored_response_is_409_not_stored,
            row_15_streamed_body_under_the_limit_is_stored,
            row_15_sse_streams_and_is_never_stored,
            row_16_expired_lease_is_taken_over_as_recovery,
            row_17_transient_statuses_release_the_key,
            row_18_oversized_response_streams_and_is_not_stored,
            row_19_store_down_at_claim_is_503,
            row_20_store_down_at_completion_is_retried_then_replayed,
            row_20b_store_down_at_completion_after_a_saved_resource_id,
            row_21_lease_lost_is_409,
            row_22_corrupt_record_is_500,
            row_23_disconnect_when_detached_completes,
            row_24_dropped_when_not_detached_is_recovered,
            row_25_panic_is_500_then_recovery,
            row_26_owners_are_isolated,
            row_27_routes_are_isolated_per_route_or_422_per_owner,
            row_28_different_key_same_body_executes,
            row_29_equivalent_bodies_replay,
            row_30_empty_body_runs_once,
            row_31_shut_down_layer_is_503,
            race_64_reject_mode_runs_once,
            race_64_wait_mode_replays_to_all,
            response_body_failure_releases_the_key,
            problem_echoes_the_unquoted_key,
            json_duplicate_members_are_400,
            wait_mode_timeout_is_409_with_retry_after,
            nested_router_names_the_full_route,
            to_builder_derives_per_route_layers,
        );
    };
    (@each $setup:expr; $($name:ident),+ $(,)?) => {
        $crate::__scenario_tests!(http, 2, $setup; $($name),+);
    };
}
