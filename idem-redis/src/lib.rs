#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod ack;
mod admin;
mod config;
mod error;
mod keys;
mod record;
mod scripts;
mod store;

pub use ack::{NotAcknowledged, ReplicaAck};
pub use admin::SCAN_STEPS;
pub use config::{KeyPrefix, MAX_PREFIX_LEN, PrefixError};
pub use error::Error;
pub use redis;
pub use store::RedisStore;

/// The commands and scripts the store runs, exactly, for review or a
/// raw-driver baseline (the benches' "store scripts without the engine"
/// side builds its calls here, so it cannot drift from the store).
#[doc(hidden)]
pub mod statements {
    use idem_core::ops::{OutcomeKind, RecordState};
    use redis::Pipeline;

    pub use crate::scripts::sources::*;

    /// A new in-flight record (attempt 1, layout 1) as the claim writes it.
    ///
    /// # Errors
    ///
    /// An owner, operation or key longer than 65,535 bytes.
    pub fn in_flight_record(
        (owner, operation, key): (&str, &str, &str),
        fingerprint: [u8; 32],
        token: i64,
        lease_until: i64,
        key_expires_at: i64,
    ) -> Result<Vec<u8>, idem_core::store::StoreError> {
        crate::record::Record {
            state: RecordState::InFlight,
            token,
            attempt: 1,
            lease_until,
            key_expires_at,
            response_expires_at: 0,
            fingerprint,
            outcome: None,
            owner: owner.to_owned(),
            operation: operation.to_owned(),
            key: key.to_owned(),
            resource_id: None,
        }
        .encode()
    }

    /// The claim's pipeline: `SET … NX PX … GET` and `GET <body>`.
    #[must_use]
    pub fn claim(record: &str, body: &str, fresh: &[u8], ttl_ms: i64) -> Pipeline {
        crate::store::claim_pipeline(record, body, fresh, ttl_ms)
    }

    /// The body value a completion stores under `token`.
    #[must_use]
    pub fn body_value(token: i64, body: &[u8]) -> Vec<u8> {
        crate::record::encode_body(token, body)
    }

    /// The completion's pipeline, keeping the record's resource id: for a
    /// body value over 1 KiB `SET <staging> <body value> PX …`, then
    /// `complete.lua` (`EVALSHA`: load [`COMPLETE`] first, or after
    /// `NOSCRIPT`); its reply is the pipeline's last. `record` is the
    /// record's key (`…:r`); the body and staging keys follow from it.
    #[must_use]
    pub fn complete(
        record: &str,
        token: i64,
        expiries: [i64; 2],
        ttls: [i64; 2],
        body_value: &[u8],
    ) -> Pipeline {
        let keys = crate::keys::RecordKeys {
            record: record.to_owned(),
            body: crate::keys::body_for(record),
        };
        let (mut pipe, inv) = crate::store::complete_pipeline(
            &keys,
            token,
            OutcomeKind::Success,
            expiries,
            ttls,
            Some(body_value),
            None,
        );
        pipe.invoke_script(&inv);
        pipe
    }

    /// What a claim's replies say, decoded as the store decodes them:
    /// `Some(body)` for a completed record whose body (`body_value`) is its
    /// own, `None` for anything else (in flight, released, no body).
    #[must_use]
    pub fn replayed(record: &[u8], body_value: Option<&[u8]>) -> Option<Vec<u8>> {
        let rec = crate::record::Record::decode(record).ok()?;
        if rec.state != RecordState::Completed {
            return None;
        }
        let b = crate::record::body_of(body_value?, rec.token).ok()??;
        Some(b.to_vec())
    }
}
