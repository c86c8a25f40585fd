//! What the work returns and what `execute` hands back.

/// The work's verdict. The work classifies its own result, because only it
/// knows whether running again would give the same answer.
///
/// Rule: cache a failure if and only if re-running it would produce the same
/// failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T, E> {
    /// Done: stored and replayed to every retry.
    Success(T),
    /// A permanent failure (validation, hard decline, unknown account):
    /// stored and replayed.
    Failure(E),
    /// A transient failure (provider 503, timeout, serialization conflict):
    /// not stored; the key is released so the next retry runs the work again.
    Transient(E),
}

/// The error side of a work that returns `Result<T, Failure<E>>`, so the
/// work can use `?`: a permanent failure is stored and replayed, a transient
/// one releases the key.
///
/// ```
/// use idem_core::{Failure, Idem, MemoryStore, Scope};
///
/// async fn charge(amount: u64) -> Result<String, std::io::Error> {
///     Ok(format!("ch_{amount}"))
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_core::Error> {
/// let idem = Idem::new(MemoryStore::new());
/// let scope = Scope::new("acct_42", "POST /charges")?;
/// let reply = idem
///     .execute(&scope, "order-7", &serde_json::json!({"amount": 100}), |_attempt| async move {
///         if 100 > 10_000 {
///             return Err(Failure::permanent("amount too large".to_owned()));
///         }
///         // A provider outage is transient: the key is released for a retry.
///         let id = charge(100).await.map_err(|e| Failure::transient(e.to_string()))?;
///         Ok(id)
///     })
///     .await?;
/// assert_eq!(reply.into_result(), Ok("ch_100".to_owned()));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure<E> {
    /// Re-running would fail the same way: stored and replayed.
    Permanent(E),
    /// Re-running may succeed: the key is released.
    Transient(E),
}

impl<E> Failure<E> {
    /// A permanent failure (stored and replayed).
    pub fn permanent(error: E) -> Self {
        Self::Permanent(error)
    }

    /// A transient failure (the key is released).
    pub fn transient(error: E) -> Self {
        Self::Transient(error)
    }
}

impl<T, E> From<Result<T, Failure<E>>> for Outcome<T, E> {
    fn from(result: Result<T, Failure<E>>) -> Self {
        match result {
            Ok(value) => Self::Success(value),
            Err(Failure::Permanent(e)) => Self::Failure(e),
            Err(Failure::Transient(e)) => Self::Transient(e),
        }
    }
}

impl<T, E> Outcome<T, E> {
    /// `Success` as `Ok`, either failure as `Err`.
    ///
    /// # Errors
    ///
    /// The failure, permanent or transient.
    pub fn into_result(self) -> Result<T, E> {
        match self {
            Self::Success(t) => Ok(t),
            Self::Failure(e) | Self::Transient(e) => Err(e),
        }
    }
}

/// The answer of [`Idem::execute`](crate::Idem::execute).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply<T, E> {
    pub(crate) outcome: Outcome<T, E>,
    pub(crate) replayed: bool,
    pub(crate) attempt: u32,
    pub(crate) stored: bool,
    /// The completion's write failed: the engine writes it again in the
    /// background (or left it to recovery).
    pub(crate) pending: bool,
}

impl<T, E> Reply<T, E> {
    /// Whether this is a replay of a stored outcome (the work did not run).
    /// HTTP adapters send `Idempotent-Replayed: true` for these.
    #[must_use]
    pub fn is_replay(&self) -> bool {
        self.replayed
    }

    /// The outcome (a replay is never `Transient`).
    #[must_use]
    pub fn outcome(&self) -> &Outcome<T, E> {
        &self.outcome
    }

    /// Takes the outcome.
    #[must_use]
    pub fn into_outcome(self) -> Outcome<T, E> {
        self.outcome
    }

    /// `Success` as `Ok`, either failure as `Err` (use
    /// [`Reply::into_outcome`] to tell a permanent failure from a transient
    /// one).
    ///
    /// # Errors
    ///
    /// The failure, permanent or transient.
    pub fn into_result(self) -> Result<T, E> {
        self.outcome.into_result()
    }

    /// The attempt number that produced the outcome (for replays, the number
    /// of attempts the record has seen).
    #[must_use]
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Whether the outcome is in the store. `false` only for an executed
    /// outcome whose completion write failed (the store was down: the record
    /// is left to lease expiry and recovery), or whose response was too large
    /// to store; a transient failure is never stored either. Replays are
    /// always `true`.
    #[must_use]
    pub fn is_stored(&self) -> bool {
        self.stored
    }

    /// Whether the outcome's completion could not be written when the work
    /// finished (the store failed after the policy's retries): the engine
    /// keeps writing it in the background until it is stored, fenced off,
    /// or the lease ends (see [`Idem::drain_completions`](crate::Idem::drain_completions)).
    /// Until it is stored, a retry gets [`Error::InFlight`](crate::Error::InFlight);
    /// if it never is, the retry after the lease runs the work again as a
    /// recovery, given the resource id the work saved
    /// ([`Attempt::save_resource_id`](crate::Attempt::save_resource_id)).
    /// An adapter must not tell its client "done" for such an outcome
    /// unless the work saved its resource id.
    #[must_use]
    pub fn is_pending(&self) -> bool {
        self.pending
    }
}
