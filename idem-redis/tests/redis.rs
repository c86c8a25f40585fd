//! Redis-specific behaviour on the shared server and the cluster: NOSCRIPT
//! reload on every primary, garbage records, the key layout, records of the
//! hash layout of builds before 0.1 refused, isolation, native expiry,
//! contention and volume.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use idem_core::clock::{Clock, ManualClock};
use idem_core::store::OutcomeKind;
use idem_core::store::{Completion, Store, StoreError, Token};
use idem_core::{Error, IdempotencyKey, Scope};
use idem_redis::RedisStore;
use idem_redis::redis::{self, AsyncCommands};
use support::scenario::{
    Counter, KEY_TTL, LEASE, Out, RESPONSE_TTL, claim_req, complete, counted, engine, record_id,
    request, scope, success,
};

/// A fresh store on the shared server, a handle on it, a plain connection
/// to the server (to read what the store wrote), and a clock at the current
/// time.
async fn standalone_with_admin() -> (
    support::RedisFixture,
    RedisStore,
    redis::aio::MultiplexedConnection,
    ManualClock,
) {
    let fixture = support::standalone().await;
    let store = fixture.store.clone();
    let admin = support::admin(&support::standalone_url()).await;
    (fixture, store, admin, ManualClock::starting_now())
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
            let reply = counted(&idem, &scope, key.as_str(), "ch", &runs)
                .await
                .expect("EVALSHA falls back to SCRIPT LOAD on the primaries");
            assert_eq!(reply.is_replay(), round > 0);
        }
    }
    assert_eq!(runs.get(), keys.len());
    fixture.teardown_checked().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_written_by_hand_is_corrupt_not_a_panic() {
    let (fixture, store, mut admin, clock) = standalone_with_admin().await;
    let scope = scope();

    // Each edit damages one field of the record's value (layout 1, see
    // `src/record.rs`); offsets from 0.
    type Edit = fn(&mut Vec<u8>);
    let edits: [(&str, bool, Edit); 9] = [
        ("version", false, |v| v[0] = 9),
        ("state", false, |v| v[1] = b'?'),
        ("attempt 0", false, |v| v[10..14].copy_from_slice(&[0; 4])),
        ("outcome", true, |v| v[70] = b'?'),
        ("resource flag", false, |v| v[77] = 7),
        ("identity cut short", false, |v| v.truncate(v.len() - 1)),
        ("header cut short", false, |v| v.truncate(40)),
        ("owner not UTF-8", false, |v| v[78] = 0xff),
        ("resource id not UTF-8", true, |v| {
            let n = v.len();
            v[n - 1] = 0xff;
        }),
    ];
    for (what, completed, edit) in edits {
        let id = record_id(&scope);
        let req = claim_req(&id, &clock);
        store.claim(&req).await.expect("claim");
        if completed {
            complete(&store, &req, &clock, b"ok", Some("r")).await;
        }
        let mut value: Vec<u8> = admin.get(store.record_key(&id)).await.expect("GET");
        edit(&mut value);
        let _: () = redis::cmd("SET")
            .arg(store.record_key(&id))
            .arg(value)
            .arg("KEEPTTL")
            .query_async(&mut admin)
            .await
            .expect("SET");
        corrupt(store.fetch(&id, clock.now()).await, what);
        corrupt(store.claim(&claim_req(&id, &clock)).await, what);
    }

    // A body replaced by another type.
    let id = record_id(&scope);
    let req = claim_req(&id, &clock);
    store.claim(&req).await.expect("claim");
    complete(&store, &req, &clock, b"ok", None).await;
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
        assert!(suffix == ":r" || suffix == ":v", "{key}");
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
            key.replace("}:r", "}:v")
        } else {
            key.replace("}:v", "}:r")
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
        let reply = counted(idem, scope, key.clone(), name, &runs)
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
    let (fixture, store, mut admin, clock) = standalone_with_admin().await;
    let id = record_id(&scope());
    let req = claim_req(&id, &clock);
    store.claim(&req).await.expect("claim");
    let in_flight: i64 = admin.pttl(store.record_key(&id)).await.expect("PTTL");
    assert!(
        in_flight > (KEY_TTL - Duration::from_secs(60)).as_millis() as i64,
        "{in_flight}"
    );
    let now = clock.now();
    let done = Completion::new(
        OutcomeKind::Success,
        Some(b"body"),
        None,
        now,
        now.plus(Duration::from_millis(300)),
        now.plus(KEY_TTL),
    );
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

/// `count_states` follows the engine's clock for what is live, and its
/// `expired` is always 0: a record whose key expired on the engine's clock
/// while Redis still holds it (its native TTL has not fired) is counted in no
/// state, since the engine treats it as absent and Redis drops it by itself,
/// with no purge to wait for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_leave_out_records_expired_on_the_engine_clock_before_redis_drops_them() {
    use idem_core::store::AdminStore;

    let (fixture, store, mut admin, clock) = standalone_with_admin().await;
    let scope = scope();
    let mut ids = Vec::new();
    for completed in [false, true, true] {
        let id = record_id(&scope);
        let req = claim_req(&id, &clock);
        store.claim(&req).await.expect("claim");
        if completed {
            complete(&store, &req, &clock, b"body", None).await;
        }
        ids.push(id);
    }
    let c = store.count_states(clock.now()).await.expect("count");
    assert_eq!(
        (c.in_flight, c.stuck, c.released, c.completed, c.expired),
        (1, 0, 0, 2, 0),
        "{c:?}"
    );
    clock.advance(KEY_TTL + LEASE);
    for id in &ids {
        let pttl: i64 = admin.pttl(store.record_key(id)).await.expect("PTTL");
        assert!(pttl > 0, "Redis still holds the record: PTTL {pttl}");
        assert!(
            store.fetch(id, clock.now()).await.expect("fetch").is_none(),
            "the engine sees no record"
        );
    }
    let c = store.count_states(clock.now()).await.expect("count");
    assert_eq!(c, idem_core::store::StateCounts::default(), "{c:?}");
    fixture.teardown_checked().await;
}

/// `migrate` exists on every backend; on Redis it writes nothing.
/// `connect_with` takes the client and the connection settings apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_is_a_no_op_and_connect_with_takes_the_settings() {
    let url = support::standalone_url();
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_secs(3)));
    let store = RedisStore::connect_with(config, redis::Client::open(url.as_str()).unwrap())
        .await
        .expect("connect")
        .with_prefix(&support::unique_prefix())
        .expect("prefix");
    store.migrate().await.expect("nothing to migrate");
    let fixture = support::RedisFixture::from_store(store, vec![url]);
    assert!(
        support::scan_keys(&fixture.nodes, fixture.store.prefix().as_str())
            .await
            .is_empty(),
        "migrate wrote nothing"
    );
    let clock = ManualClock::starting_now();
    let id = record_id(&scope());
    fixture
        .store
        .claim(&claim_req(&id, &clock))
        .await
        .expect("the store works");
    fixture.teardown_checked().await;
}

/// A lease extended past the key's expiry moves the native TTL too, so Redis
/// cannot drop an in-flight record while its lease holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extending_a_lease_past_the_key_moves_the_native_ttl() {
    let (fixture, store, mut admin, clock) = standalone_with_admin().await;
    let id = record_id(&scope());
    let mut req = claim_req(&id, &clock);
    req.key_expires_at = req.now.plus(Duration::from_secs(120));
    store.claim(&req).await.expect("claim");
    let before: i64 = admin.pttl(store.record_key(&id)).await.expect("PTTL");
    assert!((110_000..=120_000).contains(&before), "{before}");
    let until = req.now.plus(Duration::from_secs(3600));
    store
        .extend_lease(&id, req.token, until)
        .await
        .expect("extend");
    let after: i64 = admin.pttl(store.record_key(&id)).await.expect("PTTL");
    assert!(
        (3_590_000..=3_600_000).contains(&after),
        "native TTL must cover the lease: {after}"
    );
    let rec = store
        .fetch(&id, req.now.plus(Duration::from_secs(3000)))
        .await
        .expect("fetch")
        .expect("leased record visible past key_ttl");
    assert_eq!(rec.key_expires_at, until);
    // A shorter extension leaves the (longer) key expiry alone.
    store
        .extend_lease(&id, req.token, req.now.plus(Duration::from_secs(60)))
        .await
        .expect("extend");
    let kept: i64 = admin.pttl(store.record_key(&id)).await.expect("PTTL");
    assert!(kept >= 3_590_000, "{kept}");
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
    let tasks = idem_core::testkit::race(64, |i| {
        let (idem, scope, key, runs) = (
            engines[i % 8].clone(),
            scope.clone(),
            key.clone(),
            runs.clone(),
        );
        async move {
            idem.execute(&scope, key, &request(), move |_| async move {
                runs.hit();
                tokio::time::sleep(Duration::from_millis(50)).await;
                Out::Success(format!("winner-{i}"))
            })
            .await
        }
    });
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

/// Writes a record in the hash layout of the builds before 0.1 by hand, as
/// their claim and complete scripts left it; returns its token.
async fn write_hash_layout(
    admin: &mut redis::aio::MultiplexedConnection,
    store: &RedisStore,
    id: &idem_core::RecordId,
    state: &str,
    now: idem_core::clock::Timestamp,
) -> Token {
    let token = Token::random();
    let record = store.record_key(id);
    let req = claim_req(id, &ManualClock::new(now));
    let mut fields: Vec<(&str, Vec<u8>)> = vec![
        ("f", req.fingerprint.as_bytes().to_vec()),
        ("s", state.into()),
        ("t", token.as_i64().to_string().into()),
        ("a", b"2".to_vec()),
        ("l", now.plus(LEASE).as_unix_millis().to_string().into()),
        ("k", now.plus(KEY_TTL).as_unix_millis().to_string().into()),
        ("x", b"ch_legacy".to_vec()),
        ("io", id.owner().into()),
        ("ip", id.operation().into()),
        ("ik", id.key().as_str().into()),
    ];
    if state == "completed" {
        fields.push(("o", b"success".to_vec()));
        let e = now.plus(RESPONSE_TTL).as_unix_millis();
        fields.push(("e", e.to_string().into()));
        let _: () = admin
            .pset_ex(
                format!("{}:b", record.trim_end_matches(":r")),
                "legacy body",
                3_600_000,
            )
            .await
            .expect("SET");
    }
    let _: () = admin.hset_multiple(&record, &fields).await.expect("HSET");
    let _: bool = admin.pexpire(&record, 86_400_000).await.expect("PEXPIRE");
    token
}

/// A record written in the hash layout of the builds before 0.1 is refused
/// with a typed error that says what to do, by every call that meets it: it
/// is never read, rewritten or claimed over, and stays as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_the_hash_layout_are_refused_never_read() {
    use idem_core::store::{AdminStore, InFlightQuery};

    let (fixture, store, mut admin, clock) = standalone_with_admin().await;
    let scope = scope();
    let refused = |what: &str, r: Result<(), StoreError>| match r {
        Err(StoreError::Corrupt { detail, .. }) => {
            assert!(detail.contains("before 0.1"), "{what}: {detail}");
            assert!(detail.contains("delete the key"), "{what}: {detail}");
        }
        other => panic!("{what}: expected Corrupt, got {other:?}"),
    };

    let done = record_id(&scope);
    write_hash_layout(&mut admin, &store, &done, "completed", clock.now()).await;
    refused(
        "claim",
        store.claim(&claim_req(&done, &clock)).await.map(drop),
    );
    refused("fetch", store.fetch(&done, clock.now()).await.map(drop));

    let flying = record_id(&scope);
    let token = write_hash_layout(&mut admin, &store, &flying, "in_flight", clock.now()).await;
    let now = clock.now();
    refused(
        "complete",
        store
            .complete(&flying, token, &success(now, b"new body", None))
            .await,
    );
    refused("release", store.release(&flying, token, now).await);
    let listing = store
        .list_in_flight(&InFlightQuery {
            now,
            lease_before: now.plus(LEASE),
            cursor: None,
            limit: 100,
        })
        .await;
    refused("listing", listing.map(drop));

    for id in [&done, &flying] {
        let kind: String = redis::cmd("TYPE")
            .arg(store.record_key(id))
            .query_async(&mut admin)
            .await
            .expect("TYPE");
        assert_eq!(kind, "hash", "left as it was");
    }
    let old_body: bool = admin
        .exists(format!(
            "{}:b",
            store.record_key(&done).trim_end_matches(":r")
        ))
        .await
        .expect("EXISTS");
    assert!(old_body, "its body is left as it was");
    fixture.teardown_checked().await;
}

/// A completion stages a large body under its own token's key; an attempt
/// whose lease was lost leaves the holder's body alone and nothing staged
/// behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_off_completion_leaves_the_body_and_no_staged_key() {
    let fixture = support::standalone().await;
    let store = fixture.store.clone();
    let clock = ManualClock::starting_now();
    let id = record_id(&scope());
    let first = claim_req(&id, &clock);
    store.claim(&first).await.expect("claim");
    clock.advance(LEASE + Duration::from_secs(1));
    let second = claim_req(&id, &clock);
    let taken = store.claim(&second).await.expect("takeover");
    assert!(
        matches!(&taken, idem_core::store::ClaimOutcome::Claimed(c) if c.attempt == 2),
        "{taken:?}"
    );
    let now = clock.now();
    let done = |body: &'static [u8]| success(now, body, None);
    store
        .complete(&id, second.token, &done(&[2; 2000]))
        .await
        .expect("the holder completes");
    let late = store.complete(&id, first.token, &done(&[1; 2000])).await;
    assert!(matches!(late, Err(StoreError::LeaseLost)), "{late:?}");
    let rec = store
        .fetch(&id, clock.now())
        .await
        .expect("fetch")
        .expect("record");
    assert_eq!(rec.response.as_deref(), Some([2; 2000].as_slice()));
    let keys = support::scan_keys(&fixture.nodes, store.prefix().as_str()).await;
    assert_eq!(keys.len(), 2, "record and body only: {keys:?}");
    assert!(keys.iter().all(|(_, k)| !k.contains("}:s:")), "{keys:?}");
    fixture.teardown_checked().await;
}
