//! Property tests: the contract holds for arbitrary input, not only for the
//! cases written down. 256 cases each by default; `PROPTEST_CASES=10000`
//! for a longer run.

use std::time::Duration;

use idem_core::adapter::{EngineExt, canonical_json, fingerprint};
use idem_core::clock::{ManualClock, Timestamp};
use idem_core::store::Fingerprint;
use idem_core::store::{ClaimOutcome, StoredRecord};
use idem_core::store::{OutcomeKind, RecordState};
use idem_core::{
    FieldFilter, HttpResponse, Idem, IdempotencyKey, InFlightMode, Json, MemoryStore, Outcome,
    Policy, RawJson, Scope, Storable,
};
use proptest::prelude::*;
use serde_json::{Map, Number, Value};

/// Integers every double holds exactly: number spelling cannot change them.
const EXACT: i64 = 1 << 53;

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-EXACT..=EXACT).prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| Value::Number(Number::from_f64(f).expect("finite"))),
        "\\PC{0,12}".prop_map(Value::String),
        any::<String>().prop_map(Value::String),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("\\PC{0,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Numbers compared as doubles, everything else exactly.
fn same_as_f64(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_as_f64(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_as_f64(v, w)))
        }
        _ => a == b,
    }
}

/// JSON text for `v` with object members in an order given by `seed`, and
/// numbers spelled one of several equivalent ways.
fn respell(v: &Value, seed: &mut u64, out: &mut String) {
    let mut next = || {
        *seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        *seed >> 33
    };
    match v {
        Value::Number(n) => {
            let text = if let Some(i) = n.as_i64().filter(|i| i.unsigned_abs() <= EXACT as u64) {
                match next() % 4 {
                    0 => format!("{i}"),
                    1 => format!("{i}.0"),
                    2 => format!("{i}e0"),
                    _ => format!("{i}0e-1"),
                }
            } else if n.is_f64() {
                let f = n.as_f64().expect("f64");
                if next() % 2 == 0 {
                    format!("{f:e}")
                } else {
                    format!("{f:?}")
                }
            } else {
                n.to_string()
            };
            out.push_str(&text);
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(" ,");
                }
                respell(item, seed, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut members: Vec<_> = map.iter().collect();
            // A seeded shuffle (Fisher-Yates).
            for i in (1..members.len()).rev() {
                *seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                let j = usize::try_from(*seed >> 33).unwrap_or(0) % (i + 1);
                members.swap(i, j);
            }
            out.push('{');
            for (i, (k, v)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::to_string(k).expect("name"));
                out.push_str(" : ");
                respell(v, seed, out);
            }
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Changes the `n`-th leaf (in document order, modulo the leaf count) into a
/// different one; `false` when there is no leaf.
fn mutate_leaf(v: &mut Value, n: &mut usize) -> bool {
    match v {
        Value::Array(items) => items.iter_mut().any(|i| mutate_leaf(i, n)),
        Value::Object(map) => map.values_mut().any(|i| mutate_leaf(i, n)),
        leaf => {
            if *n > 0 {
                *n -= 1;
                return false;
            }
            *leaf = match leaf.take() {
                Value::Null => Value::from(0),
                Value::Bool(b) => Value::Bool(!b),
                Value::String(s) => Value::String(s + "x"),
                Value::Number(x) => match (x.as_u64(), x.as_i64()) {
                    (Some(u), _) => Value::from(u.wrapping_add(1)),
                    (None, Some(i)) => Value::from(i.wrapping_add(1)),
                    _ => Value::String("was a float".into()),
                },
                other => other,
            };
            true
        }
    }
}

fn count_leaves(v: &Value) -> usize {
    match v {
        Value::Array(items) => items.iter().map(count_leaves).sum(),
        Value::Object(map) => map.values().map(count_leaves).sum(),
        _ => 1,
    }
}

fn fp<R: serde::Serialize + ?Sized>(r: &R, filter: &FieldFilter) -> Fingerprint {
    fingerprint("POST /p", r, filter).expect("fingerprint")
}

fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        (0u64..10_000).prop_map(Duration::from_millis),
        (0u64..100 * 365 * 86_400).prop_map(Duration::from_secs),
        (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        Just(Duration::ZERO),
        Just(Duration::MAX),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn canonical_json_round_trips(v in value()) {
        let c = canonical_json(&v);
        let back: Value = serde_json::from_str(&c).expect("canonical JSON parses");
        prop_assert_eq!(canonical_json(&back), c.clone());
        prop_assert!(same_as_f64(&v, &back), "{} vs {}", v, back);
    }

    #[test]
    fn fingerprint_ignores_member_order_and_number_spelling(v in value(), seed in any::<u64>()) {
        let mut text = String::new();
        let mut s = seed;
        respell(&v, &mut s, &mut text);
        let raw = RawJson(text.as_bytes());
        prop_assert_eq!(fp(&v, &FieldFilter::All), fp(&raw, &FieldFilter::All), "{}", text);
    }

    #[test]
    fn fingerprint_ignores_ignored_fields(v in value(), a in leaf(), b in leaf()) {
        let ignore = FieldFilter::ignore(["/client_ts"]);
        let mut x = Map::new();
        x.insert("body".into(), v.clone());
        let mut y = x.clone();
        x.insert("client_ts".into(), a);
        y.insert("client_ts".into(), b);
        prop_assert_eq!(fp(&x, &ignore), fp(&y, &ignore));
    }

    #[test]
    fn fingerprint_changes_with_any_other_change(v in value(), pick in any::<usize>()) {
        let leaves = count_leaves(&v);
        let mut changed = v.clone();
        let mut n = pick % leaves.max(1);
        prop_assume!(mutate_leaf(&mut changed, &mut n));
        prop_assert_ne!(fp(&v, &FieldFilter::All), fp(&changed, &FieldFilter::All));
        prop_assert_ne!(fingerprint("POST /other", &v, &FieldFilter::All).expect("valid"), fp(&v, &FieldFilter::All));
    }

    #[test]
    fn fingerprint_tells_every_pair_of_integers_apart(a in any::<i64>(), b in any::<u64>()) {
        let (x, y) = (Value::from(a), Value::from(b));
        prop_assume!(i128::from(a) != i128::from(b));
        prop_assert_ne!(fp(&x, &FieldFilter::All), fp(&y, &FieldFilter::All));
        prop_assert_ne!(fp(&Value::from(b), &FieldFilter::All), fp(&Value::from(b ^ 1), &FieldFilter::All));
    }

    #[test]
    fn policy_and_execute_never_panic(
        response_ttl in duration(),
        key_ttl in duration(),
        lease in duration(),
        timeout in duration(),
        poll in duration(),
        backoff in duration(),
        extend in duration(),
        wait in any::<bool>(),
        now in any::<i64>(),
    ) {
        let in_flight = if wait { InFlightMode::Wait { timeout, poll } } else { InFlightMode::Reject };
        let built = Policy::builder()
            .response_ttl(response_ttl)
            .key_ttl(key_ttl)
            .lease(lease)
            .in_flight(in_flight)
            .store_retries(1, backoff)
            .build();
        if let Ok(policy) = built {
            let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("valid");
            rt.block_on(async {
                let clock = ManualClock::new(Timestamp::from_unix_millis(now));
                let idem = Idem::new(MemoryStore::new()).with_policy(policy).with_clock(clock.clone());
                let scope = Scope::new("o", "op").expect("valid");
                for _ in 0..2 {
                    let _ = idem
                        .execute(&scope, "k", &1, |a| async move {
                            let _ = a.extend_lease(extend).await;
                            Outcome::<u32, u32>::Success(1)
                        })
                        .await;
                    clock.advance(extend);
                }
            });
        }
    }

    #[test]
    fn key_validation_is_total(raw in prop_oneof![any::<String>(), "[ \t]{0,3}[\\x20-\\x7e]{0,260}[ \t]{0,3}"]) {
        let trimmed = raw.trim_matches([' ', '\t']);
        let valid = !trimmed.is_empty()
            && trimmed.len() <= 255
            && trimmed.bytes().all(|b| (0x20..=0x7e).contains(&b));
        match IdempotencyKey::parse(&raw) {
            Ok(key) => {
                prop_assert!(valid);
                prop_assert_eq!(key.as_str(), trimmed);
                prop_assert_eq!(IdempotencyKey::parse(key.as_str()), Ok(key.clone()));
            }
            Err(_) => prop_assert!(!valid),
        }
    }

    #[test]
    fn record_decoding_is_total(
        bytes in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..64),
            prop::collection::vec(any::<u8>(), 0..64).prop_map(|b| [b"IDH1".to_vec(), b].concat()),
            prop::collection::vec(any::<u8>(), 0..64)
                .prop_map(|b| [b"IDH1\x00\xc8\x00\x00\x00\x01\x00\x00\x00".to_vec(), b].concat()),
        ],
        state in "\\PC{0,12}",
    ) {
        if let Ok(r) = HttpResponse::decode(&bytes) {
            prop_assert_eq!(r.encode().expect("re-encode"), bytes.clone());
        }
        let _ = <Value as Storable>::decode(&bytes);
        let _ = <String as Storable>::decode(&bytes);
        let _ = <Json<Vec<f64>> as Storable>::decode(&bytes);
        let _ = Fingerprint::from_slice(&bytes);
        let _ = RecordState::parse(&state);
        let _ = OutcomeKind::parse(&state);
        let _ = RawJson(&bytes).parse();
        let _ = fingerprint("op", &RawJson(&bytes), &FieldFilter::All);
    }

    #[test]
    fn resolving_any_stored_record_never_panics(
        bytes in prop::option::of(prop::collection::vec(any::<u8>(), 0..48)),
        state in 0u8..3,
        outcome in 0u8..4,
        attempt in any::<u32>(),
        lease_until in any::<i64>(),
        key_expires_at in any::<i64>(),
        now in any::<i64>(),
    ) {
        let clock = ManualClock::new(Timestamp::from_unix_millis(now));
        let idem = Idem::new(MemoryStore::new()).with_clock(clock);
        let scope = Scope::new("o", "op").expect("scope");
        let prepared = idem.prepare(&scope, "k", &1).expect("prepared");
        let record = StoredRecord {
            fingerprint: prepared.fingerprint,
            state: [RecordState::InFlight, RecordState::Released, RecordState::Completed][usize::from(state)],
            attempt,
            lease_until: Timestamp::from_unix_millis(lease_until),
            resource_id: None,
            outcome: [None, Some(OutcomeKind::Success), Some(OutcomeKind::Failure), Some(OutcomeKind::NotStored)][usize::from(outcome)],
            response: bytes,
            response_expires_at: None,
            key_expires_at: Timestamp::from_unix_millis(key_expires_at),
        };
        let answer = || ClaimOutcome::Existing(record.clone());
        let _ = idem.settle::<HttpResponse, HttpResponse>(idem.ticket(prepared.clone()), answer());
        if let Err(e) = idem.settle::<Value, String>(idem.ticket(prepared), answer()) {
            // Every refusal of a stored record has a status and a code.
            prop_assert!(e.http_status() >= 400);
            prop_assert!(!e.code().is_empty());
        }
    }
}
