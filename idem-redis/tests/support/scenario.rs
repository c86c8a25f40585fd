//! What the backend tests share: a policy, engines, identities, a counter.

use std::time::Duration;

use idem_core::adapter::fingerprint;
use idem_core::clock::{Clock, ManualClock, Timestamp};
use idem_core::store::OutcomeKind;
use idem_core::store::{ClaimRequest, Completion, Store, Token};
use idem_core::{FieldFilter, Idem, IdempotencyKey, Policy, RecordId, Scope};
use idem_redis::RedisStore;

#[allow(unused_imports, reason = "each test binary uses a different part")]
pub(crate) use idem_test_support::work::{Counter, Out, counted, request};

#[allow(unused_imports, reason = "each test binary uses a different part")]
pub(crate) use idem_test_support::work::{LEASE, RESPONSE_TTL};
pub(crate) const KEY_TTL: Duration = Duration::from_secs(30 * 86_400);

pub(crate) fn policy() -> Policy {
    idem_test_support::work::policy(KEY_TTL, 5, Duration::from_millis(50))
}

pub(crate) fn engine(store: RedisStore, clock: &ManualClock) -> Idem<RedisStore> {
    Idem::new(store)
        .with_clock(clock.clone())
        .with_policy(policy())
}

pub(crate) fn scope() -> Scope {
    Scope::new(
        format!("tenant-{}", IdempotencyKey::random()),
        "POST /charges",
    )
    .expect("scope")
}

pub(crate) fn claim_req<'a>(id: &'a RecordId, clock: &ManualClock) -> ClaimRequest<'a> {
    let now = clock.now();
    ClaimRequest::new(
        id,
        fingerprint("POST /charges", &request(), &FieldFilter::All).expect("fp"),
        Token::random(),
        now,
        now.plus(LEASE),
        now.plus(KEY_TTL),
    )
}

pub(crate) fn record_id(scope: &Scope) -> RecordId {
    RecordId::new(scope.clone(), IdempotencyKey::random())
}

/// A success completed at `now`, kept for the tests' response and key TTLs.
pub(crate) fn success<'a>(
    now: Timestamp,
    body: &'a [u8],
    resource_id: Option<&'a str>,
) -> Completion<'a> {
    Completion::new(
        OutcomeKind::Success,
        Some(body),
        resource_id,
        now,
        now.plus(RESPONSE_TTL),
        now.plus(KEY_TTL),
    )
}

/// Completes what `req` claimed on `store` with [`success`] at the clock's
/// now.
pub(crate) async fn complete(
    store: &RedisStore,
    req: &ClaimRequest<'_>,
    clock: &ManualClock,
    body: &[u8],
    resource_id: Option<&str>,
) {
    store
        .complete(req.id, req.token, &success(clock.now(), body, resource_id))
        .await
        .expect("complete");
}
