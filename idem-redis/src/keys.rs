//! The key layout: where one record lives.
//!
//! A record is up to two keys sharing one hash tag, the hex SHA-256 of the
//! record identity ([`RecordId::digest`]):
//!
//! * `<prefix>{<hex>}:r`, the record (a string, see [`crate::record`]),
//!   expiring natively at `key_expires_at`;
//! * `<prefix>{<hex>}:v`, the response body with a header naming the
//!   completion that wrote it, expiring natively at `response_expires_at`,
//!   for a body not kept inside the record (layout 1).
//!
//! Nothing else is read: a key of ours holding another type (a record of
//! a build before 0.1 was a hash) is refused as corrupt.
//!
//! No byte of the owner, operation or key reaches a Redis key: whatever they
//! hold (spaces, braces, newlines), the tag is 64 hex digits, so every key of
//! a record always hashes to the same cluster slot and no identity can forge
//! another's keys. The prefix holds no braces (see [`KeyPrefix`]), so the tag
//! is always the digest.
//!
//! The keys of a call are built on the stack (a prefix is at most
//! [`MAX_PREFIX_LEN`] bytes, so every key fits a fixed buffer), with the hex
//! digits from a table: no allocation per call.

use std::fmt;

use idem_core::RecordId;

use crate::config::{KeyPrefix, MAX_PREFIX_LEN};

/// The longest key: the prefix, `{`, 64 hex digits, `}`, `:s:` and a token
/// in 16 hex digits (a staging key).
const MAX_KEY: usize = MAX_PREFIX_LEN + 1 + 64 + 1 + 3 + 16;

const HEX: &[u8; 16] = b"0123456789abcdef";

/// One Redis key, built in a fixed buffer. Always ASCII.
#[derive(Clone, Copy)]
pub(crate) struct Key {
    buf: [u8; MAX_KEY],
    len: usize,
}

impl Key {
    fn push(&mut self, bytes: &[u8]) {
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }

    fn push_hex(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.buf[self.len] = HEX[usize::from(b >> 4)];
            self.buf[self.len + 1] = HEX[usize::from(b & 0xf)];
            self.len += 2;
        }
    }

    /// The key's bytes, as sent to Redis.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// The key as text (for the public accessors).
    pub(crate) fn to_string_lossy(self) -> String {
        String::from_utf8_lossy(self.as_bytes()).into_owned()
    }

    /// The same key with its last byte replaced (`…:r` → `…:v`).
    fn with_last(mut self, last: u8) -> Self {
        self.buf[self.len - 1] = last;
        self
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&String::from_utf8_lossy(self.as_bytes()), f)
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Key {}

/// The keys of one record; [`Self::record`] is built once, the others are
/// derived from it by changing its tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecordKeys {
    record: Key,
}

impl RecordKeys {
    pub(crate) fn new(prefix: &KeyPrefix, id: &RecordId) -> Self {
        let mut record = Key {
            buf: [0; MAX_KEY],
            len: 0,
        };
        record.push(prefix.as_str().as_bytes());
        record.push(b"{");
        record.push_hex(&id.digest());
        record.push(b"}:r");
        Self { record }
    }

    /// The keys of the record at `record` (`…:r`, as [`Self::record`] makes
    /// it); `None` for a key that is not one.
    pub(crate) fn from_record(record: &str) -> Option<Self> {
        if !record.ends_with(":r") || record.len() > MAX_KEY - 17 {
            return None;
        }
        let mut key = Key {
            buf: [0; MAX_KEY],
            len: 0,
        };
        key.push(record.as_bytes());
        Some(Self { record: key })
    }

    /// The record (`…:r`).
    pub(crate) fn record(&self) -> &[u8] {
        self.record.as_bytes()
    }

    /// The record's key, as a value.
    pub(crate) fn record_key(&self) -> Key {
        self.record
    }

    /// The response body (`…:v`).
    pub(crate) fn body(&self) -> Key {
        self.record.with_last(b'v')
    }

    /// Where a completion under `token` stages its body before
    /// `complete.lua` moves it to [`Self::body`] (one key per token, so an
    /// attempt whose lease was lost cannot touch another's).
    pub(crate) fn staging(&self, token: i64) -> Key {
        let mut k = self.record;
        k.len -= 1; // `r`
        k.push(b"s:");
        k.push_hex(&token.to_be_bytes());
        k
    }
}

/// The body key of layout 1, for a record key `…:r`.
#[cfg(test)]
pub(crate) fn body_for(record: &str) -> String {
    format!("{}:v", record.strip_suffix(":r").unwrap_or(record))
}

#[cfg(test)]
mod tests {
    use idem_core::{IdempotencyKey, Scope};

    use super::*;

    fn id(owner: &str, op: &str, key: &str) -> RecordId {
        let key = IdempotencyKey::parse(key).unwrap();
        RecordId::new(Scope::new(owner, op).unwrap(), key)
    }

    /// The hash tag as Redis Cluster computes it: the bytes between the first
    /// `{` and the next `}`, if not empty.
    fn hash_tag(key: &str) -> &str {
        let open = key.find('{').expect("a tag");
        let close = key[open + 1..].find('}').expect("closed") + open + 1;
        &key[open + 1..close]
    }

    fn text(k: Key) -> String {
        String::from_utf8(k.as_bytes().to_vec()).expect("ASCII")
    }

    #[test]
    fn both_keys_share_a_tag_made_only_of_hex() {
        let prefix = KeyPrefix::default();
        let hostile = [
            id("o {x} \u{1F600}", "POST /{a}", "{tag} * % _ \\"),
            id("}{", "{", "}"),
            id("o", "op", &"k".repeat(255)),
        ];
        for rid in &hostile {
            let k = RecordKeys::new(&prefix, rid);
            let record = text(k.record_key());
            let tag = hash_tag(&record);
            assert_eq!(
                tag,
                hex::encode(rid.digest()),
                "the digest in lower-case hex"
            );
            assert_eq!(tag.len(), 64);
            assert!(tag.bytes().all(|b| b.is_ascii_hexdigit()));
            assert_eq!(tag, hash_tag(&text(k.body())));
            assert_eq!(body_for(&record), text(k.body()));
            let staging = text(k.staging(-1));
            assert_eq!(tag, hash_tag(&staging));
            assert!(staging.ends_with("}:s:ffffffffffffffff"), "{staging}");
            assert_eq!(
                text(k.staging(0x0123_4567_89ab_cdef)),
                format!("idem:{{{tag}}}:s:0123456789abcdef")
            );
            assert!(record.starts_with("idem:{") && record.ends_with("}:r"));
            assert_eq!(record.len(), "idem:{}:r".len() + 64);
            assert_eq!(RecordKeys::from_record(&record), Some(k));
        }
        assert_ne!(
            RecordKeys::new(&prefix, &hostile[0]),
            RecordKeys::new(&prefix, &hostile[1])
        );
    }

    #[test]
    fn the_longest_prefix_fits_every_key() {
        let prefix = KeyPrefix::new(&"p".repeat(MAX_PREFIX_LEN)).unwrap();
        let k = RecordKeys::new(&prefix, &id("o", "op", "k"));
        assert_eq!(k.staging(i64::MIN).as_bytes().len(), MAX_KEY);
        assert!(text(k.record_key()).starts_with(prefix.as_str()));
    }
}
