//! `IdempotentTools` on the real engine over every backend, driven by an
//! rmcp client through an in-process connection: the key locations, the
//! answers (replay, mismatch, in flight, transient release, permanent
//! replay, no key, invalid keys), owners, the capability, cancellation, and
//! `ToolCaller` through a connection that drops the first answer.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_core::testkit::Fixture;
use idem_core::{Idem, IdempotencyKey, store::Store};
use idem_mcp::rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ErrorData, JsonObject,
    RequestMetaObject, ServerCapabilities, ServerConfig,
};
use idem_mcp::rmcp::service::{Peer, RequestContext, RunningService, ServiceError};
use idem_mcp::rmcp::{RoleClient, RoleServer, ServerHandler, ServiceExt};
use idem_mcp::{IdempotentTools, ReportKind, ToolCaller, ToolKeys, ToolOutcome, error_code};
use serde_json::{Value, json};
use tokio::sync::Notify;

/// The orders server of the example, in miniature: `create_order` (keyed,
/// reads the `idempotency_key` argument), `strict` (a key required),
/// `stats` (never keyed). Amount 7 is a permanent failure, 13 a transient
/// one; note `gate` waits for [`Orders::gate`].
#[derive(Clone)]
struct Orders<S: Store> {
    tools: IdempotentTools<S>,
    executions: Arc<AtomicU64>,
    gate: Arc<Notify>,
    started: Arc<Notify>,
    panicked: Arc<std::sync::atomic::AtomicBool>,
}

impl<S: Store> Orders<S> {
    fn new(idem: Idem<S>, owner: Option<&'static str>) -> Self {
        let tools = match owner {
            Some(o) => IdempotentTools::with_owner(idem, o),
            // The owner travels in the request's `_meta.owner` (a stand-in
            // for a session's principal).
            None => IdempotentTools::new(idem, |ctx: &RequestContext<RoleServer>| {
                ctx.meta.0.0.get("owner")?.as_str().map(str::to_owned)
            }),
        };
        Self {
            tools: tools
                .tool("create_order", ToolKeys::optional().with_argument())
                .tool("strict", ToolKeys::required())
                .tool("stats", ToolKeys::never()),
            executions: Arc::default(),
            gate: Arc::new(Notify::new()),
            started: Arc::new(Notify::new()),
            panicked: Arc::default(),
        }
    }

    fn executions(&self) -> u64 {
        self.executions.load(Ordering::SeqCst)
    }
}

impl<S: Store> ServerHandler for Orders<S> {
    fn get_info(&self) -> ServerConfig {
        let mut caps = ServerCapabilities::builder().enable_tools().build();
        self.tools.advertise(&mut caps);
        ServerConfig::new(caps)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let executions = Arc::clone(&self.executions);
        let (gate, started) = (Arc::clone(&self.gate), Arc::clone(&self.started));
        let stats = request.name == "stats";
        let panicked = Arc::clone(&self.panicked);
        self.tools
            .call(request, &context, move |call| async move {
                if stats {
                    let n = executions.load(Ordering::SeqCst);
                    return CallToolResult::structured(json!({ "executions": n })).into();
                }
                let n = executions.fetch_add(1, Ordering::SeqCst) + 1;
                let args = call.arguments();
                if args.get("note").and_then(Value::as_str) == Some("gate") {
                    started.notify_one();
                    gate.notified().await;
                }
                let attempt = call.attempt().map(idem_core::Attempt::number);
                match args.get("amount").and_then(Value::as_i64) {
                    Some(99) if !panicked.swap(true, Ordering::SeqCst) => {
                        panic!("the tool crashed mid-work")
                    }
                    Some(7) => failed("insufficient_funds").into(),
                    Some(13) => ToolOutcome::transient(failed("provider_unavailable")),
                    amount => {
                        let id = format!("ord_{n}");
                        if let Some(a) = call.attempt() {
                            a.set_resource_id(&id);
                        }
                        CallToolResult::structured(
                            json!({ "id": id, "amount": amount, "run": n, "attempt": attempt }),
                        )
                        .into()
                    }
                }
            })
            .await
            .map(Into::into)
    }
}

/// A permanent or transient failure the host sees: `isError`, the word in
/// `structuredContent.error` and in the text.
fn failed(why: &str) -> CallToolResult {
    CallToolResult::structured_error(json!({ "error": why }))
}

type Client = RunningService<RoleClient, ()>;

/// A server and a client on an in-process connection.
async fn connect<S: Store>(server: Orders<S>) -> Client {
    let (a, b) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(a).await {
            let _ = running.waiting().await;
        }
    });
    ().serve(b).await.unwrap()
}

fn args(v: Value) -> JsonObject {
    match v {
        Value::Object(m) => m,
        _ => panic!("not an object"),
    }
}

/// A `tools/call` with these arguments and `_meta` members.
fn request(tool: &'static str, arguments: Value, meta: Value) -> CallToolRequestParams {
    let mut r = CallToolRequestParams::new(tool).with_arguments(args(arguments));
    if let Value::Object(m) = meta {
        let mut rm = RequestMetaObject::default();
        rm.0.0.extend(m);
        r.meta = Some(rm);
    }
    r
}

async fn call(c: &Client, r: CallToolRequestParams) -> Result<CallToolResult, ErrorData> {
    match c.call_tool(r).await {
        Ok(res) => Ok(res),
        Err(ServiceError::McpError(e)) => Err(e),
        Err(e) => panic!("transport: {e}"),
    }
}

/// A `create_order` call with these arguments and `_meta` members.
async fn create(c: &Client, arguments: &Value, meta: Value) -> Result<CallToolResult, ErrorData> {
    call(c, request("create_order", arguments.clone(), meta)).await
}

/// Starts a `create_order` call from `peer` in the background (arguments
/// that hold the tool at its gate) and waits until the tool has entered it.
async fn gated<S: Store>(
    server: &Orders<S>,
    peer: &Peer<RoleClient>,
    arguments: &Value,
    meta: Value,
) -> tokio::task::JoinHandle<Result<CallToolResult, ServiceError>> {
    let (r, peer) = (
        request("create_order", arguments.clone(), meta),
        peer.clone(),
    );
    let call = tokio::spawn(async move { peer.call_tool(r).await });
    server.started.notified().await;
    call
}

/// Opens the gate of a [`gated`] call and retries it until it is no longer
/// in flight: the stored outcome.
async fn settled<S: Store>(
    server: &Orders<S>,
    c: &Client,
    arguments: &Value,
    meta: Value,
) -> CallToolResult {
    server.gate.notify_one();
    loop {
        match create(c, arguments, meta.clone()).await {
            Err(e) if code(&e) == "in_flight" => tokio::task::yield_now().await,
            other => break other.unwrap(),
        }
    }
}

fn replayed(r: &CallToolResult) -> bool {
    idem_mcp::is_replayed(r)
}

fn code(e: &ErrorData) -> &str {
    error_code(e).unwrap_or("<none>")
}

fn fresh_key() -> String {
    IdempotencyKey::random().as_str().to_owned()
}

/// Every answer the issue lists, on one store.
async fn answers<S: Store + Clone>(store: S) {
    let clock = idem_core::clock::ManualClock::starting_now();
    let server = Orders::new(Idem::new(store.clone()).with_clock(clock.clone()), None);
    let c = connect(server.clone()).await;
    let alice = json!({ "owner": "alice" });
    let with_key = |key: &str| json!({ "owner": "alice", "idempotencyKey": key });

    // First call, then the replay with the marker; the stored result exactly.
    let k = fresh_key();
    let order = json!({ "amount": 5, "currency": "EUR" });
    let first = create(&c, &order, with_key(&k)).await.unwrap();
    assert!(!replayed(&first), "{first:?}");
    assert!(first.meta.is_none(), "no marker on a first execution");
    let again = create(&c, &order, with_key(&k)).await.unwrap();
    assert!(replayed(&again));
    assert_eq!(again.structured_content, first.structured_content);
    assert_eq!(again.content, first.content);
    assert_eq!(again.is_error, first.is_error);
    assert_eq!(server.executions(), 1);

    // The key as an argument names the same record; `_meta` wins over it.
    let by_arg = json!({ "amount": 5, "currency": "EUR", "idempotency_key": k });
    let r = create(&c, &by_arg, alice.clone()).await.unwrap();
    assert!(
        replayed(&r),
        "the argument key replays the _meta key's record"
    );
    let other = fresh_key();
    let both = json!({ "amount": 5, "currency": "EUR", "idempotency_key": other });
    let r = create(&c, &both, with_key(&k)).await.unwrap();
    assert!(replayed(&r), "_meta wins");
    assert_eq!(server.executions(), 1);
    let k2 = fresh_key();
    let arg_only = json!({ "amount": 6, "currency": "EUR", "idempotency_key": k2 });
    let r1 = create(&c, &arg_only, alice.clone()).await.unwrap();
    let r2 = create(&c, &arg_only, alice.clone()).await.unwrap();
    assert!(!replayed(&r1) && replayed(&r2));
    assert_eq!(server.executions(), 2);

    // Same key, other arguments.
    let e = create(&c, &json!({ "amount": 9, "currency": "EUR" }), with_key(&k))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "fingerprint_mismatch", "{e:?}");
    assert_eq!(server.executions(), 2);

    // Permanent failure: stored and replayed.
    let kp = fresh_key();
    let seven = json!({ "amount": 7, "currency": "EUR" });
    let p1 = create(&c, &seven, with_key(&kp)).await.unwrap();
    assert_eq!(p1.is_error, Some(true));
    let p2 = create(&c, &seven, with_key(&kp)).await.unwrap();
    assert!(replayed(&p2));
    assert_eq!(p2.is_error, Some(true));
    assert_eq!(
        p2.structured_content,
        Some(json!({ "error": "insufficient_funds" }))
    );
    assert_eq!(server.executions(), 3);

    // Transient failure: released, the retry runs again.
    let kt = fresh_key();
    let thirteen = json!({ "amount": 13, "currency": "EUR" });
    for run in 4..=5 {
        let t = create(&c, &thirteen, with_key(&kt)).await.unwrap();
        assert!(!replayed(&t));
        assert_eq!(
            t.structured_content,
            Some(json!({ "error": "provider_unavailable" }))
        );
        assert_eq!(server.executions(), run);
    }

    // No key: runs each time. `stats` is never keyed.
    for run in 6..=7 {
        let r = create(
            &c,
            &json!({ "amount": 1, "currency": "EUR" }),
            alice.clone(),
        )
        .await
        .unwrap();
        assert!(!replayed(&r));
        assert_eq!(server.executions(), run);
    }
    let s = call(&c, request("stats", json!({}), with_key(&k)))
        .await
        .unwrap();
    assert_eq!(s.structured_content, Some(json!({ "executions": 7 })));
    let s = call(&c, request("stats", json!({}), with_key(&k)))
        .await
        .unwrap();
    assert!(!replayed(&s), "a key sent to stats is ignored");

    // A tool that requires a key.
    let e = call(&c, request("strict", json!({ "amount": 1 }), alice.clone()))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "missing_key");

    // Malformed keys: nothing runs.
    for bad in [
        json!(""),
        json!("x".repeat(256)),
        json!("caf\u{e9}"),
        json!(42),
        json!(null),
    ] {
        let meta = json!({ "owner": "alice", "idempotencyKey": bad });
        let e = create(&c, &json!({ "amount": 1, "currency": "EUR" }), meta)
            .await
            .unwrap_err();
        assert_eq!(code(&e), "invalid_key", "{bad}: {e:?}");
        let by_arg = json!({ "amount": 1, "currency": "EUR", "idempotency_key": bad });
        let e = create(&c, &by_arg, alice.clone()).await.unwrap_err();
        assert_eq!(code(&e), "invalid_key", "{bad}: {e:?}");
    }
    assert_eq!(
        create(
            &c,
            &json!({"amount": 1, "currency": "EUR", "idempotency_key": "x".repeat(255)}),
            alice.clone()
        )
        .await
        .unwrap()
        .is_error,
        Some(false)
    );
    assert_eq!(server.executions(), 8);

    // A key is taken as is: surrounding spaces make another key (a header's
    // optional whitespace does not apply to a JSON string).
    let spaced = format!(" {k} ");
    let s = create(&c, &order, with_key(&spaced)).await.unwrap();
    assert!(!replayed(&s), "{spaced:?} is not {k:?}");
    assert_ne!(s.structured_content, first.structured_content);
    let s2 = create(&c, &order, with_key(&spaced)).await.unwrap();
    assert!(replayed(&s2), "and is a key of its own");
    assert_eq!(s2.structured_content, s.structured_content);
    assert_eq!(server.executions(), 9);

    // Two owners, one key: two executions, no cross-owner replay.
    let bob = json!({ "owner": "bob", "idempotencyKey": k });
    let b = create(&c, &order, bob).await.unwrap();
    assert!(!replayed(&b));
    assert_ne!(b.structured_content, first.structured_content);
    assert_eq!(server.executions(), 10);
    // No owner: refused.
    let e = create(&c, &order, json!({ "idempotencyKey": k }))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "owner_unavailable");

    // In flight: the first call holds the record until the gate opens.
    let kf = fresh_key();
    let slow = json!({ "amount": 2, "currency": "EUR", "note": "gate" });
    let first = gated(&server, c.peer(), &slow, with_key(&kf)).await;
    let e = create(&c, &slow, with_key(&kf)).await.unwrap_err();
    assert_eq!(code(&e), "in_flight");
    assert!(
        e.data.as_ref().unwrap()["retryAfterMs"].as_u64().unwrap() > 0,
        "{e:?}"
    );
    server.gate.notify_one();
    let done = first.await.unwrap().unwrap();
    assert!(!replayed(&done));
    let r = create(&c, &slow, with_key(&kf)).await.unwrap();
    assert!(replayed(&r));
    assert_eq!(r.structured_content, done.structured_content);

    // Cancellation: the caller gives up (its future dropped, the server is
    // told `notifications/cancelled`); the work finishes and is stored.
    let kc = fresh_key();
    let before = server.executions();
    let abandoned = gated(&server, c.peer(), &slow, with_key(&kc)).await;
    abandoned.abort();
    let _ = abandoned.await;
    let r = settled(&server, &c, &slow, with_key(&kc)).await;
    assert!(replayed(&r), "the abandoned call's outcome was stored");
    assert_eq!(server.executions(), before + 1);

    // A panic mid-work is a crash: `handler_panicked` with the lease to
    // wait, the record in flight until then, and the retry after it a
    // recovery (attempt 2) that runs the work again.
    let kx = fresh_key();
    let crash = json!({ "amount": 99, "currency": "EUR" });
    let e = create(&c, &crash, with_key(&kx)).await.unwrap_err();
    assert_eq!(code(&e), "handler_panicked", "{e:?}");
    let lease = server.tools.idem().policy().lease();
    assert_eq!(
        e.data.as_ref().unwrap()["retryAfterMs"].as_u64(),
        Some(lease.as_millis() as u64)
    );
    let e = create(&c, &crash, with_key(&kx)).await.unwrap_err();
    assert_eq!(code(&e), "in_flight");
    clock.advance(lease + Duration::from_secs(1));
    let r = create(&c, &crash, with_key(&kx)).await.unwrap();
    assert!(!replayed(&r));
    assert_eq!(
        r.structured_content.as_ref().unwrap()["attempt"],
        2,
        "{r:?}"
    );
    let r = create(&c, &crash, with_key(&kx)).await.unwrap();
    assert!(replayed(&r));

    // A dropped connection: the host goes away mid-call; the work
    // finishes and is stored, and a new connection's retry replays it.
    let kd = fresh_key();
    let before = server.executions();
    {
        let gone = connect(server.clone()).await;
        let pending = gated(&server, gone.peer(), &slow, with_key(&kd)).await;
        drop(gone);
        pending.abort();
        let _ = pending.await;
    }
    let r = settled(&server, &c, &slow, with_key(&kd)).await;
    assert!(replayed(&r), "the dropped connection's outcome was stored");
    assert_eq!(server.executions(), before + 1);

    // The capability.
    let info = c.peer_info().unwrap();
    let cap = &info.capabilities.experimental.as_ref().unwrap()["idempotency"];
    assert_eq!(
        cap["keyLocations"],
        json!(["_meta.idempotencyKey", "arguments.idempotency_key"])
    );
    let policy = server.tools.idem().policy();
    assert_eq!(
        cap["responseTtlMs"],
        json!(policy.response_ttl().as_millis() as u64)
    );
    assert_eq!(cap["keyTtlMs"], json!(policy.key_ttl().as_millis() as u64));

    let _ = c.cancel().await;
}

/// `ToolCaller` through a connection whose first answer is lost: the
/// attempt times out, the retry carries the same key and is replayed; the
/// tool ran once. With the server gated, `in_flight` is retried too.
async fn caller<S: Store + Clone>(store: S) {
    let clock = idem_core::clock::ManualClock::starting_now();
    let server = Orders::new(Idem::new(store).with_clock(clock.clone()), Some("host"));
    let c = connect(server.clone()).await;
    let caller = ToolCaller::new(
        idem_client::IdempotencyClientLayer::builder()
            .backoff(Duration::from_millis(10), Duration::from_millis(50))
            .deadline(Duration::from_secs(20))
            .build_policy()
            .unwrap(),
    )
    .attempt_timeout(Some(Duration::from_secs(2)));
    let order = request(
        "create_order",
        json!({ "amount": 5, "currency": "EUR" }),
        json!({}),
    );
    let mut sent = 0;
    let report = caller
        .call(order.clone(), None, |r| {
            sent += 1;
            let peer = c.peer().clone();
            let lose = sent == 1;
            async move {
                let answer = peer.call_tool(r).await;
                if lose {
                    // The answer arrived and is dropped on the floor.
                    std::future::pending::<()>().await;
                }
                answer
            }
        })
        .await;
    assert_eq!(report.outcome, ReportKind::Replayed, "{report:?}");
    assert_eq!(report.attempts, 2);
    assert_eq!(server.executions(), 1);
    assert!(replayed(report.answer.as_ref().unwrap().as_ref().unwrap()));

    // The same intent again later: its key, replayed.
    let again = caller
        .call_peer(c.peer(), order.clone(), Some(report.key.clone()))
        .await;
    assert_eq!((again.outcome, again.attempts), (ReportKind::Replayed, 1));

    // A mismatch is not retried.
    let other = request(
        "create_order",
        json!({ "amount": 6, "currency": "EUR" }),
        json!({}),
    );
    let m = caller
        .call_peer(c.peer(), other, Some(report.key.clone()))
        .await;
    assert_eq!((m.outcome, m.attempts), (ReportKind::Rejected, 1));
    assert_eq!(
        code(m.answer.unwrap().as_ref().unwrap_err()),
        "fingerprint_mismatch"
    );
    assert_eq!(server.executions(), 1);

    // The result is no longer kept, the key still is: already processed,
    // with what the first execution created; nothing runs again.
    clock.advance(server.tools.idem().policy().response_ttl() + Duration::from_secs(1));
    let gone = caller
        .call_peer(c.peer(), order, Some(report.key.clone()))
        .await;
    assert_eq!(
        (gone.outcome, gone.attempts),
        (ReportKind::AlreadyProcessed, 1)
    );
    let e = gone.answer.unwrap().unwrap_err();
    assert_eq!(code(&e), "response_expired");
    let id = &report.answer.unwrap().unwrap().structured_content.unwrap()["id"];
    assert_eq!(e.data.as_ref().unwrap()["resourceId"], *id, "{e:?}");
    assert_eq!(server.executions(), 1);
    let _ = c.cancel().await;
}

async fn on<F: Fixture>(fixture: F)
where
    F::Store: Clone,
{
    let store = fixture.store();
    answers(store.clone()).await;
    caller(store).await;
    fixture.teardown().await;
}

/// One test per backend, each running [`on`] over a fresh fixture.
macro_rules! on_every_backend {
    ($($name:ident => $fixture:ident),+ $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            on(idem_test_support::fixtures::$fixture().await).await;
        }
    )+};
}

on_every_backend!(
    on_memory => memory,
    on_sqlite => sqlite_file,
    on_postgres => postgres,
    on_mysql => mysql,
    on_redis => redis,
);

/// Shutting down: keyed calls that arrive after `shutdown` began are
/// refused with `shutting_down` (nothing runs, a retry hint given); the work
/// already started runs to its end and its outcome is stored; `shutdown`
/// returns once it has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_refuses_new_keyed_calls_and_stores_the_running_one() {
    let server = Orders::new(Idem::new(idem_core::MemoryStore::new()), None);
    let c = connect(server.clone()).await;
    let k = fresh_key();
    let slow = json!({ "amount": 5, "currency": "EUR", "note": "gate" });
    let meta = json!({ "owner": "alice", "idempotencyKey": k });
    let running = gated(&server, c.peer(), &slow, meta.clone()).await;

    // The first poll of `shutdown` closes the door; it then waits for the
    // running call, so it does not finish here.
    let waited = tokio::time::timeout(Duration::ZERO, server.tools.shutdown()).await;
    assert!(waited.is_err(), "shutdown waits for the running call");
    let other = json!({ "owner": "alice", "idempotencyKey": fresh_key() });
    let e = create(&c, &json!({ "amount": 1, "currency": "EUR" }), other)
        .await
        .unwrap_err();
    assert_eq!(code(&e), "shutting_down", "{e:?}");
    assert!(
        e.data.as_ref().unwrap()["retryAfterMs"].as_u64().unwrap() > 0,
        "{e:?}"
    );
    assert_eq!(server.executions(), 1, "nothing new ran");

    server.gate.notify_one();
    let answered = running.await.unwrap().unwrap();
    tokio::time::timeout(Duration::from_secs(10), server.tools.shutdown())
        .await
        .expect("shutdown returns once the running call is done");
    let scope = idem_core::Scope::new("alice", "create_order").unwrap();
    let record = server
        .tools
        .idem()
        .admin()
        .inspect(&scope, &k, true)
        .await
        .unwrap()
        .expect("the running call's record");
    assert_eq!(record.state, idem_core::store::RecordState::Completed);
    assert!(!replayed(&answered), "the running call's own answer");
    let _ = c.cancel().await;
}

/// A tool that outlives its lease keeps its record: the lease is renewed
/// while it runs, so a retry past the first lease's end finds it in flight
/// instead of recovering it and running the tool a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_that_outlives_its_lease_is_not_run_twice() {
    let clock = idem_core::clock::ManualClock::starting_now();
    let lease = Duration::from_millis(300);
    let idem = Idem::new(idem_core::MemoryStore::new())
        .with_clock(clock.clone())
        .with_policy(idem_core::Policy::builder().lease(lease).build().unwrap());
    let server = Orders::new(idem, None);
    let c = connect(server.clone()).await;
    let k = fresh_key();
    let slow = json!({ "amount": 5, "currency": "EUR", "note": "gate" });
    let meta = json!({ "owner": "alice", "idempotencyKey": k });
    let running = gated(&server, c.peer(), &slow, meta.clone()).await;
    let scope = idem_core::Scope::new("alice", "create_order").unwrap();
    let admin = server.tools.idem().admin();
    let first_end = admin
        .inspect(&scope, &k, false)
        .await
        .unwrap()
        .unwrap()
        .lease_until;

    // Half the lease passes; a renewal (every third of it, in the runtime's
    // time) moves the end a whole lease past the engine's now.
    clock.advance(lease / 2);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while admin
        .inspect(&scope, &k, false)
        .await
        .unwrap()
        .unwrap()
        .lease_until
        <= first_end
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the lease was never renewed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Past the first lease's end: the retry finds the call still running.
    clock.advance(lease * 2 / 3);
    let e = create(&c, &slow, meta.clone()).await.unwrap_err();
    assert_eq!(code(&e), "in_flight", "{e:?}");
    assert_eq!(server.executions(), 1, "not recovered while it runs");

    server.gate.notify_one();
    let first = running.await.unwrap().unwrap();
    let again = create(&c, &slow, meta).await.unwrap();
    assert!(replayed(&again));
    assert_eq!(again.structured_content, first.structured_content);
    assert_eq!(server.executions(), 1);
    let _ = c.cancel().await;
}

/// The store fails after the tool ran and it saved no resource id: the
/// host is told `store_unavailable` (never the result of work a retry could
/// run again), and once the engine's background write stores the outcome
/// the retry replays it; the tool ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_not_stored_yet_is_not_answered_as_done() {
    let store = idem_core::testkit::FailingStore::new(Arc::new(idem_core::MemoryStore::new()));
    let server = Orders::new(Idem::new(store.clone()), None);
    let c = connect(server.clone()).await;
    let k = fresh_key();
    let order = json!({ "amount": 5, "currency": "EUR" });
    let meta = json!({ "owner": "alice", "idempotencyKey": k });

    store.fail_complete(true);
    let e = create(&c, &order, meta.clone()).await.unwrap_err();
    assert_eq!(code(&e), "store_unavailable", "{e:?}");
    assert_eq!(server.tools.idem().pending_completions(), 1, "kept");

    store.fail_complete(false);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let replay = loop {
        match create(&c, &order, meta.clone()).await {
            Err(e) if code(&e) == "in_flight" => {
                assert!(std::time::Instant::now() < deadline, "never stored");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            other => break other.unwrap(),
        }
    };
    assert!(replayed(&replay), "stored in the background, then replayed");
    assert_eq!(server.executions(), 1);
    let _ = c.cancel().await;
}
