#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod admin;
mod any;
mod attempt;
mod canonical;
mod canonical_ser;
mod claim;
mod clock;
mod codec;
mod engine;
mod error;
mod fingerprint;
mod http;
mod json_check;
mod key;
mod memory;
pub mod metrics;
mod ops;
mod outcome;
mod policy;
mod purger;
mod scope;
pub mod store;
mod util;

#[cfg(feature = "testkit")]
#[cfg_attr(docsrs, doc(cfg(feature = "testkit")))]
pub mod testkit;

pub use admin::AdminStore;
pub use any::AnyStore;
pub use attempt::{Attempt, downstream_key};
pub use canonical::canonical_json;
pub use claim::{Begin, Claim, PendingCompletion};
pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use codec::{HttpResponse, Json, Storable};
#[doc(hidden)]
pub use codec::{json_decode as codec_json_decode, json_encode as codec_json_encode};
pub use engine::{ClaimTicket, Idem, Prepared};
pub use error::{Error, ErrorKind, Result};
pub use fingerprint::{
    FieldFilter, Fingerprint, MAX_REQUEST_DEPTH, RawJson, RequestError, fingerprint,
};
pub use http::method_needs_key;
pub use key::{
    IDEMPOTENCY_KEY_HEADER, IdempotencyKey, IntoKey, KeyError, MAX_KEY_LEN, REPLAYED_HEADER,
};
pub use memory::MemoryStore;
pub use ops::{Admin, AdminOutcome, AdminTimeout, DEFAULT_ADMIN_TIMEOUT, RecordView};
pub use outcome::{Failure, Outcome, Reply};
pub use policy::{InFlightMode, Policy, PolicyBuilder, PolicyError};
pub use purger::{PurgerConfig, PurgerHandle};
pub use scope::{MAX_SCOPE_PART_LEN, RecordId, Scope, ScopeError};
pub use store::{BoxDynError, Store, StoreError};

#[cfg(all(test, feature = "testkit"))]
mod memory_conformance {
    use crate::MemoryStore;
    use crate::testkit::Fixture;

    struct Memory(MemoryStore);
    impl Fixture for Memory {
        type Store = MemoryStore;
        fn store(&self) -> MemoryStore {
            self.0.clone()
        }
        async fn teardown(self) {}
    }
    async fn setup() -> Memory {
        Memory(MemoryStore::new())
    }

    crate::store_conformance!(setup());
}

/// The same suite through [`AnyStore`]: the dyn-compatible mirror forwards
/// every store and operator call, so a backend chosen at run time keeps every
/// promise.
#[cfg(all(test, feature = "testkit"))]
mod any_store_conformance {
    use crate::testkit::Fixture;
    use crate::{AnyStore, MemoryStore};

    struct Any(AnyStore);
    impl Fixture for Any {
        type Store = AnyStore;
        fn store(&self) -> AnyStore {
            self.0.clone()
        }
        async fn teardown(self) {}
    }
    async fn setup() -> Any {
        Any(AnyStore::new(MemoryStore::new()))
    }

    crate::store_conformance!(setup());
}
