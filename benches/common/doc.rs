//! Deterministic, realistic JSON documents for the fingerprint benches.

use serde_json::{Map, Value, json};

/// SplitMix64: tiny, deterministic, good enough to vary test data.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub(crate) fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        let i = usize::try_from(self.below(items.len() as u64)).unwrap_or(0);
        items[i]
    }
}

const NAMES: &[&str] = &[
    "Zoë Müller",
    "Jürgen Straße",
    "Ana Lúcia",
    "李小龙",
    "Ольга",
    "O'Brien",
    "Renée",
    "Bob",
];
const WORDS: &[&str] = &[
    "express",
    "gift",
    "fragile",
    "leave at door",
    "caf\u{e9}",
    "na\u{ef}ve",
    "\u{1f4e6} parcel",
    "tab\there",
    "line\nbreak",
    "say \"hi\"",
    "back\\slash",
    "ctrl\u{1}char",
];
const CURRENCIES: &[&str] = &["eur", "usd", "gbp", "jpy", "chf"];

/// A number of the kinds real requests carry: small integers, amounts in
/// cents, prices as decimals, timestamps, rates, the odd exponent.
fn number(rng: &mut Rng) -> Value {
    match rng.below(8) {
        0 => json!(rng.below(10)),
        1 => json!(rng.below(1_000_000)),
        2 => json!(1_700_000_000_000_u64 + rng.below(10_000_000_000)),
        3 => json!(f64::from(u32::try_from(rng.below(100_000)).unwrap_or(0)) / 100.0),
        4 => json!(-(i64::try_from(rng.below(5_000)).unwrap_or(0))),
        5 => json!(0.000_001 * f64::from(u32::try_from(rng.below(1000)).unwrap_or(0) + 1)),
        6 => json!(1.0e21 + f64::from(u32::try_from(rng.below(1000)).unwrap_or(0)) * 1.0e18),
        _ => json!(f64::from(u32::try_from(rng.below(1 << 20)).unwrap_or(0)) / 7.0),
    }
}

fn text(rng: &mut Rng) -> String {
    let n = 1 + rng.below(4);
    (0..n)
        .map(|_| rng.pick(WORDS))
        .collect::<Vec<_>>()
        .join(" ")
}

fn item(rng: &mut Rng, i: u64) -> Value {
    json!({
        "sku": format!("SKU-{:06}", rng.below(1_000_000)),
        "quantity": 1 + rng.below(5),
        "unit_price": number(rng),
        "line": i,
        "note": text(rng),
        "discounts": (0..rng.below(3)).map(|_| json!({"code": rng.pick(WORDS), "pct": number(rng)})).collect::<Vec<_>>(),
        "gift": rng.below(4) == 0,
        "options": null,
    })
}

fn order(rng: &mut Rng, id: u64) -> Value {
    let items: Vec<Value> = (0..1 + rng.below(3)).map(|i| item(rng, i)).collect();
    let mut metadata = Map::new();
    for i in 0..rng.below(4) {
        metadata.insert(format!("k{i}_{}", rng.pick(WORDS)), json!(text(rng)));
    }
    json!({
        "order_id": format!("ord_{id:08x}"),
        "amount": rng.below(1_000_000),
        "currency": rng.pick(CURRENCIES),
        "customer": {
            "name": rng.pick(NAMES),
            "email": format!("user{}@example.com", rng.below(10_000)),
            "address": {"line1": text(rng), "city": rng.pick(NAMES), "zip": format!("{:05}", rng.below(100_000))},
        },
        "items": items,
        "metadata": metadata,
        "client_ts": 1_700_000_000_000_u64 + rng.below(1_000_000),
        "capture": rng.below(2) == 0,
    })
}

/// A nested request document whose compact JSON is `target` bytes or a few
/// bytes more, the same on every run: whole orders while they fit, then short
/// remarks to fill up.
pub(crate) fn document(target: usize) -> Value {
    let mut rng = Rng::new(0x1DE0_0000 + target as u64);
    let mut doc = json!({"batch": 0, "source": "bench", "orders": [], "remarks": []});
    let size = |d: &Value| serde_json::to_vec(d).map_or(0, |v| v.len());
    let mut id = 0;
    loop {
        let o = order(&mut rng, id);
        let len = serde_json::to_vec(&o).map_or(0, |v| v.len()) + 1;
        if size(&doc) + len > target {
            break;
        }
        if let Some(a) = doc["orders"].as_array_mut() {
            a.push(o);
        }
        id += 1;
    }
    doc["batch"] = json!(id);
    while size(&doc) < target {
        let r = text(&mut rng);
        if let Some(a) = doc["remarks"].as_array_mut() {
            a.push(json!(r));
        }
    }
    doc
}
