//! One named case per row of the bad-input table in `idem-core/README.md`:
//! every input a caller or a corrupted store can produce, the typed error,
//! its HTTP status, and whether the work ran.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::{Idem, InFlightMode, ManualClock, MemoryStore, Outcome, Policy, Scope};

/// Counts how many times the work really ran.
#[derive(Clone, Default)]
struct Runs(Arc<AtomicUsize>);

impl Runs {
    fn hit(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
    fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

fn scope() -> Scope {
    Scope::new("acct_1", "POST /charges").expect("scope")
}

fn engine() -> Idem<MemoryStore> {
    Idem::new(MemoryStore::new()).with_clock(ManualClock::starting_now())
}

/// Row "policy: a wait timeout at the limit": builds, and `execute` computes
/// its deadline without overflowing.
#[tokio::test]
async fn policy_longest_wait_timeout_executes() {
    let policy = Policy::builder()
        .in_flight(InFlightMode::Wait {
            timeout: Policy::MAX_DURATION,
            poll: Policy::MAX_DURATION,
        })
        .build()
        .expect("the longest accepted durations build");
    let idem = engine().with_policy(policy);
    let runs = Runs::default();
    let r = runs.clone();
    let reply = idem
        .execute(
            &scope(),
            "k1",
            &serde_json::json!({"a": 1}),
            |a| async move {
                r.hit();
                a.extend_lease(Duration::MAX)
                    .await
                    .expect("extend by anything");
                Outcome::<u8, u8>::Success(1)
            },
        )
        .await
        .expect("executes");
    assert_eq!(reply.into_result(), Ok(1));
    assert_eq!(runs.get(), 1);
}
