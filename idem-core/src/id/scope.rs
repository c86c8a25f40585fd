//! Scopes and record identities: `(owner, operation, key)`.

use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::IdempotencyKey;
use crate::util::short_hash;

/// The longest owner or operation accepted, in bytes.
pub(crate) const MAX_SCOPE_PART_LEN: usize = Scope::MAX_PART_LEN;

/// Who is asking and what they are doing: `(owner, operation)`.
///
/// `owner` is the tenant, account or session user (or the webhook endpoint for
/// a derived key); `operation` names what is done, e.g. `POST /payments`. The
/// same key under another owner or operation is a different record, so no
/// response ever crosses tenants.
///
/// # Examples
///
/// ```
/// use idem_core::Scope;
///
/// let scope = Scope::new("acct_42", "POST /payments").unwrap();
/// assert_eq!(scope.owner(), "acct_42");
/// assert!(Scope::new("", "POST /payments").is_err());
/// ```
#[derive(Clone)]
pub struct Scope {
    // Shared, so cloning a scope (into every record id the engine makes)
    // allocates nothing.
    owner: Arc<str>,
    operation: Arc<str>,
    /// The `operation` metrics label when it is not the operation itself
    /// ([`Scope::with_metrics_label`]); never part of the identity.
    label: Option<Arc<str>>,
}

// The identity is `(owner, operation)`: the metrics label is not part of it.
impl PartialEq for Scope {
    fn eq(&self, other: &Self) -> bool {
        self.owner == other.owner && self.operation == other.operation
    }
}

impl Eq for Scope {}

impl std::hash::Hash for Scope {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.owner.hash(state);
        self.operation.hash(state);
    }
}

/// Why an owner or operation was rejected (HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScopeError {
    /// The part is empty.
    #[error("scope {part} is empty")]
    Empty {
        /// `"owner"` or `"operation"`.
        part: &'static str,
    },
    /// The part is longer than [`Scope::MAX_PART_LEN`] bytes.
    #[error("scope {part} is {len} bytes long; the limit is {MAX_SCOPE_PART_LEN}")]
    TooLong {
        /// `"owner"` or `"operation"`.
        part: &'static str,
        /// Its length in bytes.
        len: usize,
    },
    /// The part holds a control character (NUL, newline, ...), which no
    /// backend can store faithfully and no log can show safely.
    #[error("scope {part} holds a control character at byte {position}")]
    ControlCharacter {
        /// `"owner"` or `"operation"`.
        part: &'static str,
        /// Byte offset of the character.
        position: usize,
    },
}

fn check_part(part: &'static str, value: &str) -> Result<(), ScopeError> {
    if value.is_empty() {
        return Err(ScopeError::Empty { part });
    }
    if value.len() > MAX_SCOPE_PART_LEN {
        return Err(ScopeError::TooLong {
            part,
            len: value.len(),
        });
    }
    if let Some((position, _)) = value.char_indices().find(|(_, c)| c.is_control()) {
        return Err(ScopeError::ControlCharacter { part, position });
    }
    Ok(())
}

impl Scope {
    /// The longest owner or operation accepted, in bytes.
    pub const MAX_PART_LEN: usize = 1024;

    /// Builds a scope. Any UTF-8 without control characters, 1 to 1024 bytes
    /// per part.
    ///
    /// # Errors
    ///
    /// [`ScopeError`] for an empty or oversized part, or one with a control
    /// character.
    pub fn new(owner: impl Into<String>, operation: impl Into<String>) -> Result<Self, ScopeError> {
        let owner = owner.into();
        let operation = operation.into();
        check_part("owner", &owner)?;
        check_part("operation", &operation)?;
        Ok(Self {
            owner: owner.into(),
            operation: operation.into(),
            label: None,
        })
    }

    /// The same scope, counted in metrics under `label` instead of its
    /// operation (the `operation` label of every `idem_*` metric).
    ///
    /// The label is not part of the record's identity: two scopes that
    /// differ only in it are the same scope. Use it when the operation holds
    /// values without bound (a concrete path such as `POST /orders/123`) and
    /// a bounded name exists for the metrics (the route template, or the
    /// method alone).
    ///
    /// ```
    /// use idem_core::Scope;
    ///
    /// let a = Scope::new("acct", "POST /orders/123").unwrap();
    /// let b = a.clone().with_metrics_label("POST /orders/{id}");
    /// assert_eq!(a, b);
    /// assert_eq!(b.metrics_label(), "POST /orders/{id}");
    /// assert_eq!(a.metrics_label(), "POST /orders/123");
    /// ```
    #[must_use]
    pub fn with_metrics_label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into().into());
        self
    }

    /// The value of the `operation` metrics label: the name given to
    /// [`Scope::with_metrics_label`], else the operation.
    #[must_use]
    pub fn metrics_label(&self) -> &str {
        self.label_shared()
    }

    /// The tenant, account or user.
    #[must_use]
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The operation, e.g. `POST /payments`.
    #[must_use]
    pub fn operation(&self) -> &str {
        &self.operation
    }

    /// The metrics label's shared string: a label without a copy.
    pub(crate) fn label_shared(&self) -> &Arc<str> {
        self.label.as_ref().unwrap_or(&self.operation)
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scope")
            .field("owner", &self.owner)
            .field("operation", &self.operation)
            .finish()
    }
}

/// The identity of one stored record: `(owner, operation, key)`.
///
/// Backends address records by it. [`RecordId::encoded`] and
/// [`RecordId::digest`] are injective: every part is length-prefixed, so no two
/// different triples collide (unlike `join(":")`).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RecordId {
    scope: Scope,
    key: IdempotencyKey,
}

impl RecordId {
    /// Joins a scope and a key.
    #[must_use]
    pub fn new(scope: Scope, key: IdempotencyKey) -> Self {
        Self { scope, key }
    }

    /// The owner.
    #[must_use]
    pub fn owner(&self) -> &str {
        &self.scope.owner
    }

    /// The operation.
    #[must_use]
    pub fn operation(&self) -> &str {
        &self.scope.operation
    }

    /// The scope's metrics label, shared: a label without a copy.
    pub(crate) fn label_shared(&self) -> &Arc<str> {
        self.scope.label_shared()
    }

    /// The key.
    #[must_use]
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// The scope.
    #[must_use]
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The length-prefixed encoding: for each of owner, operation, key, its
    /// length as 8 big-endian bytes, then its bytes.
    #[must_use]
    pub fn encoded(&self) -> Vec<u8> {
        let parts = [
            self.scope.owner.as_bytes(),
            self.scope.operation.as_bytes(),
            self.key.as_str().as_bytes(),
        ];
        let mut out = Vec::with_capacity(24 + parts.iter().map(|p| p.len()).sum::<usize>());
        for part in parts {
            out.extend_from_slice(&(part.len() as u64).to_be_bytes());
            out.extend_from_slice(part);
        }
        out
    }

    /// SHA-256 of [`RecordId::encoded`]: a fixed-size identity, safe in Redis
    /// keys and hash tags whatever the parts hold.
    #[must_use]
    pub fn digest(&self) -> [u8; 32] {
        // The same bytes as `encoded()`, fed as they come: no buffer (the
        // Redis store computes this on every call).
        let mut hasher = Sha256::new();
        hasher.update(b"idem-record-v1\0");
        for part in [
            self.scope.owner.as_bytes(),
            self.scope.operation.as_bytes(),
            self.key.as_str().as_bytes(),
        ] {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        hasher.finalize().into()
    }

    /// A short hash for logs; never the raw key.
    #[must_use]
    pub fn log_hash(&self) -> String {
        short_hash(&self.encoded())
    }
}

impl fmt::Debug for RecordId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordId")
            .field("owner", &self.scope.owner)
            .field("operation", &self.scope.operation)
            .field("key", &self.key)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(owner: &str, op: &str, key: &str) -> RecordId {
        RecordId::new(
            Scope::new(owner, op).unwrap(),
            IdempotencyKey::parse(key).unwrap(),
        )
    }

    #[test]
    fn encoding_is_injective_where_join_is_not() {
        let a = id("a:b", "c", "d");
        let b = id("a", "b:c", "d");
        assert_ne!(a.encoded(), b.encoded());
        assert_ne!(a.digest(), b.digest());
        assert_eq!(a.digest(), id("a:b", "c", "d").digest());
    }

    /// `RecordId::digest` of `("acct_42", "POST /payments", "k-1")`.
    const PINNED_DIGEST: &str = "ad52184ec4cf63a75337f64597d6685da1d95039247b1863ccd46a035246ba30";

    #[test]
    fn the_digest_is_sha256_of_the_tag_and_the_encoding() {
        for rid in [
            id("a:b", "c", "d"),
            id("o \u{e9}", "POST /x", &"k".repeat(255)),
        ] {
            let mut whole = b"idem-record-v1\0".to_vec();
            whole.extend_from_slice(&rid.encoded());
            let want: [u8; 32] = Sha256::digest(&whole).into();
            assert_eq!(rid.digest(), want);
        }
        // Pinned: Redis keys are named by it, so it may never change.
        assert_eq!(
            hex::encode(id("acct_42", "POST /payments", "k-1").digest()),
            PINNED_DIGEST
        );
    }

    #[test]
    fn rejects_bad_parts() {
        assert_eq!(
            Scope::new("", "op"),
            Err(ScopeError::Empty { part: "owner" })
        );
        assert_eq!(
            Scope::new("o", ""),
            Err(ScopeError::Empty { part: "operation" })
        );
        assert!(matches!(
            Scope::new("o\0x", "op"),
            Err(ScopeError::ControlCharacter { position: 1, .. })
        ));
        assert!(matches!(
            Scope::new("o".repeat(1025), "op"),
            Err(ScopeError::TooLong { len: 1025, .. })
        ));
        assert!(Scope::new("tenant 'x'; DROP TABLE t; --", "POST /{a}").is_ok());
    }
}
