//! Coalescing on standalone Redis: a lone task's calls never wait for a
//! pipeline; a busy store's calls go together and each gets its own answer
//! (fresh keys, duplicates, replays and mismatches mixed); a call whose
//! record is corrupt fails alone in its pipeline; and the whole conformance
//! suite with every call sent through the pipelined path
//! (`Coalescing::Always`).

mod support;

use std::sync::Arc;

use idem_core::store::Coalescing;
use idem_core::{Error, Idem, Scope};
use idem_redis::redis::AsyncCommands;
use idem_test_support::work::{Counter, Out, mixed_callers, recorded_apart, request, series};

use support::scenario::{policy, record_id, scope};

/// A fixture whose store coalesces as `mode` says.
async fn coalescing(mode: Coalescing, inline: bool) -> support::RedisFixture {
    let mut f = if inline {
        support::standalone_inline().await
    } else {
        support::standalone().await
    };
    f.store = f.store.clone().with_coalescing_mode(mode);
    f
}

mod always {
    idem_core::store_conformance!(super::coalescing(
        idem_core::store::Coalescing::Always,
        false
    ));
}

mod always_inline {
    idem_core::store_conformance!(super::coalescing(
        idem_core::store::Coalescing::Always,
        true
    ));
}

/// Stores `key` on `idem`, counting the work's runs in `runs`.
async fn store_key(
    idem: &Idem<idem_redis::RedisStore>,
    scope: &Scope,
    key: String,
    runs: &Counter,
) -> Result<idem_core::Reply<String, String>, Error> {
    let runs = runs.clone();
    let body = format!("body of {key}");
    idem.execute(scope, key, &request(), move |_| async move {
        runs.hit();
        Out::Success(body)
    })
    .await
}

/// One task, one call at a time: every command goes at once, alone (30
/// sends of one call: 10 claims, 10 completions, 10 replays; one more if
/// the server had not seen the completion's script yet and answered
/// `NOSCRIPT`), none waited.
#[test]
fn a_lone_task_never_waits_for_a_pipeline() {
    let m = recorded_apart(|| async {
        let fx = coalescing(Coalescing::WhenBusy, true).await;
        let idem = Idem::new(fx.store.clone()).with_policy(policy());
        let (scope, runs) = (scope(), Counter::default());
        for round in 0..2 {
            for i in 0..10 {
                let reply = store_key(&idem, &scope, format!("k{i}"), &runs)
                    .await
                    .expect("answered");
                assert_eq!(reply.is_replay(), round == 1);
            }
        }
        assert_eq!(runs.get(), 10);
        fx.teardown_checked().await;
    });
    let sends = series(&m, "idem_store_batch_size", "command");
    assert!((30..=31).contains(&sends), "{sends} sends: {m:#?}");
    assert!(
        !m.keys()
            .any(|k| k.starts_with("idem_store_calls_coalesced_total")),
        "no call waited: {m:#?}"
    );
}

/// 64 tasks storing 8 fresh keys each, then replaying them: more calls
/// under way than go alone, so they wait and go in pipelines. Each key's
/// work runs once, every replay gets its key's body, and the 1,536 calls
/// took fewer sends than calls.
#[test]
fn busy_stores_send_their_calls_in_pipelines() {
    let m = recorded_apart(|| async {
        let fx = coalescing(Coalescing::WhenBusy, true).await;
        let idem = Arc::new(Idem::new(fx.store.clone()).with_policy(policy()));
        let (scope, runs) = (scope(), Counter::default());
        for round in 0..2 {
            let tasks: Vec<_> = (0..64)
                .map(|t| {
                    let (idem, scope, runs) = (Arc::clone(&idem), scope.clone(), runs.clone());
                    tokio::spawn(async move {
                        for i in 0..8 {
                            let key = format!("t{t}-k{i}");
                            let reply = store_key(&idem, &scope, key.clone(), &runs)
                                .await
                                .expect("answered");
                            assert_eq!(reply.is_replay(), round == 1, "{key}");
                            assert_eq!(reply.into_result(), Ok(format!("body of {key}")));
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.expect("task");
            }
        }
        assert_eq!(runs.get(), 512, "each key's work ran once");
        fx.teardown_checked().await;
    });
    let sends = series(&m, "idem_store_batch_size", "command");
    assert!(
        sends > 0 && sends < 1536,
        "1,536 calls in {sends} sends: {m:#?}"
    );
    assert!(
        series(&m, "idem_store_calls_coalesced_total", "command") > 0,
        "{m:#?}"
    );
}

/// 96 mixed callers at once ([`mixed_callers`]) on a store coalescing as
/// `mode` says: each gets the answer it would get alone.
async fn every_answer_kept(mode: Coalescing, inline: bool) {
    let fx = coalescing(mode, inline).await;
    let idem = Arc::new(Idem::new(fx.store.clone()).with_policy(policy()));
    mixed_callers(idem, scope()).await;
    fx.teardown_checked().await;
}

/// Every call batched, bodies in the body key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn coalesced_calls_keep_every_answer_always() {
    every_answer_kept(Coalescing::Always, false).await;
}

/// The default mode under 96 callers (busy), bodies inside their records.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn coalesced_calls_keep_every_answer_when_busy() {
    every_answer_kept(Coalescing::WhenBusy, true).await;
}

/// 16 fresh keys and one whose record holds garbage, sent at once through
/// the pipelined path: the garbage key's call fails alone with a typed
/// error (its work never runs), and the 16 others are stored, each run
/// once, though they shared pipelines with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_failing_call_fails_no_other_in_its_pipeline() {
    let fx = coalescing(Coalescing::Always, true).await;
    let store = fx.store.clone();
    let scope = scope();
    let bad = record_id(&scope);
    let mut admin = support::admin(&support::standalone_url()).await;
    let () = admin
        .set(store.record_key(&bad), "garbage")
        .await
        .expect("SET");
    let idem = Arc::new(Idem::new(store).with_policy(policy()));
    let runs: Vec<Counter> = (0..17).map(|_| Counter::default()).collect();
    let tasks: Vec<_> = (0..17)
        .map(|i| {
            let key = if i == 8 {
                bad.key().as_str().to_owned()
            } else {
                format!("ok-{i}")
            };
            let (idem, scope, runs) = (Arc::clone(&idem), scope.clone(), runs[i].clone());
            tokio::spawn(async move { store_key(&idem, &scope, key, &runs).await })
        })
        .collect();
    for (i, task) in tasks.into_iter().enumerate() {
        let answer = task.await.expect("task");
        if i == 8 {
            assert!(
                matches!(answer, Err(Error::CorruptRecord { .. })),
                "{answer:?}"
            );
            assert_eq!(runs[i].get(), 0, "no work on a corrupt record");
        } else {
            let reply = answer.expect("stored");
            assert_eq!(reply.into_result(), Ok(format!("body of ok-{i}")));
            assert_eq!(runs[i].get(), 1, "ok-{i} ran once");
        }
    }
    fx.teardown_checked().await;
}
