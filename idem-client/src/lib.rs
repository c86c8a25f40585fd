#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
mod key;
pub mod policy;
mod problem;
mod report;
pub mod retry_after;

pub use error::{Error, StopReason};
pub use idem_core::IdempotencyKey;
pub use key::{Intent, KeySyntax, decode as decode_key};
pub use policy::{AttemptView, Decision, Outcome, Policy, Step};
pub use problem::{MAX_PROBLEM_BYTES, Problem};
pub use report::{Report, ReportKind};
