//! Completions that could not be stored when the work finished, kept and
//! written again in the background under their fencing token.
//!
//! A completion whose write fails after the policy's retries (a database
//! failing over, a commit waiting on a standby, a call timeout) used to be
//! dropped: the record stayed in flight under the attempt's token, and after
//! the lease the next retry ran the work again. Here it is handed to a
//! task that writes it again, with a growing pause (the policy's retry
//! backoff, doubled up to [`MAX_PAUSE`]), until it is stored, fenced off (a
//! newer attempt took the record over: its outcome is the one kept), the
//! attempt's lease has ended (the record is then left to recovery, which
//! reconciles from the saved resource id), or the store answers with an
//! error a retry cannot fix. A process that survives its database's
//! failover thus stores what it answered within seconds of the promotion,
//! and the client's retry replays it.
//!
//! The number of completions kept at once is bounded per engine (and its
//! clones) by [`Policy::completion_backlog`](crate::Policy): a completion
//! over the bound is left to lease expiry and recovery, as before, and
//! counted. [`Idem::drain_completions`] waits for the ones in hand (call it
//! on shutdown).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tracing::{info, warn};

use crate::RecordId;
use crate::clock::{Clock, Timestamp};
use crate::engine::core::Idem;
use crate::store::any::DynStore;
use crate::store::{Completion, OwnedCompletion, StoreError, Token};

/// The longest pause between two background writes of one completion.
pub(crate) const MAX_PAUSE: Duration = Duration::from_secs(1);

/// What became of a completion kept in the background: the `result` label
/// of `idem_background_completions_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kept {
    /// Written: retries replay it.
    Stored,
    /// A newer attempt took the record over.
    Fenced,
    /// The attempt's lease ended first: left to recovery.
    Expired,
    /// The store refused it with an error a retry cannot fix.
    Failed,
    /// Not kept: the backlog was full, or no runtime to run it on.
    Dropped,
}

impl Kept {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Stored => "stored",
            Self::Fenced => "fenced",
            Self::Expired => "expired",
            Self::Failed => "failed",
            Self::Dropped => "dropped",
        }
    }
}

/// The completions an engine (and its clones) keeps in the background.
#[derive(Debug, Default)]
pub(crate) struct Backlog {
    pending: AtomicUsize,
    idle: Notify,
}

/// Decrements the count when a kept completion's task ends, however it ends.
struct Slot(Arc<Backlog>);

impl Drop for Slot {
    fn drop(&mut self) {
        if self.0.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
        crate::metrics::set_completions_pending(self.0.pending.load(Ordering::Acquire));
    }
}

impl Backlog {
    /// Completions kept now.
    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Takes a slot, unless `capacity` are taken.
    fn take(self: &Arc<Self>, capacity: usize) -> Option<Slot> {
        let mut n = self.pending.load(Ordering::Acquire);
        loop {
            if n >= capacity {
                return None;
            }
            match self
                .pending
                .compare_exchange(n, n + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    crate::metrics::set_completions_pending(n + 1);
                    return Some(Slot(Arc::clone(self)));
                }
                Err(now) => n = now,
            }
        }
    }

    /// Waits until no completion is kept, or `timeout` passes; returns how
    /// many are still kept.
    pub(crate) async fn drain(&self, timeout: Duration) -> usize {
        let wait = async {
            loop {
                let idle = self.idle.notified();
                if self.pending() == 0 {
                    return;
                }
                idle.await;
            }
        };
        let _ = tokio::time::timeout(timeout, wait).await;
        self.pending()
    }
}

/// One completion's background writes.
struct Job {
    control: Arc<dyn DynStore>,
    clock: Arc<dyn Clock>,
    id: RecordId,
    token: Token,
    completion: OwnedCompletion,
    lease_until: Timestamp,
    pause: Duration,
}

impl Job {
    async fn run(self) -> Kept {
        let mut pause = self.pause;
        loop {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_PAUSE);
            if self.clock.now() >= self.lease_until {
                return Kept::Expired;
            }
            let timer = crate::metrics::StoreTimer::start("complete");
            let done = self
                .control
                .complete(&self.id, self.token, &self.completion.completion())
                .await;
            timer.finish(&done);
            match done {
                Ok(()) => return Kept::Stored,
                Err(StoreError::LeaseLost) => return Kept::Fenced,
                Err(e) if !e.is_retryable() => {
                    warn!(error = %e, "background completion refused by the store");
                    return Kept::Failed;
                }
                Err(_) => {}
            }
        }
    }
}

impl<S> Idem<S> {
    /// Keeps `completion` of the attempt on `id` under `token`, whose lease
    /// ends at `lease_until`, and writes it again in the background. `false`
    /// when it is not kept (the backlog is full, the policy keeps none, or
    /// there is no Tokio runtime to run it on): it is then left to lease
    /// expiry and recovery.
    pub(crate) fn keep_completion(
        &self,
        id: &RecordId,
        token: Token,
        completion: &Completion<'_>,
        lease_until: Timestamp,
    ) -> bool {
        let op = Arc::clone(id.label_shared());
        let capacity = self.policy.completion_backlog();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            crate::metrics::record_background_completion(&op, Kept::Dropped.as_str());
            return false;
        };
        let Some(slot) = self.backlog.take(capacity) else {
            warn!(
                capacity,
                "completion backlog full: left to lease expiry and recovery"
            );
            crate::metrics::record_background_completion(&op, Kept::Dropped.as_str());
            return false;
        };
        let job = Job {
            control: Arc::clone(&self.control),
            clock: Arc::clone(&self.clock),
            id: id.clone(),
            token,
            completion: OwnedCompletion::of(completion),
            lease_until,
            pause: self
                .policy
                .store_retry_backoff()
                .max(Duration::from_millis(10)),
        };
        let record = id.log_hash();
        runtime.spawn(async move {
            let _slot = slot;
            let kept = job.run().await;
            match kept {
                Kept::Stored => info!(%record, "completion stored in the background"),
                Kept::Fenced => {
                    info!(%record, "background completion fenced off by a newer attempt")
                }
                Kept::Expired => warn!(
                    %record,
                    "background completion gave up: the lease ended; left to recovery"
                ),
                Kept::Failed | Kept::Dropped => {}
            }
            crate::metrics::record_background_completion(&op, kept.as_str());
        });
        true
    }

    /// Waits until every completion this engine (or a clone) keeps in the
    /// background is stored, fenced off or given up, or `timeout` passes;
    /// returns how many are still kept. Call it on shutdown, after the last
    /// request: a completion still kept when the process exits is left to
    /// lease expiry and recovery.
    ///
    /// A completion is kept when its write failed after the policy's
    /// retries ([`Reply::is_stored`](crate::Reply::is_stored) `false` for a
    /// store failure): it is written again, with pauses of
    /// [`Policy::store_retry_backoff`](crate::Policy::store_retry_backoff)
    /// doubling up to one second, until it is stored (retries then replay
    /// it), a newer attempt took the record over, or the attempt's lease
    /// ended. At most [`Policy::completion_backlog`](crate::Policy::completion_backlog)
    /// are kept at once.
    pub fn drain_completions(
        &self,
        timeout: Duration,
    ) -> impl std::future::Future<Output = usize> + Send + 'static {
        let backlog = Arc::clone(&self.backlog);
        async move { backlog.drain(timeout).await }
    }

    /// How many completions this engine (and its clones) keeps in the
    /// background now (see [`Idem::drain_completions`]).
    pub fn pending_completions(&self) -> usize {
        self.backlog.pending()
    }
}
