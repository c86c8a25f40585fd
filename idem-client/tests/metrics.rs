//! The client's metrics (feature `metrics`), read back with exact counts
//! from a scripted run against a real `idem-http` server (SQLite file). The
//! server runs on its own runtime, so only the client's series are recorded
//! here.

#![allow(clippy::unwrap_used)]

mod support;

use std::{
    sync::atomic::Ordering,
    time::{Duration, SystemTime},
};

use idem_client::{
    IdemResponseExt, IdempotencyMiddleware, IdempotentRequestExt, Intent, ReportKind,
};
use idem_core::testkit::metrics::{assert_exactly, recorded};
use support::{Backend, Fault, RESPONSE_TTL, client, client_with, fault_proxy};

#[test]
fn every_send_and_retry_is_counted_by_outcome_and_reason() {
    let keys = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = std::sync::Arc::clone(&keys);
    let m = recorded(support::run(Backend::SqliteFile, |w| async move {
        let c = client();
        let kind = |r: &reqwest::Response| r.idem_report().unwrap().kind;
        // Fresh, then its replay.
        let intent = Intent::random();
        seen.lock().unwrap().push(intent.key().as_str().to_owned());
        let send = || c.post(w.url("/orders")).body("{}").intent(&intent).send();
        assert_eq!(kind(&send().await.unwrap()), ReportKind::Fresh);
        assert_eq!(kind(&send().await.unwrap()), ReportKind::Replayed);
        // Another body under the same intent: rejected.
        let other = c
            .post(w.url("/orders"))
            .body(r#"{"a":1}"#)
            .intent(&intent)
            .send()
            .await
            .unwrap();
        assert_eq!(kind(&other), ReportKind::Rejected);
        // Two 503s, then fresh: two retries.
        w.knobs.fail.store(2, Ordering::SeqCst);
        let r = c.post(w.url("/flaky")).body("{}").send().await.unwrap();
        assert_eq!(kind(&r), ReportKind::Fresh);
        // A dropped response, then the replay: one retry for the transport.
        let proxy = fault_proxy(w.base(), vec![Fault::DropResponse]).await;
        let r = c
            .post(format!("{}/orders", proxy.base))
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(kind(&r), ReportKind::Replayed);
        // Past the response TTL: already processed.
        w.knobs.clock.advance(RESPONSE_TTL + Duration::from_secs(1));
        assert_eq!(kind(&send().await.unwrap()), ReportKind::AlreadyProcessed);
        // `Retry-After: 30` past a 2 s deadline: exhausted at once.
        let short = client_with(IdempotencyMiddleware::builder().deadline(Duration::from_secs(2)));
        let r = short.post(w.url("/busy")).body("{}").send().await.unwrap();
        assert!(matches!(kind(&r), ReportKind::Exhausted(_)));
        // Refused before sending: a key past its lifetime.
        let aged = client_with(
            IdempotencyMiddleware::builder().key_lifetime(Some(Duration::from_secs(86_400))),
        );
        let old =
            Intent::random().with_created_at(SystemTime::now() - Duration::from_secs(2 * 86_400));
        assert!(
            aged.post(w.url("/orders"))
                .body("{}")
                .intent(&old)
                .send()
                .await
                .is_err()
        );
        // Nobody listening: one connect retry, then exhausted (no response).
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let twice = client_with(
            IdempotencyMiddleware::builder()
                .backoff(Duration::from_millis(5), Duration::from_millis(10))
                .max_attempts(2),
        );
        assert!(
            twice
                .post(format!("http://{addr}/orders"))
                .body("{}")
                .send()
                .await
                .is_err()
        );
        // Not an idempotent send: not counted.
        let get = c.get(w.url("/orders")).send().await.unwrap();
        assert!(get.idem_report().is_none());
        // /orders twice (two keys), /flaky three times (two released 503s), /busy once.
        assert_eq!(w.runs().await, 6);
    }));
    // The server's own engine records nothing here (its runtime is another
    // thread), but keep only the client's series to be sure.
    let m: std::collections::HashMap<String, u64> = m
        .into_iter()
        .filter(|(k, _)| k.starts_with("idem_client_"))
        .collect();
    let want = [
        ("idem_client_sends_total{outcome=fresh}".to_owned(), 2),
        ("idem_client_sends_total{outcome=replayed}".to_owned(), 2),
        ("idem_client_sends_total{outcome=rejected}".to_owned(), 1),
        (
            "idem_client_sends_total{outcome=already_processed}".to_owned(),
            1,
        ),
        ("idem_client_sends_total{outcome=exhausted}".to_owned(), 2),
        ("idem_client_sends_total{outcome=refused}".to_owned(), 1),
        ("idem_client_retries_total{reason=status_503}".to_owned(), 2),
        ("idem_client_retries_total{reason=transport}".to_owned(), 1),
        ("idem_client_retries_total{reason=connect}".to_owned(), 1),
        // One sample per send that reached the network.
        ("idem_client_attempts{}".to_owned(), 8),
    ];
    assert_exactly(&m, &want);
    // Never a key, a URL or a host in a label.
    let key = keys.lock().unwrap()[0].clone();
    for series in m.keys() {
        assert!(!series.contains(&key), "{series}");
        assert!(
            !series.contains("127.0.0.1") && !series.contains('/'),
            "{series}"
        );
    }
}
