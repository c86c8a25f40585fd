#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod ack;
mod admin;
mod claim;
mod combine;
mod complete;
mod config;
mod conn;
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
    use idem_core::store::{OutcomeKind, RecordState};
    use redis::{Cmd, Pipeline};

    pub use crate::scripts::sources::*;

    /// A new in-flight record (attempt 1, layout 1) as the claim writes it.
    ///
    /// # Errors
    ///
    /// An owner, operation or key longer than 65,535 bytes.
    pub fn in_flight_record(
        identity: (&str, &str, &str),
        fingerprint: [u8; 32],
        token: i64,
        lease_until: i64,
        key_expires_at: i64,
    ) -> Result<Vec<u8>, idem_core::store::StoreError> {
        crate::record::InFlight::new(identity, &fingerprint, token, lease_until, key_expires_at)
            .map(|r| r.to_vec())
    }

    /// The claim's command with bodies kept inside their record
    /// ([`RedisStore::with_inline_body_limit`](crate::RedisStore::with_inline_body_limit)):
    /// `SET <record> <fresh> NX PX <ttl> GET`, the whole claim.
    #[must_use]
    pub fn claim(record: &str, fresh: &[u8], ttl_ms: i64) -> Cmd {
        crate::claim::command(record.as_bytes(), fresh, fresh.len(), ttl_ms)
    }

    /// The claim without inline bodies: the same `SET` and `GET <body>`,
    /// one pipeline (`body` is the record's body key, `…:v`).
    #[must_use]
    pub fn claim_with_body(record: &str, body: &str, fresh: &[u8], ttl_ms: i64) -> Pipeline {
        let mut pipe = redis::pipe();
        pipe.add_command(claim(record, fresh, ttl_ms))
            .cmd("GET")
            .arg(body);
        pipe
    }

    /// The completion's pipeline, keeping the record's resource id: for a
    /// body over `inline_limit` whose value is over 1 KiB
    /// `SET <staging> <body value> PX …`, then `complete.lua` (`EVALSHA`:
    /// load [`COMPLETE`] first, or after `NOSCRIPT`); its reply is the
    /// pipeline's last. `record` is the record's key (`…:r`); the body and
    /// staging keys follow from it. `expiries` are the key's and the
    /// response's (ms since the epoch), `ttls` the same as native TTLs.
    ///
    /// # Panics
    ///
    /// When `record` is not a record key (`…:r`, at most 131 bytes).
    #[must_use]
    pub fn complete(
        record: &str,
        token: i64,
        expiries: [i64; 2],
        ttls: [i64; 2],
        body: &[u8],
        inline_limit: usize,
    ) -> Pipeline {
        let keys = crate::keys::RecordKeys::from_record(record).expect("a record key");
        let (pre, call) = crate::complete::commands(
            &keys,
            &crate::complete::Args {
                token,
                outcome: OutcomeKind::Success,
                expiries,
                ttls,
                body: Some(body),
                resource_id: None,
                inline_limit,
            },
        );
        let mut pipe = redis::pipe();
        if let Some(pre) = pre {
            pipe.add_command(pre);
        }
        pipe.add_command(call);
        pipe
    }

    /// What a claim's reply says, decoded as the store decodes it:
    /// `Some(body)` for a completed record holding its body, or whose body
    /// key's value (`body_value`) is its own; `None` for anything else (in
    /// flight, released, no body).
    #[must_use]
    pub fn replayed(record: Vec<u8>, body_value: Option<Vec<u8>>) -> Option<Vec<u8>> {
        let rec = crate::record::Parsed::parse(&record).ok()?;
        if rec.state != RecordState::Completed {
            return None;
        }
        rec.take_response(record, body_value, i64::MIN).ok()?
    }
}
