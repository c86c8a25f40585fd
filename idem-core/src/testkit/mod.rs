//! The conformance suite: one scenario per promise of the contract, run by
//! every backend against a real server.
//!
//! A backend implements [`Fixture`] (how to make an isolated store for one
//! test, and how to clean it up) and expands [`store_conformance!`](crate::store_conformance):
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
//! // idem_core::store_conformance!(setup());
//! ```
//!
//! Each scenario takes the store behind an `Arc`, builds engines with a
//! [`ManualClock`](crate::clock::ManualClock) starting at the current time, and moves
//! that clock instead of sleeping. Scenarios use random owners and keys, but
//! some (purge) count every record in the store, so each test needs its own
//! store (table, schema, file or key prefix): that is the fixture's job.
//!
//! **Not covered by semver.** Like object_store's integration tests, this
//! module's items (scenarios, [`Charge`], [`Counter`], [`Decline`], [`FailingStore`],
//! [`race`], [`run`]) may change in any release: they exist to prove backends, not to be
//! built upon.

mod admin;
mod basic;
mod concurrency;
mod expiry;
mod faults;
mod guard;
mod lease_vs_key;
mod recovery;
mod store_level;
mod support;

#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;

use std::future::Future;
use std::sync::Arc;

pub use admin::*;
pub use basic::*;
pub use concurrency::*;
pub use expiry::*;
pub use faults::*;
pub use guard::*;
pub use lease_vs_key::*;
pub use recovery::*;
pub use store_level::*;
pub use support::{Charge, Counter, Decline, FailingStore, race};

use crate::store::AdminStore;

/// An isolated store for one test.
pub trait Fixture: Send + Sized + 'static {
    /// The store under test.
    type Store: AdminStore + Clone;
    /// A handle on the store (scenarios may open several engines on it).
    fn store(&self) -> Self::Store;
    /// Removes whatever the test created (its table, schema or keys).
    fn teardown(self) -> impl Future<Output = ()> + Send;
}

/// Runs one scenario against a fresh fixture, tearing it down even when the
/// scenario fails, then re-raises the failure.
///
/// # Panics
///
/// When the scenario fails (that is the test failing).
pub async fn run<Fx, Sc, Fut>(setup: impl Future<Output = Fx>, scenario: Sc)
where
    Fx: Fixture,
    Sc: FnOnce(Arc<Fx::Store>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let fixture = setup.await;
    let store = Arc::new(fixture.store());
    let result = tokio::spawn(scenario(store)).await;
    fixture.teardown().await;
    if let Err(e) = result {
        match e.try_into_panic() {
            Ok(payload) => std::panic::resume_unwind(payload),
            Err(e) => panic!("scenario did not finish: {e}"),
        }
    }
}

/// Expands one `#[tokio::test]` per conformance scenario, each calling
/// `$setup` (an expression giving a future of a [`Fixture`]) for a fresh,
/// isolated store.
///
/// `store_conformance!(setup())` runs every scenario, in the order listed
/// here (this list is the one registry of the suite: a scenario is a
/// `pub async fn` of this module named in it);
/// `store_conformance!(@each setup(); name, …)` runs the named ones (a smoke
/// subset on a slow fixture).
///
/// The calling crate needs `tokio` (features `macros`, `rt-multi-thread`) as a
/// dev-dependency.
#[macro_export]
macro_rules! store_conformance {
    ($setup:expr) => {
        $crate::store_conformance!(@each $setup;
            first_call_executes_and_stores,
            replay_is_byte_for_byte,
            typed_replay_round_trips,
            mismatch_is_rejected_and_leaves_record_untouched,
            mismatch_while_in_flight_is_rejected,
            in_flight_duplicate_is_rejected_with_retry_after,
            in_flight_wait_mode_replays_when_first_finishes,
            in_flight_wait_mode_times_out,
            expired_lease_is_taken_over_as_recovery_with_resource_id,
            expired_lease_with_other_request_is_a_mismatch,
            zombie_holder_cannot_complete_save_resource_id_or_extend,
            extended_lease_keeps_duplicates_out,
            transient_failure_releases_the_key_for_a_rerun,
            permanent_failure_is_stored_and_replayed,
            expired_response_answers_with_the_resource_id,
            expired_key_is_a_new_operation,
            purge_runs_in_bounded_batches,
            purge_counts_each_record_once,
            owners_are_isolated,
            operations_are_isolated,
            hostile_identities_round_trip_and_stay_apart,
            invalid_input_stores_nothing_and_runs_nothing,
            oversize_response_is_not_stored_and_never_rerun,
            downstream_key_is_stable_across_recovery,
            concurrent_duplicates_run_the_work_once,
            distinct_keys_run_concurrently,
            store_writes_are_fenced_by_token,
            claim_reports_existing_records,
            completion_failure_leaves_record_to_recovery,
            completion_with_a_lost_reply_is_reported_stored,
            unstored_completion_is_written_in_the_background,
            background_completion_ends_with_the_lease,
            extended_lease_outlives_key_ttl,
            takeover_lease_outlives_key_ttl,
            claim_checks_the_lease_before_key_expiry,
            guard_begin_runs_then_replays,
            guard_dropped_claim_is_recovered_after_the_lease,
            guard_release_makes_the_next_attempt_a_recovery,
            guard_complete_not_stored_is_never_rerun,
            guard_every_write_of_a_fenced_holder_is_lease_lost,
            admin_lists_stuck_records_in_pages,
            admin_release_makes_the_next_attempt_a_recovery,
            admin_delete_refuses_unfinished_records,
            admin_counts_records_by_state,
            admin_refuses_a_cursor_it_did_not_write,
            purger_runs_by_itself_and_stops,
        );
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
