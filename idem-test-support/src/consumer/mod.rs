//! idem-consumer's conformance suite (feature `consumer`): one scenario per
//! row of the behaviour table (C1–C15), run against every idem backend.
//!
//! A test reuses a core `idem_core::testkit::Fixture` (an isolated store per
//! test) and expands [`consumer_conformance!`](crate::consumer_conformance):
//!
//! ```text
//! idem_test_support::consumer_conformance!(setup());
//! ```
//!
//! Each scenario builds a consumer on the store with a
//! [`ManualClock`](idem_core::clock::ManualClock), moves the clock instead of
//! sleeping, uses real tasks for concurrency, and counts how many times the
//! work really ran.
//!
//! The kit lives in this unpublished crate, not in idem-consumer: only the
//! workspace's own tests run it, through idem-consumer's public API.

mod rows;
mod support;

pub use rows::*;

/// Expands one `#[tokio::test]` per consumer scenario, each calling `$setup`
/// (an expression giving a future of an `idem_core::testkit::Fixture`) for a
/// fresh, isolated store: the same shape as `idem_core::store_conformance!`
/// (this list is the kit's one registry; `@each setup(); name, …` runs a
/// subset).
///
/// The calling crate needs `tokio` (features `macros`, `rt-multi-thread`) as
/// a dev-dependency.
#[macro_export]
macro_rules! consumer_conformance {
    ($setup:expr) => {
        $crate::consumer_conformance!(@each $setup;
            c01_fresh_success_is_acked,
            c02_permanent_failure_is_acked_and_reported_once,
            c02_permanent_failure_dead_letters_when_configured,
            c03_transient_failure_is_retried_with_backoff,
            c04_redelivery_replays_without_running,
            c04_concurrent_duplicates_run_once,
            c05_in_flight_retries_after_the_lease_left,
            c06_expired_lease_is_recovered_with_the_saved_resource,
            c07_lease_lost_at_completion_retries,
            c08_done_without_a_stored_response_is_acked,
            c09_same_id_other_payload_is_dead_lettered,
            c10_unfingerprintable_payload_is_dead_lettered,
            c11_store_unavailable_at_the_claim_retries,
            c12_completion_not_stored_is_acked,
            c13_panicking_work_retries_after_the_lease,
            c14_consumer_killed_mid_work_is_in_flight_then_recovered,
            c15_corrupt_record_or_fatal_store_error_is_dead_lettered,
            groups_each_process_a_message_once,
            invalid_ids_are_derived_and_deduplicated,
        );
    };
    (@each $setup:expr; $($name:ident),+ $(,)?) => {
        $crate::__scenario_tests!(consumer, 4, $setup; $($name),+);
    };
}
