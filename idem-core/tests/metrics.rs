//! The metrics of scripted runs, read back from a recording exporter: first
//! call, replay, mismatch, in flight, recovery, invalid key; then a transient
//! release and its recovery, a response not stored, a store outage and a
//! purge.

use std::sync::Arc;
use std::time::Duration;

use idem_core::adapter::EngineExt;
use idem_core::clock::{Clock, ManualClock};
use idem_core::store::{ClaimRequest, Store, Token};
use idem_core::testkit::FailingStore;
use idem_core::testkit::metrics::{assert_exactly, recorded};
use idem_core::{Begin, Idem, MemoryStore, Outcome, Policy, Scope};

type Out = Outcome<String, String>;

#[test]
fn a_scripted_run_counts_exactly() {
    let m = recorded(async {
        let clock = ManualClock::starting_now();
        let idem = Idem::new(MemoryStore::new()).with_clock(clock.clone());
        let scope = Scope::new("acct_1", "POST /charges").expect("scope");
        let work = |_| async { Out::Success("ch_1".to_owned()) };
        let req = serde_json::json!({"amount": 1});

        idem.execute(&scope, "k1", &req, work).await.expect("first");
        let replay = idem
            .execute(&scope, "k1", &req, work)
            .await
            .expect("replay");
        assert!(replay.is_replay());
        let other = serde_json::json!({"amount": 2});
        let err = idem
            .execute(&scope, "k1", &other, work)
            .await
            .expect_err("mismatch");
        assert_eq!(err.code(), "fingerprint_mismatch");

        // A crashed attempt on k2: claimed, never completed.
        let prepared = idem.prepare(&scope, "k2", &req).expect("prepare");
        let now = clock.now();
        idem.store()
            .claim(&ClaimRequest::new(
                &prepared.id,
                prepared.fingerprint,
                Token::random(),
                now,
                now.plus(idem.policy().lease()),
                now.plus(idem.policy().key_ttl()),
            ))
            .await
            .expect("claim");
        let err = idem
            .execute(&scope, "k2", &req, work)
            .await
            .expect_err("in flight");
        assert_eq!(err.code(), "in_flight");
        clock.advance(idem.policy().lease() + Duration::from_secs(1));
        let recovered = idem
            .execute(&scope, "k2", &req, work)
            .await
            .expect("recovery");
        assert_eq!(recovered.attempt(), 2);

        let err = idem
            .execute(&scope, " ", &req, work)
            .await
            .expect_err("invalid");
        assert_eq!(err.code(), "invalid_key");
    });
    let op = "operation=POST /charges";
    let want = [
        (format!("idem_executions_total{{{op}}}"), 2),
        (format!("idem_replays_total{{{op}}}"), 1),
        (
            format!("idem_rejections_total{{code=fingerprint_mismatch,{op}}}"),
            1,
        ),
        (format!("idem_rejections_total{{code=in_flight,{op}}}"), 1),
        (format!("idem_rejections_total{{code=invalid_key,{op}}}"), 1),
        (
            format!("idem_recoveries_total{{{op},reason=lease_expired}}"),
            1,
        ),
        (format!("idem_work_seconds{{{op}}}"), 2),
        ("idem_store_call_seconds{call=claim}".to_owned(), 5),
        ("idem_store_call_seconds{call=complete}".to_owned(), 2),
    ];
    assert_exactly(&m, &want);
}

#[test]
fn failures_and_purges_count_exactly() {
    let m = recorded(async {
        let clock = ManualClock::starting_now();
        let store = FailingStore::new(Arc::new(MemoryStore::new()));
        let policy = Policy::builder()
            .max_response_bytes(16)
            .store_retries(1, Duration::from_millis(1))
            .build()
            .expect("policy");
        let idem = Idem::new(store.clone())
            .with_clock(clock.clone())
            .with_policy(policy);
        let scope = Scope::new("acct_1", "POST /refunds").expect("scope");
        let req = serde_json::json!({"amount": 1});

        // A transient failure releases k1; the next call recovers it.
        let reply = idem
            .execute(&scope, "k1", &req, |_| async {
                Out::Transient("busy".to_owned())
            })
            .await
            .expect("transient");
        assert!(!reply.is_stored());
        let reply = idem
            .execute(&scope, "k1", &req, |_| async {
                Out::Success("ok".to_owned())
            })
            .await
            .expect("recovered");
        assert_eq!(reply.attempt(), 2);

        // A response over the 16-byte limit is not stored.
        let reply = idem
            .execute(&scope, "k2", &req, |_| async {
                Out::Success("x".repeat(100))
            })
            .await
            .expect("not stored");
        assert!(!reply.is_stored());

        // The store is down: the claim fails, the work does not run.
        store.fail_all(true);
        let err = idem
            .execute(&scope, "k3", &req, |_| async {
                Out::Success("never".to_owned())
            })
            .await
            .expect_err("store down");
        assert_eq!(err.code(), "store_unavailable");
        store.fail_all(false);

        // Past response_ttl, a purge by hand drops k1's body (k2 stored
        // none); past key_ttl, another removes both keys. Each is one
        // batch that did something and an empty one.
        clock.advance(idem.policy().response_ttl() + Duration::from_secs(1));
        let report = idem.admin().purge_expired(10).await.expect("purge bodies");
        assert_eq!((report.keys_removed, report.bodies_dropped), (0, 1));
        clock.advance(idem.policy().key_ttl());
        let report = idem.admin().purge_expired(10).await.expect("purge keys");
        assert_eq!((report.keys_removed, report.bodies_dropped), (2, 0));
    });
    let op = "operation=POST /refunds";
    let want = [
        (format!("idem_executions_total{{{op}}}"), 3),
        (format!("idem_work_seconds{{{op}}}"), 3),
        (format!("idem_transient_releases_total{{{op}}}"), 1),
        (format!("idem_recoveries_total{{{op},reason=released}}"), 1),
        (format!("idem_responses_not_stored_total{{{op}}}"), 1),
        (
            format!("idem_rejections_total{{code=store_unavailable,{op}}}"),
            1,
        ),
        (
            "idem_store_errors_total{call=claim,kind=unavailable}".to_owned(),
            1,
        ),
        ("idem_store_call_seconds{call=claim}".to_owned(), 4),
        ("idem_store_call_seconds{call=complete}".to_owned(), 2),
        ("idem_store_call_seconds{call=release}".to_owned(), 1),
        ("idem_store_call_seconds{call=purge}".to_owned(), 4),
        ("idem_purge_runs_total{}".to_owned(), 4),
        ("idem_purge_keys_removed_total{}".to_owned(), 2),
        ("idem_purge_bodies_dropped_total{}".to_owned(), 1),
    ];
    assert_exactly(&m, &want);
}

/// The guard path (`begin`, then `Claim::complete`, `complete_not_stored`
/// or `release`) counts what `execute` counts: runs, replays, work time,
/// transient releases, responses not stored, and a fenced holder's lost
/// lease as a rejection.
#[test]
fn the_claim_guard_counts_exactly() {
    let m = recorded(async {
        let clock = ManualClock::starting_now();
        let idem = Idem::new(MemoryStore::new()).with_clock(clock.clone());
        let scope = Scope::new("acct_1", "POST /guarded").expect("scope");
        let req = serde_json::json!({"amount": 1});
        let begin = |key: &'static str| idem.begin::<String, String, _, _>(&scope, key, &req);

        // k1: run and complete, then a replay.
        let Begin::Run(claim) = begin("k1").await.expect("begin") else {
            panic!("fresh");
        };
        claim
            .complete(Out::Success("ok".to_owned()))
            .await
            .expect("complete");
        assert!(matches!(
            begin("k1").await.expect("again"),
            Begin::Replay(_)
        ));

        // k2: completed without a body.
        let Begin::Run(claim) = begin("k2").await.expect("begin") else {
            panic!("fresh");
        };
        assert!(claim.complete_not_stored().await.expect("not stored"));

        // k3: released after a transient failure.
        let Begin::Run(claim) = begin("k3").await.expect("begin") else {
            panic!("fresh");
        };
        claim.release().await.expect("release");

        // k4: taken over after the lease; the old holder's write is refused.
        let Begin::Run(old) = begin("k4").await.expect("begin") else {
            panic!("fresh");
        };
        clock.advance(idem.policy().lease() + Duration::from_secs(1));
        let Begin::Run(newer) = begin("k4").await.expect("takeover") else {
            panic!("expired lease");
        };
        let err = old
            .complete(Out::Transient("busy".to_owned()))
            .await
            .expect_err("fenced");
        assert_eq!(err.code(), "lease_lost");
        newer
            .complete(Out::Success("new".to_owned()))
            .await
            .expect("newer");
    });
    let op = "operation=POST /guarded";
    let want = [
        // k1, k2, k3, k4 twice.
        (format!("idem_executions_total{{{op}}}"), 5),
        (format!("idem_replays_total{{{op}}}"), 1),
        (format!("idem_work_seconds{{{op}}}"), 5),
        (format!("idem_responses_not_stored_total{{{op}}}"), 1),
        (format!("idem_transient_releases_total{{{op}}}"), 1),
        (
            format!("idem_recoveries_total{{{op},reason=lease_expired}}"),
            1,
        ),
        (format!("idem_rejections_total{{code=lease_lost,{op}}}"), 1),
        ("idem_store_call_seconds{call=claim}".to_owned(), 6),
        // k1, k2, k4's newer attempt.
        ("idem_store_call_seconds{call=complete}".to_owned(), 3),
        // k3's release and the old k4 holder's refused one.
        ("idem_store_call_seconds{call=release}".to_owned(), 2),
    ];
    assert_exactly(&m, &want);
}

/// A scope's metrics label replaces its operation in every `operation`
/// label, and only there: scopes that differ in the operation stay distinct
/// records (each id runs once, then replays) while the label stays one value.
#[test]
fn the_metrics_label_is_not_the_identity() {
    let m = recorded(async {
        let idem = Idem::new(MemoryStore::new());
        let work = |_| async { Out::Success("done".to_owned()) };
        for id in 0..3 {
            let scope = Scope::new("acct_1", format!("POST /orders/{id}"))
                .expect("scope")
                .with_metrics_label("POST /orders/{id}");
            let first = idem.execute(&scope, "k", &id, work).await.expect("first");
            assert!(!first.is_replay(), "order {id} is its own record");
            let again = idem.execute(&scope, "k", &id, work).await.expect("again");
            assert!(again.is_replay());
        }
    });
    let op = "operation=POST /orders/{id}";
    let want = [
        (format!("idem_executions_total{{{op}}}"), 3),
        (format!("idem_replays_total{{{op}}}"), 3),
        (format!("idem_work_seconds{{{op}}}"), 3),
        ("idem_store_call_seconds{call=claim}".to_owned(), 6),
        ("idem_store_call_seconds{call=complete}".to_owned(), 3),
    ];
    assert_exactly(&m, &want);
}
