//! The wire vocabulary this adapter shares with the HTTP one: the key
//! syntax and its parser, the problem codes (an `ErrorInfo` reason is the
//! code in upper case) and the field names, from their protocol-neutral home
//! (`idem_core::wire`); the rejections, the owner sources and the response
//! classes, from the HTTP layer. Every use in this crate goes through here.

pub(crate) use idem_core::wire::{KeyHeaderError, KeySyntax, ProblemCode};
use idem_core::wire::{header, parse_key_field, quote};
pub(crate) use idem_http::{
    Class, HeaderPolicy, IdemAttempt, IdemKey, NoOwner, OwnerSource, Rejection,
};

/// The `ErrorInfo.domain` of every answer the layer gives on its own.
pub(crate) const DOMAIN: &str = "idem";

/// The metadata that marks a replay (the HTTP header's name, lowercase).
pub(crate) const REPLAYED: &str = header::IDEMPOTENT_REPLAYED;

/// The metadata that carries the first attempt's resource id on an
/// "already done" answer.
pub(crate) const RESOURCE_ID: &str = "idempotency-resource-id";

/// The default key metadata (the HTTP header's name, lowercase).
pub(crate) const KEY_METADATA: &str = header::IDEMPOTENCY_KEY;

/// The `ErrorInfo.reason` of `code`: the HTTP problem code in upper case
/// (`invalid_key` → `INVALID_KEY`).
pub(crate) fn reason(code: ProblemCode) -> String {
    code.as_str().to_ascii_uppercase()
}

/// Parses the values of the key metadata with the HTTP header's parser:
/// the same syntax and limits, and two entries refused, never the first one
/// taken silently.
pub(crate) fn parse_key(
    values: &[&[u8]],
) -> Result<Option<idem_core::IdempotencyKey>, KeyHeaderError> {
    parse_key_field(values, KeySyntax::Lenient)
}

/// The client's policy, its outcome vocabulary and its key minting: the
/// client layer is `idem::client`'s decision table over gRPC answers.
pub(crate) use idem_client::policy::{AttemptView, SendState, Step, TransportFailure, os_random};
pub(crate) use idem_client::policy::{RetryPolicy, SendOutcome};
pub(crate) use idem_client::{Intent, Problem, ReportKind, StopReason};

/// A key the caller set in the metadata, quoted or bare (`"k"` and `k` are
/// one key), as the server parses it.
pub(crate) fn decode_key(value: &str) -> Result<idem_core::IdempotencyKey, KeyHeaderError> {
    parse_key_field(&[value.as_bytes()], KeySyntax::Lenient)?.ok_or(KeyHeaderError::Empty)
}

/// The key as the client writes it in its metadata (an sf-string, the
/// draft's form, which every server parser reads).
pub(crate) fn quote_key(key: &idem_core::IdempotencyKey) -> String {
    quote(key)
}

/// The HTTP problem code of an `ErrorInfo` reason (`IN_FLIGHT` →
/// `in_flight`): the inverse of [`reason`].
pub(crate) fn code_of_reason(reason: &str) -> String {
    reason.to_ascii_lowercase()
}

/// Whether the HTTP layer's header `policy` keeps metadata `name`
/// (lowercase): the same deny list by default (`set-cookie`, trace ids, ...).
pub(crate) fn policy_keeps(policy: &HeaderPolicy, name: &str) -> bool {
    match policy {
        HeaderPolicy::DenyList(d) => !d.iter().any(|n| n == name),
        HeaderPolicy::AllowList(a) => a.iter().any(|n| n == name),
        _ => true,
    }
}
