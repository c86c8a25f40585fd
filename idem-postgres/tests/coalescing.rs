//! Coalescing on the real server: the shared scenarios (a lone task never
//! waits for a batch; 96 mixed callers on a pool of two each get their own
//! answer), and the whole conformance suite with every call sent through
//! the batched path (`Coalescing::Always`, a pool of two).

mod support;

use idem_sql::Coalescing;

idem_test_support::sql_suite!(crate::support::Pg; @coalescing);

mod always {
    use idem_test_support::sql::ServerDialect;

    async fn setup() -> crate::support::PgFixture {
        let store = crate::support::connect(2, crate::support::options()).await;
        let store = store.with_coalescing_mode(super::Coalescing::Always);
        crate::support::Pg
            .isolate(store, crate::support::options(), true)
            .await
    }

    idem_core::store_conformance!(idem_test_support::sql::conformance(setup()));
}

/// A caller that goes away changes no other call's answer, and its own call
/// ends as a dropped single call would. On a store of one connection, every
/// call through the batched path: `a`'s completion waits in its batch for a
/// row lock held elsewhere; `b` and `c` wait behind it for the connection.
/// `a`'s and `b`'s callers go away; the lock is let go. `a`'s batch runs to
/// its end without its caller (its completion is stored, as a statement
/// already sent would be), `b`'s completion never runs (its record stays in
/// flight, to its lease), and `c` gets its answer.
#[test]
fn a_caller_gone_mid_batch_changes_no_other_answer() {
    use idem_core::clock::{Clock, ManualClock};
    use idem_core::store::{ClaimOutcome, Completion, OutcomeKind, RecordState, Store};
    use idem_core::{IdempotencyKey, RecordId};
    use idem_test_support::sql::{Dialect, KillDialect, Teardown, TxDialect, claim_request, scope};

    let m = std::thread::spawn(|| {
        idem_core::testkit::metrics::recorded(async {
            let fx = support::Pg.open(1).await;
            let store = fx.store.clone().with_coalescing_mode(Coalescing::Always);
            let now = ManualClock::starting_now().now();
            let ids: Vec<RecordId> = (0..3)
                .map(|_| RecordId::new(scope(), IdempotencyKey::random()))
                .collect();
            let mut tokens = Vec::new();
            for id in &ids {
                let req = claim_request(id, now);
                let claimed = store.claim(&req).await.expect("claim");
                assert!(matches!(claimed, ClaimOutcome::Claimed(_)), "{claimed:?}");
                tokens.push(req.token);
            }
            let blocker = support::Pg.blocker(&fx, &String::new()).await;
            let lock = support::Pg.lock(&fx, blocker, &ids[0]).await;
            let complete = |i: usize| {
                let (store, id, token) = (store.clone(), ids[i].clone(), tokens[i]);
                tokio::spawn(async move {
                    let body = format!("body {i}").into_bytes();
                    let c = Completion::new(
                        OutcomeKind::Success,
                        Some(&body),
                        None,
                        now,
                        now.plus(std::time::Duration::from_secs(3600)),
                        now.plus(std::time::Duration::from_secs(86_400)),
                    );
                    store.complete(&id, token, &c).await
                })
            };
            let a = complete(0);
            assert!(
                support::Pg.claim_waiting(&fx).await,
                "a's batch waits for the row lock"
            );
            let (b, c) = (complete(1), complete(2));
            // One runtime thread: b and c run up to their wait for the
            // connection before the test goes on.
            for _ in 0..16 {
                tokio::task::yield_now().await;
            }
            a.abort();
            b.abort();
            support::Pg.unlock(lock).await;
            c.await.expect("task").expect("c's completion stored");
            let state = |i: usize| {
                let (store, id) = (store.clone(), ids[i].clone());
                async move {
                    store
                        .fetch(&id, now)
                        .await
                        .expect("fetch")
                        .expect("record")
                        .state
                }
            };
            // a's batch may still be returning its connection: c's came
            // after it, so a's statement has run.
            assert_eq!(state(0).await, RecordState::Completed, "a's batch ran on");
            assert_eq!(state(1).await, RecordState::InFlight, "b's call never ran");
            assert_eq!(state(2).await, RecordState::Completed);
            fx.teardown().await;
        })
    })
    .join()
    .unwrap_or_else(|e| std::panic::resume_unwind(e));
    // Every call waited (the store never sends one alone here): three
    // claims, and the completions of a and c; b's never reached a batch.
    let waited = |call: &str| {
        m.iter()
            .filter(|(k, _)| {
                k.starts_with(&format!("idem_store_calls_coalesced_total{{call={call},"))
            })
            .map(|(_, n)| *n)
            .sum::<u64>()
    };
    assert_eq!(waited("claim"), 3, "{m:#?}");
    assert_eq!(waited("complete"), 2, "{m:#?}");
}
