//! The contract's rows: first call, replay, mismatch, isolation, bad input.

use std::sync::Arc;

use crate::clock::ManualClock;
use crate::id::key::MAX_KEY_LEN;
use crate::store::Store;
use crate::store::{OutcomeKind, RecordState};
use crate::{Error, HttpResponse, Outcome, RawJson, Scope};

use super::support::{
    Charge, Counter, Decline, Out, charge, charge_request, engine, inspect, key, scope, setup,
};

/// A first call runs the work once, stores the outcome and says it executed.
pub async fn first_call_executes_and_stores<S: Store>(store: Arc<S>) {
    let (_, idem, scope, key) = setup(&store, "POST /charges");
    let runs = Counter::default();
    let reply = idem
        .execute(&scope, &key, &charge_request(100), |attempt| {
            let runs = runs.clone();
            async move {
                runs.hit();
                assert_eq!(attempt.number(), 1);
                assert!(!attempt.is_recovery());
                charge("ch_1")
            }
        })
        .await
        .expect("first call");
    assert!(!reply.is_replay());
    assert!(reply.is_stored());
    assert_eq!(reply.attempt(), 1);
    assert_eq!(runs.get(), 1);
    let record = inspect(&idem, &scope, &key, true)
        .await
        .expect("record exists");
    assert_eq!(record.state, RecordState::Completed);
    assert_eq!(record.outcome, Some(OutcomeKind::Success));
    assert!(record.body.is_some());
}

/// Every retry gets the first response back byte for byte (status, headers,
/// body, including bytes that are not UTF-8), marked as a replay, and the work
/// does not run again.
pub async fn replay_is_byte_for_byte<S: Store>(store: Arc<S>) {
    let (_, idem, scope, key) = setup(&store, "POST /charges");
    let runs = Counter::default();
    let body: Vec<u8> = (0..=255u8)
        .chain(b"{\"id\":\"ch_1\"}".iter().copied())
        .collect();
    let first = HttpResponse::new(
        201,
        vec![
            ("Location".into(), "/charges/ch_1".into()),
            ("X-Weird".into(), "a: b; c=\"d\"".into()),
            ("X-Empty".into(), Vec::new()),
            ("X-Bytes".into(), b"\xff\x00\x80 not utf-8".to_vec()),
            ("Location".into(), "/charges/ch_1#repeated".into()),
        ],
        body,
    );
    for round in 0..3 {
        let response = first.clone();
        let runs = runs.clone();
        let reply = idem
            .execute(&scope, &key, &charge_request(100), move |_| async move {
                runs.hit();
                Outcome::<HttpResponse, HttpResponse>::Success(response)
            })
            .await
            .expect("call");
        assert_eq!(reply.is_replay(), round > 0, "round {round}");
        assert_eq!(reply.into_result().expect("success"), first);
    }
    assert_eq!(runs.get(), 1);
}

/// A typed response comes back equal through serde, and the request's key
/// order and number spelling do not break the match.
pub async fn typed_replay_round_trips<S: Store>(store: Arc<S>) {
    let (_, idem, scope, key) = setup(&store, "POST /charges");
    let original = Charge {
        id: "ch_ü\u{1F600}\"\\".into(),
        amount: u64::from(u32::MAX),
    };
    let sent = original.clone();
    idem.execute(
        &scope,
        &key,
        &serde_json::json!({"amount": 100, "currency": "eur"}),
        |_| async move { Out::Success(sent) },
    )
    .await
    .expect("first");
    let respelled: serde_json::Value =
        serde_json::from_str(r#"{"currency":"eur","amount":1.0e2}"#).expect("json");
    let reply = idem
        .execute(&scope, &key, &respelled, |_| async {
            Out::Success(Charge {
                id: "other".into(),
                amount: 1,
            })
        })
        .await
        .expect("replay");
    assert!(reply.is_replay());
    assert_eq!(reply.into_result(), Ok(original));
}

/// The same key with another request is rejected (422): the work does not
/// run and the stored record is unchanged; the original still replays.
pub async fn mismatch_is_rejected_and_leaves_record_untouched<S: Store>(store: Arc<S>) {
    let (_, idem, scope, key) = setup(&store, "POST /charges");
    let runs = Counter::default();
    idem.execute(&scope, &key, &charge_request(100), |_| async {
        charge("ch_1")
    })
    .await
    .expect("first");
    let before = inspect(&idem, &scope, &key, true).await;
    let r = runs.clone();
    let err = idem
        .execute(&scope, &key, &charge_request(200), move |_| async move {
            r.hit();
            Out::Success(Charge {
                id: "ch_2".into(),
                amount: 200,
            })
        })
        .await
        .expect_err("mismatch");
    assert!(matches!(err, Error::FingerprintMismatch), "{err:?}");
    assert_eq!(err.http_status(), 422);
    assert_eq!(runs.get(), 0);
    assert_eq!(inspect(&idem, &scope, &key, true).await, before);
    let again = idem
        .execute(&scope, &key, &charge_request(100), |_| async {
            unreachable_work()
        })
        .await
        .expect("replay");
    assert_eq!(again.into_result().expect("ok").id, "ch_1");
}

fn unreachable_work() -> Out {
    Out::Failure(Decline {
        code: "the work must not run here".into(),
    })
}

/// Another request under a key whose first attempt is still running is a
/// mismatch (422), not a 409.
pub async fn mismatch_while_in_flight_is_rejected<S: Store>(store: Arc<S>) {
    let (_, idem, scope, key) = setup(&store, "POST /charges");
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let (idem, scope, key) = (idem.clone(), scope.clone(), key.clone());
        tokio::spawn(async move {
            idem.execute(&scope, &key, &charge_request(100), |_| async move {
                let _ = started_tx.send(());
                let _ = go_rx.await;
                charge("ch_1")
            })
            .await
        })
    };
    started_rx.await.expect("first started");
    let err = idem
        .execute(&scope, &key, &charge_request(999), |_| async {
            unreachable_work()
        })
        .await
        .expect_err("mismatch");
    assert!(matches!(err, Error::FingerprintMismatch), "{err:?}");
    let _ = go_tx.send(());
    assert!(!first.await.expect("join").expect("first").is_replay());
}

/// The same key under another owner is another record: both run, and each
/// owner replays only its own response.
pub async fn owners_are_isolated<S: Store>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let idem = engine(&store, &clock);
    let key = key();
    let a = scope("POST /charges");
    let b = Scope::new(format!("{}-b", a.owner()), a.operation()).expect("scope");
    let runs = Counter::default();
    for (s, id) in [(&a, "ch_a"), (&b, "ch_b")] {
        let runs = runs.clone();
        let reply = idem
            .execute(s, &key, &charge_request(100), move |_| async move {
                runs.hit();
                charge(id)
            })
            .await
            .expect("call");
        assert!(!reply.is_replay());
    }
    assert_eq!(runs.get(), 2);
    for (s, id) in [(&a, "ch_a"), (&b, "ch_b")] {
        let reply = idem
            .execute(s, &key, &charge_request(100), |_| async {
                unreachable_work()
            })
            .await
            .expect("replay");
        assert!(reply.is_replay());
        assert_eq!(reply.into_result().expect("ok").id, id);
    }
    let c = Scope::new(format!("{}-c", a.owner()), a.operation()).expect("scope");
    assert!(inspect(&idem, &c, &key, true).await.is_none());
}

/// The same owner and key under another operation is another record.
pub async fn operations_are_isolated<S: Store>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let idem = engine(&store, &clock);
    let key = key();
    let a = scope("POST /charges");
    let b = Scope::new(a.owner(), "POST /refunds").expect("scope");
    let runs = Counter::default();
    for s in [&a, &b, &a, &b] {
        let runs = runs.clone();
        let op = s.operation().to_owned();
        let reply = idem
            .execute(s, &key, &charge_request(100), move |_| async move {
                runs.hit();
                Out::Success(Charge {
                    id: op,
                    amount: 100,
                })
            })
            .await
            .expect("call");
        assert_eq!(reply.into_result().expect("ok").id, s.operation());
    }
    assert_eq!(runs.get(), 2);
}

/// Owners, operations and keys full of quotes, `;`, braces, spaces, `%`, `*`,
/// and keys of the maximum length go through the store unchanged and never
/// meet: identities that differ only in where a separator falls stay apart.
pub async fn hostile_identities_round_trip_and_stay_apart<S: Store>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let idem = engine(&store, &clock);
    let salt = key();
    let long_key = format!(
        "{}{}",
        salt.as_str(),
        "k".repeat(MAX_KEY_LEN - salt.as_str().len())
    );
    let owner = |s: &str| format!("{s}-{}", salt.as_str());
    let cases = [
        (
            owner("o'; DROP TABLE idem; --"),
            "POST /x{y}",
            "k\"ey' ; --".to_owned(),
        ),
        (owner("o"), "POST /x{y}:k", "ey".to_owned()),
        (owner("o:POST /x{y}"), "k", "ey".to_owned()),
        (owner("{tag}"), "op", "{tag} * % _ \\ ".to_owned()),
        (owner("{tag"), "}op", "{tag} * % _ \\".to_owned()),
        (owner("über-Ω-\u{1F600}"), "op", long_key.clone()),
        (owner("o"), "op", long_key),
    ];
    for (i, (o, op, k)) in cases.iter().enumerate() {
        let s = Scope::new(o.as_str(), *op).expect("scope");
        let reply = idem
            .execute(&s, k.as_str(), &charge_request(100), move |_| async move {
                charge(&format!("case-{i}"))
            })
            .await
            .expect("call");
        assert!(!reply.is_replay(), "case {i} collided with an earlier case");
    }
    for (i, (o, op, k)) in cases.iter().enumerate() {
        let s = Scope::new(o.as_str(), *op).expect("scope");
        let reply = idem
            .execute(&s, k.as_str(), &charge_request(100), |_| async {
                unreachable_work()
            })
            .await
            .expect("replay");
        assert!(reply.is_replay());
        assert_eq!(reply.into_result().expect("ok").id, format!("case-{i}"));
    }
}

/// Invalid keys and requests that are not JSON get typed 400 errors before
/// the store is touched: nothing is stored and the work does not run.
pub async fn invalid_input_stores_nothing_and_runs_nothing<S: Store>(store: Arc<S>) {
    let clock = ManualClock::starting_now();
    let idem = engine(&store, &clock);
    let scope = scope("POST /charges");
    let runs = Counter::default();
    let too_long = "k".repeat(MAX_KEY_LEN + 1);
    for bad in ["", "   ", too_long.as_str(), "a\nb", "clé", "tab\there"] {
        let r = runs.clone();
        let err = idem
            .execute(&scope, bad, &charge_request(1), move |_| async move {
                r.hit();
                unreachable_work()
            })
            .await
            .expect_err("invalid key");
        assert!(matches!(err, Error::InvalidKey(_)), "{err:?}");
        assert_eq!(err.http_status(), 400);
        assert!(!err.to_string().is_empty());
    }
    let key = key();
    let deep = "[".repeat(10_000);
    for body in [b"{\"amount\": ".as_slice(), b"not json", deep.as_bytes()] {
        let r = runs.clone();
        let err = idem
            .execute(&scope, &key, &RawJson(body), move |_| async move {
                r.hit();
                unreachable_work()
            })
            .await
            .expect_err("invalid request");
        assert!(matches!(err, Error::InvalidRequest(_)), "{err:?}");
        assert_eq!(err.http_status(), 400);
    }
    assert_eq!(runs.get(), 0);
    assert!(inspect(&idem, &scope, &key, true).await.is_none());
}
