//! What the adapters' builders share (the webhook receiver's in idem-http,
//! the queue consumer's in idem-consumer): the scope of their records, set
//! as an owner and an operation and checked once when the adapter is built,
//! and the policy for a permanent failure of the work with the hook told
//! about it. It lives here, in the adapter tier, because the consumer
//! depends on idem-core and not on idem-http.

use std::fmt;
use std::sync::Arc;

use crate::error::ScopeError;
use crate::id::scope::Scope;

/// The scope an adapter's builder collects: an owner and an operation, each
/// set on its own, and checked together by [`ScopeSetting::build`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScopeSetting {
    owner: Option<String>,
    operation: Option<String>,
}

impl ScopeSetting {
    /// Sets the owner (the consumer group, the webhook endpoint).
    pub fn set_owner(&mut self, owner: impl Into<String>) {
        self.owner = Some(owner.into());
    }

    /// Sets the operation (the handler's name).
    pub fn set_operation(&mut self, operation: impl Into<String>) {
        self.operation = Some(operation.into());
    }

    /// The owner, when set.
    #[must_use]
    pub fn owner(&self) -> Option<&str> {
        self.owner.as_deref()
    }

    /// The scope; `default_operation` names the operation when none was set.
    ///
    /// # Errors
    ///
    /// [`ScopeSettingError`] for a missing owner or operation, or a pair a
    /// [`Scope`] refuses.
    pub fn build(
        self,
        default_operation: impl FnOnce() -> Option<String>,
    ) -> Result<Scope, ScopeSettingError> {
        let owner = self.owner.ok_or(ScopeSettingError::MissingOwner)?;
        let operation = self
            .operation
            .or_else(default_operation)
            .ok_or(ScopeSettingError::MissingOperation)?;
        match Scope::new(owner.as_str(), operation.as_str()) {
            Ok(scope) => Ok(scope),
            Err(source) => Err(ScopeSettingError::Invalid {
                owner,
                operation,
                source,
            }),
        }
    }
}

/// Why [`ScopeSetting::build`] refused. Exhaustive: each adapter maps
/// every variant onto its own configuration error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScopeSettingError {
    /// No owner was set.
    #[error("no owner was set")]
    MissingOwner,
    /// No operation was set, and there is no default.
    #[error("no operation was set")]
    MissingOperation,
    /// The owner or the operation breaks the scope rules.
    #[error("owner {owner:?}, operation {operation:?}: {source}")]
    Invalid {
        /// The owner.
        owner: String,
        /// The operation.
        operation: String,
        /// Why a scope refuses them.
        #[source]
        source: ScopeError,
    },
}

/// What an adapter does with a permanent failure of the work: its answer
/// `P` (acknowledge, dead-letter, pass the handler's response through...),
/// and a hook `H` (a `dyn Fn` of what was being processed and the failure),
/// called once, when the failure is stored, never on its replays.
pub struct PermanentFailurePolicy<P, H: ?Sized> {
    policy: P,
    hook: Option<Arc<H>>,
}

impl<P: Default, H: ?Sized> Default for PermanentFailurePolicy<P, H> {
    fn default() -> Self {
        Self {
            policy: P::default(),
            hook: None,
        }
    }
}

impl<P: Clone, H: ?Sized> Clone for PermanentFailurePolicy<P, H> {
    fn clone(&self) -> Self {
        Self {
            policy: self.policy.clone(),
            hook: self.hook.clone(),
        }
    }
}

impl<P: fmt::Debug, H: ?Sized> fmt::Debug for PermanentFailurePolicy<P, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PermanentFailurePolicy")
            .field("policy", &self.policy)
            .field("hook", &self.hook.is_some())
            .finish()
    }
}

impl<P: Copy, H: ?Sized> PermanentFailurePolicy<P, H> {
    /// Sets the answer.
    pub fn set_policy(&mut self, policy: P) {
        self.policy = policy;
    }

    /// Sets the hook.
    pub fn set_hook(&mut self, hook: Arc<H>) {
        self.hook = Some(hook);
    }

    /// The answer, for a replay of a stored failure (the hook is not called).
    #[must_use]
    pub fn policy(&self) -> P {
        self.policy
    }

    /// A failure was just stored: `call` tells the hook (when there is
    /// one), then the answer is given.
    pub fn report(&self, call: impl FnOnce(&H)) -> P {
        if let Some(hook) = &self.hook {
            call(hook);
        }
        self.policy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_needs_an_owner_and_an_operation_a_scope_accepts() {
        let mut s = ScopeSetting::default();
        assert_eq!(
            s.clone().build(|| None),
            Err(ScopeSettingError::MissingOwner)
        );
        s.set_owner("group");
        assert_eq!(s.owner(), Some("group"));
        assert_eq!(
            s.clone().build(|| None),
            Err(ScopeSettingError::MissingOperation)
        );
        let scope = s.clone().build(|| Some("default".into())).expect("scope");
        assert_eq!((scope.owner(), scope.operation()), ("group", "default"));
        s.set_operation("handler\n");
        assert!(matches!(
            s.build(|| Some("default".into())),
            Err(ScopeSettingError::Invalid { ref operation, .. }) if operation == "handler\n"
        ));
    }

    #[test]
    fn the_hook_is_told_on_report_never_on_policy() {
        let told = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let mut p: PermanentFailurePolicy<u8, dyn Fn(&str) + Send + Sync> =
            PermanentFailurePolicy::default();
        assert_eq!(p.report(|h| h("id")), 0, "no hook: the answer alone");
        p.set_policy(7);
        let seen = Arc::clone(&told);
        p.set_hook(Arc::new(move |_: &str| {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }));
        assert_eq!(p.policy(), 7);
        assert_eq!(told.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert_eq!(p.report(|h| h("id")), 7);
        assert_eq!(told.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
