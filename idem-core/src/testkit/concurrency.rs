//! Real concurrency: many tasks, one key; many keys at once.

use std::sync::Arc;
use std::time::Duration;

use crate::Error;
use crate::clock::{Clock, ManualClock};
use crate::store::RecordState;
use crate::store::Store;

use super::support::{
    Counter, charge, charge_request, engine, key, race, record_id, scope, setup, try_charge,
};

/// 64 tasks racing on one key: the work runs exactly once; every other caller
/// gets 409 (in flight) or the replay; afterwards everyone gets the replay.
pub async fn concurrent_duplicates_run_the_work_once<S: Store>(store: Arc<S>) {
    let (_, idem, scope, key) = setup(&store, "POST /charges");
    let runs = Counter::default();
    let tasks = race(64, |i| {
        let (idem, scope, key, runs) = (idem.clone(), scope.clone(), key.clone(), runs.clone());
        async move {
            idem.execute(&scope, &key, &charge_request(100), move |_| async move {
                runs.hit();
                tokio::time::sleep(Duration::from_millis(50)).await;
                charge(&format!("ch_{i}"))
            })
            .await
        }
    });
    let (mut executed, mut replayed, mut in_flight) = (0, 0, 0);
    let mut winner = None;
    for t in tasks {
        match t.await.expect("join") {
            Ok(r) if r.is_replay() => replayed += 1,
            Ok(r) => {
                executed += 1;
                winner = Some(r.into_result().expect("ok").id);
            }
            Err(Error::InFlight { .. }) => in_flight += 1,
            Err(e) => panic!("unexpected error under contention: {e:?}"),
        }
    }
    assert_eq!(runs.get(), 1, "the work must run exactly once");
    assert_eq!(executed, 1);
    assert_eq!(executed + replayed + in_flight, 64);
    let winner = winner.expect("one winner");
    for _ in 0..8 {
        let reply = try_charge(&idem, &scope, &key, 100, "no")
            .await
            .expect("replay");
        assert!(reply.is_replay());
        assert_eq!(reply.into_result().expect("ok").id, winner);
    }
    assert_eq!(runs.get(), 1);
}

/// 1,000 distinct keys from 32 tasks at once: 1,000 executions, 1,000
/// completed records, each replaying its own response.
pub async fn distinct_keys_run_concurrently<S: Store>(store: Arc<S>) {
    const KEYS: usize = 1000;
    const TASKS: usize = 32;
    let clock = ManualClock::starting_now();
    let idem = engine(&store, &clock);
    let scope = scope("POST /charges");
    let keys: Arc<Vec<_>> = Arc::new((0..KEYS).map(|_| key()).collect());
    let runs = Counter::default();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (idem, scope, keys, runs) =
                (idem.clone(), scope.clone(), Arc::clone(&keys), runs.clone());
            tokio::spawn(async move {
                for (i, k) in keys.iter().enumerate().filter(|(i, _)| i % TASKS == t) {
                    let runs = runs.clone();
                    let reply = idem
                        .execute(&scope, k, &charge_request(100), move |_| async move {
                            runs.hit();
                            charge(&format!("ch_{i}"))
                        })
                        .await
                        .expect("call");
                    assert!(!reply.is_replay());
                    assert!(reply.is_stored());
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("join");
    }
    assert_eq!(runs.get(), KEYS);
    let now = clock.now();
    let mut completed = 0;
    for k in keys.iter() {
        let record = store
            .fetch(&record_id(&scope, k), now)
            .await
            .expect("fetch")
            .expect("a record per key");
        completed += usize::from(record.state == RecordState::Completed);
    }
    assert_eq!(completed, KEYS);
    for (i, k) in keys.iter().enumerate().step_by(97) {
        let reply = try_charge(&idem, &scope, k, 100, "no")
            .await
            .expect("replay");
        assert_eq!(reply.into_result().expect("ok").id, format!("ch_{i}"));
    }
    assert_eq!(runs.get(), KEYS);
}
