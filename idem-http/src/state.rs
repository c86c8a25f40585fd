//! What a built layer and every service it wraps share at run time: the
//! engine, the validated configuration, the mode (where a record comes from
//! and how the answer goes out) and the shutdown state. Built by the
//! builders in `layer.rs` and `webhook/layer.rs`, read by `service.rs` and
//! the steps it runs; it imports neither.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use idem_core::Idem;
use tokio_util::task::TaskTracker;

use crate::config::Config;

/// How long a shutdown waits for the outcomes the engine is still writing
/// in the background ([`Idem::drain_completions`]).
const DRAIN_COMPLETIONS: std::time::Duration = std::time::Duration::from_secs(10);

/// The shutdown state a layer hands to the layers built from it
/// (`to_builder`): its tracker of detached handlers and its closed flag.
pub(crate) type Link = (TaskTracker, Arc<AtomicBool>);

pub(crate) struct Shared<S, M> {
    pub(crate) idem: Idem<S>,
    pub(crate) cfg: Config,
    /// The owner source of the `Idempotency-Key` layer, or the webhook
    /// receiver's settings.
    pub(crate) mode: M,
    pub(crate) tracker: TaskTracker,
    pub(crate) closed: Arc<AtomicBool>,
}

impl<S, M> Shared<S, M> {
    /// The state of a new layer, sharing `link`'s shutdown state when given.
    pub(crate) fn new(idem: Idem<S>, cfg: Config, mode: M, link: Option<Link>) -> Arc<Self> {
        let (tracker, closed) =
            link.unwrap_or_else(|| (TaskTracker::new(), Arc::new(AtomicBool::new(false))));
        Arc::new(Self {
            idem,
            cfg,
            mode,
            tracker,
            closed,
        })
    }

    /// This state's shutdown state, for a layer built from it.
    pub(crate) fn link(&self) -> Link {
        (self.tracker.clone(), Arc::clone(&self.closed))
    }

    /// Whether the layer stopped accepting requests.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// New requests get 503 `shutting_down`; no more handlers are tracked.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.tracker.close();
    }

    /// [`close`](Self::close), then waits for every detached handler to
    /// finish and store its outcome.
    pub(crate) async fn shutdown(&self)
    where
        S: Send + Sync,
        M: Send + Sync,
    {
        self.close();
        self.tracker.wait().await;
        // Outcomes whose completion is still being written in the
        // background (the store failed when their handler finished).
        let left = self.idem.drain_completions(DRAIN_COMPLETIONS).await;
        if left > 0 {
            tracing::warn!(
                left,
                "shutdown: completions still unstored, left to recovery"
            );
        }
    }
}
