//! Bodies kept inside their record (`with_inline_body_limit`, record layout
//! 2), on throwaway servers: replays of the exact bytes in one command,
//! tiered retention, bodies over the limit, records of layout 1 written by
//! the code before layout 2, and the commands each call costs.

mod support;

use std::time::Duration;

use idem_core::clock::{Clock, ManualClock};
use idem_core::store::OutcomeKind;
use idem_core::store::{ClaimOutcome, Store, StoreError, StoredRecord, Token};
use idem_core::{Error, RecordId};
use idem_redis::RedisStore;
use idem_redis::redis::{self, AsyncCommands};
use support::scenario::{
    Counter, KEY_TTL, LEASE, Out, RESPONSE_TTL, claim_req, counted, engine, record_id, request,
    scope, success,
};
use support::server::Throwaway;
use support::stats::{counts, delta};

/// A store on a throwaway server keeping bodies of up to `limit` bytes
/// inside their record.
async fn store(server: &Throwaway, limit: usize) -> RedisStore {
    RedisStore::connect(&server.url())
        .await
        .expect("connect")
        .with_prefix(&support::unique_prefix())
        .expect("prefix")
        .with_inline_body_limit(limit)
}

/// Every byte value, twice: a body that is not UTF-8 and not JSON.
fn all_bytes() -> Vec<u8> {
    (0..=255u8).chain((0..=255u8).rev()).collect()
}

async fn existing(store: &RedisStore, id: &RecordId, clock: &ManualClock) -> StoredRecord {
    match store.claim(&claim_req(id, clock)).await.expect("claim") {
        ClaimOutcome::Existing(rec) => rec,
        ClaimOutcome::Claimed(c) => panic!("claimed again: {c:?}"),
    }
}

async fn value(admin: &mut redis::aio::MultiplexedConnection, key: &str) -> Option<Vec<u8>> {
    admin.get(key).await.expect("GET")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_replay_is_one_command_and_returns_the_exact_bytes() {
    let server = Throwaway::start();
    let store = store(&server, 1024).await;
    assert_eq!(store.inline_body_limit(), 1024);
    let mut admin = support::admin(&server.url()).await;
    let clock = ManualClock::starting_now();
    // Load the script first: the counts below are the steady state.
    let warm = record_id(&scope());
    let req = claim_req(&warm, &clock);
    store.claim(&req).await.expect("warm");
    let body = b"warm".as_slice();
    store
        .complete(&warm, req.token, &success(clock.now(), body, None))
        .await
        .expect("warm");

    let id = record_id(&scope());
    let req = claim_req(&id, &clock);
    let body = all_bytes();
    let claim = delta(&mut admin, async {
        assert!(matches!(
            store.claim(&req).await,
            Ok(ClaimOutcome::Claimed(c)) if c.attempt == 1
        ));
    })
    .await;
    assert_eq!(claim, counts(&[("set", 1)]), "a new key's claim");
    let complete = delta(&mut admin, async {
        store
            .complete(&id, req.token, &success(clock.now(), &body, Some("ch_1")))
            .await
            .expect("complete");
    })
    .await;
    assert_eq!(
        complete,
        counts(&[("evalsha", 1), ("get", 1), ("set", 1)]),
        "the completion: one script, reading and writing the record only"
    );
    let v = value(&mut admin, &store.record_key(&id))
        .await
        .expect("record");
    assert_eq!(v[0], 2, "layout 2");
    assert!(
        v.windows(body.len()).any(|w| w == body),
        "the body is inside"
    );
    let body_key: bool = admin.exists(store.body_key(&id)).await.expect("EXISTS");
    assert!(!body_key, "no body key");

    for round in 0..2 {
        let replay = delta(&mut admin, async {
            let rec = existing(&store, &id, &clock).await;
            assert_eq!(rec.response.as_deref(), Some(body.as_slice()));
            assert_eq!(rec.resource_id.as_deref(), Some("ch_1"));
            assert_eq!(rec.outcome, Some(OutcomeKind::Success));
            assert_eq!(rec.attempt, 1);
        })
        .await;
        assert_eq!(replay, counts(&[("set", 1)]), "replay {round}: one command");
    }
    let fetched = store
        .fetch(&id, clock.now())
        .await
        .expect("fetch")
        .expect("record");
    assert_eq!(fetched.response.as_deref(), Some(body.as_slice()));

    // A body over 512 bytes is appended to the record by the script
    // (`APPEND`, cheaper than copying it into a new Lua string); the replay
    // is the same one command.
    let long = record_id(&scope());
    let req = claim_req(&long, &clock);
    store.claim(&req).await.expect("claim");
    let long_body = [all_bytes(), b"tail".to_vec()].concat();
    let complete = delta(&mut admin, async {
        store
            .complete(&long, req.token, &success(clock.now(), &long_body, None))
            .await
            .expect("complete");
    })
    .await;
    assert_eq!(
        complete,
        counts(&[("append", 1), ("evalsha", 1), ("get", 1), ("set", 1)])
    );
    let replay = delta(&mut admin, async {
        let rec = existing(&store, &long, &clock).await;
        assert_eq!(rec.response.as_deref(), Some(long_body.as_slice()));
    })
    .await;
    assert_eq!(replay, counts(&[("set", 1)]));

    // Through the engine: the work ran once, the replay is the first reply.
    let idem = engine(store.clone(), &clock);
    let (scope, runs) = (scope(), Counter::default());
    for round in 0..3 {
        let reply = counted(&idem, &scope, "k", "ch_é \u{1F600}", &runs)
            .await
            .expect("execute");
        assert_eq!(reply.is_replay(), round > 0);
        assert_eq!(reply.into_result(), Ok("ch_é \u{1F600}".to_owned()));
    }
    assert_eq!(runs.get(), 1);

    // Token-checked writes on a completed record of layout 2 are lost
    // leases, not corrupt records.
    let now = clock.now();
    assert!(matches!(
        store.release(&id, req.token, now).await,
        Err(StoreError::LeaseLost)
    ));
    assert!(matches!(
        store.save_resource_id(&id, req.token, "x").await,
        Err(StoreError::LeaseLost)
    ));
    assert!(matches!(
        store.extend_lease(&id, req.token, now.plus(LEASE)).await,
        Err(StoreError::LeaseLost)
    ));
    assert!(matches!(
        store
            .complete(&id, Token::random(), &success(now, b"other", None))
            .await,
        Err(StoreError::LeaseLost)
    ));
    let rec = existing(&store, &id, &clock).await;
    assert_eq!(rec.response.as_deref(), Some(body.as_slice()), "unchanged");
}

/// Tiered retention: after `response_ttl` the body kept inside the record is
/// no longer returned (the reader checks the deadline) though Redis still
/// holds it, the key still answers as known (the engine's "response
/// expired", as with a body in the body key), and a later rewrite of the
/// record drops the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_body_is_not_returned_after_its_response_ttl() {
    let server = Throwaway::start();
    let store = store(&server, 1024).await;
    let mut admin = support::admin(&server.url()).await;
    let clock = ManualClock::starting_now();
    let idem = engine(store.clone(), &clock);
    let (scope, runs, request) = (scope(), Counter::default(), request());
    let run = || {
        let r = runs.clone();
        idem.execute(&scope, "k", &request, |attempt| async move {
            r.hit();
            attempt.save_resource_id("ch_1").await.expect("saved");
            Out::Success("ch_1".into())
        })
    };
    assert!(!run().await.expect("first").is_replay());
    assert!(run().await.expect("replay").is_replay());
    let id = RecordId::new(
        scope.clone(),
        idem_core::IdempotencyKey::parse("k").expect("key"),
    );
    let record_key = store.record_key(&id);
    let before = value(&mut admin, &record_key).await.expect("record");
    assert_eq!(before[0], 2);

    clock.advance(RESPONSE_TTL);
    let err = run().await.expect_err("the response expired");
    assert!(
        matches!(&err, Error::ResponseExpired { resource_id } if resource_id.as_deref() == Some("ch_1")),
        "{err:?}"
    );
    assert_eq!(runs.get(), 1, "the key still answers: the work did not run");
    let rec = existing(&store, &id, &clock).await;
    assert_eq!(rec.response, None);
    assert_eq!(rec.outcome, Some(OutcomeKind::Success));
    let fetched = store.fetch(&id, clock.now()).await.expect("fetch");
    assert_eq!(fetched.expect("record").response, None);
    // The reader's check hides it; Redis still holds it until a rewrite or
    // the key's own expiry (the memory cost the crate docs measure).
    assert_eq!(value(&mut admin, &record_key).await, Some(before.clone()));
    let pttl: i64 = admin.pttl(&record_key).await.expect("PTTL");
    assert!(
        pttl > (KEY_TTL - RESPONSE_TTL - Duration::from_secs(60)).as_millis() as i64,
        "the key lives on: {pttl}"
    );
}

/// A completion retried by the attempt that completed (a lost reply)
/// rewrites the record: past the response expiry that rewrite drops the
/// body kept inside it, and the record goes back to layout 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewrite_after_the_response_expiry_drops_the_inline_body() {
    let server = Throwaway::start();
    let store = store(&server, 1024).await;
    let mut admin = support::admin(&server.url()).await;
    let clock = ManualClock::starting_now();
    let id = record_id(&scope());
    let req = claim_req(&id, &clock);
    store.claim(&req).await.expect("claim");
    let body = all_bytes();
    let first = success(clock.now(), &body, Some("ch_1"));
    store.complete(&id, req.token, &first).await.expect("done");
    let with_body = value(&mut admin, &store.record_key(&id))
        .await
        .expect("record");

    // Before the response expiry a retry changes nothing.
    clock.advance(RESPONSE_TTL - Duration::from_millis(1));
    let retry = success(clock.now(), &body, Some("ch_1"));
    store
        .complete(&id, req.token, &retry)
        .await
        .expect("a retry is done");
    assert_eq!(
        value(&mut admin, &store.record_key(&id)).await,
        Some(with_body.clone())
    );

    clock.advance(Duration::from_millis(1));
    let retry = success(clock.now(), &body, Some("ch_1"));
    store
        .complete(&id, req.token, &retry)
        .await
        .expect("a retry is done");
    let without = value(&mut admin, &store.record_key(&id))
        .await
        .expect("record");
    assert_eq!(without[0], 1, "back to layout 1");
    assert_eq!(
        without.len(),
        with_body.len() - body.len() - 4,
        "the body and its length dropped"
    );
    assert_eq!(without[1..], with_body[1..without.len()]);
    let rec = existing(&store, &id, &clock).await;
    assert_eq!(
        (rec.response, rec.resource_id.as_deref(), rec.outcome),
        (None, Some("ch_1"), Some(OutcomeKind::Success))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_goes_to_the_body_key_and_still_replays() {
    let server = Throwaway::start();
    let store = store(&server, 300).await;
    let mut admin = support::admin(&server.url()).await;
    let clock = ManualClock::starting_now();
    // At the limit: inside. One byte over, and a body staged (over 1 KiB):
    // in the body key, the record in layout 1.
    let at_limit: Vec<u8> = all_bytes().into_iter().take(300).collect();
    let over: Vec<u8> = all_bytes().into_iter().take(301).collect();
    let staged: Vec<u8> = all_bytes().repeat(8);
    for (body, inside) in [(&at_limit, true), (&over, false), (&staged, false)] {
        let id = record_id(&scope());
        let req = claim_req(&id, &clock);
        store.claim(&req).await.expect("claim");
        store
            .complete(&id, req.token, &success(clock.now(), body, None))
            .await
            .expect("complete");
        let v = value(&mut admin, &store.record_key(&id))
            .await
            .expect("record");
        let in_key = value(&mut admin, &store.body_key(&id)).await;
        assert_eq!(v[0], if inside { 2 } else { 1 }, "{} bytes", body.len());
        assert_eq!(in_key.is_some(), !inside, "{} bytes", body.len());
        let replay = delta(&mut admin, async {
            let rec = existing(&store, &id, &clock).await;
            assert_eq!(rec.response.as_deref(), Some(body.as_slice()));
        })
        .await;
        let want = if inside {
            counts(&[("set", 1)])
        } else {
            // The claim, then the body key's `GET`: one more round trip.
            counts(&[("get", 1), ("set", 1)])
        };
        assert_eq!(replay, want, "{} bytes", body.len());
        let rec = store
            .fetch(&id, clock.now())
            .await
            .expect("fetch")
            .expect("record");
        assert_eq!(rec.response.as_deref(), Some(body.as_slice()));
    }
    // Off: every body goes to the body key, and the claim reads it in the
    // same pipeline.
    let off = store.clone().with_inline_body_limit(0);
    let id = record_id(&scope());
    let req = claim_req(&id, &clock);
    off.claim(&req).await.expect("claim");
    off.complete(&id, req.token, &success(clock.now(), b"small", None))
        .await
        .expect("complete");
    let v = value(&mut admin, &off.record_key(&id))
        .await
        .expect("record");
    assert_eq!(v[0], 1);
    let replay = delta(&mut admin, async {
        let rec = existing(&off, &id, &clock).await;
        assert_eq!(rec.response.as_deref(), Some(b"small".as_slice()));
    })
    .await;
    assert_eq!(replay, counts(&[("get", 1), ("set", 1)]));
}

/// A record value of layout 1, byte by byte as the table in
/// `src/record.rs` (and the code before layout 2) has it.
#[allow(clippy::too_many_arguments)]
fn layout_1(
    state: u8,
    token: i64,
    attempt: u32,
    expiries: [i64; 3],
    fingerprint: &[u8; 32],
    outcome: u8,
    id: &RecordId,
    resource_id: Option<&str>,
) -> Vec<u8> {
    let [lease, key, response] = expiries;
    let (o, p, k) = (id.owner(), id.operation(), id.key().as_str());
    let mut v = vec![1, state];
    v.extend_from_slice(&token.to_be_bytes());
    v.extend_from_slice(&attempt.to_be_bytes());
    for t in [lease, key, response] {
        v.extend_from_slice(&t.to_be_bytes());
    }
    v.extend_from_slice(fingerprint);
    v.push(outcome);
    for part in [o, p, k] {
        v.extend_from_slice(&u16::try_from(part.len()).expect("short").to_be_bytes());
    }
    v.push(u8::from(resource_id.is_some()));
    assert_eq!(v.len(), 78, "the fixed header");
    for part in [o, p, k, resource_id.unwrap_or_default()] {
        v.extend_from_slice(part.as_bytes());
    }
    v
}

/// Records of layout 1 written by the code before layout 2 (here by hand)
/// are read, replayed and completed by a store keeping bodies inside their
/// record, and a record of layout 2 by a store without the option (a
/// deployment where instances differ in the option).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_layout_1_are_read_replayed_and_completed() {
    let server = Throwaway::start();
    let store = store(&server, 1024).await;
    let off = store.clone().with_inline_body_limit(0);
    let mut admin = support::admin(&server.url()).await;
    let clock = ManualClock::starting_now();
    let scope = scope();
    let now = clock.now().as_unix_millis();
    let fp = *claim_req(&record_id(&scope), &clock).fingerprint.as_bytes();
    let day = 86_400_000;

    // Completed, its body in the body key (version 1, the token, the body).
    let old = record_id(&scope);
    let token = Token::random().as_i64();
    let record = layout_1(
        b'c',
        token,
        3,
        [now, now + 30 * day, now + day],
        &fp,
        b's',
        &old,
        Some("ch_old"),
    );
    let mut body_value = vec![1];
    body_value.extend_from_slice(&token.to_be_bytes());
    body_value.extend_from_slice(&all_bytes());
    let _: () = admin
        .pset_ex(store.record_key(&old), &record, 30 * 86_400_000)
        .await
        .expect("SET");
    let _: () = admin
        .pset_ex(store.body_key(&old), &body_value, 86_400_000)
        .await
        .expect("SET");
    for s in [&store, &off] {
        let rec = existing(s, &old, &clock).await;
        assert_eq!(rec.response.as_deref(), Some(all_bytes().as_slice()));
        assert_eq!(
            (rec.attempt, rec.resource_id.as_deref()),
            (3, Some("ch_old"))
        );
        let rec = s
            .fetch(&old, clock.now())
            .await
            .expect("fetch")
            .expect("record");
        assert_eq!(rec.response.as_deref(), Some(all_bytes().as_slice()));
    }
    // Past its response expiry: known, no body.
    let later = ManualClock::new(clock.now().plus(Duration::from_millis(day as u64)));
    let rec = existing(&store, &old, &later).await;
    assert_eq!(
        (rec.response, rec.outcome),
        (None, Some(OutcomeKind::Success))
    );

    // In flight under a token, a resource id saved: the holder completes it
    // (the body then kept inside the record), and both stores replay it.
    let flying = record_id(&scope);
    let token = Token::random();
    let record = layout_1(
        b'f',
        token.as_i64(),
        2,
        [now + 60_000, now + 30 * day, 0],
        &fp,
        0,
        &flying,
        Some("ch_saved"),
    );
    let _: () = admin
        .pset_ex(store.record_key(&flying), &record, 30 * 86_400_000)
        .await
        .expect("SET");
    let lost = store
        .complete(&flying, Token::random(), &success(clock.now(), b"x", None))
        .await;
    assert!(matches!(lost, Err(StoreError::LeaseLost)), "{lost:?}");
    store
        .complete(&flying, token, &success(clock.now(), &all_bytes(), None))
        .await
        .expect("the holder completes");
    let v = value(&mut admin, &store.record_key(&flying))
        .await
        .expect("record");
    assert_eq!(v[0], 2, "rewritten in layout 2");
    assert_eq!(v[2..22], record[2..22], "token, attempt, lease kept");
    assert_eq!(v[38..70], record[38..70], "fingerprint kept");
    for s in [&store, &off] {
        let rec = existing(s, &flying, &clock).await;
        assert_eq!(rec.response.as_deref(), Some(all_bytes().as_slice()));
        assert_eq!(
            (rec.attempt, rec.resource_id.as_deref()),
            (2, Some("ch_saved"))
        );
    }

    // Released: taken over (attempt 3), then completed with a new id.
    let released = record_id(&scope);
    let record = layout_1(
        b'r',
        Token::random().as_i64(),
        2,
        [now, now + 30 * day, 0],
        &fp,
        0,
        &released,
        None,
    );
    let _: () = admin
        .pset_ex(store.record_key(&released), &record, 30 * 86_400_000)
        .await
        .expect("SET");
    let req = claim_req(&released, &clock);
    let Ok(ClaimOutcome::Claimed(c)) = store.claim(&req).await else {
        panic!("a released record is taken over");
    };
    assert_eq!(c.attempt, 3);
    store
        .complete(
            &released,
            req.token,
            &success(clock.now(), b"new", Some("ch_3")),
        )
        .await
        .expect("complete");
    let rec = existing(&off, &released, &clock).await;
    assert_eq!(
        (
            rec.response.as_deref(),
            rec.resource_id.as_deref(),
            rec.attempt
        ),
        (Some(b"new".as_slice()), Some("ch_3"), 3)
    );
}
