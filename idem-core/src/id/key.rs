//! Idempotency keys: validation, random keys and keys derived from an intent.

use std::fmt;

use sha2::{Digest, Sha256};

/// The longest key accepted, in characters (after trimming).
pub(crate) const MAX_KEY_LEN: usize = IdempotencyKey::MAX_LEN;

/// A validated idempotency key: 1 to [`IdempotencyKey::MAX_LEN`] printable ASCII characters
/// (`0x20..=0x7E`) after trimming surrounding ASCII spaces and tabs (only
/// those: a key wrapped in any other whitespace is invalid).
///
/// The client makes the key once per *intent* (not per attempt) and stores it
/// next to the intent, so a retry carries the same key.
///
/// # Examples
///
/// ```
/// use idem_core::IdempotencyKey;
///
/// let key = IdempotencyKey::parse("  order-42/charge  ").unwrap();
/// assert_eq!(key.as_str(), "order-42/charge");
/// assert!(IdempotencyKey::parse("").is_err());
/// assert!(IdempotencyKey::parse("caf\u{e9}").is_err());
///
/// let random = IdempotencyKey::random();
/// assert_eq!(random.as_str().len(), 32);
///
/// // The same verified event id always gives the same key.
/// let a = IdempotencyKey::derive("stripe-webhook", "evt_1Nv2");
/// let b = IdempotencyKey::derive("stripe-webhook", "evt_1Nv2");
/// assert_eq!(a, b);
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(String);

/// Why a key was rejected (HTTP 400). Nothing is stored for a rejected key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key is empty or only spaces and tabs.
    #[error(
        "idempotency key is empty (after trimming spaces and tabs); send 1 to 255 printable ASCII characters"
    )]
    Empty,
    /// The key is longer than [`IdempotencyKey::MAX_LEN`] characters.
    #[error("idempotency key is {len} characters long; the limit is {MAX_KEY_LEN}")]
    TooLong {
        /// Length of the trimmed key, in bytes.
        len: usize,
    },
    /// The key holds a character outside printable ASCII.
    #[error(
        "idempotency key has a character outside printable ASCII at byte {position} ({found}); use 0x20..=0x7E only"
    )]
    InvalidCharacter {
        /// Byte offset of the first offending character in the trimmed key.
        position: usize,
        /// The character, escaped for display (never the whole key).
        found: String,
    },
}

impl IdempotencyKey {
    /// The longest key accepted, in characters (after trimming).
    pub const MAX_LEN: usize = 255;

    /// Validates a key sent by a client in a header field: surrounding
    /// ASCII spaces and tabs are dropped first (HTTP's optional whitespace
    /// around a field value), so `" k "` and `"k"` are one key.
    ///
    /// # Errors
    ///
    /// [`KeyError`] when the trimmed key is empty, longer than 255 characters
    /// or holds anything but printable ASCII.
    pub fn parse(raw: &str) -> Result<Self, KeyError> {
        // ASCII space and tab only: any other whitespace (`\n`, U+00A0,
        // U+2003, ...) is not printable ASCII, so it is an invalid key,
        // never silently dropped.
        Self::parse_exact(raw.trim_matches([' ', '\t']))
    }

    /// Validates a key sent as a typed value (a JSON string, such as MCP's
    /// `_meta.idempotencyKey`), taken exactly as given: 1 to 255 printable
    /// ASCII characters, spaces included and kept, so `" k"` and `"k"` are
    /// two keys.
    ///
    /// # Errors
    ///
    /// [`KeyError`] when the key is empty, longer than 255 characters or
    /// holds anything but printable ASCII.
    pub fn parse_exact(raw: &str) -> Result<Self, KeyError> {
        if raw.is_empty() {
            return Err(KeyError::Empty);
        }
        // Bytes first (every valid key is ASCII); chars only to report.
        let bad = if raw.bytes().all(|b| matches!(b, b' '..=b'~')) {
            None
        } else {
            raw.char_indices().find(|&(_, c)| !matches!(c, ' '..='~'))
        };
        if let Some((position, ch)) = bad {
            return Err(KeyError::InvalidCharacter {
                position,
                found: ch.escape_default().to_string(),
            });
        }
        if raw.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong { len: raw.len() });
        }
        Ok(Self(raw.to_owned()))
    }

    /// A new random key: 128 bits from the operating system's generator, as 32
    /// hex characters. Make it once per intent and store it with the intent.
    ///
    /// # Panics
    ///
    /// Never on a supported platform; if the operating system has no entropy
    /// source at all, key generation falls back to a hash of the time and
    /// process id rather than panicking.
    #[must_use]
    pub fn random() -> Self {
        Self(hex::encode(crate::util::random_bytes::<16>()))
    }

    /// A key derived deterministically from an intent or a verified event id,
    /// e.g. a webhook event id: `derive("stripe-webhook", "evt_123")`.
    ///
    /// The namespace keeps two sources with the same id apart. The result is a
    /// 64-character hex SHA-256, so it is always a valid key.
    #[must_use]
    pub fn derive(namespace: &str, intent_id: &str) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(b"idem-key-v1\0");
        hasher.update((namespace.len() as u64).to_be_bytes());
        hasher.update(namespace.as_bytes());
        hasher.update((intent_id.len() as u64).to_be_bytes());
        hasher.update(intent_id.as_bytes());
        Self(hex::encode(hasher.finalize()))
    }

    /// The key as sent (trimmed by [`IdempotencyKey::parse`], as given to
    /// [`IdempotencyKey::parse_exact`]).
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A short hash of the key, safe to log (the raw key is never logged).
    #[must_use]
    pub fn log_hash(&self) -> String {
        crate::util::short_hash(self.0.as_bytes())
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keys can be secrets in practice: show only a hash.
        write!(f, "IdempotencyKey(#{})", self.log_hash())
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<&str> for IdempotencyKey {
    type Error = KeyError;
    fn try_from(value: &str) -> Result<Self, KeyError> {
        Self::parse(value)
    }
}

impl TryFrom<String> for IdempotencyKey {
    type Error = KeyError;
    fn try_from(value: String) -> Result<Self, KeyError> {
        Self::parse(&value)
    }
}

impl std::str::FromStr for IdempotencyKey {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<Self, KeyError> {
        Self::parse(s)
    }
}

impl AsRef<str> for IdempotencyKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Anything [`Idem::execute`](crate::Idem::execute) accepts as a key: a raw
/// `&str`/`String` from a header (validated on the way in) or an
/// [`IdempotencyKey`].
pub trait IntoKey {
    /// Validates (if needed) and returns the key.
    ///
    /// # Errors
    ///
    /// [`KeyError`] for an invalid raw key.
    fn into_key(self) -> Result<IdempotencyKey, KeyError>;
}

impl IntoKey for IdempotencyKey {
    fn into_key(self) -> Result<IdempotencyKey, KeyError> {
        Ok(self)
    }
}
impl IntoKey for &IdempotencyKey {
    fn into_key(self) -> Result<IdempotencyKey, KeyError> {
        Ok(self.clone())
    }
}
impl IntoKey for &str {
    fn into_key(self) -> Result<IdempotencyKey, KeyError> {
        IdempotencyKey::parse(self)
    }
}
impl IntoKey for String {
    fn into_key(self) -> Result<IdempotencyKey, KeyError> {
        IdempotencyKey::parse(&self)
    }
}
impl IntoKey for &String {
    fn into_key(self) -> Result<IdempotencyKey, KeyError> {
        IdempotencyKey::parse(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_printable_ascii_and_trims() {
        assert_eq!(IdempotencyKey::parse(" a b ").unwrap().as_str(), "a b");
        assert!(IdempotencyKey::parse("~!@#$%^&*()_+{}|:\"<>?`-=[]\\;',./").is_ok());
        assert!(IdempotencyKey::parse(&"k".repeat(255)).is_ok());
        // 255 after trimming is fine even with padding.
        assert!(IdempotencyKey::parse(&format!("  {}\t", "k".repeat(255))).is_ok());
    }

    #[test]
    fn an_exact_key_keeps_its_spaces_and_checks_the_rest_alike() {
        let spaced = IdempotencyKey::parse_exact(" k ").unwrap();
        assert_eq!(spaced.as_str(), " k ");
        assert_ne!(spaced, IdempotencyKey::parse_exact("k").unwrap());
        assert_eq!(IdempotencyKey::parse_exact(" ").unwrap().as_str(), " ");
        assert_eq!(IdempotencyKey::parse_exact(""), Err(KeyError::Empty));
        assert!(matches!(
            IdempotencyKey::parse_exact("\tk"),
            Err(KeyError::InvalidCharacter { position: 0, .. })
        ));
        assert!(IdempotencyKey::parse_exact(&"k".repeat(255)).is_ok());
        assert_eq!(
            IdempotencyKey::parse_exact(&format!(" {}", "k".repeat(255))),
            Err(KeyError::TooLong { len: 256 })
        );
    }

    #[test]
    fn rejects_bad_keys_with_typed_errors() {
        assert_eq!(IdempotencyKey::parse(""), Err(KeyError::Empty));
        assert_eq!(IdempotencyKey::parse(" \t "), Err(KeyError::Empty));
        for raw in [
            " \t\n ",
            "\u{a0}k1",
            "k1\u{a0}",
            "\u{2003}k1",
            "\nk1",
            "k1\r\n",
            "\u{feff}k1",
        ] {
            assert!(
                matches!(
                    IdempotencyKey::parse(raw),
                    Err(KeyError::InvalidCharacter { .. })
                ),
                "{raw:?} must be an invalid key"
            );
        }
        assert_eq!(
            IdempotencyKey::parse(&"k".repeat(256)),
            Err(KeyError::TooLong { len: 256 })
        );
        assert!(matches!(
            IdempotencyKey::parse("a\nb"),
            Err(KeyError::InvalidCharacter { position: 1, .. })
        ));
        assert!(matches!(
            IdempotencyKey::parse("a\0b"),
            Err(KeyError::InvalidCharacter { position: 1, .. })
        ));
        assert!(matches!(
            IdempotencyKey::parse("clé"),
            Err(KeyError::InvalidCharacter { position: 2, .. })
        ));
        assert!(matches!(
            IdempotencyKey::parse("a\u{7f}"),
            Err(KeyError::InvalidCharacter { .. })
        ));
    }

    #[test]
    fn random_keys_are_valid_and_distinct() {
        let a = IdempotencyKey::random();
        let b = IdempotencyKey::random();
        assert_ne!(a, b);
        assert!(IdempotencyKey::parse(a.as_str()).is_ok());
    }

    #[test]
    fn derived_keys_are_stable_and_namespaced() {
        let a = IdempotencyKey::derive("ns", "evt_1");
        assert_eq!(a, IdempotencyKey::derive("ns", "evt_1"));
        assert_ne!(a, IdempotencyKey::derive("ns2", "evt_1"));
        // Length prefixes: moving a byte between the parts changes the key.
        assert_ne!(
            IdempotencyKey::derive("ab", "c"),
            IdempotencyKey::derive("a", "bc")
        );
        assert_eq!(a.as_str().len(), 64);
    }

    #[test]
    fn debug_never_shows_the_key() {
        let key = IdempotencyKey::parse("secret-key-123").unwrap();
        assert!(!format!("{key:?}").contains("secret"));
    }
}
