//! The framework-neutral pipeline: key-header parsing over byte slices, the
//! fingerprint envelope, header filtering and problem rendering. It uses no
//! `http` types, so an adapter for another framework (actix-web's `http` 0.2
//! types) reuses it unchanged.

mod envelope;
mod headers;
mod key;
mod problem;

pub use envelope::{BodyFingerprint, FingerprintSpec, RequestView, envelope, fingerprint_request};
pub use headers::{Class, DEFAULT_DENY, HeaderPolicy, NEVER_STORED, default_class, stored_headers};
pub use key::{KeyHeaderError, KeySyntax, parse_key_header};
pub use problem::{CODES, DRAFT, Problem, ProblemTypes, Rendered, title};
