//! The webhook receiver (feature `webhook`): a provider's deliveries
//! verified before anything is claimed, run at most once per event id, and
//! answered so that the provider stops, or retries when a retry can help.
//!
//! [`WebhookLayer`] replaces [`IdempotencyLayer`](crate::IdempotencyLayer)
//! on a webhook route (never stack them). The owner of every record is the
//! endpoint you configure, the operation is `webhook <provider>`, and the
//! key is the provider's event id, verbatim when it passes the key rules
//! (so `idem inspect --key evt_…` finds it), else
//! `IdempotencyKey::derive(provider, id)`. It is the idempotency layer in
//! [`WebhookMode`]: the same service, body limit, executor (detached
//! handlers, lease renewal, panics as crashes), classification hook and
//! problem renderer, with the event id as the key source and a provider's
//! answers as the answer policy.
//!
//! ```no_run
//! use axum::{Router, body::Bytes, http::StatusCode, routing::post};
//! use idem_core::{Idem, MemoryStore};
//! use idem_http::IdemAttempt;
//! use idem_http::webhook::{Provider, Secret, WebhookDelivery, WebhookLayer};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let idem = Idem::new(MemoryStore::new());
//! let stripe = WebhookLayer::builder(idem.clone())
//!     .provider(Provider::stripe([Secret::new(std::env::var("STRIPE_WHSEC")?)]))
//!     .endpoint("stripe/acct_1/billing")
//!     .build()?;
//! let resend = WebhookLayer::builder(idem)
//!     .provider(Provider::svix([Secret::whsec(&std::env::var("RESEND_WHSEC")?)?]))
//!     .endpoint("resend/prod")
//!     .build()?;
//! async fn on_stripe(
//!     WebhookDelivery(d): WebhookDelivery,
//!     IdemAttempt(a): IdemAttempt,
//!     body: Bytes,
//! ) -> StatusCode {
//!     let _psp_key = a.downstream_key("psp", 1); // the same on a recovery
//!     let _ = (d.event_id(), a.is_recovery(), body);
//!     StatusCode::OK
//! }
//! let app: Router = Router::new()
//!     .route("/hooks/stripe", post(on_stripe))
//!     .route_layer(stripe)
//!     .route("/hooks/resend", post(|| async { StatusCode::NO_CONTENT }))
//!     .route_layer(resend);
//! # let _ = app; Ok(()) }
//! ```
//!
//! # Pipeline
//!
//! 1. `POST` only; anything else is 405.
//! 2. The body is read up to `max_body` (2 MiB): 413 above it.
//! 3. The signature headers are parsed: at most 16 candidates, unknown
//!    versions (`v1a`, `v0`) skipped; missing or unparsable is 400
//!    `malformed_webhook`.
//! 4. The signed timestamp must be within the tolerance (±300 s on the
//!    engine's clock), else 401 `stale_webhook`; then one HMAC-SHA256 per
//!    secret is compared with every candidate in constant time
//!    (`Mac::verify_slice`, length-checked): no match is 401
//!    `invalid_signature`, logged at `warn`. **Nothing is claimed before
//!    this step succeeds**: anonymous traffic cannot poison keys or hold
//!    leases.
//! 5. The event id is read (a JSON pointer parses the body only now):
//!    missing is 400 `missing_event_id`, or with `fallback_body_hash` the
//!    key `derive(provider, sha256(body))`.
//! 6. The record `(endpoint, "webhook <provider>", key)` is claimed and the
//!    handler runs (detached), with [`WebhookDelivery`] and
//!    [`IdemAttempt`](crate::IdemAttempt) in its extensions. No body
//!    fingerprint by default: providers re-sign each attempt and may
//!    re-serialise it.
//! 7. The answer follows the table.
//!
//! # Behaviour
//!
//! | # | delivery | answer to the provider | handler runs | stored |
//! |---|---|---|---|---|
//! | W1 | signature header missing or unparsable | 400 `malformed_webhook` | no | nothing |
//! | W2 | no signature matches (wrong secret, tampered body, `v1,` empty) | 401 `invalid_signature` | no | nothing |
//! | W3 | timestamp outside ±tolerance | 401 `stale_webhook` | no | nothing |
//! | W4 | body over the limit | 413 `request_too_large` | no | nothing |
//! | W5 | verified, but no event id | 400 `missing_event_id` (or the fallback key) | no | nothing |
//! | W6 | first delivery, handler 2xx | the handler's response | once | `Success` |
//! | W7 | first delivery, handler 4xx (not 408/425/429) | 200 ([`WebhookPermanentFailure::Acknowledge`]) or its own status | once | `Failure`; hook called |
//! | W8 | handler 5xx/408/425/429, or a body error | the handler's status | once | released: the next delivery runs again, as a recovery |
//! | W9 | handler panics, or the process dies | 500 `handler_panicked`, or the connection is lost | partially | in flight until the lease ends, then W12 or a recovery |
//! | W10 | duplicate of W6/W7, [`DuplicateAnswer::Ack`] | 200, empty, `Idempotent-Replayed: true` | no | unchanged |
//! | W11 | duplicate, [`DuplicateAnswer::Replay`] | the stored response + marker (W7 under `Acknowledge`: 200) | no | unchanged |
//! | W12 | duplicate while the first runs | 503 + `Retry-After` (the lease left) | no | unchanged |
//! | W13 | duplicate after `response_ttl`, or with the response not stored | 200, as W10 | no | unchanged |
//! | W14 | duplicate after `key_ttl` | as W6: a new operation (`build` keeps `key_ttl` ≥ the window) | again | new record |
//! | W15 | same id, other body, with `fingerprint_body(true)` | 422 `fingerprint_mismatch`, logged at `error` | no | unchanged |
//! | W16 | store unavailable | 503 `store_unavailable`, `Retry-After: 1` | no | nothing |
//! | W17 | layer shutting down | 503 `shutting_down` | no | nothing |
//! | W18 | N identical deliveries at once | one W6; the others W10 or W12 | once | one record |
//! | W19 | a captured signed request replayed | inside the tolerance: W10; after it: W3; GitHub: W10 until `key_ttl` | no | unchanged |
//!
//! # Retention
//!
//! [`WebhookLayerBuilder::build`] refuses an engine whose `key_ttl` is shorter than the
//! provider's redelivery window (Standard Webhooks 76 h, Svix 28 h, Stripe
//! 72 h, GitHub 72 h) unless [`WebhookLayerBuilder::allow_short_retention`], and always
//! refuses one shorter than the tolerance: with `key_ttl` ≥ tolerance a
//! captured signed request never runs twice (inside the window it is a
//! duplicate, outside it is stale). The default `Policy` keeps keys 30 days.
//! GitHub signs no timestamp: only the dedup protects it, for `key_ttl`,
//! and its `X-GitHub-Delivery` header is not signed (see
//! [`Provider::github`]).
//!
//! # Metrics
//!
//! With feature `metrics`: `idem_webhook_deliveries_total{provider,
//! result}`, `result` one of `verified_failed`, `fresh`, `duplicate`,
//! `in_flight`, `transient`, `permanent_failure`; the engine's own metrics
//! as for every call.

mod config;
mod delivery;
mod layer;
mod provider;
mod service;
mod verify;

pub use config::{DuplicateAnswer, WebhookConfigError, WebhookMode, WebhookPermanentFailure};
pub use delivery::{Delivery, WebhookDelivery};
pub use layer::{WebhookLayer, WebhookLayerBuilder};
pub use provider::{EventId, Provider};
pub use service::WebhookService;
pub use verify::{MAX_CANDIDATES, Secret, SecretError, Verified, Verify, VerifyError};
