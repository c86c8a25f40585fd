//! Request fingerprints: SHA-256 over the operation and the canonical JSON of
//! the request, after the caller's field filter.

/// `Serializer` methods that give one answer whatever their arguments:
/// for the passes that only accept, refuse or count a kind of value (the
/// depth check, the member-name writer). The caller names `self`, so that
/// the answer may use it.
macro_rules! answer {
    ($this:ident => $res:ty = $answer:expr; $($method:ident($($ty:ty),*)),* $(,)?) => {$(
        fn $method($this, $(_: $ty),*) -> $res {
            $answer
        }
    )*};
}

pub(crate) mod check;
pub(crate) mod direct;
pub(crate) mod value;

use std::cell::{Cell, RefCell};
use std::fmt;

use serde::Serialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::fingerprint::direct::{CanonError, Scratch};
use crate::fingerprint::value::fingerprint_bytes;

/// The deepest nesting of arrays and objects accepted in a request, the same
/// for every form (a `Serialize` value, a `serde_json::Value`, [`RawJson`]):
/// 127, the deepest serde_json's parser reads back. One more is
/// [`RequestError::TooDeep`].
pub const MAX_REQUEST_DEPTH: usize = crate::fingerprint::check::MAX_DEPTH;

/// Version tags of the fingerprint encoding. `v1`: the RFC 8785 canonical
/// JSON. `v2`: the same, except that integers beyond 2^53 in magnitude are
/// hashed by their exact digits. A request without such an integer is hashed
/// as `v1`, byte for byte as before `v2` existed.
const FINGERPRINT_V1: &[u8] = b"idem-fp-v1\0";
const FINGERPRINT_V2: &[u8] = b"idem-fp-v2\0";

/// SHA-256 identifying "the same request" under one key.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// Wraps raw digest bytes (as read back from a store).
    #[must_use]
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// Reads a stored fingerprint, refusing any length but 32 bytes.
    ///
    /// # Errors
    ///
    /// The actual length, when it is not 32.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, usize> {
        <[u8; 32]>::try_from(bytes)
            .map(Self)
            .map_err(|_| bytes.len())
    }

    /// The digest bytes.
    #[must_use]
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lowercase hex of the digest.
    #[must_use]
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", &self.to_hex()[..16])
    }
}

/// Which fields of a request count toward its fingerprint, as JSON pointers
/// (RFC 6901).
///
/// Array elements are addressed by canonical indexes only (`/items/1`, never
/// `/items/01` or `/items/+1`), as RFC 6901 says: [`PolicyBuilder::build`](crate::PolicyBuilder::build)
/// refuses a pointer with a token that looks like an index but is not
/// canonical ([`PolicyError::InvalidPointer`](crate::error::PolicyError::InvalidPointer)), so an object member named
/// `01` cannot be filtered. A filter passed to [`fingerprint`] directly is not
/// checked; such a token then matches no array element in either list.
///
/// # Examples
///
/// ```
/// use idem_core::FieldFilter;
/// use idem_core::adapter::fingerprint;
/// use serde_json::json;
///
/// let ignore_ts = FieldFilter::ignore(["/client_ts"]);
/// let a = fingerprint("POST /payments", &json!({"amount": 100, "client_ts": 1}), &ignore_ts).unwrap();
/// let b = fingerprint("POST /payments", &json!({"client_ts": 2, "amount": 100.0}), &ignore_ts).unwrap();
/// assert_eq!(a, b);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FieldFilter {
    /// Every field counts (the default).
    #[default]
    All,
    /// Only these pointers count; a missing one counts as absent.
    Only(Vec<String>),
    /// Everything but these pointers counts. Object members are removed;
    /// array elements are replaced by `null` so other indices stay put.
    Ignore(Vec<String>),
}

impl FieldFilter {
    /// An allowlist of JSON pointers.
    pub fn only<I, S>(pointers: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::Only(pointers.into_iter().map(Into::into).collect())
    }

    /// A denylist of JSON pointers.
    pub fn ignore<I, S>(pointers: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::Ignore(pointers.into_iter().map(Into::into).collect())
    }

    /// Checks every pointer (called by [`PolicyBuilder::build`](crate::PolicyBuilder::build)):
    /// RFC 6901 syntax, and no token that reads as an array index but is not
    /// the canonical spelling RFC 6901 requires (`01`, `+1`, `-1`).
    /// A bad pointer comes back as `(pointer, reason)`; the policy builder
    /// turns it into its own error, so this module does not depend on it.
    pub(crate) fn validate(&self) -> Result<(), (String, &'static str)> {
        let (Self::Only(pointers) | Self::Ignore(pointers)) = self else {
            return Ok(());
        };
        pointers.iter().try_for_each(|p| check_pointer(p))
    }

    fn apply(&self, value: Value) -> Value {
        match self {
            Self::All => value,
            Self::Only(pointers) => {
                // Keyed by the pointer itself: deterministic and injective.
                let mut picked = Map::new();
                for p in pointers {
                    if let Some(v) = value.pointer(p) {
                        picked.insert(p.clone(), v.clone());
                    }
                }
                Value::Object(picked)
            }
            Self::Ignore(pointers) => {
                let mut value = value;
                for p in pointers {
                    remove_pointer(&mut value, p);
                }
                value
            }
        }
    }
}

/// Refuses a pointer that is not RFC 6901, or whose token looks like an
/// array index without being a canonical one.
fn check_pointer(pointer: &str) -> Result<(), (String, &'static str)> {
    let bad = |reason| Err((pointer.to_owned(), reason));
    if pointer.is_empty() {
        return Ok(());
    }
    let Some(rest) = pointer.strip_prefix('/') else {
        return bad("must be empty or start with `/`");
    };
    for token in rest.split('/') {
        let mut chars = token.chars();
        while let Some(c) = chars.next() {
            if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
                return bad("has a `~` not followed by `0` or `1`");
            }
        }
        let digits = token.strip_prefix(['+', '-']).unwrap_or(token);
        let index_like = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
        if index_like && canonical_index(token).is_none() {
            return bad(
                "has an array index that is not canonical (a sign or a leading zero); \
                 RFC 6901 indexes are `0` or digits without a leading zero",
            );
        }
    }
    Ok(())
}

/// The array index a reference token denotes, RFC 6901 §4: `0`, or digits
/// without a leading zero (the rule `serde_json`'s own pointers follow).
fn canonical_index(token: &str) -> Option<usize> {
    let b = token.as_bytes();
    let canonical = token == "0"
        || (b.first().is_some_and(|c| (b'1'..=b'9').contains(c))
            && b.iter().all(u8::is_ascii_digit));
    canonical.then(|| token.parse().ok()).flatten()
}

fn remove_pointer(value: &mut Value, pointer: &str) {
    let Some(split) = pointer.rfind('/') else {
        return;
    };
    let (parent, last) = (&pointer[..split], &pointer[split + 1..]);
    let token = last.replace("~1", "/").replace("~0", "~");
    match value.pointer_mut(parent) {
        Some(Value::Object(map)) => {
            map.remove(&token);
        }
        Some(Value::Array(items)) => {
            if let Some(slot) = canonical_index(&token).and_then(|i| items.get_mut(i)) {
                *slot = Value::Null;
            }
        }
        _ => {}
    }
}

/// Why a request could not be fingerprinted (HTTP 400).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// The request could not be turned into JSON (e.g. [`RawJson`] that does
    /// not parse, or a map with non-string keys).
    #[error("request is not valid JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    /// The request nests deeper than [`MAX_REQUEST_DEPTH`].
    #[error("request nests deeper than {MAX_REQUEST_DEPTH} levels")]
    TooDeep,
    /// The request holds a NaN or infinite float: it has no RFC 8785 form
    /// (serde_json would silently write `null`).
    #[error("request holds a NaN or infinite number, which JSON cannot represent")]
    NonFiniteNumber,
    /// A [`RawJson`] object names the same member twice: not I-JSON
    /// (RFC 7493), which RFC 8785 requires.
    #[error("request object has a duplicate member name")]
    DuplicateMember,
    /// The request's bytes do not decode as what the operation takes, in an
    /// adapter's own encoding (a gRPC message that is not its method's
    /// input type): nothing to fingerprint.
    #[error("request does not decode: {0}")]
    Undecodable(String),
}

/// Fingerprints `request` for `operation` under `filter`.
///
/// SHA-256 over a version tag, the operation (length-prefixed) and the
/// RFC 8785 canonical JSON of the filtered request, except that an integer
/// beyond 2^53 in magnitude that serde_json holds exactly (`i64`/`u64`) is
/// hashed by its exact digits (tag `idem-fp-v2`), so `9007199254740993` and
/// `9007199254740992` are different requests. Requests without such an
/// integer keep the `idem-fp-v1` fingerprint they always had.
///
/// The request is defined as what `serde_json::to_value` makes of it (a
/// member written twice counts once, with its last value). With
/// [`FieldFilter::All`] the canonical JSON is written straight from the
/// request's `Serialize` implementation into a per-thread buffer, without
/// building that `Value`; the bytes are the same. A field filter, a map key
/// that is not a string, an `i128` beyond 64 bits or serde_json's
/// `arbitrary_precision`/`RawValue` forms go through the `Value`.
///
/// # Errors
///
/// [`RequestError`] when the request is not JSON, holds a non-finite
/// number, names an object member twice ([`RawJson`]) or nests deeper than
/// [`MAX_REQUEST_DEPTH`].
pub fn fingerprint<R: Serialize + ?Sized>(
    operation: &str,
    request: &R,
    filter: &FieldFilter,
) -> Result<Fingerprint, RequestError> {
    if *filter != FieldFilter::All {
        // A filter picks or removes members by pointer: done on a `Value`.
        return fingerprint_via_value(operation, request, filter);
    }
    let direct = with_scratch(|scratch| {
        RAW_JSON_FAILURE.with(Cell::take);
        let exact_ints = crate::fingerprint::direct::write(request, scratch)?;
        Ok(digest(operation, &scratch.out, exact_ints))
    });
    match direct {
        Ok(fp) => Ok(fp),
        Err(CanonError::Fallback) => fingerprint_via_value(operation, request, filter),
        Err(CanonError::NonFinite) => Err(RequestError::NonFiniteNumber),
        Err(CanonError::TooDeep) => Err(RequestError::TooDeep),
        Err(CanonError::Custom(msg)) => Err(RAW_JSON_FAILURE
            .with(Cell::take)
            .unwrap_or_else(|| RequestError::NotJson(serde::ser::Error::custom(msg)))),
    }
}

/// The fingerprint through a `serde_json::Value`: the request converted
/// with `serde_json::to_value`, the filter applied, then canonicalised. The
/// definition the direct path of [`fingerprint`] reproduces byte for byte;
/// taken when a field filter is set, and for what only `to_value` decides
/// (map keys that are not strings, `i128` beyond 64 bits, serde_json's
/// `arbitrary_precision` and `RawValue` tokens).
pub(crate) fn fingerprint_via_value<R: Serialize + ?Sized>(
    operation: &str,
    request: &R,
    filter: &FieldFilter,
) -> Result<Fingerprint, RequestError> {
    let value = to_request_value(request)?;
    let (canonical, exact_ints) = fingerprint_bytes(&filter.apply(value));
    Ok(digest(operation, &canonical, exact_ints))
}

/// The JSON fingerprint of canonical bytes: [`fingerprint_raw`] under the
/// version tag. (The tag depends on the whole request, so the bytes are
/// complete before hashing starts.)
fn digest(operation: &str, canonical: &[u8], exact_ints: bool) -> Fingerprint {
    let tag = if exact_ints {
        FINGERPRINT_V2
    } else {
        FINGERPRINT_V1
    };
    fingerprint_raw(tag, operation, canonical)
}

/// Fingerprints raw bytes for `operation` under `tag`: SHA-256 over the tag,
/// the operation's length (8 bytes, big-endian), the operation and the
/// bytes. The one layout of every fingerprint: [`fingerprint`] is this over
/// the canonical JSON under its own version tags, and an adapter that
/// fingerprints bytes that are not JSON (a queue message's payload) calls it
/// under a tag of its own, ending in a NUL byte, so the two never collide.
///
/// ```
/// use idem_core::adapter::{fingerprint, fingerprint_raw};
/// use idem_core::FieldFilter;
///
/// let bytes = fingerprint_raw(b"my-adapter-bytes-v1\0", "ingest", b"\x00\x01");
/// assert_eq!(bytes, fingerprint_raw(b"my-adapter-bytes-v1\0", "ingest", b"\x00\x01"));
/// let json = fingerprint("ingest", &serde_json::json!(1), &FieldFilter::All).unwrap();
/// assert_eq!(json, fingerprint_raw(b"idem-fp-v1\0", "ingest", b"1"));
/// ```
#[must_use]
pub fn fingerprint_raw(tag: &[u8], operation: &str, bytes: &[u8]) -> Fingerprint {
    let mut hasher = Sha256::new();
    hasher.update(tag);
    hasher.update((operation.len() as u64).to_be_bytes());
    hasher.update(operation.as_bytes());
    hasher.update(bytes);
    Fingerprint(hasher.finalize().into())
}

/// Lowercase hex of the SHA-256 of raw bytes: how a body that is not
/// fingerprinted as JSON stands in a request's description (idem-http's
/// envelope), and the event id of a webhook delivery that carries none.
#[must_use]
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

thread_local! {
    /// The direct path's buffers, reused by every fingerprint on this thread.
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Runs `f` with this thread's buffers (fresh ones if they are in use: a
/// `Serialize` that fingerprints another request while being fingerprinted).
fn with_scratch<T>(f: impl FnOnce(&mut Scratch) -> T) -> T {
    // Not available while the thread's locals are being destroyed.
    if SCRATCH.try_with(|_| ()).is_err() {
        return f(&mut Scratch::default());
    }
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => {
            let out = f(&mut scratch);
            scratch.trim();
            out
        }
        Err(_) => f(&mut Scratch::default()),
    })
}

/// The request as a `Value`, refusing what has no RFC 8785 form: a first,
/// allocation-free pass refuses non-finite floats and deep nesting (which
/// `serde_json::to_value` would turn into `null` or recurse into), then the
/// conversion; a [`RawJson`] parse reports its own typed failure.
fn to_request_value<R: Serialize + ?Sized>(request: &R) -> Result<Value, RequestError> {
    use crate::fingerprint::check::{CheckError, check};
    check(request).map_err(|e| match e {
        CheckError::NonFinite => RequestError::NonFiniteNumber,
        CheckError::TooDeep => RequestError::TooDeep,
        CheckError::Custom(msg) => RequestError::NotJson(serde::ser::Error::custom(msg)),
    })?;
    RAW_JSON_FAILURE.with(Cell::take);
    let value = serde_json::to_value(request).map_err(|e| {
        RAW_JSON_FAILURE
            .with(Cell::take)
            .unwrap_or(RequestError::NotJson(e))
    })?;
    // A RawJson nested inside another value adds its own depth.
    if exceeds_depth(&value, MAX_REQUEST_DEPTH) {
        return Err(RequestError::TooDeep);
    }
    Ok(value)
}

thread_local! {
    /// The typed reason of the last [`RawJson`] parse failure on this thread:
    /// `Serialize` can only report a message, so the parse leaves its
    /// reason here for [`to_request_value`], which takes it right after the
    /// (synchronous) conversion returns.
    static RAW_JSON_FAILURE: Cell<Option<RequestError>> = const { Cell::new(None) };
}

/// Iterative depth check, so a hostile value cannot overflow the stack here.
/// Only containers are pushed, and nothing is boxed: one allocation at most.
fn exceeds_depth(value: &Value, limit: usize) -> bool {
    fn push<'a>(stack: &mut Vec<(&'a Value, usize)>, v: &'a Value, depth: usize) {
        if matches!(v, Value::Array(_) | Value::Object(_)) {
            stack.push((v, depth));
        }
    }
    let mut stack: Vec<(&Value, usize)> = Vec::new();
    push(&mut stack, value, 1);
    while let Some((v, depth)) = stack.pop() {
        if depth > limit {
            return true;
        }
        match v {
            Value::Array(items) => items.iter().for_each(|c| push(&mut stack, c, depth + 1)),
            Value::Object(map) => map.values().for_each(|c| push(&mut stack, c, depth + 1)),
            _ => {}
        }
    }
    false
}

/// A raw JSON request body (e.g. an HTTP body) to fingerprint as JSON.
///
/// Invalid JSON, an object naming a member twice (not I-JSON), or nesting
/// deeper than [`MAX_REQUEST_DEPTH`] becomes
/// [`Error::InvalidRequest`](crate::Error::InvalidRequest) before anything is
/// stored.
///
/// ```
/// use idem_core::{FieldFilter, RawJson};
/// use idem_core::adapter::fingerprint;
/// use idem_core::error::RequestError;
///
/// let a = fingerprint("op", &RawJson(br#"{"a":1,"b":2}"#), &FieldFilter::All).unwrap();
/// let b = fingerprint("op", &RawJson(br#"{ "b":2.0, "a":1 }"#), &FieldFilter::All).unwrap();
/// assert_eq!(a, b);
/// assert!(fingerprint("op", &RawJson(b"{not json"), &FieldFilter::All).is_err());
/// assert!(matches!(
///     fingerprint("op", &RawJson(br#"{"amount":1,"amount":1000}"#), &FieldFilter::All),
///     Err(RequestError::DuplicateMember)
/// ));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct RawJson<'a>(pub &'a [u8]);

impl RawJson<'_> {
    /// Parses the body, refusing what [`fingerprint`] refuses.
    ///
    /// # Errors
    ///
    /// [`RequestError::NotJson`], [`RequestError::DuplicateMember`],
    /// [`RequestError::TooDeep`].
    pub fn parse(&self) -> Result<Value, RequestError> {
        let failure = Cell::new(None);
        let mut de = serde_json::Deserializer::from_slice(self.0);
        // The seed counts depth itself and stops at MAX_REQUEST_DEPTH, so
        // serde_json's own limit (one level deeper) is never the one hit.
        de.disable_recursion_limit();
        let seed = Strict {
            depth: 0,
            failure: &failure,
        };
        let value = serde::de::DeserializeSeed::deserialize(seed, &mut de)
            .and_then(|v| de.end().map(|()| v));
        value.map_err(|e| match failure.take() {
            Some(Failure::TooDeep) => RequestError::TooDeep,
            Some(Failure::Duplicate) => RequestError::DuplicateMember,
            None => RequestError::NotJson(e),
        })
    }
}

impl Serialize for RawJson<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer
            .serialize_newtype_struct(crate::fingerprint::check::RAW_JSON_TOKEN, &Parsed(self.0))
    }
}

/// The body of a [`RawJson`], parsed when serialized.
struct Parsed<'a>(&'a [u8]);

impl Serialize for Parsed<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match RawJson(self.0).parse() {
            Ok(value) => value.serialize(serializer),
            Err(e) => {
                let msg = e.to_string();
                RAW_JSON_FAILURE.with(|f| f.set(Some(e)));
                Err(serde::ser::Error::custom(msg))
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Failure {
    TooDeep,
    Duplicate,
}

/// Builds a `Value` like serde_json's own, but refuses duplicate member
/// names and nesting past [`MAX_REQUEST_DEPTH`], noting which in `failure`.
#[derive(Clone, Copy)]
struct Strict<'f> {
    depth: usize,
    failure: &'f Cell<Option<Failure>>,
}

impl Strict<'_> {
    fn fail<E: serde::de::Error>(self, why: Failure) -> E {
        self.failure.set(Some(why));
        E::custom(match why {
            Failure::TooDeep => "request nests too deep",
            Failure::Duplicate => "duplicate member name",
        })
    }

    fn child<E: serde::de::Error>(self) -> Result<Self, E> {
        if self.depth + 1 > MAX_REQUEST_DEPTH {
            return Err(self.fail(Failure::TooDeep));
        }
        Ok(Self {
            depth: self.depth + 1,
            failure: self.failure,
        })
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let child = self.child()?;
        let mut items = Vec::new();
        while let Some(v) = seq.next_element_seed(child)? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let child = self.child()?;
        let mut members = Map::new();
        while let Some(name) = map.next_key::<String>()? {
            if members.contains_key(&name) {
                return Err(self.fail(Failure::Duplicate));
            }
            let v = map.next_value_seed(child)?;
            members.insert(name, v);
        }
        Ok(Value::Object(members))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::PolicyError;
    use serde_json::json;

    fn fp(v: &Value) -> Fingerprint {
        fingerprint("POST /payments", v, &FieldFilter::All).unwrap()
    }

    #[test]
    fn key_order_and_number_spelling_do_not_matter() {
        let a = fp(&json!({"amount": 100, "currency": "usd", "meta": {"x": 1, "y": 2}}));
        let b: Value =
            serde_json::from_str(r#"{"meta":{"y":2.0,"x":1e0},"currency":"usd","amount":1.00e2}"#)
                .unwrap();
        assert_eq!(a, fp(&b));
    }

    #[test]
    fn a_changed_amount_changes_the_fingerprint() {
        assert_ne!(fp(&json!({"amount": 100})), fp(&json!({"amount": 101})));
    }

    #[test]
    fn operation_is_part_of_the_fingerprint() {
        let v = json!({"a": 1});
        assert_ne!(
            fingerprint("op1", &v, &FieldFilter::All).unwrap(),
            fingerprint("op2", &v, &FieldFilter::All).unwrap()
        );
    }

    #[test]
    fn denylist_and_allowlist() {
        let ignore = FieldFilter::ignore(["/client_ts", "/items/1", "/a~1b"]);
        let f = |v: Value| fingerprint("op", &v, &ignore).unwrap();
        assert_eq!(
            f(json!({"amount": 1, "client_ts": 5, "items": [1, 2], "a/b": 1})),
            f(json!({"amount": 1, "client_ts": 9, "items": [1, 3], "a/b": 2}))
        );
        assert_ne!(f(json!({"amount": 1})), f(json!({"amount": 2})));

        let only = FieldFilter::only(["/amount", "/currency"]);
        let g = |v: Value| fingerprint("op", &v, &only).unwrap();
        assert_eq!(
            g(json!({"amount": 1, "currency": "eur", "note": "a"})),
            g(json!({"amount": 1, "currency": "eur", "note": "b"}))
        );
        assert_ne!(
            g(json!({"amount": 1})),
            g(json!({"amount": 1, "currency": "eur"}))
        );
    }

    #[test]
    fn invalid_and_too_deep_requests_are_typed_errors() {
        assert!(matches!(
            fingerprint("op", &RawJson(b"{\"a\":"), &FieldFilter::All),
            Err(RequestError::NotJson(_))
        ));
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert!(matches!(
            fingerprint("op", &RawJson(deep.as_bytes()), &FieldFilter::All),
            Err(RequestError::TooDeep)
        ));
        // Built in code (no parser limit): caught by the depth check.
        let mut v = json!(1);
        for _ in 0..200 {
            v = json!([v]);
        }
        assert!(matches!(
            fingerprint("op", &v, &FieldFilter::All),
            Err(RequestError::TooDeep)
        ));
        let mut ok = json!(1);
        for _ in 0..100 {
            ok = json!({"a": ok});
        }
        assert!(fingerprint("op", &ok, &FieldFilter::All).is_ok());
    }

    #[test]
    fn non_canonical_array_indexes_are_refused_and_never_match() {
        use crate::Policy;
        for p in [
            "/items/01",
            "/items/+1",
            "/items/-1",
            "/a/00",
            "/a~2b",
            "/a~",
        ] {
            let err = Policy::builder()
                .fields(FieldFilter::ignore([p]))
                .build()
                .expect_err(p);
            assert!(
                matches!(err, PolicyError::InvalidPointer { .. }),
                "{p}: {err:?}"
            );
            assert!(
                Policy::builder()
                    .fields(FieldFilter::only([p]))
                    .build()
                    .is_err()
            );
        }
        for p in ["", "/items/0", "/items/10", "/items/-", "/a~0b~1c", "/x/1a"] {
            assert!(
                Policy::builder()
                    .fields(FieldFilter::ignore([p]))
                    .build()
                    .is_ok(),
                "{p}"
            );
        }
        // Unchecked filters: one rule for both lists, the token matches no element.
        let v = json!({"items": [1, 2, 3]});
        let changed = json!({"items": [1, 9, 3]});
        for p in ["/items/01", "/items/+1"] {
            let ignore = FieldFilter::ignore([p]);
            assert_ne!(
                fingerprint("op", &v, &ignore).unwrap(),
                fingerprint("op", &changed, &ignore).unwrap(),
                "denylist {p} must not hide element 1"
            );
            let only = FieldFilter::only([p]);
            assert_eq!(
                fingerprint("op", &v, &only).unwrap(),
                fingerprint("op", &changed, &only).unwrap(),
                "allowlist {p} picks nothing"
            );
        }
    }

    #[test]
    fn wrong_length_stored_fingerprint_is_refused() {
        assert_eq!(Fingerprint::from_slice(&[0; 31]), Err(31));
        assert!(Fingerprint::from_slice(&[0; 32]).is_ok());
    }
}
