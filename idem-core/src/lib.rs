#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The application API is re-exported at the root (below); each module is one
// layer of the architecture, and the public ones are the three other tiers:
// `ops` (operators), `store` (backend implementers), `adapter` (adapters that
// run the engine on their own terms), and `wire`, the names of the answers
// every adapter gives whatever its protocol.
mod builder;
mod engine;
mod fingerprint;
mod id;
mod metrics;
mod policy;
mod util;

pub mod adapter;
pub mod clock;
pub mod ops;
pub mod store;
pub mod wire;

#[cfg(feature = "testkit")]
#[cfg_attr(docsrs, doc(cfg(feature = "testkit")))]
pub mod testkit;

/// The class of an [`Error`] ([`error::ErrorKind`], what
/// [`Error::kind`] returns) and the detailed errors behind its input
/// variants: what exactly was wrong with a key, a scope, a policy or a
/// request.
pub mod error {
    pub use crate::engine::error::ErrorKind;
    pub use crate::fingerprint::RequestError;
    pub use crate::id::key::KeyError;
    pub use crate::id::scope::ScopeError;
    pub use crate::policy::PolicyError;
}

/// Support for [`storable_as_json!`]; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use crate::engine::codec::{json_decode, json_encode};
}

pub use engine::Idem;
pub use engine::attempt::Attempt;
pub use engine::claim::{Begin, Claim};
pub use engine::codec::{HttpResponse, Json, Storable};
pub use engine::error::Error;
pub use engine::outcome::{Failure, Outcome, Reply};
pub use fingerprint::{FieldFilter, RawJson};
pub use id::key::{IdempotencyKey, IntoKey};
pub use id::scope::{RecordId, Scope};
pub use policy::{InFlightMode, Policy, PolicyBuilder};
pub use store::any::AnyStore;
pub use store::memory::MemoryStore;
pub use store::record::TakeoverReason;

/// A store that needs no teardown (it lives in this process), as a
/// conformance fixture.
#[cfg(all(test, feature = "testkit"))]
struct InProcess<S>(S);

#[cfg(all(test, feature = "testkit"))]
impl<S: store::AdminStore + Clone> testkit::Fixture for InProcess<S> {
    type Store = S;
    fn store(&self) -> S {
        self.0.clone()
    }
    async fn teardown(self) {}
}

#[cfg(all(test, feature = "testkit"))]
mod memory_conformance {
    use crate::{InProcess, MemoryStore};

    async fn setup() -> InProcess<MemoryStore> {
        InProcess(MemoryStore::new())
    }

    crate::store_conformance!(setup());
}

/// The same suite through [`AnyStore`]: the dyn-compatible mirror forwards
/// every store and operator call, so a backend chosen at run time keeps every
/// promise.
#[cfg(all(test, feature = "testkit"))]
mod any_store_conformance {
    use crate::{AnyStore, InProcess, MemoryStore};

    async fn setup() -> InProcess<AnyStore> {
        InProcess(AnyStore::new(MemoryStore::new()))
    }

    crate::store_conformance!(setup());
}
