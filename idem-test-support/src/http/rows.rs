//! One scenario per row of the behaviour table (spec 2.12), named after it.

use std::sync::Arc;
use std::time::Duration;

use idem_core::clock::Clock;
use idem_core::store::OutcomeKind;
use idem_core::store::{ClaimOutcome, ClaimRequest, Completion, Store, Token};
use idem_core::{IdempotencyKey, RecordId, Scope};
use reqwest::Method;
use reqwest::header::HeaderValue;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::app::{App, KEY_TTL, MAX_REQUEST, Options, RESPONSE_TTL, start};
use super::check::{Got, assert_section, executed, key, send};
use idem_http::KeyNamespace;

/// Writes `request` on a raw connection and returns the status and the
/// whole response text (the request should say `Connection: close`).
pub async fn raw(addr: &str, request: &[u8]) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(request).await.expect("write");
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    assert!(
        read.is_ok(),
        "the server did not answer (did it wait for the body?)"
    );
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

/// Row 1: GET, HEAD, PUT, DELETE, OPTIONS and TRACE pass through
/// untouched, with or without a key, valid or not: no buffering, no
/// validation, no marker, no record (the same key runs again).
pub async fn row_01_uncovered_methods_pass_through<S: Store>(store: Arc<S>) {
    let app = App::start(store).await;
    for (m, path, body) in [
        (Method::GET, "/orders", "{}"),
        (Method::HEAD, "/orders", ""),
        (Method::PUT, "/orders/1", "{}"),
        (Method::DELETE, "/orders/1", "{}"),
        (Method::OPTIONS, "/orders/1", "{}"),
        (Method::TRACE, "/orders/1", ""),
    ] {
        for k in [None, Some("a, b"), Some("good-key"), Some("good-key")] {
            let g = executed(app.request(m.clone(), path, k, body), 201).await;
            if m == Method::HEAD {
                assert!(g.body.is_empty(), "HEAD has no body");
            } else {
                assert_eq!(g.json()["id"], format!("ord_{}", app.counts.executions()));
            }
        }
    }
    let g = send(
        app.request(Method::GET, "/orders", Some("k"), "")
            .header("idempotency-key", "k2"),
    )
    .await;
    g.assert_executed(201);
    assert_eq!(app.counts.executions(), 25);
}

/// Row 2 (and `docs_url`): a covered request without a key on a `Required` route: 400
/// `missing_key`, nothing runs.
pub async fn row_02_missing_key_is_400<S: Store>(store: Arc<S>) {
    let docs = Options {
        docs_url: Some("https://docs.example/idempotency".to_owned()),
        ..Options::default()
    };
    // With `docs_url`, every problem links to it (the draft's alternative).
    let link = r#"<https://docs.example/idempotency>; rel="describedby"; type="text/html""#;
    for (opts, want_link) in [(Options::default(), None), (docs, Some(link))] {
        let app = App::with(Arc::clone(&store), opts).await;
        let g = send(app.post("/orders", None, "{}")).await;
        let p = g.assert_problem(400, "missing_key", None);
        assert_eq!(p["retryable"], false);
        assert_section(&p, "#section-2.1");
        assert_eq!(g.header("link"), want_link);
        assert_eq!(app.counts.executions(), 0);
    }
}

/// Row 3: no key on an `Optional` route passes through (no marker); a key
/// there is still honoured and validated.
pub async fn row_03_optional_key_passes_through<S: Store>(store: Arc<S>) {
    let app = App::start(store).await;
    for _ in 0..2 {
        send(app.post("/optional", None, "{}"))
            .await
            .assert_executed(201);
    }
    assert_eq!(app.counts.executions(), 2);
    let k = key();
    let first = executed(app.post("/optional", Some(&k), "{}"), 201).await;
    send(app.post("/optional", Some(&k), "{}"))
        .await
        .assert_replay_of(&first);
    send(app.post("/optional", Some("a, b"), "{}"))
        .await
        .assert_problem(400, "invalid_key", Some("a, b"));
    assert_eq!(app.counts.executions(), 3);
}

/// Row 4: empty, `""`, 256 characters, non-ASCII, bad escape, unterminated,
/// a list, two field lines: 400 `invalid_key` with the received key.
pub async fn row_04_invalid_keys_are_400<S: Store>(store: Arc<S>) {
    let app = App::start(store).await;
    let long = "k".repeat(256);
    let cases: Vec<(HeaderValue, &str)> = vec![
        (HeaderValue::from_static(""), ""),
        (HeaderValue::from_static("\"\""), ""),
        (HeaderValue::from_str(&long).expect("ascii"), long.as_str()),
        (
            HeaderValue::from_bytes(b"caf\xe9").expect("obs-text"),
            "caf\u{fffd}",
        ),
        (HeaderValue::from_static("\"a\\x\""), "a\\x"),
        (HeaderValue::from_static("\"abc"), "\"abc"),
        (HeaderValue::from_static("a, b"), "a, b"),
    ];
    for (value, received) in cases {
        let g = send(
            app.post("/orders", None, "{}")
                .header("idempotency-key", value),
        )
        .await;
        let p = g.assert_problem(400, "invalid_key", Some(received));
        assert_eq!(p["retryable"], false);
    }
    let g = send(
        app.post("/orders", None, "{}")
            .header("idempotency-key", "k1")
            .header("idempotency-key", "k2"),
    )
    .await;
    let p = g.assert_problem(400, "invalid_key", Some("k1"));
    assert!(
        p["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("repeated"),
        "{p}"
    );
    assert_eq!(app.counts.executions(), 0);
}

/// Row 5: `"k"` then `k` with the same body: one record, the second is a
/// replay.
pub async fn row_05_quoted_and_bare_key_are_one_record<S: Store>(store: Arc<S>) {
    let (app, k) = start(store).await;
    let first = executed(app.order(&format!("\"{k}\"")), 201).await;
    app.send_order(&k).await.assert_replay_of(&first);
    assert_eq!(app.counts.executions(), 1);
}

/// Row 6: no owner (auth missing or misplaced): 500 `owner_unavailable`,
/// nothing runs.
pub async fn row_06_owner_unavailable_is_500<S: Store>(store: Arc<S>) {
    let (app, k) = start(store).await;
    let g = send(
        app.client
            .post(format!("{}/orders", app.base))
            .header("idempotency-key", &k)
            .body("{}"),
    )
    .await;
    g.assert_problem(500, "owner_unavailable", Some(&k));
    assert_eq!(app.counts.executions(), 0);
}

/// Row 7: a body over the limit, declared or streamed: 413, nothing runs,
/// and a declared one is refused without reading the body.
pub async fn row_07_request_body_over_limit_is_413<S: Store>(store: Arc<S>) {
    let (app, k) = start(store).await;
    let big = "x".repeat(MAX_REQUEST + 1);
    let g = send(app.post("/orders", Some(&k), &big)).await;
    let p = g.assert_problem(413, "request_too_large", Some(&k));
    assert_eq!(p["limit"], MAX_REQUEST);
    let head = |framing: &str| {
        format!(
            "POST /orders HTTP/1.1\r\nHost: x\r\nX-Owner: alice\r\nIdempotency-Key: {k}\r\n\
             {framing}\r\nConnection: close\r\n\r\n"
        )
    };
    // A lying Content-Length: answered before any body byte is sent.
    let lying = head("Content-Type: application/json\r\nContent-Length: 100000000");
    // Chunked, over the limit.
    let chunk = "y".repeat(4096);
    let mut chunked = head("Transfer-Encoding: chunked");
    for _ in 0..3 {
        chunked.push_str(&format!("{:x}\r\n{chunk}\r\n", chunk.len()));
    }
    chunked.push_str("0\r\n\r\n");
    for (req, names_the_code) in [(lying, false), (chunked, true)] {
        let (status, text) = raw(app.addr(), req.as_bytes()).await;
        assert_eq!(status, 413, "{text}");
        if names_the_code {
            assert!(text.contains("request_too_large"));
        }
    }
    assert_eq!(app.counts.executions(), 0);
}

/// Row 8: a first request runs the handler; its response goes out
/// unchanged, without a marker.
pub async fn row_08_first_request_executes<S: Store>(store: Arc<S>) {
    let app = App::start(store).await;
    let g = executed(app.post("/orders", Some(&key()), r#"{"item":"a"}"#), 201).await;
    assert_eq!(g.json()["id"], "ord_1");
    assert_eq!(g.header("x-recovery"), Some("false"));
    assert_eq!(app.counts.executions(), 1);
}

/// Row 9: a retry gets the stored status, headers (repeats in order, no
/// `Set-Cookie`), exact bytes (also non-UTF-8 bodies and header values), a fresh `Date`, a
/// recomputed `Content-Length` and the marker.
pub async fn row_09_retry_is_a_byte_exact_replay<S: Store>(store: Arc<S>) {
    let (app, k) = start(store).await;
    let first = executed(app.order(&k).header("x-cookie", "1"), 201).await;
    assert!(first.header("set-cookie").is_some());
    for _ in 0..2 {
        send(app.order(&k).header("x-cookie", "1"))
            .await
            .assert_replay_of(&first);
    }
    let k = key();
    let first = send(app.order(&k).header("x-bin", "1").header("x-nonutf8", "1")).await;
    assert!(std::str::from_utf8(&first.body).is_err());
    let replay = app.send_order(&k).await;
    replay.assert_replay_of(&first);
    let obs = |g: &Got| g.headers.get("x-bin-header").map(|v| v.as_bytes().to_vec());
    assert_eq!(
        obs(&replay),
        Some(b"caf\xe9".to_vec()),
        "obs-text header values replay byte for byte"
    );
    assert_eq!(app.counts.executions(), 2);
}

/// Row 10: a stored 4xx (`Failure`) is replayed like a success.
pub async fn row_10_stored_failure_is_replayed<S: Store>(store: Arc<S>) {
    let (app, k) = start(store).await;
    let first = executed(app.order(&k).header("x-status", "400"), 400).await;
    app.send_order(&k).await.assert_replay_of(&first);
    assert_eq!(app.counts.executions(), 1);
}

/// Row 11: the same key with another body, path parameter, query or
/// included header: 422 every time; the record is untouched.
pub async fn row_11_same_key_other_request_is_422<S: Store>(store: Arc<S>) {
    let (app, k) = start(store).await;
    let charge =
        |path: &str, body: &str, fp: &str| send(app.post(path, Some(&k), body).header("x-fp", fp));
    let first = charge("/accounts/1/charges?a=1", r#"{"n":1}"#, "1").await;
    first.assert_executed(201);
    let variants = [
        ("/accounts/1/charges?a=1", r#"{"n":2}"#, "1"),
        ("/accounts/2/charges?a=1", r#"{"n":1}"#, "1"),
        ("/accounts/1/charges?a=2", r#"{"n":1}"#, "1"),
        ("/accounts/1/charges", r#"{"n":1}"#, "1"),
        ("/accounts/1/charges?a=1", r#"{"n":1}"#, "2"),
    ];
    for (path, body, fp) in variants {
        for _ in 0..2 {
            let g = charge(path, body, fp).await;
            let p = g.assert_problem(422, "fingerprint_mismatch", Some(&k));
            assert_section(&p, "#section-2.2");
        }
    }
    charge("/accounts/1/charges?a=1", r#"{"n":1}"#, "1")
        .await
        .assert_replay_of(&first);
    assert_eq!(app.counts.executions(), 1);
}

/// Row 12: a duplicate while the first runs (reject mode): 409 `in_flight`
/// with `Retry-After` = the lease left; then the replay.
pub async fn row_12_in_flight_is_409_with_retry_after<S: Store>(store: Arc<S>) {
    let (app, k) = start(store).await;
    let a = app.hold(&k).await;
    for (left, advance) in [("60", 30), ("30", 0)] {
        let g = app.send_order(&k).await;
        let p = g.assert_problem(409, "in_flight", Some(&k));
        assert_section(&p, "#section-2.6");
        assert_eq!(g.header("retry-after"), Some(left));
        app.clock.advance(Duration::from_secs(advance));
    }
    app.finish(a, &k).await;
    assert_eq!(app.counts.executions(), 1);
}

/// Row 13: in wait mode the duplicate waits for the first and gets the
/// replay.
pub async fn row_13_wait_mode_replays_when_the_first_finishes<S: Store>(store: Arc<S>) {
    let app = App::with(store, Options::waiting()).await;
    let k = key();
    let a = app.hold(&k).await;
    let b = tokio::spawn(app.order(&k).send());
    tokio::task::yield_now().await;
    app.counts.release(1);
    let first = Got::joined(a).await;
    first.assert_executed(201);
    Got::joined(b).await.assert_replay_of(&first);
    assert_eq!(app.counts.executions(), 1);
}

/// Row 14: after `response_ttl`, before `key_ttl`: 409 `response_expired`
/// with the resource id, no `Retry-After`, the handler does not run.
pub async fn row_14_expired_response_is_409_with_resource_id<S: Store>(store: Arc<S>) {
    let (app, k) = start(store).await;
    send(app.order(&k).header("x-resource", "ord_77"))
        .await
        .assert_executed(201);
    app.clock.advance(RESPONSE_TTL + Duration::from_secs(1));
    let g = app.send_order(&k).await;
    let p = g.assert_problem(409, "response_expired", Some(&k));
    assert_eq!(p["resource_id"], "ord_77");
    assert_eq!(p["retryable"], false);
    app.clock.advance(KEY_TTL);
    app.send_order(&k).await.assert_executed(201);
    assert_eq!(app.counts.executions(), 2);
}

/// Row 15: a response that was not stored (`CompleteWithoutBody`, SSE): the
/// first gets it whole, retries 409 `response_not_stored`. (The spec's
/// non-UTF-8 header case does not apply: such values are stored and
/// replayed byte-exact, row 9.)
pub async fn row_15_unstored_response_is_409_not_stored<S: Store>(store: Arc<S>) {
    let app = App::start(store).await;
    let cases: [(&str, &str); 2] = [("x-class", "complete-without-body"), ("x-sse", "1")];
    for (i, (h, v)) in cases.into_iter().enumerate() {
        let k = key();
        let first = executed(app.order(&k).header(h, v).header("x-resource", "r1"), 201).await;
        if h == "x-sse" {
            assert_eq!(first.body, b"data: 1\n\ndata: 2\n\n");
        }
        let g = app.send_order(&k).await;
        let p = g.assert_problem(409, "response_not_stored", Some(&k));
        assert_eq!(p["resource_id"], "r1");
        assert_eq!(app.counts.executions(), i + 1);
    }
}

/// Row 15, streamed but not unstored: a chunked body under the limit (no
/// size hint, several chunks with yields between them) is collected, stored
/// and replayed byte-exact; streaming alone is not a reason to skip storing.
pub async fn row_15_streamed_body_under_the_limit_is_stored<S: Store>(store: Arc<S>) {
    let (app, k) = start(store).await;
    let chunks = 8;
    let first = executed(app.order(&k).header("x-stream", chunks.to_string()), 201).await;
    assert_eq!(first.body, super::app::streamed_body(1, chunks));
    assert!(first.body.len() < super::app::MAX_RESPONSE);
    for _ in 0..2 {
        app.send_order(&k).await.assert_replay_of(&first);
    }
    assert_eq!(app.counts.executions(), 1);
}

/// Row 15, live SSE: the first event reaches the client while the handler's
/// stream still waits to produce the second (so nothing buffers it), the
/// record is already completed "not stored" then (a retry meanwhile gets 409
/// `response_not_stored`), and the stream ends whole; later retries get the
/// same 409, never a replay or a second run.
pub async fn row_15_sse_streams_and_is_never_stored<S: Store>(store: Arc<S>) {
    let (app, k) = start(store).await;
    let mut res = app
        .order(&k)
        .header("x-sse-live", "1")
        .header("x-resource", "r1")
        .send()
        .await
        .expect("request sent");
    assert_eq!(res.status().as_u16(), 201);
    assert_eq!(
        res.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("text/event-stream")
    );
    assert!(res.headers().get("idempotent-replayed").is_none());
    let mut got = Vec::new();
    while got.len() < b"data: 1\n\n".len() {
        let chunk = tokio::time::timeout(Duration::from_secs(10), res.chunk())
            .await
            .expect("the first event arrives before the stream ends")
            .expect("body chunk")
            .expect("not the end yet");
        got.extend_from_slice(&chunk);
    }
    assert_eq!(got, b"data: 1\n\n");
    // The stream is still open (the handler waits for the signal) and the
    // record is already done.
    let g = app.send_order(&k).await;
    let p = g.assert_problem(409, "response_not_stored", Some(&k));
    assert_eq!(p["resource_id"], "r1");
    app.counts.release_stream(1);
    while let Some(chunk) = res.chunk().await.expect("body chunk") {
        got.extend_from_slice(&chunk);
    }
    assert_eq!(got, b"data: 1\n\ndata: 2\n\n");
    app.send_order(&k)
        .await
        .assert_problem(409, "response_not_stored", Some(&k));
    assert_eq!(app.counts.executions(), 1);
}

/// Row 16: an in-flight record whose lease ended: the retry runs as a
/// recovery, and its outcome is the one replayed.
pub async fn row_16_expired_lease_is_taken_over_as_recovery<S: Store>(store: Arc<S>) {
    let (app, k) = start(store).await;
    let a = app.hold(&k).await;
    let b = app.recover(&k).await;
    app.counts.release(1);
    let _ = a.await;
    app.send_order(&k).await.assert_replay_of(&b);
    assert_eq!(app.counts.executions(), 2);
}

/// Row 17: 5xx, 401, 403, 408, 425, 429 from the handler release the key:
/// the same request runs again.
pub async fn row_17_transient_statuses_release_the_key<S: Store>(store: Arc<S>) {
    let app = App::start(store).await;
    for (i, status) in [500u16, 503, 401, 403, 408, 425, 429]
        .into_iter()
        .enumerate()
    {
        let k = key();
        for _ in 0..2 {
            send(app.order(&k).header("x-status", status.to_string()))
                .await
                .assert_executed(status);
        }
        assert_eq!(app.counts.executions(), 2 * (i + 1));
    }
}

/// Row 18: a response over `max_response_bytes` (sized or chunked) arrives
/// whole and byte-exact; the record completes "not stored" (row 15).
pub async fn row_18_oversized_response_streams_and_is_not_stored<S: Store>(store: Arc<S>) {
    let app = App::start(store).await;
    let size = super::app::MAX_RESPONSE + 1;
    for (i, chunked) in [false, true].into_iter().enumerate() {
        let k = key();
        let mut r = app.order(&k).header("x-size", size.to_string());
        if chunked {
            r = r.header("x-chunked", "1");
        }
        let first = executed(r, 201).await;
        let want = if chunked {
            size.div_ceil(1024) * 1024
        } else {
            size
        };
        assert_eq!(first.body.len(), want);
        assert!(
            first
                .body
                .iter()
                .all(|&b| b == if chunked { b'y' } else { b'x' })
        );
        app.send_order(&k)
            .await
            .assert_problem(409, "response_not_stored", Some(&k));
        assert_eq!(app.counts.executions(), i + 1);
    }
}

/// Row 19: the store is unreachable at the claim: 503 `store_unavailable`
/// with `Retry-After: 1`, and the handler does not run (fail closed).
pub async fn row_19_store_down_at_claim_is_503<S: Store>(store: Arc<S>) {
    let (app, k) = start(store).await;
    app.store.fail_all(true);
    let g = app.send_order(&k).await;
    g.assert_problem(503, "store_unavailable", Some(&k));
    assert_eq!(g.header("retry-after"), Some("1"));
    assert_eq!(app.counts.executions(), 0);
    app.store.fail_all(false);
    app.send_order(&k).await.assert_executed(201);
}

/// Row 20: the store fails at completion (a failover, a call timeout).
/// The handler saved no resource id, so its answer is not sent as "done":
/// 503 `store_unavailable` with `Retry-After`, and the engine writes the
/// outcome again in the background. While it is not stored, a retry gets
/// 409 `in_flight` (nothing runs); once it is, the retry replays the
/// handler's 201. The handler ran once.
pub async fn row_20_store_down_at_completion_is_retried_then_replayed<S: Store>(store: Arc<S>) {
    let (app, k) = start(store).await;
    app.store.fail_complete(true);
    let g = app.send_order(&k).await;
    g.assert_problem(503, "store_unavailable", Some(&k));
    assert!(g.header("retry-after").is_some(), "{g:?}");
    app.send_order(&k)
        .await
        .assert_problem(409, "in_flight", Some(&k));
    app.store.fail_complete(false);
    assert_eq!(app.drain().await, 0, "stored in the background");
    let r = app.send_order(&k).await;
    assert_eq!(r.status, 201, "{r:?}");
    assert!(r.is_replay(), "{r:?}");
    assert_eq!(app.counts.executions(), 1);
}

/// Row 20b: the store fails at completion after the handler saved its
/// resource id: the handler's answer is sent (a recovery would reconcile
/// from the saved id), and if the outcome is never stored before the lease
/// ends, the retry after it is a recovery given that id.
pub async fn row_20b_store_down_at_completion_after_a_saved_resource_id<S: Store>(store: Arc<S>) {
    let (app, k) = start(store).await;
    app.store.fail_complete(true);
    send(app.order(&k).header("x-save-resource", "ord_1"))
        .await
        .assert_executed(201);
    app.expire_lease();
    app.store.fail_complete(false);
    assert_eq!(app.drain().await, 0, "given up at the lease's end");
    let g = app.recover(&k).await;
    assert_eq!(g.header("x-previous-resource"), Some("ord_1"));
    assert_eq!(app.counts.executions(), 2);
}

/// Row 21: a holder whose lease was taken over gets 409 `lease_lost`
/// (`Retry-After: 1`); the newer attempt's outcome is the one replayed.
pub async fn row_21_lease_lost_is_409<S: Store>(store: Arc<S>) {
    let (app, k) = start(store).await;
    let a = app.hold(&k).await;
    app.expire_lease();
    let b = app.send_order(&k).await;
    b.assert_executed(201);
    app.counts.release(1);
    let a = Got::joined(a).await;
    a.assert_problem(409, "lease_lost", Some(&k));
    assert_eq!(a.header("retry-after"), Some("1"));
    app.send_order(&k).await.assert_replay_of(&b);
    assert_eq!(app.counts.executions(), 2);
}

/// Row 22: a corrupted record: 500 `corrupt_record`, untouched, nothing runs.
pub async fn row_22_corrupt_record_is_500<S: Store>(store: Arc<S>) {
    let (app, k) = start(store).await;
    let body = b"{}";
    let fp = app.fingerprint_of("/orders", "/orders", body).await;
    let scope = Scope::new("alice", "POST /orders").expect("scope");
    let id = RecordId::new(scope, IdempotencyKey::parse(&k).expect("key"));
    let now = app.clock.now();
    let token = Token::random();
    let claimed = app
        .store
        .claim(&ClaimRequest::new(
            &id,
            fp,
            token,
            now,
            now.plus(Duration::from_secs(60)),
            now.plus(KEY_TTL),
        ))
        .await
        .expect("claim");
    assert!(matches!(claimed, ClaimOutcome::Claimed(_)));
    app.store
        .complete(
            &id,
            token,
            &Completion::new(
                OutcomeKind::Success,
                Some(b"garbage, not a stored response"),
                None,
                now,
                now.plus(RESPONSE_TTL),
                now.plus(KEY_TTL),
            ),
        )
        .await
        .expect("complete");
    for _ in 0..2 {
        let g = app.send_order(&k).await;
        let p = g.assert_problem(500, "corrupt_record", Some(&k));
        assert!(!p.to_string().contains("garbage"));
    }
    assert_eq!(app.counts.executions(), 0);
}

/// Row 23: the client disconnects mid-handler (detached): the handler runs
/// to the end, the outcome is stored, the retry replays it.
pub async fn row_23_disconnect_when_detached_completes<S: Store>(store: Arc<S>) {
    let (app, k) = start(store).await;
    let a = app.hold(&k).await;
    a.abort();
    let _ = a.await;
    app.counts.release(1);
    let mut replay = None;
    for _ in 0..500 {
        let g = app.send_order(&k).await;
        if g.status != 409 {
            replay = Some(g);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let g = replay.expect("the detached handler completed");
    assert_eq!(g.status, 201);
    assert!(g.is_replay());
    assert_eq!(g.json()["id"], "ord_1");
    assert_eq!(app.counts.executions(), 1);
}

/// Row 24: not detached, the response future is dropped mid-handler: the
/// handler is dropped, the record stays in flight, and after the lease the
/// retry is a recovery.
pub async fn row_24_dropped_when_not_detached_is_recovered<S: Store>(store: Arc<S>) {
    let app = App::with(store, Options::attached()).await;
    let k = key();
    let req = axum::http::Request::post("/orders")
        .header("x-owner", "alice")
        .header("idempotency-key", &k)
        .header("content-type", "application/json")
        .header("x-hold", "1")
        .body(axum::body::Body::from("{}"))
        .expect("request");
    let mut router = app.router.clone();
    let fut = tower::Service::call(&mut router, req);
    tokio::select! {
        _ = fut => panic!("the held handler answered"),
        () = app.counts.entered() => {}
    }
    app.send_order(&k)
        .await
        .assert_problem(409, "in_flight", Some(&k));
    app.recover(&k).await;
    assert_eq!(app.counts.executions(), 2);
}

/// Row 25: the handler panics (detached, then not detached): 500
/// `handler_panicked` with `Retry-After`; the record stays in flight and is
/// recovered after the lease.
pub async fn row_25_panic_is_500_then_recovery<S: Store>(store: Arc<S>) {
    // Not detached, the panic happens inside the request's own future: it is
    // answered the same way and the record recovered the same way.
    for opts in [Options::default(), Options::attached()] {
        let app = App::with(Arc::clone(&store), opts).await;
        let k = key();
        let g = send(app.order(&k).header("x-panic", "1")).await;
        g.assert_problem(500, "handler_panicked", Some(&k));
        assert_eq!(g.header("retry-after"), Some("60"));
        app.send_order(&k)
            .await
            .assert_problem(409, "in_flight", Some(&k));
        let g = app.recover(&k).await;
        app.send_order(&k).await.assert_replay_of(&g);
        assert_eq!(app.counts.executions(), 2);
    }
}

/// Row 26: the same key under two owners: two records, each replays its own.
pub async fn row_26_owners_are_isolated<S: Store>(store: Arc<S>) {
    let (app, k) = start(store).await;
    let a = app.send_order(&k).await;
    let bob = || app.post_with("/orders", Some(&k), "{}", "bob", "application/json");
    let b = send(bob()).await;
    a.assert_executed(201);
    b.assert_executed(201);
    assert_ne!(a.body, b.body);
    app.send_order(&k).await.assert_replay_of(&a);
    send(bob()).await.assert_replay_of(&b);
    assert_eq!(app.counts.executions(), 2);
}

/// Row 27: the same key on another route: a separate record per route
/// (`PerRoute`), a 422 with `PerOwner`.
pub async fn row_27_routes_are_isolated_per_route_or_422_per_owner<S: Store>(store: Arc<S>) {
    let per_owner = Options {
        namespace: KeyNamespace::PerOwner,
        ..Options::default()
    };
    for (opts, separate) in [(Options::default(), true), (per_owner, false)] {
        let app = App::with(Arc::clone(&store), opts).await;
        let k = key();
        app.send_order(&k).await.assert_executed(201);
        let other = send(app.post("/other", Some(&k), "{}")).await;
        if separate {
            other.assert_executed(201);
            assert_eq!(app.counts.executions(), 2);
        } else {
            other.assert_problem(422, "fingerprint_mismatch", Some(&k));
            assert_eq!(app.counts.executions(), 1);
        }
    }
}

/// Row 28: a different key with the same body is a new request, never
/// rejected.
pub async fn row_28_different_key_same_body_executes<S: Store>(store: Arc<S>) {
    let app = App::start(store).await;
    for _ in 0..2 {
        send(app.post("/orders", Some(&key()), r#"{"a":1}"#))
            .await
            .assert_executed(201);
    }
    assert_eq!(app.counts.executions(), 2);
}

/// Row 29: JSON with another key order, whitespace, `1.0` for `1`, or a
/// change only in an ignored field; reordered form pairs; the same
/// multipart bytes: replays.
pub async fn row_29_equivalent_bodies_replay<S: Store>(store: Arc<S>) {
    let (app, k) = start(store).await;
    let first = executed(
        app.post("/orders", Some(&k), r#"{"a":1,"b":[1,2],"client_ts":1}"#),
        201,
    )
    .await;
    send(app.post(
        "/orders",
        Some(&k),
        "{ \"b\" : [1.0, 2],\n \"client_ts\": 99, \"a\": 1 }",
    ))
    .await
    .assert_replay_of(&first);
    let typed = |k: &str, body: &str, content_type: &str| {
        send(app.post_with("/orders", Some(k), body, "alice", content_type))
    };
    let k = key();
    let form = "application/x-www-form-urlencoded";
    let first = typed(&k, "a=1&b=2&b=3", form).await;
    first.assert_executed(201);
    typed(&k, "b=2&a=1&b=3", form)
        .await
        .assert_replay_of(&first);
    typed(&k, "b=3&a=1&b=2", form)
        .await
        .assert_problem(422, "fingerprint_mismatch", Some(&k));
    let k = key();
    let mp = "--XyZ\r\nContent-Disposition: form-data; name=\"f\"\r\n\r\nv\r\n--XyZ--\r\n";
    let multipart = "multipart/form-data; boundary=XyZ";
    let first = typed(&k, mp, multipart).await;
    first.assert_executed(201);
    typed(&k, mp, multipart).await.assert_replay_of(&first);
    assert_eq!(app.counts.executions(), 3);
}

/// Row 30: a POST with a key and an empty body, retried: once, then replayed.
pub async fn row_30_empty_body_runs_once<S: Store>(store: Arc<S>) {
    let (app, k) = start(store).await;
    let first = executed(app.post("/orders", Some(&k), ""), 201).await;
    send(app.post("/orders", Some(&k), ""))
        .await
        .assert_replay_of(&first);
    assert_eq!(app.counts.executions(), 1);
}

/// Row 31: after shutdown, keyed requests get 503 `shutting_down`
/// (`Retry-After: 1`); uncovered requests still pass.
pub async fn row_31_shut_down_layer_is_503<S: Store>(store: Arc<S>) {
    let app = App::start(store).await;
    app.layer.shutdown().await;
    let k = key();
    let g = app.send_order(&k).await;
    g.assert_problem(503, "shutting_down", Some(&k));
    assert_eq!(g.header("retry-after"), Some("1"));
    send(app.request(Method::GET, "/orders", None, ""))
        .await
        .assert_executed(201);
    assert_eq!(app.counts.executions(), 1);
}
