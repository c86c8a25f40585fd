//! Configuration: the key prefix every key of a store starts with.

use std::fmt;
use std::sync::Arc;

/// The longest prefix accepted, in bytes.
pub const MAX_PREFIX_LEN: usize = 64;

/// A validated key prefix, e.g. `idem:` (the default) or `billing:idem:`.
///
/// Every key a [`RedisStore`](crate::RedisStore) writes starts with it, so
/// two stores with different prefixes never see each other's records, and
/// operators can find the keys with `SCAN MATCH <prefix>*`.
///
/// A prefix is 1 to 64 bytes of ASCII letters, digits and `:` `_` `-` `.` `/`.
/// Braces are refused (they would change the Redis Cluster hash tag), and so
/// are glob characters, spaces and control characters (they would break
/// `SCAN MATCH`).
///
/// # Examples
///
/// ```
/// use idem_redis::KeyPrefix;
///
/// assert_eq!(KeyPrefix::default().as_str(), "idem:");
/// assert!(KeyPrefix::new("shop:idem:").is_ok());
/// assert!(KeyPrefix::new("x{y}").is_err());
/// assert!(KeyPrefix::new("").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct KeyPrefix(Arc<str>);

/// Why a prefix was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PrefixError {
    /// The prefix is empty.
    #[error("the key prefix is empty")]
    Empty,
    /// The prefix is longer than [`MAX_PREFIX_LEN`] bytes.
    #[error("the key prefix is {0} bytes long; the limit is {MAX_PREFIX_LEN}")]
    TooLong(usize),
    /// The prefix holds a character outside `A-Z a-z 0-9 : _ - . /`.
    #[error("the key prefix holds a forbidden character at byte {position}")]
    ForbiddenCharacter {
        /// Byte offset of the character.
        position: usize,
    },
}

impl KeyPrefix {
    /// Validates a prefix.
    ///
    /// # Errors
    ///
    /// [`PrefixError`] when it is empty, too long, or holds a character that
    /// could change the hash tag or the `SCAN` pattern.
    pub fn new(prefix: &str) -> Result<Self, PrefixError> {
        if prefix.is_empty() {
            return Err(PrefixError::Empty);
        }
        if prefix.len() > MAX_PREFIX_LEN {
            return Err(PrefixError::TooLong(prefix.len()));
        }
        let allowed =
            |b: u8| b.is_ascii_alphanumeric() || matches!(b, b':' | b'_' | b'-' | b'.' | b'/');
        if let Some(position) = prefix.bytes().position(|b| !allowed(b)) {
            return Err(PrefixError::ForbiddenCharacter { position });
        }
        Ok(Self(Arc::from(prefix)))
    }

    /// The prefix as text, exactly as it starts every key of the store.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for KeyPrefix {
    fn default() -> Self {
        Self(Arc::from("idem:"))
    }
}

impl fmt::Debug for KeyPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("KeyPrefix").field(&self.as_str()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_could_break_the_layout() {
        assert_eq!(KeyPrefix::new(""), Err(PrefixError::Empty));
        assert_eq!(
            KeyPrefix::new(&"a".repeat(65)),
            Err(PrefixError::TooLong(65))
        );
        for (bad, at) in [
            ("a{b", 1),
            ("a}", 1),
            ("a*", 1),
            ("a?", 1),
            ("[a", 0),
            ("a b", 1),
            ("a\nb", 1),
            ("ü", 0),
        ] {
            assert_eq!(
                KeyPrefix::new(bad),
                Err(PrefixError::ForbiddenCharacter { position: at }),
                "{bad:?}"
            );
        }
        assert_eq!(
            KeyPrefix::new("app-1:idem/v1.").expect("valid").as_str(),
            "app-1:idem/v1."
        );
        assert!(KeyPrefix::new(&"a".repeat(64)).is_ok());
    }
}
