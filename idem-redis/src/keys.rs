//! The key layout: where one record lives.
//!
//! A record is two keys sharing one hash tag, the hex SHA-256 of the record
//! identity ([`RecordId::digest`]):
//!
//! * `<prefix>{<hex>}:r`, a hash with the record's fields (fingerprint,
//!   state, token, attempt, lease, key expiry, resource id, outcome, response
//!   expiry), expiring natively at `key_expires_at`;
//! * `<prefix>{<hex>}:b`, the response body, expiring natively at
//!   `response_expires_at`.
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
    /// The record hash.
    pub(crate) record: String,
    /// The response body.
    pub(crate) body: String,
}

impl RecordKeys {
    pub(crate) fn new(prefix: &KeyPrefix, id: &RecordId) -> Self {
        let tag = hex::encode(id.digest());
        let p = prefix.as_str();
        Self {
            record: format!("{p}{{{tag}}}:r"),
            body: format!("{p}{{{tag}}}:b"),
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
            assert!(k.record.starts_with("idem:{") && k.record.ends_with("}:r"));
            assert_eq!(k.record.len(), "idem:{}:r".len() + 64);
        }
        assert_ne!(
            RecordKeys::new(&prefix, &hostile[0]),
            RecordKeys::new(&prefix, &hostile[1])
        );
    }
}
