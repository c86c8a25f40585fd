//! Races, response-body failures and problem types, beyond the table rows.

use std::sync::Arc;

use idem_core::{IdempotencyKey, Store};

use super::app::{App, Options};
use super::check::Got;

const RACERS: usize = 64;

/// 64 concurrent identical requests in reject mode: the handler runs once;
/// the others get 409 `in_flight` with `Retry-After` ≥ 1 (or a replay).
pub async fn race_64_reject_mode_runs_once<S: Store>(store: Arc<S>) {
    let app = Arc::new(App::start(store).await);
    let k = IdempotencyKey::random().as_str().to_owned();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..RACERS {
        let r = app
            .post("/orders", Some(&k), r#"{"n":1}"#)
            .header("x-hold", "1");
        set.spawn(async move { Got::read(r.send().await.expect("sent")).await });
    }
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
    let app = Arc::new(
        App::with(
            store,
            Options {
                wait: true,
                ..Options::default()
            },
        )
        .await,
    );
    let k = IdempotencyKey::random().as_str().to_owned();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..RACERS {
        let r = app
            .post("/orders", Some(&k), r#"{"n":1}"#)
            .header("x-hold", "1");
        set.spawn(async move { Got::read(r.send().await.expect("sent")).await });
    }
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
    let app = App::start(store).await;
    let k = IdempotencyKey::random().as_str().to_owned();
    for i in 1..=2 {
        let g = Got::read(
            app.post("/orders", Some(&k), "{}")
                .header("x-body-error", "1")
                .send()
                .await
                .expect("sent"),
        )
        .await;
        g.assert_problem(500, "response_body_failed", Some(&k));
        assert_eq!(app.counts.executions(), i);
    }
}

/// Rejections of a covered request carry the problem shape even when the
/// key header arrives in the draft's quoted form: the key is echoed unquoted.
pub async fn problem_echoes_the_unquoted_key<S: Store>(store: Arc<S>) {
    let app = App::start(store).await;
    let g = Got::read(
        app.client
            .post(format!("{}/orders", app.base))
            .header("idempotency-key", "\"quoted-key-1\"")
            .body("{}")
            .send()
            .await
            .expect("sent"),
    )
    .await;
    g.assert_problem(500, "owner_unavailable", Some("quoted-key-1"));
}
