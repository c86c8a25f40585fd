//! The handle the work receives: recovery information, saved resource ids,
//! lease extension and downstream keys.

use std::fmt;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::clock::{Clock, Timestamp};
use crate::store::any::DynStore;
use crate::store::{Previous, Token};
use crate::{Error, RecordId, TakeoverReason};

/// The work's view of its own attempt. Cheap to clone.
///
/// ```
/// # use idem_core::{Idem, MemoryStore, Outcome, Scope};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
/// let idem = Idem::new(MemoryStore::new());
/// let scope = Scope::new("acct_1", "POST /charges")?;
/// let reply = idem
///     .execute(&scope, "key-1", &serde_json::json!({"amount": 100}), |attempt| async move {
///         // The same id on every attempt for this record: the provider dedups a re-run.
///         let provider_key = attempt.downstream_key("provider-charge", 1);
///         if let Some(charge) = attempt.previous_resource_id() {
///             return Outcome::Success(charge.to_owned()); // reconcile
///         }
///         let charge = format!("ch_{}", &provider_key[..8]);
///         if attempt.save_resource_id(&charge).await.is_err() {
///             return Outcome::Transient("lease lost".to_owned());
///         }
///         Outcome::Success(charge)
///     })
///     .await?;
/// assert!(!reply.is_replay());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Attempt {
    inner: Arc<Inner>,
}

struct Inner {
    id: RecordId,
    token: Token,
    number: u32,
    previous: Option<Previous>,
    clock: Arc<dyn Clock>,
    /// `None` when the writes are deferred (a claim held by a transaction).
    control: Option<Arc<dyn DynStore>>,
    resource_id: Mutex<Option<String>>,
    /// Whether [`Attempt::save_resource_id`] wrote a resource id.
    saved: AtomicBool,
    /// The lease's end as this attempt last set it (the claim's, then each
    /// extension's).
    lease_until: Mutex<Timestamp>,
}

impl fmt::Debug for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Attempt")
            .field("record", &self.inner.id.log_hash())
            .field("token", &self.inner.token)
            .field("number", &self.inner.number)
            .field("previous", &self.inner.previous.as_ref().map(|p| p.reason))
            .finish_non_exhaustive()
    }
}

impl Attempt {
    pub(crate) fn new(
        id: RecordId,
        token: Token,
        number: u32,
        previous: Option<Previous>,
        clock: Arc<dyn Clock>,
        control: Option<Arc<dyn DynStore>>,
        lease_until: Timestamp,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                id,
                token,
                number,
                previous,
                clock,
                control,
                resource_id: Mutex::new(None),
                saved: AtomicBool::new(false),
                lease_until: Mutex::new(lease_until),
            }),
        }
    }

    /// 1 for the first attempt on this record, then 2, 3, ...
    #[must_use]
    pub fn number(&self) -> u32 {
        self.inner.number
    }

    /// Whether an earlier attempt ran: its lease expired with the outcome
    /// unknown, or it released the key after a transient failure. The work
    /// should reconcile (e.g. look the charge up by its downstream key)
    /// before acting again.
    #[must_use]
    pub fn is_recovery(&self) -> bool {
        self.inner.previous.is_some()
    }

    /// Why this attempt took over, if it did.
    #[must_use]
    pub fn recovery_reason(&self) -> Option<TakeoverReason> {
        self.inner.previous.as_ref().map(|p| p.reason)
    }

    /// The resource id an earlier attempt saved on this record, if
    /// any: what a recovery reconciles from.
    #[must_use]
    pub fn previous_resource_id(&self) -> Option<&str> {
        self.inner.previous.as_ref()?.resource_id.as_deref()
    }

    /// The record this attempt works on.
    #[must_use]
    pub fn record(&self) -> &RecordId {
        &self.inner.id
    }

    /// This attempt's fencing token (adapters reach it through
    /// [`PendingCompletion::token`](crate::adapter::PendingCompletion::token)).
    #[must_use]
    pub(crate) fn token(&self) -> Token {
        self.inner.token
    }

    /// Saves the record's resource id *now*, under this attempt's token,
    /// e.g. the id of the charge just created, so a later
    /// recovery can reconcile ([`Attempt::previous_resource_id`]). It is kept
    /// after the response body is dropped. One round trip; use
    /// [`Attempt::set_resource_id`] to save it with the outcome instead.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when a newer attempt took the record over;
    /// [`Error::Store`] when the store fails.
    pub async fn save_resource_id(&self, resource_id: &str) -> Result<(), Error> {
        let i = &self.inner;
        let Some(control) = &i.control else {
            self.set_resource_id(resource_id);
            return Ok(());
        };
        control
            .save_resource_id(&i.id, i.token, resource_id)
            .await
            .map_err(Error::from)?;
        i.saved.store(true, Ordering::Release);
        Ok(())
    }

    /// Whether [`Attempt::save_resource_id`] wrote a resource id to the
    /// store in this attempt: a later recovery will be given it
    /// ([`Attempt::previous_resource_id`]), so it can reconcile instead of
    /// acting twice. An adapter whose completion is not stored yet
    /// ([`Reply::is_pending`](crate::Reply::is_pending)) may still answer
    /// "done" when this is `true`.
    #[must_use]
    pub fn has_saved_resource_id(&self) -> bool {
        self.inner.saved.load(Ordering::Acquire)
    }

    /// Extends the lease to `now + by` (the engine's clock), for long work.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when a newer attempt took the record over;
    /// [`Error::Store`] when the store fails.
    pub async fn extend_lease(&self, by: Duration) -> Result<(), Error> {
        let i = &self.inner;
        let Some(control) = &i.control else {
            return Ok(());
        };
        let until = i.clock.now().plus(by);
        control
            .extend_lease(&i.id, i.token, until)
            .await
            .map_err(Error::from)?;
        if let Ok(mut end) = i.lease_until.lock() {
            *end = until;
        }
        Ok(())
    }

    /// Runs `work`, extending the lease by `lease` (the policy's) every
    /// third of it while `work` runs, for at most `ceiling` after it
    /// starts (`None`: no renewal, `work` as it is): work that outlives one
    /// lease is not taken over by a retry while it still runs, and work
    /// that hangs is, once the ceiling has passed and the last lease ended.
    /// The first extension that fails (the record taken over, the store
    /// down) ends the renewals, with a warning; `work` runs on to its end
    /// either way.
    ///
    /// The period is the runtime's time (`tokio::time`), the lease's end the
    /// engine's clock. For adapters that run a handler they did not write
    /// (the HTTP, gRPC and MCP layers renew this way); work of your own can
    /// call [`Attempt::extend_lease`] where it knows it is making progress.
    pub async fn renewing<F: Future>(
        &self,
        lease: Duration,
        ceiling: Option<Duration>,
        work: F,
    ) -> F::Output {
        let Some(ceiling) = ceiling else {
            return work.await;
        };
        let every = (lease / 3).max(Duration::from_millis(10));
        let start = tokio::time::Instant::now();
        let mut work = std::pin::pin!(work);
        loop {
            tokio::select! {
                out = &mut work => return out,
                () = tokio::time::sleep(every) => {
                    if start.elapsed() >= ceiling {
                        return work.await;
                    }
                    if let Err(e) = self.extend_lease(lease).await {
                        tracing::warn!(error = %e, "lease renewal failed; no more renewals");
                        return work.await;
                    }
                }
            }
        }
    }

    /// The lease's end as this attempt last set it.
    pub(crate) fn lease_until(&self) -> Timestamp {
        self.inner
            .lease_until
            .lock()
            .map_or_else(|poisoned| *poisoned.into_inner(), |end| *end)
    }

    /// Names the resource the work created, saved with the outcome at no
    /// extra round trip (use [`Attempt::save_resource_id`] to save it right
    /// away). Retries after the body is dropped get it in
    /// [`Error::ResponseExpired`].
    pub fn set_resource_id(&self, resource_id: impl Into<String>) {
        if let Ok(mut slot) = self.inner.resource_id.lock() {
            *slot = Some(resource_id.into());
        }
    }

    pub(crate) fn take_resource_id(&self) -> Option<String> {
        self.inner
            .resource_id
            .lock()
            .ok()
            .and_then(|mut s| s.take())
    }

    /// A deterministic key for a call to another idempotent API: lowercase
    /// hex SHA-256 of the *scoped* record identity, `name` and `version`.
    ///
    /// Every attempt on this record gets the same value, so a re-run is a
    /// retry at the provider too; two owners using the same key never
    /// collide; bump `version` to roll the derivation.
    #[must_use]
    pub fn downstream_key(&self, name: &str, version: u32) -> String {
        downstream_key_of(&self.inner.id, name, version)
    }
}

/// See [`Attempt::downstream_key`].
fn downstream_key_of(id: &RecordId, name: &str, version: u32) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"idem-downstream-v1\0");
    hasher.update(id.digest());
    hasher.update((name.len() as u64).to_be_bytes());
    hasher.update(name.as_bytes());
    hasher.update(version.to_be_bytes());
    hex::encode(hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{IdempotencyKey, Scope};

    #[test]
    fn downstream_keys_are_scoped_and_versioned() {
        let key = IdempotencyKey::parse("k").unwrap();
        let a = RecordId::new(Scope::new("tenant-a", "op").unwrap(), key.clone());
        let b = RecordId::new(Scope::new("tenant-b", "op").unwrap(), key);
        assert_eq!(
            downstream_key_of(&a, "charge", 1),
            downstream_key_of(&a, "charge", 1)
        );
        assert_ne!(
            downstream_key_of(&a, "charge", 1),
            downstream_key_of(&b, "charge", 1)
        );
        assert_ne!(
            downstream_key_of(&a, "charge", 1),
            downstream_key_of(&a, "charge", 2)
        );
        assert_ne!(
            downstream_key_of(&a, "charge", 1),
            downstream_key_of(&a, "refund", 1)
        );
        assert_eq!(downstream_key_of(&a, "charge", 1).len(), 64);
    }
}
