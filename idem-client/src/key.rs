//! Keys on the client: the persisted [`Intent`] and how the key is written
//! (the codec itself is `idem_core::wire`'s, the one the server reads with).

use std::time::{Duration, SystemTime};

use idem_core::{IdempotencyKey, error::KeyError, wire};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One logical send: its key and when the key was made.
///
/// Store it next to the thing being sent (the order row) *before* the first
/// attempt: after a crash, the same intent resends the same key, and the
/// server replays or finishes the first run instead of running it again. It is
/// the only way a key survives the process.
///
/// `created_at` bounds the key's use: once it is older than the server keeps
/// keys (`key_lifetime`), the client refuses to send it.
///
/// # Examples
///
/// ```
/// use idem_client::Intent;
///
/// let intent = Intent::derive("orders", "ord_42");
/// let saved = serde_json::to_string(&intent).unwrap();
/// let loaded: Intent = serde_json::from_str(&saved).unwrap();
/// assert_eq!(loaded.key(), intent.key());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intent {
    #[serde(serialize_with = "ser_key", deserialize_with = "de_key")]
    key: IdempotencyKey,
    /// Seconds since the Unix epoch (whole seconds: enough for lifetimes in days).
    #[serde(rename = "created_at")]
    created_at_unix: u64,
}

fn ser_key<S: Serializer>(key: &IdempotencyKey, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(key.as_str())
}

fn de_key<'de, D: Deserializer<'de>>(d: D) -> Result<IdempotencyKey, D::Error> {
    let raw = String::deserialize(d)?;
    IdempotencyKey::parse(&raw).map_err(serde::de::Error::custom)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Intent {
    /// An intent for a key the caller already has, made now.
    #[must_use]
    pub fn new(key: IdempotencyKey) -> Self {
        Self {
            key,
            created_at_unix: unix_now(),
        }
    }

    /// An intent with a random key (128 bits, 32 hex characters), made now.
    #[must_use]
    pub fn random() -> Self {
        Self::new(IdempotencyKey::random())
    }

    /// An intent whose key is [`IdempotencyKey::derive`]`(namespace, id)`:
    /// the same id always gives the same key, so an intent can be rebuilt from
    /// the order id alone (its `created_at` is then "now").
    #[must_use]
    pub fn derive(namespace: &str, id: &str) -> Self {
        Self::new(IdempotencyKey::derive(namespace, id))
    }

    /// The same intent, made at `at` (for an intent loaded from elsewhere).
    #[must_use]
    pub fn with_created_at(mut self, at: SystemTime) -> Self {
        self.created_at_unix = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self
    }

    /// The key.
    #[must_use]
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// When the key was made.
    #[must_use]
    pub fn created_at(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(self.created_at_unix)
    }

    /// The key's age at `now` (zero for a `created_at` in the future).
    #[must_use]
    pub fn age(&self, now: SystemTime) -> Duration {
        now.duration_since(self.created_at()).unwrap_or_default()
    }
}

/// How the client writes the key in its header field. (How strictly a server
/// reads it is `idem::wire::KeySyntax`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeyEncoding {
    /// An RFC 8941 sf-string, as the IETF draft requires: `"8e03…"`. The default.
    #[default]
    Structured,
    /// The raw key, for servers that validate the bare value (a UUID check).
    Bare,
}

impl KeyEncoding {
    /// The field value for `key`.
    #[must_use]
    pub fn encode(self, key: &IdempotencyKey) -> String {
        match self {
            Self::Bare => key.as_str().to_owned(),
            Self::Structured => wire::quote(key),
        }
    }
}

/// Reads a key from a field value the caller set: an sf-string is unquoted,
/// anything else is taken as the bare key (the caller may be talking to a
/// server that takes any bare value).
///
/// # Errors
///
/// [`KeyError`] when the (unquoted) key is invalid.
// Read only by the front-ends.
#[cfg_attr(not(any(feature = "reqwest", feature = "tower")), allow(dead_code))]
pub(crate) fn decode(value: &str) -> Result<IdempotencyKey, KeyError> {
    let trimmed = value.trim_matches([' ', '\t']);
    if trimmed.starts_with('"')
        && let Ok(text) = wire::unquote(trimmed.as_bytes())
    {
        return IdempotencyKey::parse(&text);
    }
    IdempotencyKey::parse(trimmed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sf_string_round_trip_for_every_printable_ascii_key() {
        for b in b' '..=b'~' {
            let raw = format!("k{}k", b as char);
            let key = IdempotencyKey::parse(&raw).expect("printable ASCII is a key");
            let field = KeyEncoding::Structured.encode(&key);
            assert_eq!(field, wire::quote(&key));
            assert_eq!(decode(&field).expect("decodes"), key);
        }
        let all: String = (b' '..=b'~').map(char::from).collect();
        let key = IdempotencyKey::parse(&format!("x{all}")).expect("key");
        assert_eq!(
            decode(&KeyEncoding::Structured.encode(&key)).expect("decodes"),
            key
        );
    }

    #[test]
    fn bare_and_quoted_read_as_one_key() {
        let k = IdempotencyKey::parse("abc").expect("key");
        assert_eq!(KeyEncoding::Bare.encode(&k), "abc");
        assert_eq!(KeyEncoding::Structured.encode(&k), "\"abc\"");
        assert_eq!(decode("\"abc\"").expect("key"), k);
        assert_eq!(decode("abc").expect("key"), k);
        assert!(decode("\"\"").is_err());
        assert!(decode("caf\u{e9}").is_err());
    }

    #[test]
    fn intent_serde_keeps_key_and_age() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let intent = Intent::derive("orders", "ord_1").with_created_at(at);
        let json = serde_json::to_string(&intent).expect("json");
        let back: Intent = serde_json::from_str(&json).expect("back");
        assert_eq!(back, intent);
        assert_eq!(back.key(), &IdempotencyKey::derive("orders", "ord_1"));
        assert_eq!(
            back.age(at + Duration::from_secs(5)),
            Duration::from_secs(5)
        );
        assert!(serde_json::from_str::<Intent>(r#"{"key":"","created_at":0}"#).is_err());
    }
}
