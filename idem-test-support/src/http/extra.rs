//! Races, response-body failures and problem types, beyond the table rows.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::store::Store;
use idem_core::{IdempotencyKey, Scope};

use super::app::{App, Options, engine, start};
use super::check::{Got, executed, key, send};
use idem_http::HttpConfigError;

const RACERS: usize = 64;

/// [`RACERS`] identical held requests with key `k`, sent at once.
fn racers<S: Store>(app: &App<S>, k: &str) -> tokio::task::JoinSet<Got> {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..RACERS {
        let r = app
            .post("/orders", Some(k), r#"{"n":1}"#)
            .header("x-hold", "1");
        set.spawn(async move { Got::read(r.send().await.expect("sent")).await });
    }
    set
}

/// 64 concurrent identical requests in reject mode: the handler runs once;
/// the others get 409 `in_flight` with `Retry-After` ≥ 1 (or a replay).
pub async fn race_64_reject_mode_runs_once<S: Store>(store: Arc<S>) {
    let (app, k) = start(store).await;
    let mut set = racers(&app, &k);
    let mut conflicts = 0;
    let mut executed = Vec::new();
    let mut released = false;
    while let Some(g) = set.join_next().await {
        let g = g.expect("join");
        if g.status == 409 {
            g.assert_problem(409, "in_flight", Some(&k));
            conflicts += 1;
        } else {
            executed.push(g);
        }
        if !released && conflicts == RACERS - 1 {
            app.counts.release(1);
            released = true;
        }
    }
    assert_eq!(conflicts, RACERS - 1);
    assert_eq!(executed.len(), 1);
    executed[0].assert_executed(201);
    assert_eq!(app.counts.executions(), 1);
}

/// 64 concurrent identical requests in wait mode: one execution and 63
/// replays of the same bytes.
pub async fn race_64_wait_mode_replays_to_all<S: Store>(store: Arc<S>) {
    let app = App::with(store, Options::waiting()).await;
    let k = key();
    let mut set = racers(&app, &k);
    app.counts.entered().await;
    app.counts.release(1);
    let mut all = Vec::new();
    while let Some(g) = set.join_next().await {
        all.push(g.expect("join"));
    }
    let (replays, fresh): (Vec<Got>, Vec<Got>) = all.into_iter().partition(Got::is_replay);
    assert_eq!(fresh.len(), 1, "exactly one execution answered fresh");
    fresh[0].assert_executed(201);
    assert_eq!(replays.len(), RACERS - 1);
    for r in &replays {
        r.assert_replay_of(&fresh[0]);
    }
    assert_eq!(app.counts.executions(), 1);
}

/// The handler's body fails while read: 500 `response_body_failed`
/// (retryable), the key is released and the retry runs again.
pub async fn response_body_failure_releases_the_key<S: Store>(store: Arc<S>) {
    let (app, k) = start(store).await;
    for i in 1..=2 {
        let g = send(app.order(&k).header("x-body-error", "1")).await;
        g.assert_problem(500, "response_body_failed", Some(&k));
        assert_eq!(app.counts.executions(), i);
    }
}

/// Rejections of a covered request carry the problem shape even when the
/// key header arrives in the draft's quoted form: the key is echoed unquoted.
pub async fn problem_echoes_the_unquoted_key<S: Store>(store: Arc<S>) {
    let app = App::start(store).await;
    let g = send(
        app.client
            .post(format!("{}/orders", app.base))
            .header("idempotency-key", "\"quoted-key-1\"")
            .body("{}"),
    )
    .await;
    g.assert_problem(500, "owner_unavailable", Some("quoted-key-1"));
}

/// A JSON body naming an object member twice (`{"amount":1,"amount":1000}`)
/// is not one request: 400 `invalid_request`, the handler does not run and
/// nothing is recorded, so a later `{"amount":1000}` under the same key is a
/// first execution, not a replay of the duplicate. Nested objects and
/// `application/*+json` are refused the same way.
pub async fn json_duplicate_members_are_400<S: Store>(store: Arc<S>) {
    let (app, k) = start(store).await;
    let g = send(app.post("/orders", Some(&k), r#"{"amount":1,"amount":1000}"#)).await;
    let p = g.assert_problem(400, "invalid_request", Some(&k));
    assert_eq!(p["retryable"], false);
    assert!(
        p["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("duplicate member"),
        "{p}"
    );
    assert_eq!(app.counts.executions(), 0, "the work did not run");
    let first = executed(app.post("/orders", Some(&k), r#"{"amount":1000}"#), 201).await;
    assert_eq!(app.counts.executions(), 1);
    send(app.post("/orders", Some(&k), r#"{"amount":1000}"#))
        .await
        .assert_replay_of(&first);
    // Still refused once the key has a record: the request is invalid, not a
    // mismatch or a replay.
    send(app.post("/orders", Some(&k), r#"{"amount":1000,"amount":1000}"#))
        .await
        .assert_problem(400, "invalid_request", Some(&k));
    let k = key();
    send(app.post_with(
        "/orders",
        Some(&k),
        r#"{"a":{"b":1,"b":2}}"#,
        "alice",
        "application/merge-patch+json",
    ))
    .await
    .assert_problem(400, "invalid_request", Some(&k));
    assert_eq!(app.counts.executions(), 1);
}

/// Wait mode (rows 12 and 13): a duplicate that waits longer than the wait
/// timeout for the first attempt gets what reject mode answers at once, 409
/// `in_flight` in the problem shape with `Retry-After` (the first attempt's
/// lease left), not before the timeout; the handler does not run for it, and
/// once the first finishes the same request is a replay.
pub async fn wait_mode_timeout_is_409_with_retry_after<S: Store>(store: Arc<S>) {
    let wait = Duration::from_millis(150);
    let app = App::with(
        store,
        Options {
            wait: true,
            wait_timeout: wait,
            ..Options::default()
        },
    )
    .await;
    let k = key();
    let first = app.hold(&k).await;
    // 20 s of the 60 s lease have passed on the engine's clock.
    app.clock.advance(Duration::from_secs(20));
    let asked = Instant::now();
    let g = app.send_order(&k).await;
    assert!(
        asked.elapsed() >= wait,
        "answered after {:?}, before the wait timeout",
        asked.elapsed()
    );
    let p = g.assert_problem(409, "in_flight", Some(&k));
    assert_eq!(p["retryable"], true);
    assert_eq!(g.header("retry-after"), Some("40"), "{p}");
    assert_eq!(app.counts.executions(), 1, "the waiter did not run");
    app.finish(first, &k).await;
    assert_eq!(app.counts.executions(), 1);
}

/// The layer on a nested router (`Router::nest("/v1", …)`): the operation
/// is the method and the **full** route template, prefix included
/// (`POST /v1/accounts/{id}/charges`), so the same key is one record per
/// nested route and prefix, and a retry on the same nested path replays;
/// the fingerprint hashes the path as received (prefix included), not the
/// path the nested router sees.
pub async fn nested_router_names_the_full_route<S: Store>(store: Arc<S>) {
    let (app, k) = start(store).await;
    let first = executed(app.post("/v1/orders", Some(&k), r#"{"a":1}"#), 201).await;
    send(app.post("/v1/orders", Some(&k), r#"{"a":1}"#))
        .await
        .assert_replay_of(&first);
    // Another prefix, or the top-level route: another operation.
    for path in ["/v2/orders", "/orders"] {
        executed(app.post(path, Some(&k), r#"{"a":1}"#), 201).await;
    }
    assert_eq!(app.counts.executions(), 3);
    // A template with a parameter: one operation for every id (another id
    // with the same key is the same record, and the path is fingerprinted:
    // 422), named after the full template.
    let k = key();
    send(app.post("/v1/accounts/1/charges", Some(&k), "{}"))
        .await
        .assert_executed(201);
    send(app.post("/v1/accounts/2/charges", Some(&k), "{}"))
        .await
        .assert_problem(422, "fingerprint_mismatch", Some(&k));
    send(app.post("/v2/accounts/1/charges", Some(&k), "{}"))
        .await
        .assert_executed(201);
    assert_eq!(app.counts.executions(), 5);
    let idem = engine(app.store.clone(), &app.clock, false);
    for (operation, stored) in [
        ("POST /v1/accounts/{id}/charges", true),
        ("POST /v2/accounts/{id}/charges", true),
        ("POST /accounts/{id}/charges", false),
        ("POST /v1/accounts/1/charges", false),
    ] {
        let scope = Scope::new("alice", operation).expect("scope");
        let found = idem
            .admin()
            .inspect(&scope, k.as_str(), false)
            .await
            .expect("inspect");
        assert_eq!(found.is_some(), stored, "{operation}");
        let Some(record) = found else { continue };
        let route = operation.trim_start_matches("POST ");
        let received = route.replace("{id}", "1");
        assert_eq!(
            record.fingerprint,
            app.fingerprint_of(route, &received, b"{}").await,
            "{operation}: the received path"
        );
        assert_ne!(
            record.fingerprint,
            app.fingerprint_of(route, "/accounts/1/charges", b"{}")
                .await
        );
    }
}

/// Per-route settings: a layer derived with `layer.to_builder()`
/// (`.fingerprint(..)`, `.max_request_body(..)`, then `build`) changes only
/// those settings, shares the engine and owner source, and is shut down
/// with the layer it came from; `build` refuses what it always refuses.
pub async fn to_builder_derives_per_route_layers<S: Store>(store: Arc<S>) {
    let app = App::start(store).await;
    // `/strict` fingerprints every field; the main layer ignores /client_ts.
    for (path, second) in [("/orders", 201), ("/strict", 422)] {
        let k = key();
        let first = executed(app.post(path, Some(&k), r#"{"a":1,"client_ts":1}"#), 201).await;
        let g = send(app.post(path, Some(&k), r#"{"a":1,"client_ts":2}"#)).await;
        if second == 422 {
            g.assert_problem(422, "fingerprint_mismatch", Some(&k));
        } else {
            g.assert_replay_of(&first);
        }
        // The derived layer still runs once per key and replays.
        send(app.post(path, Some(&k), r#"{"a":1,"client_ts":1}"#))
            .await
            .assert_replay_of(&first);
    }
    assert_eq!(app.counts.executions(), 2);
    // `/small` has a 16-byte request limit; the main layer's is larger.
    let big = r#"{"item":"a long enough body"}"#;
    let k = key();
    send(app.post("/small", Some(&k), big))
        .await
        .assert_problem(413, "request_too_large", Some(&k));
    send(app.post("/orders", Some(&k), big))
        .await
        .assert_executed(201);
    send(app.post("/small", Some(IdempotencyKey::random().as_str()), "{}"))
        .await
        .assert_executed(201);
    assert_eq!(app.counts.executions(), 4);
    // A derived layer is validated like the first one.
    let refused = |b: idem_http::IdempotencyLayerBuilder<_, _>| b.build().err();
    assert_eq!(
        refused(app.layer.to_builder().max_request_body(0)),
        Some(HttpConfigError::ZeroRequestBodyLimit)
    );
    assert_eq!(
        refused(app.layer.to_builder().methods([])),
        Some(HttpConfigError::NoMethods)
    );
    let key_header = http::HeaderName::from_static("idempotency-key");
    assert_eq!(
        refused(
            app.layer
                .to_builder()
                .replayed_headers([key_header.clone()])
        ),
        Some(HttpConfigError::ReplayHeaderIsKeyHeader(key_header))
    );
    let replayed = http::HeaderName::from_static("idempotent-replayed");
    assert_eq!(
        refused(app.layer.to_builder().key_header(replayed.clone())),
        Some(HttpConfigError::ReplayHeaderIsKeyHeader(replayed))
    );
    assert!(matches!(
        refused(
            app.layer
                .to_builder()
                .operation(idem_http::OperationSource::Route("/a\nb".into()))
        ),
        Some(HttpConfigError::InvalidOperation { .. })
    ));
    // One shutdown stops the derived layers too.
    app.layer.close();
    for path in ["/strict", "/small", "/orders"] {
        let k = key();
        send(app.post(path, Some(&k), "{}"))
            .await
            .assert_problem(503, "shutting_down", Some(&k));
    }
    assert_eq!(app.counts.executions(), 4);
}
