//! The consumer conformance suite: one scenario per row of the behaviour
//! table (C1–C15), run against every idem backend.
//!
//! A backend's tests implement `idem_core::testkit::Fixture` (an isolated
//! store per test) and expand [`consumer_conformance!`](crate::consumer_conformance):
//!
//! ```text
//! idem_consumer::consumer_conformance!(setup());
//! ```
//!
//! Each scenario builds a consumer on the store with a
//! [`ManualClock`](idem_core::clock::ManualClock), moves the clock instead of
//! sleeping, uses real tasks for concurrency, and counts how many times the
//! work really ran.
//!
//! **Not covered by semver**: these items exist to prove the consumer on
//! every backend, not to be built upon.

mod rows;
mod support;

pub use idem_core::testkit::run;
pub use rows::*;

/// The scenario list, in one place: both [`consumer_conformance!`](crate::consumer_conformance)
/// and [`SCENARIOS`] expand from it, and a unit test fails on a scenario
/// written but not listed.
#[doc(hidden)]
#[macro_export]
macro_rules! __consumer_for_each_scenario {
    ($callback:ident { $($prefix:tt)* }) => {
        $crate::$callback! { $($prefix)* ;
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
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __consumer_scenario_names {
    (; $($name:ident),+ $(,)?) => {
        /// The names of every consumer scenario, in the order they run.
        pub const SCENARIOS: &[&str] = &[$(stringify!($name)),+];
    };
}

crate::__consumer_for_each_scenario!(__consumer_scenario_names {});

/// Expands one `#[tokio::test]` per consumer scenario, each calling `$setup`
/// (an expression giving a future of an `idem_core::testkit::Fixture`) for a
/// fresh, isolated store.
///
/// The calling crate needs `tokio` (features `macros`, `rt-multi-thread`) as
/// a dev-dependency.
#[macro_export]
macro_rules! consumer_conformance {
    ($setup:expr) => {
        $crate::__consumer_for_each_scenario!(consumer_conformance { @each $setup });
    };
    (@each $setup:expr; $($name:ident),+ $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                $crate::testkit::run($setup, |store| $crate::testkit::$name(store)).await;
            }
        )+
    };
}

#[cfg(test)]
mod tests {
    /// A scenario written but not listed would never run on any backend.
    #[test]
    fn every_scenario_is_listed() {
        let mut found = 0;
        for line in include_str!("rows.rs").lines() {
            let Some(rest) = line.strip_prefix("pub async fn ") else {
                continue;
            };
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            found += 1;
            assert!(
                super::SCENARIOS.contains(&name.as_str()),
                "scenario `{name}` is not in __consumer_for_each_scenario!"
            );
        }
        assert_eq!(found, super::SCENARIOS.len());
    }
}
