#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod error;
mod key;
#[cfg(any(feature = "reqwest", feature = "tower"))]
mod metrics;
#[cfg(feature = "reqwest")]
mod middleware;
pub mod policy;
mod report;
pub mod retry_after;
#[cfg(any(feature = "reqwest", feature = "tower"))]
mod send;
#[cfg(feature = "tower")]
mod tower;

pub use config::{ClientConfigError, IdempotencyClientBuilder};
pub use error::{Error, StopReason};
pub use idem_core::IdempotencyKey;
pub use idem_core::wire::{MAX_PROBLEM_BYTES, Problem};
pub use key::{Intent, KeyEncoding};
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
pub use middleware::{IdemResponseExt, IdempotencyMiddleware, IdempotentRequestExt, Sent};
pub use report::{Report, ReportKind};
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub use tower::{IdempotencyClient, IdempotencyClientLayer};
