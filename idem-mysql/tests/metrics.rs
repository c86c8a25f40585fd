//! The transactional mode records the metrics every other path records: a
//! scripted run through `execute_in_tx`, read back with exact counts.

mod support;

use std::time::Duration;

use idem_core::testkit::metrics::{assert_exactly, recorded};
use idem_core::{Idem, Outcome, Policy, Scope};
use idem_mysql::{MySqlIdemExt, Server};
use support::MyFixture;

type Out = Outcome<String, String>;

fn transactional_mode_counts_exactly(server: Server) {
    let m = recorded(async move {
        let fx = MyFixture::new(2).await;
        let store = fx.store.clone().with_server(server);
        let policy = Policy::builder()
            .max_response_bytes(16)
            .store_retries(1, Duration::from_millis(1))
            .build()
            .expect("policy");
        let idem = Idem::new(store).with_policy(policy);
        let scope = Scope::new("acct_1", "POST /tx").expect("scope");
        let req = serde_json::json!({"amount": 1});
        let run = |key: &'static str, req: serde_json::Value, out: Out| {
            let (idem, scope) = (&idem, &scope);
            async move {
                idem.execute_in_tx(scope, key, &req, move |_, _| Box::pin(async move { out }))
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
        fx.drop_tables(&[]).await;
    });
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

#[test]
fn the_transactional_mode_counts_exactly_mariadb() {
    transactional_mode_counts_exactly(Server::MariaDb);
}

#[test]
fn the_transactional_mode_counts_exactly_mysql_path() {
    transactional_mode_counts_exactly(Server::MySql);
}
