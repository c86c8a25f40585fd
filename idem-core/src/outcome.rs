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

    /// `Success` as `Ok`, either failure as `Err`.
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
}
