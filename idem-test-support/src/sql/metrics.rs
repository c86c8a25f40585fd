//! The transactional mode records the metrics every other path records: a
//! scripted run through `execute_in_tx`, read back with exact counts.

use std::time::Duration;

use idem_core::testkit::metrics::{assert_exactly, recorded};
use idem_core::{Idem, Policy, Scope};

use super::{Out, SqlFixture, Teardown, TxDialect};

/// Executions, replays, work timings, rejections, transient releases and
/// responses not stored, each counted exactly once per event.
///
/// The script runs on a runtime of its own (the recorder's), on a thread of
/// its own: call it from any test.
pub async fn the_transactional_mode_counts_exactly<D: TxDialect>(d: D) {
    let m = std::thread::spawn(move || recorded(script(d)))
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e));
    let op = "operation=POST /tx";
    let want = [
        (format!("idem_executions_total{{{op}}}"), 3),
        (format!("idem_replays_total{{{op}}}"), 1),
        (format!("idem_work_seconds{{{op}}}"), 3),
        (
            format!("idem_rejections_total{{code=fingerprint_mismatch,{op}}}"),
            1,
        ),
        (format!("idem_rejections_total{{code=invalid_key,{op}}}"), 1),
        (format!("idem_transient_releases_total{{{op}}}"), 1),
        (format!("idem_responses_not_stored_total{{{op}}}"), 1),
    ];
    assert_exactly(&m, &want);
}

async fn script<D: TxDialect>(d: D) {
    let fx = d.open(2).await;
    let policy = Policy::builder()
        .max_response_bytes(16)
        .store_retries(1, Duration::from_millis(1))
        .build()
        .expect("policy");
    let idem = Idem::new(fx.store().clone()).with_policy(policy);
    let scope = Scope::new("acct_1", "POST /tx").expect("scope");
    let req = serde_json::json!({"amount": 1});
    let run = |key: &'static str, req: serde_json::Value, out: Out| {
        let (d, idem, scope) = (&d, &idem, &scope);
        async move {
            d.execute_in_tx(idem, scope, key, &req, move |_, _| {
                Box::pin(async move { out })
            })
            .await
        }
    };
    let ok = || Out::Success("ok".to_owned());

    // k1: runs and commits; then a replay and a mismatch.
    assert!(!run("k1", req.clone(), ok()).await.expect("k1").is_replay());
    assert!(
        run("k1", req.clone(), ok())
            .await
            .expect("replay")
            .is_replay()
    );
    let other = serde_json::json!({"amount": 2});
    let err = run("k1", other, ok()).await.expect_err("mismatch");
    assert_eq!(err.code(), "fingerprint_mismatch");
    // k2: a transient failure, rolled back (the release).
    let reply = run("k2", req.clone(), Out::Transient("busy".to_owned()))
        .await
        .expect("transient");
    assert!(!reply.is_stored());
    // k3: a response over 16 bytes, committed without a body.
    let reply = run("k3", req.clone(), Out::Success("x".repeat(100)))
        .await
        .expect("not stored");
    assert!(!reply.is_stored());
    // An invalid key: refused before the transaction.
    let err = run(" ", req.clone(), ok()).await.expect_err("invalid");
    assert_eq!(err.code(), "invalid_key");
    fx.teardown().await;
}
