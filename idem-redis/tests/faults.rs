//! Faults and costs, on throwaway servers (never the shared one): scripts
//! reloaded after `SCRIPT FLUSH`, a connection killed mid-call, a restart
//! without persistence, and the commands each transition costs.

mod support;

use std::time::Duration;

use idem_core::clock::{Clock, ManualClock};
use idem_core::store::{ClaimOutcome, Store, StoreError};
use idem_core::{Error, IdempotencyKey, RecordId};
use idem_redis::RedisStore;
use idem_redis::redis::aio::{ConnectionManagerConfig, MultiplexedConnection};
use idem_redis::redis::{self, Client};
use support::scenario::{
    Counter, LEASE, Out, claim_req, complete, counted, engine, record_id, request, scope, success,
};
use support::server::Throwaway;
use support::stats::{counts, delta};

/// A store on `url` that gives up reconnecting quickly (fault tests).
async fn impatient_store(url: &str) -> RedisStore {
    let config = ConnectionManagerConfig::new()
        .set_number_of_retries(1)
        .set_connection_timeout(Some(Duration::from_millis(500)))
        .set_response_timeout(Some(Duration::from_secs(2)));
    let store = RedisStore::connect_with(config, Client::open(url).expect("url"))
        .await
        .expect("connect")
        .with_prefix(&support::unique_prefix())
        .expect("prefix");
    support::batched_if_asked(store)
}

/// Polls until the store answers again (it reconnects on its own).
async fn wait_until_reachable(store: &RedisStore, id: &RecordId, now: idem_core::clock::Timestamp) {
    for _ in 0..250 {
        if store.fetch(id, now).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the store did not reconnect within 5 s");
}

/// Waits until another client has a parsed command waiting (`argv-mem`
/// above zero in `CLIENT LIST`): the call is really in flight, held by the
/// pause.
async fn wait_until_a_command_is_paused(admin: &mut MultiplexedConnection) {
    let me: i64 = redis::cmd("CLIENT")
        .arg("ID")
        .query_async(admin)
        .await
        .expect("CLIENT ID");
    for _ in 0..250 {
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(admin)
            .await
            .expect("CLIENT LIST");
        let waiting = list.lines().any(|l| {
            let field = |name: &str| l.split(' ').find_map(|f| f.strip_prefix(name));
            field("id=") != Some(me.to_string().as_str())
                && field("argv-mem=")
                    .and_then(|v| v.parse::<u64>().ok())
                    .is_some_and(|m| m > 0)
        });
        if waiting {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the claim never reached the paused server");
}

async fn kill_other_clients(admin: &mut MultiplexedConnection) -> i64 {
    redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"][..])
        .query_async(admin)
        .await
        .expect("CLIENT KILL")
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
        let reply = counted(&idem, &scope, "flush-key", "ch_1", &runs)
            .await
            .expect("EVALSHA falls back to loading the script");
        assert_eq!(reply.is_replay(), round > 0);
    }
    assert_eq!(runs.get(), 1);
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
        tokio::spawn(async move { counted(&idem, &scope, "kill-key", "ch_1", &r).await })
    };
    wait_until_a_command_is_paused(&mut admin).await;
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
        match counted(&idem, &scope, "kill-key", "again", &runs).await {
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
    let run = || counted(&idem, &scope, "restart-key", "ch_1", &runs);
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
async fn claims_and_replays_are_native_and_scripts_run_only_token_checked_writes() {
    let server = Throwaway::start();
    let store = impatient_store(&server.url()).await;
    let mut admin = support::admin(&server.url()).await;
    let clock = ManualClock::starting_now();
    let id = record_id(&scope());
    // Run every script once first, so the counts below are the steady state
    // (no SCRIPT LOAD after NOSCRIPT).
    let req = claim_req(&id, &clock);
    store.claim(&req).await.expect("warm");
    store
        .save_resource_id(&id, req.token, "x")
        .await
        .expect("warm");
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
    let warm = success(now, b"warm", None);
    store.complete(&id, req.token, &warm).await.expect("warm");
    store.fetch(&id, clock.now()).await.expect("warm");
    let id = record_id(&scope());
    let req = claim_req(&id, &clock);
    let now = clock.now();
    let done = success(now, &[7u8; 4096], Some("ch_1"));
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
            counts(&[("get", 1), ("set", 1)]),
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
            counts(&[("get", 1), ("set", 1)]),
        ),
        (
            "save_resource_id",
            delta(&mut admin, async {
                store
                    .save_resource_id(&id, req.token, "ch_1")
                    .await
                    .expect("save_resource_id")
            })
            .await,
            counts(&[("evalsha", 1), ("get", 1), ("set", 1)]),
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
            counts(&[("evalsha", 1), ("get", 1), ("set", 1)]),
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
            counts(&[("evalsha", 1), ("get", 1), ("rename", 1), ("set", 2)]),
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
            counts(&[("get", 1), ("set", 1)]),
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
            counts(&[("get", 2)]),
        ),
    ] {
        assert_eq!(got, want, "{name}");
        if name.starts_with("claim") || name == "fetch" {
            assert!(
                !got.iter().any(|(cmd, _)| cmd.starts_with("eval")),
                "{name} runs no script: {got:?}"
            );
        }
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
        counts(&[("evalsha", 1), ("get", 1), ("set", 1)]),
        "release"
    );
    // A takeover: the claim's pipeline reads the released record, the
    // client decides, and one `swap.lua` replaces it if unchanged.
    let req3 = claim_req(&id2, &clock);
    let got = delta(&mut admin, async {
        let claimed = store.claim(&req3).await;
        assert!(
            matches!(&claimed, Ok(ClaimOutcome::Claimed(c)) if c.attempt == 2),
            "{claimed:?}"
        );
    })
    .await;
    assert_eq!(
        got,
        counts(&[("evalsha", 1), ("get", 2), ("set", 2)]),
        "claim (takeover)"
    );
    // A small body (up to 1 KiB) goes to the script as an argument; a larger
    // one (the 4 KiB above) is staged natively and renamed into place.
    let now = clock.now();
    let small = success(now, &[1u8; 100], None);
    let got = delta(&mut admin, async {
        store
            .complete(&id2, req3.token, &small)
            .await
            .expect("complete");
    })
    .await;
    assert_eq!(
        got,
        counts(&[("evalsha", 1), ("get", 1), ("set", 2)]),
        "complete (small body)"
    );
}

/// The operator's writes (release, delete) wait for replicas like the data
/// path's: a swap not confirmed in time is `Unavailable` with a
/// `NotAcknowledged` source, never reported done (here no replica exists).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_writes_wait_for_replicas_like_the_data_path() {
    use idem_core::store::AdminStore;
    use idem_redis::NotAcknowledged;

    let server = Throwaway::start();
    let store = impatient_store(&server.url()).await;
    let acked = store.clone().with_replica_ack(1, Duration::from_millis(20));
    let clock = ManualClock::starting_now();
    let not_acknowledged = |r: Result<bool, StoreError>| {
        let Err(StoreError::Unavailable { source, .. }) = &r else {
            panic!("{r:?}");
        };
        assert_eq!(
            source.downcast_ref::<NotAcknowledged>(),
            Some(&NotAcknowledged {
                acknowledged: 0,
                required: 1,
                timeout: Duration::from_millis(20)
            })
        );
    };

    // Release: the lease's end is written on the primary, not confirmed.
    let id = record_id(&scope());
    let req = claim_req(&id, &clock);
    store.claim(&req).await.expect("claim");
    not_acknowledged(acked.release_in_flight(&id, None, clock.now()).await);
    let rec = store
        .fetch(&id, clock.now())
        .await
        .expect("fetch")
        .expect("record");
    assert_eq!(rec.lease_until, clock.now(), "on the primary, unconfirmed");
    // Nothing left to write (the lease is over): no WAIT, a plain answer.
    assert!(
        acked
            .release_in_flight(&id, None, clock.now())
            .await
            .expect("release")
    );

    // Delete.
    complete(&store, &req, &clock, b"ok", None).await;
    not_acknowledged(acked.delete_completed(&id, clock.now()).await);
    assert_eq!(store.fetch(&id, clock.now()).await.expect("fetch"), None);
    assert!(
        !acked
            .delete_completed(&id, clock.now())
            .await
            .expect("absent")
    );
}
