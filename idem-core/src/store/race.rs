//! The bounded "lost a race, run again" loop of claims made of a conditional
//! write and a read.

use std::future::Future;

use crate::store::{ClaimOutcome, StoreError};

/// How many times a store runs its claim again when a concurrent writer
/// made the read and the conditional write disagree (see
/// [`retry_claim_race`]).
pub const CLAIM_RACE_TRIES: u32 = 8;

/// The bounded "lost a race, run again" loop of a backend whose claim is a
/// conditional write followed by a read (SQL `INSERT … ON CONFLICT` plus a
/// guarded `UPDATE`, DynamoDB conditional puts): `try_claim` returns
/// `Ok(None)` when a concurrent writer changed the record between its steps,
/// and is run again, at most [`CLAIM_RACE_TRIES`] times.
///
/// Exhaustion is [`StoreError::Unavailable`] on every backend: contention is
/// temporary, so the caller gets 503 with `Retry-After`, and the work never
/// runs.
///
/// # Errors
///
/// Whatever `try_claim` returns, or `Unavailable` on exhaustion.
pub async fn retry_claim_race<F, Fut>(
    backend: &'static str,
    mut try_claim: F,
) -> Result<ClaimOutcome, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<ClaimOutcome>, StoreError>>,
{
    for _ in 0..CLAIM_RACE_TRIES {
        if let Some(outcome) = try_claim().await? {
            return Ok(outcome);
        }
    }
    Err(StoreError::Unavailable {
        backend,
        source: format!("the claim lost {CLAIM_RACE_TRIES} races in a row").into(),
    })
}
