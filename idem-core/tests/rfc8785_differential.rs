//! `canonical_json` against an independent RFC 8785 implementation
//! (`serde_json_canonicalizer`) on many generated documents: names that need
//! UTF-16 ordering, strings with every escape, numbers of every shape.

#![allow(missing_docs)]

use idem_core::adapter::{canonical_json, fingerprint};
use idem_core::{FieldFilter, RawJson};
use serde_json::{Map, Number, Value};
use sha2::{Digest, Sha256};

/// SplitMix64, so every run checks the same documents.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Characters chosen to hit every escape and every UTF-8 length, including
/// the ranges where UTF-16 order differs from UTF-8 order.
const CHARS: &[char] = &[
    'a',
    'b',
    'z',
    'A',
    '0',
    '9',
    ' ',
    '"',
    '\\',
    '/',
    '\u{0}',
    '\u{1}',
    '\u{8}',
    '\t',
    '\n',
    '\u{b}',
    '\u{c}',
    '\r',
    '\u{1f}',
    '\u{7f}',
    '\u{80}',
    '\u{e9}',
    '\u{f6}',
    '\u{7ff}',
    '\u{800}',
    '\u{20ac}',
    '\u{2028}',
    '\u{d7ff}',
    '\u{e000}',
    '\u{fb33}',
    '\u{fffd}',
    '\u{ffff}',
    '\u{10000}',
    '\u{1f600}',
    '\u{10ffff}',
];

fn string(rng: &mut Rng) -> String {
    let len = rng.below(24);
    (0..len)
        .map(|_| {
            if rng.below(3) == 0 {
                CHARS[usize::try_from(rng.below(CHARS.len() as u64)).unwrap_or(0)]
            } else {
                char::from(b'a' + u8::try_from(rng.below(26)).unwrap_or(0))
            }
        })
        .collect()
}

fn number(rng: &mut Rng) -> Value {
    match rng.below(7) {
        0 => Value::from(rng.below(1000)),
        // Integers within double precision (larger ones are rounded to
        // doubles by design; the other crate writes them exactly).
        1 => Value::from(rng.below(1 << 53)),
        2 => Value::from(-i64::try_from(rng.below(1 << 53)).unwrap_or(0)),
        3 => {
            // Any finite double, bit pattern at random.
            let f = f64::from_bits(rng.next());
            Number::from_f64(f).map_or(Value::Null, Value::Number)
        }
        4 => {
            // Decimal-looking values around every exponent ECMAScript switches at.
            let exp = i32::try_from(rng.below(60)).unwrap_or(0) - 30;
            let mant = f64::from(u32::try_from(rng.below(1_000_000)).unwrap_or(0)) / 1000.0;
            Number::from_f64(mant * 10f64.powi(exp)).map_or(Value::Null, Value::Number)
        }
        5 => Number::from_f64(f64::from(u32::try_from(rng.below(1 << 30)).unwrap_or(0)) / 64.0)
            .map_or(Value::Null, Value::Number),
        _ => Number::from_f64(-f64::from(u32::try_from(rng.below(100_000)).unwrap_or(0)) / 100.0)
            .map_or(Value::Null, Value::Number),
    }
}

fn value(rng: &mut Rng, depth: u32) -> Value {
    let pick = if depth >= 4 {
        rng.below(5)
    } else {
        rng.below(7)
    };
    match pick {
        0 => Value::Null,
        1 => Value::Bool(rng.below(2) == 0),
        2 => number(rng),
        3 | 4 => Value::String(string(rng)),
        5 => Value::Array((0..rng.below(6)).map(|_| value(rng, depth + 1)).collect()),
        _ => {
            let mut map = Map::new();
            for _ in 0..rng.below(8) {
                map.insert(string(rng), value(rng, depth + 1));
            }
            Value::Object(map)
        }
    }
}

#[test]
fn matches_serde_json_canonicalizer_on_generated_documents() {
    let mut rng = Rng(0x8785);
    for i in 0..20_000 {
        let v = value(&mut rng, 0);
        let ours = canonical_json(&v);
        let theirs = serde_json_canonicalizer::to_string(&v).expect("canonicalizer");
        assert_eq!(ours, theirs, "document #{i}: {v:?}");
    }
}

#[test]
fn matches_on_every_double_shape() {
    let mut rng = Rng(0x0001_EEE7);
    for _ in 0..200_000 {
        let Some(n) = Number::from_f64(f64::from_bits(rng.next())) else {
            continue;
        };
        let v = Value::Number(n);
        assert_eq!(
            canonical_json(&v),
            serde_json_canonicalizer::to_string(&v).expect("canonicalizer"),
            "{v:?}"
        );
    }
}

/// The fingerprint as documented, from the reference crate's canonical
/// bytes: SHA-256 of `idem-fp-v1\0`, the operation's length (8 bytes, big
/// endian), the operation, the canonical JSON.
fn reference_fingerprint(operation: &str, v: &Value) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"idem-fp-v1\0");
    h.update((operation.len() as u64).to_be_bytes());
    h.update(operation.as_bytes());
    h.update(serde_json_canonicalizer::to_vec(v).expect("canonicalizer"));
    h.finalize().into()
}

/// Fingerprints (made straight from `Serialize`, and from the raw text
/// through `RawJson`) equal the hash of the reference crate's canonical
/// bytes: every record stored before still matches its retries.
#[test]
fn fingerprints_match_the_reference_canonicalisation() {
    let mut rng = Rng(0x00F1_9E27);
    for i in 0..20_000 {
        let v = value(&mut rng, 0);
        let expected = reference_fingerprint("POST /orders", &v);
        let ours = fingerprint("POST /orders", &v, &FieldFilter::All).expect("fingerprint");
        assert_eq!(ours.as_bytes(), &expected, "document #{i}: {v:?}");
        let text = serde_json::to_vec(&v).expect("to_vec");
        let raw = fingerprint("POST /orders", &RawJson(&text), &FieldFilter::All)
            .expect("raw fingerprint");
        assert_eq!(raw.as_bytes(), &expected, "raw document #{i}: {v:?}");
    }
}
