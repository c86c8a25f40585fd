//! The webhook receiver's `WebhookLayer` (Standard Webhooks signature
//! check, then the claim, the handler and the stored answer; a duplicate
//! replayed) against the axum handler people write by hand: HMAC-SHA256
//! verified with `hmac`'s constant-time `verify_slice` over
//! `id.timestamp.body`, the timestamp tolerance, then the dedup-table insert
//! of `common::dedup` (`INSERT … ON CONFLICT DO NOTHING` on
//! `(provider, event_id)`, or Redis `SET NX`) and the work when it inserted.
//! Same store, same run, in process (`tower::ServiceExt::oneshot`, no
//! network), one delivery at a time:
//!
//! * **first delivery**: a new event id;
//! * **redelivery**: one of 256 events already processed, re-signed (the
//!   layer: 200, empty, `Idempotent-Replayed: true`; by hand: 200 after an
//!   insert that inserts nothing).
//!
//! The event is a 230-byte JSON body; every request is signed before the
//! timer starts (the provider's cost is on neither side). The handler is a
//! no-op that counts its runs, and the bench checks both sides ran it once
//! per first delivery and never on a redelivery.
//!
//! Run with: `cargo bench --bench webhook --all-features` (pinned:
//! `taskset -c 1 cargo bench …`; `IDEM_BENCH_QUICK=1` for a smoke run).

#[allow(dead_code, reason = "each bench uses a part of the shared helpers")]
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::routing::post;
use base64::Engine as _;
use common::dedup::{Dedup, sample};
use criterion::Criterion;
use hmac::{Hmac, KeyInit, Mac};
use idem::Idem;
use idem::http::webhook::{Provider, Secret, WebhookDelivery, WebhookLayer};
use idem::store::Store;
use sha2::Sha256;
use tokio::runtime::Runtime;
use tower::ServiceExt;

const SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
/// The provider column of the hand-written table.
const PROVIDER: &str = "standard";
/// Events delivered again in the redelivery scenario.
const STORED: u64 = 256;
/// The signature tolerance, both sides.
const TOLERANCE_S: i64 = 300;

fn secret_key() -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(SECRET.trim_start_matches("whsec_"))
        .expect("secret")
}

fn now_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Event `id`, signed now as a Standard Webhooks sender signs it.
fn signed(key: &[u8], id: &str) -> Request<Body> {
    let body = format!(
        r#"{{"id":"{id}","type":"invoice.paid","data":{{"invoice":"in_1Q2w3E4r5T6y7U8i","customer":"cus_0042","amount_paid":2599,"currency":"eur","lines":[{{"sku":"book-0042","qty":1}}]}}}}"#
    );
    let ts = now_s().to_string();
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("key");
    mac.update(format!("{id}.{ts}.{body}").as_bytes());
    let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    Request::post("/hook")
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", ts)
        .header("webhook-signature", format!("v1,{sig}"))
        .body(Body::from(body))
        .expect("request")
}

fn event(run: &str, n: u64) -> String {
    format!("msg_{run}_{n:012}")
}

/// The hand-written receiver's state.
struct Hand {
    key: Vec<u8>,
    dedup: Dedup,
    runs: Arc<AtomicU64>,
}

/// The receiver people write: verify, check the time, insert, work.
async fn by_hand(State(h): State<Arc<Hand>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let get = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    let (Some(id), Some(ts), Some(sigs)) = (
        get("webhook-id"),
        get("webhook-timestamp"),
        get("webhook-signature"),
    ) else {
        return StatusCode::BAD_REQUEST;
    };
    let Ok(t) = ts.parse::<i64>() else {
        return StatusCode::BAD_REQUEST;
    };
    if (now_s() - t).abs() > TOLERANCE_S {
        return StatusCode::UNAUTHORIZED;
    }
    let Ok(mut mac) = <Hmac<Sha256> as KeyInit>::new_from_slice(&h.key) else {
        return StatusCode::INTERNAL_SERVER_ERROR;
    };
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(ts.as_bytes());
    mac.update(b".");
    mac.update(&body);
    let verified = sigs
        .split(' ')
        .filter_map(|s| s.strip_prefix("v1,"))
        .filter_map(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .any(|sig| mac.clone().verify_slice(&sig).is_ok());
    if !verified {
        return StatusCode::UNAUTHORIZED;
    }
    if h.dedup.first_time(PROVIDER, id).await {
        h.runs.fetch_add(1, Ordering::Relaxed);
        std::hint::black_box(&body);
    }
    StatusCode::OK
}

/// The handler behind the layer: the same no-op work.
async fn handler(
    State(runs): State<Arc<AtomicU64>>,
    WebhookDelivery(d): WebhookDelivery,
    body: Bytes,
) -> StatusCode {
    runs.fetch_add(1, Ordering::Relaxed);
    std::hint::black_box((d.event_id(), &body));
    StatusCode::OK
}

async fn send(app: &Router, req: Request<Body>) {
    let res = app.clone().oneshot(req).await.expect("infallible");
    assert_eq!(res.status(), StatusCode::OK);
}

fn bench_backend<S: Store>(c: &mut Criterion, rt: &Runtime, backend: &str, store: S, dedup: Dedup) {
    let key = secret_key();
    let runs = Arc::new(AtomicU64::new(0));
    let policy = common::stores::policy();
    let layer = WebhookLayer::builder(Idem::new(store).with_policy(policy))
        .provider(Provider::standard_webhooks([
            Secret::whsec(SECRET).expect("whsec")
        ]))
        .endpoint("bench/standard")
        // The bench's records expire in 10 minutes, below the provider's
        // retry window.
        .allow_short_retention()
        .build()
        .expect("layer");
    let layered = Router::new()
        .route("/hook", post(handler))
        .route_layer(layer)
        .with_state(Arc::clone(&runs));
    let hand = Router::new()
        .route("/hook", post(by_hand))
        .with_state(Arc::new(Hand {
            key: key.clone(),
            dedup,
            runs: Arc::clone(&runs),
        }));
    let tag = std::process::id().to_string();
    let sides = [
        ("webhook layer", &layered, "l"),
        ("hand-written", &hand, "h"),
    ];
    rt.block_on(async {
        for (_, app, side) in sides {
            for n in 0..STORED {
                send(app, signed(&key, &event(&format!("{tag}{side}"), n))).await;
            }
        }
    });
    assert_eq!(runs.load(Ordering::Relaxed), 2 * STORED);
    let next = AtomicU64::new(0);
    // First deliveries (a fresh event each: the work runs every time), then
    // redeliveries of the stored events (the work never runs).
    for (group, fresh) in [("first-delivery", true), ("redelivery", false)] {
        let mut g = c.benchmark_group(format!("webhook/{backend}/{group}"));
        for (name, app, side) in sides {
            let run = format!("{tag}{side}{}", if fresh { "f" } else { "" });
            g.bench_function(name, |b| {
                b.iter_custom(|iters| {
                    let reqs: Vec<_> = (0..iters)
                        .map(|i| {
                            let n = if fresh {
                                next.fetch_add(1, Ordering::Relaxed)
                            } else {
                                i % STORED
                            };
                            signed(&key, &event(&run, n))
                        })
                        .collect();
                    let ran = if fresh { iters } else { 0 };
                    sample(rt, &runs, ran, async {
                        for req in reqs {
                            send(app, req).await;
                        }
                    })
                });
            });
        }
        g.finish();
    }
}

/// [`bench_backend`] on each backend.
struct Bench;

impl common::dedup::OnBackend for Bench {
    fn on<S: Store>(c: &mut Criterion, rt: &Runtime, backend: &str, store: S, dedup: Dedup) {
        bench_backend(c, rt, backend, store, dedup);
    }
}

fn main() {
    common::dedup::main::<Bench>("webhook");
}
