//! Purging that runs by itself: [`Idem::spawn_purger`].

use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::Idem;
use crate::ops::DEFAULT_TIMEOUT;
use crate::store::PurgeReport;
use crate::store::{Store, Token};

/// How a background purger runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PurgerConfig {
    /// The pause between two rounds (at least 1 ms). Any `Duration` works:
    /// a pause beyond what the timer holds waits as long as it can.
    pub interval: Duration,
    /// Records per store call; a round calls until a batch comes back empty.
    pub batch: u32,
    /// Up to this much is added at random to every pause, so instances
    /// started together do not purge in lockstep.
    pub jitter: Duration,
    /// How long one batch may take at the store; a batch that does not
    /// answer in time is abandoned, logged and counted as a failed round
    /// (`idem_purge_errors_total`), and the next round runs as planned.
    pub timeout: Duration,
}

impl Default for PurgerConfig {
    /// Every minute, 1,000 records per batch, up to 10 s of jitter, 30 s
    /// per batch at most ([`DEFAULT_TIMEOUT`]).
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(60),
            batch: 1000,
            jitter: Duration::from_secs(10),
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

/// A running purger. [`PurgerHandle::stop`] ends it gracefully and waits
/// for it; dropping the handle also ends it, without waiting.
#[derive(Debug)]
pub struct PurgerHandle {
    stop: oneshot::Sender<()>,
    task: JoinHandle<PurgeReport>,
}

impl PurgerHandle {
    /// Stops the purger: a batch already sent to the store finishes, no
    /// other starts. Returns what it purged over its whole life (what it
    /// had purged is lost, and an error logged, if the task was aborted
    /// with its runtime).
    pub async fn stop(self) -> PurgeReport {
        let _ = self.stop.send(());
        match self.task.await {
            Ok(report) => report,
            Err(e) => {
                tracing::error!(error = %e, "the purger task ended abnormally");
                PurgeReport::default()
            }
        }
    }

    /// Whether the purger task is still running (for a health check):
    /// `false` once it has stopped, or if its runtime shut down.
    #[must_use]
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }
}

/// The pause before the next round: `interval` plus up to `jitter`, at
/// least 1 ms (an interval of zero does not spin), and saturating rather
/// than overflowing for any `Duration` (Tokio's timers cap a far deadline).
fn pause(config: &PurgerConfig) -> Duration {
    let jitter_ms = u64::try_from(config.jitter.as_millis()).unwrap_or(u64::MAX);
    let extra = if jitter_ms == 0 {
        0
    } else {
        Token::random().as_i64().unsigned_abs() % jitter_ms.saturating_add(1)
    };
    config
        .interval
        .saturating_add(Duration::from_millis(extra))
        .max(Duration::from_millis(1))
}

impl<S: Store> Idem<S> {
    /// Spawns a task that purges expired keys and bodies every
    /// `config.interval` (plus jitter), in batches of `config.batch`, until
    /// [`PurgerHandle::stop`]. Safe to run on every instance at once (each
    /// batch is bounded and skips rows another purger holds). A failed round
    /// is logged and counted (`idem_purge_errors_total`), and the next round
    /// runs as planned.
    ///
    /// On a store with native expiry
    /// ([`Capabilities::native_expiry`](crate::store::Capabilities), Redis)
    /// the task makes no store call at all: it only waits to be stopped.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime (like `tokio::spawn`).
    pub fn spawn_purger(&self, config: PurgerConfig) -> PurgerHandle {
        let (stop, mut stopped) = oneshot::channel::<()>();
        let idem = self.clone();
        let task = tokio::spawn(async move {
            let mut total = PurgeReport::default();
            if idem.store().capabilities().native_expiry {
                let _ = stopped.await;
                return total;
            }
            loop {
                tokio::select! {
                    _ = &mut stopped => return total,
                    () = tokio::time::sleep(pause(&config)) => {}
                }
                let admin = idem.admin().timeout(config.timeout);
                loop {
                    match admin.purge_batch(config.batch).await {
                        Ok(r) if r == PurgeReport::default() => break,
                        Ok(r) => {
                            total.add(r);
                            tracing::debug!(
                                keys = r.keys_removed,
                                bodies = r.bodies_dropped,
                                "purged a batch"
                            );
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "purge failed; next round as planned");
                            break;
                        }
                    }
                    match stopped.try_recv() {
                        Err(oneshot::error::TryRecvError::Empty) => {}
                        _ => return total,
                    }
                }
            }
        });
        PurgerHandle { stop, task }
    }
}
