//! Redis-specific behaviour: scripts reloaded after `SCRIPT FLUSH`, faults,
//! garbage records, the key layout, native expiry, contention, volume, and
//! the commands each transition costs.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::store::{
    ClaimOutcome, ClaimRequest, Completion, OutcomeKind, Store, StoreError, Token,
};
use idem_core::{
    Clock, Error, FieldFilter, Idem, IdempotencyKey, InFlightMode, ManualClock, Outcome, Policy,
    RecordId, Scope, fingerprint,
};
use idem_redis::RedisStore;
use idem_redis::redis::aio::{ConnectionManagerConfig, MultiplexedConnection};
use idem_redis::redis::{self, AsyncCommands, Client};
use support::server::Throwaway;

type Out = Outcome<String, String>;

const LEASE: Duration = Duration::from_secs(60);
const RESPONSE_TTL: Duration = Duration::from_secs(3600);
const KEY_TTL: Duration = Duration::from_secs(30 * 86_400);

fn policy() -> Policy {
    Policy::builder()
        .lease(LEASE)
        .response_ttl(RESPONSE_TTL)
        .key_ttl(KEY_TTL)
        .in_flight(InFlightMode::Reject)
        .store_retries(5, Duration::from_millis(50))
        .build()
        .expect("valid policy")
}

fn engine(store: RedisStore, clock: &ManualClock) -> Idem<RedisStore> {
    Idem::new(store)
        .with_clock(clock.clone())
        .with_policy(policy())
}

fn scope() -> Scope {
    Scope::new(
        format!("tenant-{}", IdempotencyKey::random()),
        "POST /charges",
    )
    .expect("scope")
}

fn request() -> serde_json::Value {
    serde_json::json!({"amount": 100, "currency": "eur"})
}

#[derive(Clone, Default)]
struct Counter(Arc<AtomicUsize>);
impl Counter {
    fn hit(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
    fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// A store on `url` that gives up reconnecting quickly (fault tests).
async fn impatient_store(url: &str) -> RedisStore {
    let config = ConnectionManagerConfig::new()
        .set_number_of_retries(1)
        .set_connection_timeout(Some(Duration::from_millis(500)))
        .set_response_timeout(Some(Duration::from_secs(2)));
    let manager = Client::open(url)
        .expect("url")
        .get_connection_manager_with_config(config)
        .await
        .expect("connect");
    RedisStore::from_manager(manager)
        .with_prefix(&support::unique_prefix())
        .expect("prefix")
}

/// Polls until the store answers again (it reconnects on its own).
async fn wait_until_reachable(store: &RedisStore, id: &RecordId, now: idem_core::Timestamp) {
    for _ in 0..250 {
        if store.fetch(id, now).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the store did not reconnect within 5 s");
}

async fn kill_other_clients(admin: &mut MultiplexedConnection) -> i64 {
    redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"][..])
        .query_async(admin)
        .await
        .expect("CLIENT KILL")
}

fn claim_req<'a>(id: &'a RecordId, clock: &ManualClock) -> ClaimRequest<'a> {
    let now = clock.now();
    ClaimRequest {
        id,
        fingerprint: fingerprint("POST /charges", &request(), &FieldFilter::All).expect("fp"),
        token: Token::random(),
        now,
        lease_until: now.plus(LEASE),
        key_expires_at: now.plus(KEY_TTL),
    }
}

fn record_id(scope: &Scope) -> RecordId {
    RecordId::new(scope.clone(), IdempotencyKey::random())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_reloaded_after_script_flush() {
    let server = Throwaway::start();
    let store = impatient_store(&server.url()).await;
    let mut admin = support::admin(&server.url()).await;
    let clock = ManualClock::starting_now();
    let idem = engine(store.clone(), &clock);
    let (scope, runs) = (scope(), Counter::default());
    for round in 0..3 {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut admin)
            .await
            .expect("SCRIPT FLUSH");
        let r = runs.clone();
        let reply = idem
            .execute(&scope, "flush-key", &request(), |_| async move {
                r.hit();
                Out::Success("ch_1".into())
            })
            .await
            .expect("EVALSHA falls back to loading the script");
        assert_eq!(reply.is_replay(), round > 0);
    }
    assert_eq!(runs.get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_reloaded_on_every_cluster_node_after_script_flush() {
    let fixture = support::cluster().await;
    let clock = ManualClock::starting_now();
    let idem = engine(fixture.store.clone(), &clock);
    let (scope, runs) = (scope(), Counter::default());
    // Keys spread over the slots of every primary.
    let keys: Vec<String> = (0..24).map(|i| format!("flush-{i}")).collect();
    for round in 0..2 {
        for url in &fixture.nodes {
            let mut node = support::admin(url).await;
            let _: () = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query_async(&mut node)
                .await
                .expect("SCRIPT FLUSH");
        }
        for key in &keys {
            let r = runs.clone();
            let reply = idem
                .execute(&scope, key.as_str(), &request(), |_| async move {
                    r.hit();
                    Out::Success("ch".into())
                })
                .await
                .expect("EVALSHA falls back to SCRIPT LOAD on the primaries");
            assert_eq!(reply.is_replay(), round > 0);
        }
    }
    assert_eq!(runs.get(), keys.len());
    fixture.teardown_checked().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_kill_mid_call_is_a_typed_error_and_never_runs_twice() {
    let server = Throwaway::start();
    let store = impatient_store(&server.url()).await;
    let mut admin = support::admin(&server.url()).await;
    let clock = ManualClock::starting_now();
    let idem = engine(store.clone(), &clock);
    let (scope, runs) = (scope(), Counter::default());
    let id = RecordId::new(
        scope.clone(),
        IdempotencyKey::parse("kill-key").expect("key"),
    );
    store.fetch(&id, clock.now()).await.expect("connected");

    // The claim is sent while writes are paused, then its connection is killed.
    let _: () = redis::cmd("CLIENT")
        .arg(&["PAUSE", "10000", "WRITE"][..])
        .query_async(&mut admin)
        .await
        .expect("pause");
    let call = {
        let (idem, scope, r) = (idem.clone(), scope.clone(), runs.clone());
        tokio::spawn(async move {
            idem.execute(&scope, "kill-key", &request(), |_| async move {
                r.hit();
                Out::Success("ch_1".into())
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        kill_other_clients(&mut admin).await >= 1,
        "the store's connection was killed"
    );
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut admin)
        .await
        .expect("unpause");
    let err = call
        .await
        .expect("join")
        .expect_err("the claim's connection died");
    assert!(
        matches!(
            err,
            Error::Store(StoreError::Unavailable {
                backend: "redis",
                ..
            })
        ),
        "{err:?}"
    );
    assert_eq!(err.http_status(), 503);
    assert_eq!(runs.get(), 0, "nothing ran");

    // The store reconnects by itself; the killed claim left nothing behind.
    wait_until_reachable(&store, &id, clock.now()).await;
    assert_eq!(store.fetch(&id, clock.now()).await.expect("fetch"), None);

    // Now the connection dies while the work runs (between claim and complete).
    let r = runs.clone();
    let mut killer = admin.clone();
    let reply = idem
        .execute(&scope, "kill-key", &request(), |_| async move {
            r.hit();
            kill_other_clients(&mut killer).await;
            Out::Success("ch_1".into())
        })
        .await
        .expect("the caller gets the work's result");
    assert_eq!(reply.into_result(), Ok("ch_1".to_owned()));
    wait_until_reachable(&store, &id, clock.now()).await;
    for _ in 0..3 {
        let r = runs.clone();
        match idem
            .execute(&scope, "kill-key", &request(), |_| async move {
                r.hit();
                Out::Success("again".into())
            })
            .await
        {
            Ok(replay) => {
                assert!(replay.is_replay());
                assert_eq!(replay.into_result(), Ok("ch_1".to_owned()));
            }
            Err(e) => assert!(matches!(e, Error::InFlight { .. }), "{e:?}"),
        }
    }
    assert_eq!(runs.get(), 1, "the work ran exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_without_persistence_is_unavailable_then_forgets() {
    let server = Throwaway::start();
    let store = impatient_store(&server.url()).await;
    let clock = ManualClock::starting_now();
    let idem = engine(store.clone(), &clock);
    let (scope, runs) = (scope(), Counter::default());
    let id = RecordId::new(
        scope.clone(),
        IdempotencyKey::parse("restart-key").expect("key"),
    );
    let req = request();
    let run = || {
        let r = runs.clone();
        idem.execute(&scope, "restart-key", &req, |_| async move {
            r.hit();
            Out::Success("ch_1".into())
        })
    };
    assert!(!run().await.expect("first").is_replay());
    assert!(run().await.expect("replay").is_replay());

    server.stop();
    let err = store
        .fetch(&id, clock.now())
        .await
        .expect_err("server down");
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
    let err = run().await.expect_err("server down");
    assert_eq!(err.http_status(), 503);
    assert_eq!(runs.get(), 1);

    server.start_again();
    wait_until_reachable(&store, &id, clock.now()).await;
    // What the durability section warns about: without AOF the claim is gone,
    // so the retry runs the work again.
    assert_eq!(store.fetch(&id, clock.now()).await.expect("fetch"), None);
    assert!(!run().await.expect("after restart").is_replay());
    assert_eq!(runs.get(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_written_by_hand_is_corrupt_not_a_panic() {
    let fixture = support::standalone().await;
    let store = fixture.store.clone();
    let mut admin = support::admin(&support::standalone_url()).await;
    let clock = ManualClock::starting_now();
    let scope = scope();

    let edits: [(&str, &[u8]); 7] = [
        ("s", b"banana"),
        ("f", b"short"),
        ("a", b"many"),
        ("l", b"soon"),
        ("k", b"\xff\xfe"),
        ("o", b"maybe"),
        ("x", b"\xff not utf-8"),
    ];
    for (field, value) in edits {
        let id = record_id(&scope);
        let req = claim_req(&id, &clock);
        store.claim(&req).await.expect("claim");
        if field == "o" || field == "x" {
            let now = clock.now();
            store
                .complete(
                    &id,
                    req.token,
                    &Completion {
                        outcome: OutcomeKind::Success,
                        body: Some(b"ok"),
                        resource_id: Some("r"),
                        now,
                        response_expires_at: now.plus(RESPONSE_TTL),
                        key_expires_at: now.plus(KEY_TTL),
                    },
                )
                .await
                .expect("complete");
        }
        let _: i64 = admin
            .hset(store.record_key(&id), field, value)
            .await
            .expect("HSET");
        corrupt(store.fetch(&id, clock.now()).await, field);
        corrupt(store.claim(&claim_req(&id, &clock)).await, field);
    }

    // A body replaced by another type.
    let id = record_id(&scope);
    let req = claim_req(&id, &clock);
    store.claim(&req).await.expect("claim");
    let now = clock.now();
    let done = Completion {
        outcome: OutcomeKind::Success,
        body: Some(b"ok"),
        resource_id: None,
        now,
        response_expires_at: now.plus(RESPONSE_TTL),
        key_expires_at: now.plus(KEY_TTL),
    };
    store
        .complete(&id, req.token, &done)
        .await
        .expect("complete");
    let _: () = admin.del(store.body_key(&id)).await.expect("DEL");
    let _: i64 = admin
        .rpush(store.body_key(&id), "garbage")
        .await
        .expect("RPUSH");
    corrupt(store.fetch(&id, clock.now()).await, "body is a list");
    corrupt(store.claim(&claim_req(&id, &clock)).await, "body is a list");

    // A key of the record holding another type.
    let id = record_id(&scope);
    let _: () = admin
        .set(store.record_key(&id), "garbage")
        .await
        .expect("SET");
    corrupt(store.fetch(&id, clock.now()).await, "record is a string");
    corrupt(
        store.claim(&claim_req(&id, &clock)).await,
        "record is a string",
    );
    let lost = store.release(&id, Token::random(), clock.now()).await;
    corrupt(lost, "release on a string");

    // Through the engine: a typed error, and the work does not run.
    let idem = engine(store.clone(), &clock);
    let runs = Counter::default();
    let r = runs.clone();
    let garbage_key = id.key().clone();
    let err = idem
        .execute(&scope, garbage_key, &request(), |_| async move {
            r.hit();
            Out::Success("no".into())
        })
        .await
        .expect_err("corrupt record");
    assert!(matches!(err, Error::CorruptRecord { .. }), "{err:?}");
    assert_eq!(err.http_status(), 500);
    assert_eq!(runs.get(), 0);
    fixture.teardown_checked().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_identities_stay_inside_their_hash_tag() {
    let fixture = support::standalone().await;
    let store = fixture.store.clone();
    let prefix = store.prefix().as_str().to_owned();
    let clock = ManualClock::starting_now();
    let idem = engine(store.clone(), &clock);
    let long = "k".repeat(255);
    let cases = [
        ("owner with spaces", "POST /x y", "key with spaces"),
        ("{owner}", "{op}", "{key}"),
        ("}{", "{", "}"),
        ("o*?[]\\", "op", "*"),
        ("o", "op", long.as_str()),
        ("\u{1F600} \u{00FC}ber", "op", "k"),
    ];
    for (i, (owner, op, key)) in cases.iter().enumerate() {
        let scope = Scope::new(*owner, *op).expect("scope");
        let reply = idem
            .execute(&scope, *key, &request(), move |_| async move {
                Out::Success(format!("case-{i}"))
            })
            .await
            .expect("call");
        assert!(!reply.is_replay(), "case {i} collided");
    }
    // Control characters never reach the store.
    assert!(Scope::new("o\nx", "op").is_err());
    assert!(Scope::new("o", "op\r\n").is_err());
    let newline_key = idem
        .execute(&scope(), "a\nb", &request(), |_| async {
            Out::Success("no".into())
        })
        .await;
    assert!(
        matches!(newline_key, Err(Error::InvalidKey(_))),
        "{newline_key:?}"
    );

    let keys = support::scan_keys(&fixture.nodes, &prefix).await;
    assert_eq!(
        keys.len(),
        2 * cases.len(),
        "one record and one body per case: {keys:?}"
    );
    for (_, key) in &keys {
        let rest = key.strip_prefix(&prefix).expect("prefixed");
        let (tag, suffix) = rest
            .strip_prefix('{')
            .and_then(|r| r.split_once('}'))
            .expect("a hash tag");
        assert_eq!(tag.len(), 64, "{key}");
        assert!(
            tag.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
            "{key}"
        );
        assert!(suffix == ":r" || suffix == ":b", "{key}");
    }
    // Redis Cluster puts both keys of a record in one slot.
    let mut admin = support::admin(&support::cluster::urls()[0]).await;
    for (_, key) in &keys {
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(&mut admin)
            .await
            .expect("KEYSLOT");
        let pair = if key.ends_with(":r") {
            key.replace("}:r", "}:b")
        } else {
            key.replace("}:b", "}:r")
        };
        let other: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&pair)
            .query_async(&mut admin)
            .await
            .expect("KEYSLOT");
        assert_eq!(slot, other, "record and body share a slot");
    }
    fixture.teardown_checked().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_and_prefixes_never_share_records() {
    let a = support::standalone().await;
    let b = support::standalone().await;
    let clock = ManualClock::starting_now();
    let (ia, ib) = (
        engine(a.store.clone(), &clock),
        engine(b.store.clone(), &clock),
    );
    let runs = Counter::default();
    let owner1 = Scope::new("owner-1", "POST /charges").expect("scope");
    let owner2 = Scope::new("owner-2", "POST /charges").expect("scope");
    let key = IdempotencyKey::random();
    for (idem, scope, name) in [
        (&ia, &owner1, "a1"),
        (&ia, &owner2, "a2"),
        (&ib, &owner1, "b1"),
    ] {
        let r = runs.clone();
        let reply = idem
            .execute(scope, key.clone(), &request(), move |_| async move {
                r.hit();
                Out::Success(name.into())
            })
            .await
            .expect("call");
        assert!(
            !reply.is_replay(),
            "{name} must execute, not replay another's record"
        );
    }
    assert_eq!(runs.get(), 3);
    for (idem, scope, name) in [
        (&ia, &owner1, "a1"),
        (&ia, &owner2, "a2"),
        (&ib, &owner1, "b1"),
    ] {
        let reply = idem
            .execute(scope, key.clone(), &request(), |_| async {
                Out::Success("no".into())
            })
            .await
            .expect("replay");
        assert_eq!(reply.into_result(), Ok(name.to_owned()));
    }
    a.teardown_checked().await;
    // Deleting a's keys left b's alone.
    assert_eq!(
        support::scan_keys(&b.nodes, b.store.prefix().as_str())
            .await
            .len(),
        2
    );
    b.teardown_checked().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_and_record_expire_natively_on_their_own_clocks() {
    let fixture = support::standalone().await;
    let store = fixture.store.clone();
    let mut admin = support::admin(&support::standalone_url()).await;
    let clock = ManualClock::starting_now();
    let id = record_id(&scope());
    let req = claim_req(&id, &clock);
    store.claim(&req).await.expect("claim");
    let in_flight: i64 = admin.pttl(store.record_key(&id)).await.expect("PTTL");
    assert!(
        in_flight > (KEY_TTL - Duration::from_secs(60)).as_millis() as i64,
        "{in_flight}"
    );
    let now = clock.now();
    let done = Completion {
        outcome: OutcomeKind::Success,
        body: Some(b"body"),
        resource_id: None,
        now,
        response_expires_at: now.plus(Duration::from_millis(300)),
        key_expires_at: now.plus(KEY_TTL),
    };
    store
        .complete(&id, req.token, &done)
        .await
        .expect("complete");
    let body_ttl: i64 = admin.pttl(store.body_key(&id)).await.expect("PTTL");
    let record_ttl: i64 = admin.pttl(store.record_key(&id)).await.expect("PTTL");
    assert!((1..=300).contains(&body_ttl), "body PTTL {body_ttl}");
    assert!(
        record_ttl > (KEY_TTL - Duration::from_secs(60)).as_millis() as i64,
        "record PTTL {record_ttl}"
    );
    // Redis drops the body by itself; the record stays and still answers.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let exists: bool = admin.exists(store.body_key(&id)).await.expect("EXISTS");
    assert!(!exists, "the body expired natively");
    let rec = store
        .fetch(&id, clock.now())
        .await
        .expect("fetch")
        .expect("record kept");
    assert_eq!(rec.outcome, Some(OutcomeKind::Success));
    assert_eq!(rec.response, None);
    fixture.teardown_checked().await;
}

fn corrupt<T: std::fmt::Debug>(r: Result<T, StoreError>, what: &str) {
    assert!(
        matches!(
            r,
            Err(StoreError::Corrupt {
                backend: "redis",
                ..
            })
        ),
        "{what}: {r:?}"
    );
}

/// 64 tasks on one key, spread over 8 separate connections, run the work
/// exactly once.
async fn sixty_four_tasks_on_eight_connections(fixture: support::RedisFixture, cluster: bool) {
    let clock = ManualClock::starting_now();
    let prefix = fixture.store.prefix().clone();
    let mut engines = Vec::new();
    for _ in 0..8 {
        let store = if cluster {
            RedisStore::connect_cluster(&fixture.nodes)
                .await
                .expect("cluster")
        } else {
            RedisStore::connect(&support::standalone_url())
                .await
                .expect("standalone")
        };
        engines.push(engine(store.with_key_prefix(prefix.clone()), &clock));
    }
    let (scope, key, runs) = (scope(), IdempotencyKey::random(), Counter::default());
    let barrier = Arc::new(tokio::sync::Barrier::new(64));
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let (idem, scope, key, runs, barrier) = (
                engines[i % 8].clone(),
                scope.clone(),
                key.clone(),
                runs.clone(),
                Arc::clone(&barrier),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                idem.execute(&scope, key, &request(), move |_| async move {
                    runs.hit();
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Out::Success(format!("winner-{i}"))
                })
                .await
            })
        })
        .collect();
    let mut results: HashMap<&str, usize> = HashMap::new();
    for t in tasks {
        let kind = match t.await.expect("join") {
            Ok(r) if r.is_replay() => "replayed",
            Ok(_) => "executed",
            Err(Error::InFlight { .. }) => "in_flight",
            Err(e) => panic!("unexpected error under contention: {e:?}"),
        };
        *results.entry(kind).or_default() += 1;
    }
    assert_eq!(runs.get(), 1, "exactly one execution: {results:?}");
    assert_eq!(results.get("executed"), Some(&1));
    assert_eq!(results.values().sum::<usize>(), 64);
    eprintln!("64 tasks / 8 connections (cluster: {cluster}): {results:?}");
    fixture.teardown_checked().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_key_sixty_four_tasks_eight_connections_standalone() {
    sixty_four_tasks_on_eight_connections(support::standalone().await, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_key_sixty_four_tasks_eight_connections_cluster() {
    sixty_four_tasks_on_eight_connections(support::cluster().await, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_thousand_distinct_keys_run_ten_thousand_times() {
    let fixture = support::standalone().await;
    let clock = ManualClock::starting_now();
    let idem = engine(fixture.store.clone(), &clock);
    let (scope, runs) = (scope(), Counter::default());
    let started = std::time::Instant::now();
    let tasks: Vec<_> = (0..64)
        .map(|t| {
            let (idem, scope, runs) = (idem.clone(), scope.clone(), runs.clone());
            tokio::spawn(async move {
                for i in (t..10_000).step_by(64) {
                    let r = runs.clone();
                    let reply = idem
                        .execute(
                            &scope,
                            format!("key-{i}"),
                            &request(),
                            move |_| async move {
                                r.hit();
                                Out::Success(format!("ch_{i}"))
                            },
                        )
                        .await
                        .expect("call");
                    assert!(!reply.is_replay() && reply.is_stored(), "key-{i}");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("join");
    }
    let took = started.elapsed();
    assert_eq!(runs.get(), 10_000);
    eprintln!("10,000 distinct keys (claim + complete each) in {took:?}");
    let keys = support::scan_keys(&fixture.nodes, fixture.store.prefix().as_str()).await;
    assert_eq!(keys.len(), 20_000, "one record and one body per key");
    for i in (0..10_000).step_by(997) {
        let reply = idem
            .execute(&scope, format!("key-{i}"), &request(), |_| async {
                Out::Success("no".into())
            })
            .await
            .expect("replay");
        assert_eq!(reply.into_result(), Ok(format!("ch_{i}")));
    }
    assert_eq!(runs.get(), 10_000);
    fixture.teardown_checked().await;
}

/// Counts of every command Redis ran (from `INFO commandstats`).
async fn commandstats(admin: &mut MultiplexedConnection) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(admin)
        .await
        .expect("INFO");
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

async fn delta<F: std::future::Future>(
    admin: &mut MultiplexedConnection,
    f: F,
) -> Vec<(String, u64)> {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(admin)
        .await
        .expect("RESETSTAT");
    f.await;
    let mut stats: Vec<(String, u64)> = commandstats(admin)
        .await
        .into_iter()
        .filter(|(name, _)| !name.starts_with("config") && name != "info")
        .collect();
    stats.sort();
    stats
}

fn counts(pairs: &[(&str, u64)]) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = pairs.iter().map(|(n, c)| ((*n).to_owned(), *c)).collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_transition_is_one_evalsha_with_few_inner_commands() {
    let server = Throwaway::start();
    let store = impatient_store(&server.url()).await;
    let mut admin = support::admin(&server.url()).await;
    let clock = ManualClock::starting_now();
    let id = record_id(&scope());
    // Run every script once first, so the counts below are the steady state
    // (no SCRIPT LOAD after NOSCRIPT).
    let req = claim_req(&id, &clock);
    store.claim(&req).await.expect("warm");
    store.checkpoint(&id, req.token, "x").await.expect("warm");
    store
        .extend_lease(&id, req.token, clock.now().plus(LEASE))
        .await
        .expect("warm");
    store
        .release(&id, req.token, clock.now())
        .await
        .expect("warm");
    let req = claim_req(&id, &clock);
    store.claim(&req).await.expect("warm");
    let now = clock.now();
    let warm = Completion {
        outcome: OutcomeKind::Success,
        body: Some(b"warm"),
        resource_id: None,
        now,
        response_expires_at: now.plus(RESPONSE_TTL),
        key_expires_at: now.plus(KEY_TTL),
    };
    store.complete(&id, req.token, &warm).await.expect("warm");
    store.fetch(&id, clock.now()).await.expect("warm");
    let id = record_id(&scope());
    let req = claim_req(&id, &clock);
    let now = clock.now();
    let done = Completion {
        outcome: OutcomeKind::Success,
        body: Some(&[7u8; 4096]),
        resource_id: Some("ch_1"),
        now,
        response_expires_at: now.plus(RESPONSE_TTL),
        key_expires_at: now.plus(KEY_TTL),
    };
    for (name, got, want) in [
        (
            "claim (new)",
            delta(&mut admin, async {
                assert!(matches!(
                    store.claim(&req).await,
                    Ok(ClaimOutcome::Claimed(_))
                ));
            })
            .await,
            counts(&[("evalsha", 1), ("hmget", 1), ("hset", 1), ("pexpire", 1)]),
        ),
        (
            "claim (in flight)",
            delta(&mut admin, async {
                assert!(matches!(
                    store.claim(&claim_req(&id, &clock)).await,
                    Ok(ClaimOutcome::Existing(_))
                ));
            })
            .await,
            counts(&[("evalsha", 1), ("hmget", 1)]),
        ),
        (
            "checkpoint",
            delta(&mut admin, async {
                store
                    .checkpoint(&id, req.token, "ch_1")
                    .await
                    .expect("checkpoint")
            })
            .await,
            counts(&[("evalsha", 1), ("hmget", 1), ("hset", 1)]),
        ),
        (
            "extend",
            delta(&mut admin, async {
                store
                    .extend_lease(&id, req.token, now.plus(LEASE))
                    .await
                    .expect("extend")
            })
            .await,
            counts(&[("evalsha", 1), ("hmget", 1), ("hset", 1)]),
        ),
        (
            "complete",
            delta(&mut admin, async {
                store
                    .complete(&id, req.token, &done)
                    .await
                    .expect("complete")
            })
            .await,
            counts(&[
                ("evalsha", 1),
                ("hmget", 1),
                ("hset", 1),
                ("pexpire", 1),
                ("set", 1),
            ]),
        ),
        (
            "claim (replay)",
            delta(&mut admin, async {
                let Ok(ClaimOutcome::Existing(rec)) = store.claim(&claim_req(&id, &clock)).await
                else {
                    panic!("a completed record stands");
                };
                assert_eq!(rec.response.as_deref(), Some([7u8; 4096].as_slice()));
            })
            .await,
            counts(&[("evalsha", 1), ("hmget", 1), ("get", 1)]),
        ),
        (
            "fetch",
            delta(&mut admin, async {
                store
                    .fetch(&id, clock.now())
                    .await
                    .expect("fetch")
                    .expect("record")
            })
            .await,
            counts(&[("evalsha", 1), ("hmget", 1), ("get", 1)]),
        ),
    ] {
        assert_eq!(got, want, "{name}");
        eprintln!("{name}: {got:?}");
    }
    let id2 = record_id(&scope());
    let req2 = claim_req(&id2, &clock);
    store.claim(&req2).await.expect("claim");
    let got = delta(&mut admin, async {
        store
            .release(&id2, req2.token, clock.now())
            .await
            .expect("release")
    })
    .await;
    assert_eq!(
        got,
        counts(&[("evalsha", 1), ("hmget", 1), ("hset", 1)]),
        "release"
    );
}
