//! One scenario per row of the behaviour table (C1–C15), each counting how
//! many times the work really ran.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::clock::ManualClock;
use idem_core::store::{Store, StoreError};
use idem_core::testkit::{Charge, Counter, Decline, FailingStore};
use idem_core::{Attempt, Failure, Outcome, TakeoverReason};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::support::{
    BASE, LEASE, RESPONSE_TTL, backend_error, builder, consumer, corrupt_error, message_id,
};
use idem_consumer::{
    Cause, Consumer, ConsumerPermanentFailure, DeadLetterReason, Disposition, Processed,
};

type Out = Result<Charge, Failure<Decline>>;
type P = Processed<Charge, Decline>;

const PAYLOAD: &[u8] = br#"{"order":"ord_1","amount":1000,"currency":"eur"}"#;

fn charge(id: &str) -> Charge {
    Charge {
        id: id.to_owned(),
        amount: 1000,
    }
}

fn decline(code: &str) -> Decline {
    Decline {
        code: code.to_owned(),
    }
}

/// A scenario's start: a manual clock, the default consumer on `store`
/// with it, a fresh message id and a run counter.
fn start<S: Store>(store: S) -> (ManualClock, Consumer<S>, String, Counter) {
    let clock = ManualClock::starting_now();
    let consumer = consumer(store, &clock);
    (clock, consumer, message_id(), Counter::default())
}

/// Work that counts its runs and succeeds with `ch_<n>`.
fn succeed(runs: &Counter) -> impl FnOnce(Attempt) -> std::future::Ready<Out> + Send + use<> {
    let runs = runs.clone();
    move |_| std::future::ready(Ok(charge(&format!("ch_{}", runs.hit()))))
}

/// Work that counts its runs and succeeds with the charge `id`.
fn succeed_as(
    runs: &Counter,
    id: &'static str,
) -> impl FnOnce(Attempt) -> std::future::Ready<Out> + Send + use<> {
    let runs = runs.clone();
    move |_| {
        runs.hit();
        std::future::ready(Ok(charge(id)))
    }
}

/// Deliveries 1 and 2 of a fresh message whose work fails permanently with
/// `code`; the work ran once. The message id and both results.
async fn failing_permanently_twice<S: Store>(
    consumer: &Consumer<S>,
    code: &str,
) -> (String, [P; 2]) {
    let (id, runs) = (message_id(), Counter::default());
    let mut results = Vec::new();
    for delivery in 1..=2u32 {
        let r = runs.clone();
        let failure = Failure::permanent(decline(code));
        let p: P = consumer
            .delivery(delivery)
            .process(&id, PAYLOAD, move |_| async move {
                r.hit();
                Err::<Charge, _>(failure)
            })
            .await;
        results.push(p);
    }
    assert_eq!(runs.get(), 1);
    (id, results.try_into().expect("two deliveries"))
}

/// Delivery `n` of message `id` (the scenarios' payload), its work counted
/// by `runs` and succeeding.
async fn deliver<S: Store>(consumer: &Consumer<S>, n: u32, id: &str, runs: &Counter) -> P {
    consumer
        .delivery(n)
        .process(id, PAYLOAD, succeed(runs))
        .await
}

/// The first delivery of `id` in a task of its own, its work counted by
/// `runs` and holding (the lease taken) until the returned sender fires,
/// then succeeding with `charge(done)`. Returns once the work has started.
async fn holding<S: Store>(
    consumer: &Consumer<S>,
    id: &str,
    runs: &Counter,
    done: &'static str,
) -> (JoinHandle<P>, oneshot::Sender<()>) {
    let (entered_tx, entered_rx) = oneshot::channel();
    let (go_tx, go_rx) = oneshot::channel::<()>();
    let (c, i, r) = (consumer.clone(), id.to_owned(), runs.clone());
    let task = tokio::spawn(async move {
        let p: P = c
            .process(&i, PAYLOAD, move |_| async move {
                r.hit();
                let _ = entered_tx.send(());
                let _ = go_rx.await;
                Ok(charge(done))
            })
            .await;
        p
    });
    entered_rx.await.expect("first delivery in work");
    (task, go_tx)
}

/// `p` acknowledged, for `cause`.
#[track_caller]
fn assert_acked(p: &P, cause: Cause) {
    assert_eq!((p.disposition, p.cause), (Disposition::Ack, cause));
}

fn retry(after: Duration) -> Disposition {
    Disposition::Retry { after }
}

fn dead(reason: DeadLetterReason) -> Disposition {
    Disposition::DeadLetter { reason }
}

/// C1: a fresh message runs once, succeeds and is acknowledged.
pub async fn c01_fresh_success_is_acked<S: Store>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let consumer = consumer(store, &clock);
    let runs = Counter::default();
    let p: P = consumer
        .process(&message_id(), PAYLOAD, succeed(&runs))
        .await;
    assert_eq!(p.disposition, Disposition::Ack);
    assert_eq!(p.cause, Cause::Succeeded);
    assert_eq!(p.outcome, Some(Outcome::Success(charge("ch_1"))));
    assert_eq!((p.replayed, p.attempt, p.recovery), (false, 1, false));
    assert_eq!(runs.get(), 1);
}

/// C2: a permanent failure is stored, acknowledged and reported to the hook
/// once; its redelivery is a replay that calls no hook.
pub async fn c02_permanent_failure_is_acked_and_reported_once<S: Store>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let reported: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = Arc::clone(&reported);
    let consumer = builder(store, &clock)
        .on_permanent_failure(move |id, e| {
            seen.lock().expect("hook lock").push(format!("{id} {e:?}"));
        })
        .build()
        .expect("consumer");
    let (id, deliveries) = failing_permanently_twice(&consumer, "card_declined").await;
    for (p, cause) in deliveries
        .into_iter()
        .zip([Cause::PermanentFailure, Cause::Replayed])
    {
        assert_eq!(p.disposition, Disposition::Ack, "{cause:?}");
        assert_eq!(p.outcome, Some(Outcome::Failure(decline("card_declined"))));
        assert_eq!(p.cause, cause);
    }
    let reported = reported.lock().expect("hook lock").clone();
    assert_eq!(reported.len(), 1, "{reported:?}");
    assert!(reported[0].starts_with(&id) && reported[0].contains("card_declined"));
}

/// C2 with `ConsumerPermanentFailure::DeadLetter`: the failure goes to the dead
/// letter, and so does every replay of it (a failed dead-lettering is
/// retried); the work runs once.
pub async fn c02_permanent_failure_dead_letters_when_configured<S: Store>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let consumer = builder(store, &clock)
        .permanent_failure(ConsumerPermanentFailure::DeadLetter)
        .build()
        .expect("consumer");
    let (_, deliveries) = failing_permanently_twice(&consumer, "unknown_account").await;
    for (p, replayed) in deliveries.into_iter().zip([false, true]) {
        assert_eq!(p.disposition, dead(DeadLetterReason::PermanentFailure));
        assert_eq!(p.replayed, replayed);
    }
}

/// C3: a transient failure releases the key and asks for a redelivery after
/// the backoff of its delivery count; each delivery runs the work again, as a
/// recovery, until one succeeds.
pub async fn c03_transient_failure_is_retried_with_backoff<S: Store>(store: Arc<S>) {
    let (_, consumer, id, runs) = start(store);
    for (delivery, after) in [(1u32, BASE), (2, BASE * 2), (4, BASE * 8)] {
        let r = runs.clone();
        let p: P = consumer
            .delivery(delivery)
            .process(&id, PAYLOAD, move |a| async move {
                r.hit();
                assert_eq!(a.is_recovery(), delivery > 1);
                Err::<Charge, _>(Failure::transient(decline("psp_503")))
            })
            .await;
        assert_eq!(p.disposition, retry(after), "delivery {delivery}");
        assert_eq!(p.cause, Cause::TransientFailure);
        assert_eq!(p.outcome, Some(Outcome::Transient(decline("psp_503"))));
    }
    let p: P = deliver(&consumer, 5, &id, &runs).await;
    assert_acked(&p, Cause::Succeeded);
    assert_eq!((p.attempt, p.recovery), (4, true));
    assert_eq!(runs.get(), 4);
}

/// C4: a redelivery of a processed message (even re-serialised JSON) replays
/// the stored outcome, acknowledged, without running the work.
pub async fn c04_redelivery_replays_without_running<S: Store>(store: Arc<S>) {
    let (_, consumer, id, runs) = start(store);
    let first: P = consumer.process(&id, PAYLOAD, succeed(&runs)).await;
    assert_eq!(first.cause, Cause::Succeeded);
    let reordered: &[u8] = br#"{ "currency":"eur", "amount":1000.0, "order":"ord_1" }"#;
    for payload in [PAYLOAD, reordered] {
        let p: P = consumer
            .delivery(2)
            .process(&id, payload, succeed(&runs))
            .await;
        assert_acked(&p, Cause::Replayed);
        assert_eq!(p.outcome, Some(Outcome::Success(charge("ch_1"))));
        assert!(p.replayed && !p.ran());
    }
    assert_eq!(runs.get(), 1);
}

/// C4/C5 under real concurrency: 16 deliveries of one message at once run
/// the work once; the others are told to retry after the lease, and a
/// later redelivery replays.
pub async fn c04_concurrent_duplicates_run_once<S: Store>(store: Arc<S>) {
    let (_, consumer, id, runs) = start(store);
    let (release_tx, release_rx) = tokio::sync::watch::channel(false);
    let mut pending = Vec::new();
    for _ in 0..16 {
        let (c, id, r) = (consumer.clone(), id.clone(), runs.clone());
        let mut release = release_rx.clone();
        pending.push(tokio::spawn(async move {
            let p: P = c
                .process(&id, PAYLOAD, move |_| async move {
                    let n = r.hit();
                    // Hold the lease until every other delivery has answered.
                    let _ = release.wait_for(|go| *go).await;
                    Ok(charge(&format!("ch_{n}")))
                })
                .await;
            p
        }));
    }
    let mut results = Vec::new();
    // The 15 losers answer while the winner holds its lease.
    while results.len() < 15 {
        let (done, _, rest) = futures_util::future::select_all(pending).await;
        results.push(done.expect("delivery task"));
        pending = rest;
    }
    release_tx.send(true).expect("winner still waiting");
    for t in pending {
        results.push(t.await.expect("delivery task"));
    }
    let acked: Vec<&P> = results.iter().filter(|p| p.disposition.is_ack()).collect();
    assert_eq!(acked.len(), 1, "{results:?}");
    assert_eq!(acked[0].cause, Cause::Succeeded);
    for p in results.iter().filter(|p| !p.disposition.is_ack()) {
        assert_eq!(p.cause, Cause::InFlight);
        assert_eq!(p.disposition, retry(LEASE));
    }
    let again: P = consumer.process(&id, PAYLOAD, succeed(&runs)).await;
    assert_eq!(again.cause, Cause::Replayed);
    assert_eq!(runs.get(), 1);
}

/// C5: a delivery while another holds a valid lease is retried after the
/// lease left, without running.
pub async fn c05_in_flight_retries_after_the_lease_left<S: Store>(store: Arc<S>) {
    let (clock, consumer, id, runs) = start(store);
    let (first, go_tx) = holding(&consumer, &id, &runs, "ch_first").await;
    clock.advance(Duration::from_secs(20));
    let second: P = deliver(&consumer, 2, &id, &runs).await;
    assert_eq!(second.disposition, retry(Duration::from_secs(40)));
    assert_eq!((second.cause, second.attempt), (Cause::InFlight, 0));
    go_tx.send(()).expect("first still waiting");
    assert_eq!(first.await.expect("first").cause, Cause::Succeeded);
    assert_eq!(runs.get(), 1);
}

/// C6: after a lease expired with the outcome unknown, the next delivery
/// runs the work as a recovery, with the resource id the first attempt
/// saved, and is acknowledged.
pub async fn c06_expired_lease_is_recovered_with_the_saved_resource<S: Store>(store: Arc<S>) {
    let (clock, consumer, id, runs) = start(store);
    let (saved_tx, saved_rx) = oneshot::channel();
    let (c, i, r) = (consumer.clone(), id.clone(), runs.clone());
    let crashed = tokio::spawn(async move {
        let _: P = c
            .process(&i, PAYLOAD, move |a| async move {
                r.hit();
                a.save_resource_id("ch_created").await.expect("save");
                let _ = saved_tx.send(());
                std::future::pending::<Out>().await
            })
            .await;
    });
    saved_rx.await.expect("first attempt saved its charge");
    crashed.abort();
    let _ = crashed.await;
    clock.advance(LEASE + Duration::from_secs(1));
    let r = runs.clone();
    let p: P = consumer
        .delivery(2)
        .process(&id, PAYLOAD, move |a| async move {
            r.hit();
            assert_eq!(a.recovery_reason(), Some(TakeoverReason::LeaseExpired));
            // Reconcile: the charge exists, do not create another.
            Ok(charge(a.previous_resource_id().unwrap_or("missing")))
        })
        .await;
    assert_acked(&p, Cause::Succeeded);
    assert_eq!((p.attempt, p.recovery), (2, true));
    assert_eq!(p.outcome, Some(Outcome::Success(charge("ch_created"))));
    assert_eq!(runs.get(), 2);
}

/// C7: a delivery whose lease was taken over before it completed is told to
/// retry; its outcome is discarded and the newer attempt's is replayed.
pub async fn c07_lease_lost_at_completion_retries<S: Store>(store: Arc<S>) {
    let (clock, consumer, id, runs) = start(store);
    let (slow, go_tx) = holding(&consumer, &id, &runs, "ch_slow").await;
    clock.advance(LEASE + Duration::from_secs(1));
    let newer: P = consumer
        .delivery(2)
        .process(&id, PAYLOAD, succeed_as(&runs, "ch_newer"))
        .await;
    assert_eq!((newer.cause, newer.recovery), (Cause::Succeeded, true));
    go_tx.send(()).expect("slow still waiting");
    let p = slow.await.expect("slow delivery");
    assert_eq!(p.cause, Cause::LeaseLost);
    assert_eq!(p.disposition, retry(Duration::from_secs(1)));
    assert_eq!(p.attempt, 1);
    let replay: P = deliver(&consumer, 3, &id, &runs).await;
    assert_eq!(replay.outcome, Some(Outcome::Success(charge("ch_newer"))));
    assert_eq!(replay.cause, Cause::Replayed);
    assert_eq!(runs.get(), 2);
}

/// C8: a message done long ago, whose response is no longer stored, is
/// acknowledged without running.
pub async fn c08_done_without_a_stored_response_is_acked<S: Store>(store: Arc<S>) {
    let (clock, consumer, id, runs) = start(store);
    let first: P = consumer.process(&id, PAYLOAD, succeed(&runs)).await;
    assert_eq!(first.cause, Cause::Succeeded);
    clock.advance(RESPONSE_TTL + Duration::from_secs(1));
    let p: P = deliver(&consumer, 2, &id, &runs).await;
    assert_acked(&p, Cause::AlreadyDone);
    assert_eq!(p.outcome, None);
    assert_eq!(runs.get(), 1);
}

/// C9: the same message id with another payload (JSON or bytes) goes to
/// the dead letter, without running, and the stored outcome is untouched.
pub async fn c09_same_id_other_payload_is_dead_lettered<S: Store>(store: Arc<S>) {
    let (_, consumer, id, runs) = start(store);
    let _: P = consumer.process(&id, PAYLOAD, succeed(&runs)).await;
    let other = br#"{"order":"ord_1","amount":999999,"currency":"eur"}"#;
    let p: P = consumer
        .delivery(2)
        .process(&id, other, succeed(&runs))
        .await;
    assert_eq!(p.disposition, dead(DeadLetterReason::FingerprintMismatch));
    assert_eq!(p.cause, Cause::FingerprintMismatch);
    let binary_id = message_id();
    let _: P = consumer
        .process(&binary_id, b"\x00\x01binary", succeed(&runs))
        .await;
    let p: P = consumer
        .process(&binary_id, b"\x00\x02binary", succeed(&runs))
        .await;
    assert_eq!(p.disposition, dead(DeadLetterReason::FingerprintMismatch));
    let p: P = consumer.process(&id, PAYLOAD, succeed(&runs)).await;
    assert_eq!(p.outcome, Some(Outcome::Success(charge("ch_1"))));
    assert_eq!(runs.get(), 2);
}

/// C10: JSON naming a member twice, or nesting too deep, goes to the dead
/// letter before anything is claimed; bytes that are not JSON are fine.
pub async fn c10_unfingerprintable_payload_is_dead_lettered<S: Store>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let consumer = consumer(store, &clock);
    let runs = Counter::default();
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    let duplicate: &[u8] = br#"{"amount":1,"amount":1000}"#;
    for payload in [duplicate, deep.as_bytes()] {
        let id = message_id();
        for _ in 0..2 {
            let p: P = consumer.process(&id, payload, succeed(&runs)).await;
            assert_eq!(p.disposition, dead(DeadLetterReason::InvalidMessage));
            assert_eq!((p.cause, p.attempt), (Cause::InvalidMessage, 0));
        }
    }
    assert_eq!(runs.get(), 0);
    let id = message_id();
    for _ in 0..2 {
        let p: P = consumer
            .process(&id, b"\xff\xfe not json", succeed(&runs))
            .await;
        assert!(p.disposition.is_ack());
    }
    assert_eq!(runs.get(), 1);
}

/// C11: the store unreachable at the claim: retry after the backoff, the
/// work not run; once it is back, the next delivery runs.
pub async fn c11_store_unavailable_at_the_claim_retries<S: Store>(store: Arc<S>) {
    let failing = FailingStore::new(store);
    let (_, consumer, id, runs) = start(failing.clone());
    failing.fail_all(true);
    for (delivery, after) in [(1u32, BASE), (3, BASE * 4)] {
        let p: P = deliver(&consumer, delivery, &id, &runs).await;
        assert_eq!(p.disposition, retry(after));
        assert_eq!(p.cause, Cause::StoreUnavailable);
    }
    assert_eq!(runs.get(), 0);
    failing.fail_all(false);
    let p: P = deliver(&consumer, 4, &id, &runs).await;
    assert_eq!((p.cause, p.recovery), (Cause::Succeeded, false));
    assert_eq!(runs.get(), 1);
}

/// C12: the work done but its outcome not stored: acknowledged with the
/// outcome (the work must not run again because of the store). The engine
/// writes the outcome again in the background: a redelivery while the
/// store still fails is in flight, and once it is stored a redelivery is a
/// replay. The work ran once.
pub async fn c12_completion_not_stored_is_acked<S: Store>(store: Arc<S>) {
    let failing = FailingStore::new(store);
    let (_, consumer, id, runs) = start(failing.clone());
    failing.fail_complete(true);
    let p: P = consumer.process(&id, PAYLOAD, succeed(&runs)).await;
    assert_acked(&p, Cause::NotStored);
    assert_eq!(p.outcome, Some(Outcome::Success(charge("ch_1"))));
    let p: P = deliver(&consumer, 2, &id, &runs).await;
    assert_eq!(p.cause, Cause::InFlight);
    failing.fail_complete(false);
    let left = consumer
        .idem()
        .drain_completions(std::time::Duration::from_secs(10))
        .await;
    assert_eq!(left, 0, "stored in the background");
    let p: P = deliver(&consumer, 3, &id, &runs).await;
    assert_eq!(p.disposition, Disposition::Ack);
    assert!(p.replayed, "{:?}", p.cause);
    assert_eq!(p.outcome, Some(Outcome::Success(charge("ch_1"))));
    assert_eq!(runs.get(), 1);
}

/// C13: a panicking work is a crash: retry after the lease, the record in
/// flight until then, then a recovery.
pub async fn c13_panicking_work_retries_after_the_lease<S: Store>(store: Arc<S>) {
    let (clock, consumer, id, runs) = start(store);
    let r = runs.clone();
    let p: P = consumer
        .process(&id, PAYLOAD, move |_| async move {
            r.hit();
            injected_panic();
            Ok::<Charge, Failure<Decline>>(charge("never"))
        })
        .await;
    assert_eq!(p.disposition, retry(LEASE));
    assert_eq!((p.cause, p.attempt), (Cause::Panicked, 1));
    let p: P = deliver(&consumer, 2, &id, &runs).await;
    assert_eq!(p.cause, Cause::InFlight);
    clock.advance(LEASE);
    let p: P = deliver(&consumer, 3, &id, &runs).await;
    assert_eq!(
        (p.cause, p.recovery, p.attempt),
        (Cause::Succeeded, true, 2)
    );
    assert_eq!(runs.get(), 2);
}

#[allow(clippy::panic)]
fn injected_panic() {
    if std::hint::black_box(true) {
        panic!("work panicked (injected)");
    }
}

/// C14: a consumer killed mid-work (its task dropped): redeliveries are in
/// flight until the lease ends (C5), then one recovers (C6); the work ran
/// twice in all, the second time told to reconcile.
pub async fn c14_consumer_killed_mid_work_is_in_flight_then_recovered<S: Store>(store: Arc<S>) {
    let (clock, consumer, id, runs) = start(store);
    // Killed while it holds: the work never finishes.
    let (killed, _never) = holding(&consumer, &id, &runs, "never").await;
    killed.abort();
    let _ = killed.await;
    clock.advance(LEASE - Duration::from_secs(1));
    let p: P = deliver(&consumer, 2, &id, &runs).await;
    assert_eq!(
        (p.cause, p.disposition),
        (Cause::InFlight, retry(Duration::from_secs(1)))
    );
    clock.advance(Duration::from_secs(1));
    let p: P = deliver(&consumer, 3, &id, &runs).await;
    assert_eq!((p.cause, p.recovery), (Cause::Succeeded, true));
    assert_eq!(runs.get(), 2);
}

/// C15: a corrupt record or a store error a retry cannot fix goes to the
/// dead letter as `Internal`, without running the work.
pub async fn c15_corrupt_record_or_fatal_store_error_is_dead_lettered<S: Store>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let faulty = FailingStore::new(store);
    let consumer = consumer(faulty.clone(), &clock);
    let runs = Counter::default();
    for make in [backend_error as fn() -> StoreError, corrupt_error] {
        let fault = make();
        faulty.fail_claims_with(Some(make));
        let p: P = consumer
            .process(&message_id(), PAYLOAD, succeed(&runs))
            .await;
        assert_eq!(p.disposition, dead(DeadLetterReason::Internal), "{fault:?}");
        assert_eq!(p.cause, Cause::Internal);
    }
    assert_eq!(runs.get(), 0);
    faulty.fail_claims_with(None);
    let p: P = consumer
        .process(&message_id(), PAYLOAD, succeed(&runs))
        .await;
    assert_eq!(p.cause, Cause::Succeeded);
}

/// Two consumer groups on one stream each process a message once.
pub async fn groups_each_process_a_message_once<S: Store>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let billing = consumer(Arc::clone(&store), &clock);
    let shipping = consumer(store, &clock);
    let (id, runs) = (message_id(), Counter::default());
    for c in [&billing, &shipping, &billing, &shipping] {
        let _: P = c.process(&id, PAYLOAD, succeed(&runs)).await;
    }
    assert_eq!(runs.get(), 2);
}

/// An id that breaks the key rules (too long, control characters, empty)
/// is derived, so the message is still processed once.
pub async fn invalid_ids_are_derived_and_deduplicated<S: Store>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let consumer = consumer(store, &clock);
    let runs = Counter::default();
    let long = "x".repeat(1000);
    let odd = format!("{}\n\u{e9}", message_id());
    for id in [long.as_str(), odd.as_str(), ""] {
        let before = runs.get();
        for _ in 0..2 {
            let p: P = consumer.process(id, PAYLOAD, succeed(&runs)).await;
            assert!(p.disposition.is_ack(), "{id:?}: {p:?}");
        }
        assert_eq!(runs.get(), before + 1, "{id:?}");
    }
}
