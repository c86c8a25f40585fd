//! The key layout: where one record lives.
//!
//! A record is two keys sharing one hash tag, the hex SHA-256 of the record
//! identity ([`RecordId::digest`]):
//!
//! * `<prefix>{<hex>}:r`, the record (a string in layout 1, see
//!   [`crate::record`]), expiring natively at `key_expires_at`;
//! * `<prefix>{<hex>}:v`, the response body with a header naming the
//!   completion that wrote it, expiring natively at `response_expires_at`.
//!
//! Before layout 1 the record was a hash at the same `:r` key and the body a
//! bare string at `<prefix>{<hex>}:b`; such a record is rewritten in layout 1
//! the first time the store touches it (see `migrate.lua`).
//!
//! No byte of the owner, operation or key reaches a Redis key: whatever they
//! hold (spaces, braces, newlines), the tag is 64 hex digits, so both keys of
//! a record always hash to the same cluster slot and no identity can forge
//! another's keys. The prefix holds no braces (see [`KeyPrefix`]), so the tag
//! is always the digest.

use idem_core::RecordId;

use crate::config::KeyPrefix;

/// The two keys of one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RecordKeys {
    /// The record (a string in layout 1).
    pub(crate) record: String,
    /// The response body (layout 1).
    pub(crate) body: String,
}

impl RecordKeys {
    /// Where a completion under `token` stages its body before
    /// `complete.lua` moves it to [`Self::body`] (one key per token, so an
    /// attempt whose lease was lost cannot touch another's).
    pub(crate) fn staging(&self, token: i64) -> String {
        let base = self.record.strip_suffix(":r").unwrap_or(&self.record);
        format!("{base}:s:{:016x}", token.cast_unsigned())
    }
}

/// The body key of the hash layout, for a record key `…:r`.
pub(crate) fn legacy_body(record: &str) -> String {
    format!("{}:b", record.strip_suffix(":r").unwrap_or(record))
}

/// The body key of layout 1, for a record key `…:r`.
pub(crate) fn body_for(record: &str) -> String {
    format!("{}:v", record.strip_suffix(":r").unwrap_or(record))
}

impl RecordKeys {
    pub(crate) fn new(prefix: &KeyPrefix, id: &RecordId) -> Self {
        let tag = hex::encode(id.digest());
        let p = prefix.as_str();
        Self {
            record: format!("{p}{{{tag}}}:r"),
            body: format!("{p}{{{tag}}}:v"),
        }
    }
}

#[cfg(test)]
mod tests {
    use idem_core::{IdempotencyKey, Scope};

    use super::*;

    fn id(owner: &str, op: &str, key: &str) -> RecordId {
        RecordId::new(
            Scope::new(owner, op).unwrap(),
            IdempotencyKey::parse(key).unwrap(),
        )
    }

    /// The hash tag as Redis Cluster computes it: the bytes between the first
    /// `{` and the next `}`, if not empty.
    fn hash_tag(key: &str) -> &str {
        let open = key.find('{').expect("a tag");
        let close = key[open + 1..].find('}').expect("closed") + open + 1;
        &key[open + 1..close]
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
            let tag = hash_tag(&k.record);
            assert_eq!(tag.len(), 64);
            assert!(tag.bytes().all(|b| b.is_ascii_hexdigit()));
            assert_eq!(tag, hash_tag(&k.body));
            assert_eq!(body_for(&k.record), k.body);
            assert_eq!(tag, hash_tag(&k.staging(-1)));
            assert!(k.staging(-1).ends_with("}:s:ffffffffffffffff"));
            assert!(legacy_body(&k.record).ends_with("}:b"));
            assert!(k.record.starts_with("idem:{") && k.record.ends_with("}:r"));
            assert_eq!(k.record.len(), "idem:{}:r".len() + 64);
        }
        assert_ne!(
            RecordKeys::new(&prefix, &hostile[0]),
            RecordKeys::new(&prefix, &hostile[1])
        );
    }
}
