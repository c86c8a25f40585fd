//! The engine's state: a store, a policy, a clock, and the store's
//! token-guarded writes for attempts. Everything else in `engine` is built on
//! this (and `claim` only on this, not on the entry points).

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use tracing::debug;

use crate::Policy;
use crate::clock::{Clock, SystemClock};
use crate::engine::backlog::Backlog;
use crate::store::any::DynStore;
use crate::store::{Store, StoreError};

/// The idempotency engine: a store, a [`Policy`] and a clock.
///
/// Cheap to clone (everything is behind `Arc`s); holds no per-key state, so
/// any number of processes can share one store.
///
/// # Examples
///
/// ```
/// use idem_core::{Idem, MemoryStore, Outcome, Scope};
/// use serde_json::json;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
/// let idem = Idem::new(MemoryStore::new());
/// let scope = Scope::new("acct_42", "POST /payments")?;
/// let request = json!({"amount": 1000, "currency": "eur"});
///
/// let first = idem
///     .execute(&scope, "order-7", &request, |_attempt| async {
///         Outcome::<_, String>::Success("ch_1".to_owned())
///     })
///     .await?;
/// let retry = idem
///     .execute(&scope, "order-7", &request, |_attempt| async {
///         Outcome::<_, String>::Success("ch_2".to_owned()) // never runs
///     })
///     .await?;
/// assert!(!first.is_replay());
/// assert!(retry.is_replay());
/// assert_eq!(retry.into_result(), Ok("ch_1".to_owned()));
/// # Ok(()) }
/// ```
pub struct Idem<S> {
    pub(crate) store: Arc<S>,
    pub(crate) policy: Arc<Policy>,
    pub(crate) clock: Arc<dyn Clock>,
    /// The store's token-guarded writes for attempts, made once (not per
    /// claim).
    pub(crate) control: Arc<dyn DynStore>,
    /// Completions written again in the background, shared by the clones.
    pub(crate) backlog: Arc<Backlog>,
}

impl<S> Clone for Idem<S> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            policy: Arc::clone(&self.policy),
            clock: Arc::clone(&self.clock),
            control: Arc::clone(&self.control),
            backlog: Arc::clone(&self.backlog),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Idem<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idem")
            .field("store", &self.store)
            .field("policy", &self.policy)
            .field("clock", &self.clock)
            .finish()
    }
}

impl<S: Store> Idem<S> {
    /// An engine over `store` with the default [`Policy`] and the system clock.
    ///
    /// A store shared with other code can be passed as an `Arc<S>` (every
    /// `Arc<S: Store>` is a store).
    pub fn new(store: S) -> Self {
        let store = Arc::new(store);
        Self {
            control: Arc::clone(&store) as Arc<dyn DynStore>,
            store,
            policy: Arc::new(Policy::default()),
            clock: Arc::new(SystemClock),
            backlog: Arc::default(),
        }
    }

    /// Replaces the policy (see [`Policy::builder`]).
    #[must_use]
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = Arc::new(policy);
        self
    }

    /// Replaces the clock (e.g. a [`ManualClock`](crate::clock::ManualClock) in
    /// tests; an `Arc<dyn Clock>` from [`Idem::clock`] shares another
    /// engine's).
    #[must_use]
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The store this engine claims in.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The policy: TTLs, lease, in-flight mode, limits.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The clock every deadline is computed from.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Runs a token-guarded store write, retrying transient failures as the
    /// policy says (never `LeaseLost`, a corrupt record or a backend error).
    pub(crate) async fn with_retries<'a, Fut>(
        &'a self,
        mut call: impl FnMut() -> Fut + Send + 'a,
    ) -> Result<(), StoreError>
    where
        Fut: Future<Output = Result<(), StoreError>> + Send + 'a,
    {
        let tries = self.policy.store_retries();
        let mut i = 1;
        loop {
            match call().await {
                Ok(()) => return Ok(()),
                Err(e) if !e.is_retryable() || i >= tries => return Err(e),
                Err(e) => {
                    debug!(error = %e, try_ = i, "store write failed; retrying");
                    tokio::time::sleep(self.policy.store_retry_backoff()).await;
                    i += 1;
                }
            }
        }
    }
}
