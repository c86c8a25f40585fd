//! Fingerprints pinned to the digests the library produced before the
//! fingerprint was written straight from `Serialize` (computed with the
//! `serde_json::to_value` implementation of `6638eb4`): records stored
//! before must keep matching their retries. The direct path is also
//! compared with the `Value` path and with `serde_json_canonicalizer` in
//! `canonical_ser`'s unit tests and `rfc8785_differential.rs`.

#![allow(missing_docs)]

use std::collections::HashMap;

use idem_core::adapter::fingerprint;
use idem_core::{FieldFilter, RawJson};
use serde_json::json;

#[derive(serde::Serialize)]
struct Charge {
    zeta: u32,
    amount: u64,
    currency: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<&'static str>,
    items: Vec<Item>,
    #[serde(rename = "\u{fb33}")]
    hebrew: bool,
    #[serde(rename = "\u{1f600}")]
    emoji: f32,
    kind: Kind,
}

#[derive(serde::Serialize)]
struct Item {
    sku: &'static str,
    qty: i16,
    price: f64,
}

#[derive(serde::Serialize)]
enum Kind {
    Card { last4: &'static str, exp: (u8, u16) },
}

fn cases() -> Vec<(&'static str, String)> {
    let hex = |r: Result<idem_core::store::Fingerprint, idem_core::error::RequestError>| {
        r.expect("fingerprint").to_hex()
    };
    let charge = Charge {
        zeta: 1,
        amount: 1000,
        currency: "eur",
        note: None,
        items: vec![
            Item {
                sku: "b\"1\n",
                qty: -2,
                price: 9.99,
            },
            Item {
                sku: "a",
                qty: 1,
                price: 1e21,
            },
        ],
        hebrew: true,
        emoji: 0.1,
        kind: Kind::Card {
            last4: "4242",
            exp: (12, 2030),
        },
    };
    let map: HashMap<&str, u64> = [("z", 1), ("a", 2), ("m", u64::MAX)].into();
    vec![
        (
            "value",
            hex(fingerprint(
                "POST /payments",
                &json!({
                    "amount": 1000,
                    "currency": "eur",
                    "customer": "cus_4QFpXhT2",
                    "description": "Order #1234, 2 items",
                    "metadata": {"cart": "c_8812", "channel": "web"},
                }),
                &FieldFilter::All,
            )),
        ),
        (
            "struct",
            hex(fingerprint("POST /charges", &charge, &FieldFilter::All)),
        ),
        ("map_v2", hex(fingerprint("op", &map, &FieldFilter::All))),
        (
            "raw",
            hex(fingerprint(
                "op",
                &RawJson(br#"{"b":[1,2.50,{"d":null,"c":true}],"a":"\u00e9"}"#),
                &FieldFilter::All,
            )),
        ),
        (
            "filtered",
            hex(fingerprint(
                "op",
                &charge,
                &FieldFilter::ignore(["/items/0", "/zeta"]),
            )),
        ),
        (
            "scalar",
            hex(fingerprint("op", &-0.0_f64, &FieldFilter::All)),
        ),
    ]
}

/// Computed with `6638eb4` (the `Value` path), before this change.
const PINNED: &[(&str, &str)] = &[
    (
        "value",
        "d3eae2c4d4dc31a12e53d83ee4313f52d0ec79d1028d0577e471869457dc5781",
    ),
    (
        "struct",
        "e83b6fcca329b3e1c82aba1bacd1ef9c4fba9d90cb15f2de8c264076850af681",
    ),
    (
        "map_v2",
        "cb08b94fe277b0c46da795ad7f2d348c372e1332777e2aca5e1b2f08cdc08717",
    ),
    (
        "raw",
        "fe21f4c1b6e7b82901c3b0673015250c6765d27fd5c6593c8a3822bf9f9e5a60",
    ),
    (
        "filtered",
        "42590fdb500fb9f8466580e805016db31a730006a09badc867826e0fb14e0005",
    ),
    (
        "scalar",
        "6212372ca3c47d928253630f746469de5dfda8bd28c1e5de67c8571e5c9af90b",
    ),
];

#[test]
fn fingerprints_are_those_stored_before() {
    let now = cases();
    assert_eq!(now.len(), PINNED.len());
    for ((name, hex), (pinned_name, pinned)) in now.iter().zip(PINNED) {
        assert_eq!(name, pinned_name);
        assert_eq!(hex, pinned, "{name}: the fingerprint changed");
    }
}
