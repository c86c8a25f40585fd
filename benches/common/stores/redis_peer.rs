//! The `idempotent` crate (0.3, by aklanti) on the same Redis: its
//! `ValkeyStore`, used the way its README and trait documentation show:
//! `try_insert` a processing entry (one `EVALSHA` of its claim script, which
//! answers nil when claimed or the standing entry), then `complete` (one
//! `EVALSHA` of its token-checked script). A replay is `try_insert`
//! answering `Exists(Completed)`, checked against the request's fingerprint.
//!
//! The request is serialized with `serde_json::to_vec` and fingerprinted with
//! the crate's default strategy (xxHash3 over operation and bytes) on every
//! call, as idem fingerprints it on every call; the response is a 200 with
//! the bench body. The store opens its own multiplexed connection (the crate
//! takes a `redis::Client`, not a connection) and names its keys
//! `<prefix>-<key>`, under the bench's prefix, so the bench's cleanup
//! deletes them.

use bytes::Bytes;
// The `redis` the `idempotent` crate takes its `Client` from: the
// workspace's own, by semver, so a divergence fails to compile here.
use idem_redis::redis as redis_for_peer;
use idempotent::entry::{ExistingEntry, Metadata};
use idempotent::fingerprint::{DefaultFingerprintStrategy, Fingerprint, FingerprintStrategy};
use idempotent::store::valkey::ValkeyStore;
use idempotent::store::{IdempotencyStore, InsertResult};
use idempotent::{CachedResponse, IdempotencyEntry, IdempotencyKey};
use serde_json::Value;

use super::TTL;
use super::workload::{Ended, OPERATION, Target, body, request};

/// The `idempotent` crate's Redis store and the bench's request and body.
pub(crate) struct PeerIdempotent {
    store: ValkeyStore,
    request: Value,
    body: Bytes,
}

impl std::fmt::Debug for PeerIdempotent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerIdempotent").finish_non_exhaustive()
    }
}

impl PeerIdempotent {
    /// A `ValkeyStore` on `url` whose keys start with `prefix`.
    pub(crate) async fn new(url: &str, prefix: &str, body_len: usize) -> Self {
        let client = redis_for_peer::Client::open(url).expect("Redis URL");
        // The crate joins prefix and key with '-'.
        let prefix = prefix.trim_end_matches([':', '-']);
        let store = ValkeyStore::with_prefix(client, Some(prefix))
            .await
            .expect("the idempotent crate connects");
        Self {
            store,
            request: request(),
            body: Bytes::from(body(body_len)),
        }
    }

    fn fingerprint(&self) -> Fingerprint {
        let bytes = serde_json::to_vec(&self.request).expect("request serializes");
        DefaultFingerprintStrategy.compute(OPERATION, &bytes)
    }

    /// One call as an application would make it: claim, and on a claim the
    /// work (a no-op) and the completion.
    async fn call(&self, key: &str) -> Ended {
        let key = IdempotencyKey::new(key).expect("a valid key");
        let fingerprint = self.fingerprint();
        let entry = IdempotencyEntry::new(fingerprint, TTL);
        match self.store.try_insert(&key, entry.clone()).await {
            Ok(InsertResult::Claimed { fencing_token }) => {
                let response = CachedResponse {
                    status_code: 200,
                    metadata: Metadata::default(),
                    body: self.body.clone(),
                };
                self.store
                    .complete(&key, entry.complete(response), fencing_token)
                    .await
                    .expect("complete");
                Ended::Executed
            }
            Ok(InsertResult::Exists(ExistingEntry::Completed(done))) => {
                assert!(done.fingerprint_matches(fingerprint), "same request");
                std::hint::black_box(done.into_response());
                Ended::Replayed
            }
            Ok(InsertResult::Exists(_)) => Ended::Conflict,
            Err(e) => panic!("idempotent try_insert: {e}"),
        }
    }
}

impl Target for PeerIdempotent {
    async fn fresh(&self, key: &str) {
        assert_eq!(self.call(key).await, Ended::Executed, "a fresh key");
    }

    async fn replay(&self, key: &str) {
        assert_eq!(self.call(key).await, Ended::Replayed, "a completed key");
    }

    async fn contended(&self, key: &str) -> Ended {
        self.call(key).await
    }
}
