//! How responses become stored bytes and come back unchanged.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::store::BoxDynError;

/// A value that can be stored as bytes and replayed.
///
/// Implemented explicitly, so each type says how it is stored:
///
/// | type | stored as |
/// |---|---|
/// | `Vec<u8>` | the bytes |
/// | `String` | its UTF-8 bytes |
/// | `()` | nothing (an empty body) |
/// | `bool`, `i32`, `i64`, `u32`, `u64` | their JSON (decimal text) |
/// | [`HttpResponse`] | status, headers and the body's exact bytes |
/// | [`Json<T>`] for any serde type | its JSON (serde_json) |
/// | `serde_json::Value` | its JSON |
/// | your own serde types | their JSON, with [`storable_as_json!`](crate::storable_as_json) |
///
/// A custom implementation must make `decode(encode(v)) == v`; the engine
/// stores only what `encode` returns, and a replay that does not decode is
/// a 500 ([`Error::CorruptRecord`](crate::Error::CorruptRecord)).
pub trait Storable: Sized + Send + 'static {
    /// The bytes to store.
    ///
    /// # Errors
    ///
    /// When the value cannot be encoded (it is then not stored; retries get
    /// [`Error::ResponseNotStored`](crate::Error::ResponseNotStored)).
    fn encode(&self) -> Result<Vec<u8>, BoxDynError>;

    /// The value back from stored bytes.
    ///
    /// # Errors
    ///
    /// When the bytes are not a valid encoding (a corrupted record).
    fn decode(bytes: &[u8]) -> Result<Self, BoxDynError>;

    /// The value back from stored bytes the caller owns (a replay reads the
    /// record's body this way): a type that keeps the bytes, such as
    /// `Vec<u8>`, `String` or [`HttpResponse`]'s body, takes them instead
    /// of copying them. The default is [`Storable::decode`].
    ///
    /// # Errors
    ///
    /// As [`Storable::decode`]; both must accept and refuse the same bytes.
    fn decode_owned(bytes: Vec<u8>) -> Result<Self, BoxDynError> {
        Self::decode(&bytes)
    }
}

impl Storable for Vec<u8> {
    fn encode(&self) -> Result<Vec<u8>, BoxDynError> {
        Ok(self.clone())
    }
    fn decode(bytes: &[u8]) -> Result<Self, BoxDynError> {
        Ok(bytes.to_vec())
    }
    fn decode_owned(bytes: Vec<u8>) -> Result<Self, BoxDynError> {
        Ok(bytes)
    }
}

impl Storable for String {
    fn encode(&self) -> Result<Vec<u8>, BoxDynError> {
        Ok(self.as_bytes().to_vec())
    }
    fn decode(bytes: &[u8]) -> Result<Self, BoxDynError> {
        Ok(std::str::from_utf8(bytes)?.to_owned())
    }
    fn decode_owned(bytes: Vec<u8>) -> Result<Self, BoxDynError> {
        Ok(String::from_utf8(bytes)?)
    }
}

impl Storable for () {
    fn encode(&self) -> Result<Vec<u8>, BoxDynError> {
        Ok(Vec::new())
    }
    fn decode(bytes: &[u8]) -> Result<Self, BoxDynError> {
        if bytes.is_empty() {
            Ok(())
        } else {
            Err("a stored unit value has bytes".into())
        }
    }
}

impl Storable for serde_json::Value {
    fn encode(&self) -> Result<Vec<u8>, BoxDynError> {
        json_encode(self)
    }
    fn decode(bytes: &[u8]) -> Result<Self, BoxDynError> {
        json_decode(bytes)
    }
}

crate::storable_as_json!(bool, i32, i64, u32, u64);

/// Stores any serde type as its JSON, like axum's `Json` extractor wraps a
/// body: `Outcome::Success(Json(charge))`.
///
/// ```
/// use idem_core::{Json, Storable};
///
/// #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
/// struct Charge { id: String, amount: u64 }
///
/// let bytes = Json(Charge { id: "ch_1".into(), amount: 100 }).encode().unwrap();
/// assert_eq!(bytes, br#"{"id":"ch_1","amount":100}"#);
/// let Json(back) = Json::<Charge>::decode(&bytes).unwrap();
/// assert_eq!(back.amount, 100);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Json<T>(pub T);

impl<T: Serialize + DeserializeOwned + Send + 'static> Storable for Json<T> {
    fn encode(&self) -> Result<Vec<u8>, BoxDynError> {
        json_encode(&self.0)
    }
    fn decode(bytes: &[u8]) -> Result<Self, BoxDynError> {
        json_decode(bytes).map(Json)
    }
}

/// How every JSON-stored value is encoded: the one place that decides
/// whether a value can be replayed.
#[doc(hidden)]
pub fn json_encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, BoxDynError> {
    crate::fingerprint::check::to_vec_checked(value)
}

/// How every JSON-stored value is decoded.
#[doc(hidden)]
pub fn json_decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, BoxDynError> {
    Ok(serde_json::from_slice(bytes)?)
}

/// Makes serde types [`Storable`] as their JSON, without a [`Json`] wrapper.
///
/// ```
/// #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
/// struct Charge { id: String }
/// #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
/// struct Decline { code: String }
///
/// idem_core::storable_as_json!(Charge, Decline);
///
/// use idem_core::Storable;
/// let c = Charge { id: "ch_1".into() };
/// assert_eq!(Charge::decode(&c.encode().unwrap()).unwrap(), c);
/// ```
#[macro_export]
macro_rules! storable_as_json {
    ($($ty:ty),+ $(,)?) => {
        $(
            impl $crate::Storable for $ty {
                fn encode(&self) -> ::std::result::Result<::std::vec::Vec<u8>, $crate::store::BoxDynError> {
                    $crate::__private::json_encode(self)
                }
                fn decode(bytes: &[u8]) -> ::std::result::Result<Self, $crate::store::BoxDynError> {
                    $crate::__private::json_decode(bytes)
                }
            }
        )+
    };
}

/// A raw HTTP response, stored and replayed byte for byte: header values
/// are bytes (HTTP field values are opaque octets), so non-UTF-8 values
/// survive too.
///
/// ```
/// use idem_core::{HttpResponse, Storable};
///
/// let r = HttpResponse::new(201, vec![("location".into(), b"/charges/ch_1".to_vec())], b"\x00{\"id\":1}".to_vec())
///     .with_header("x-raw", b"\xff\xfe".to_vec());
/// let back = HttpResponse::decode(&r.encode().unwrap()).unwrap();
/// assert_eq!(back, r);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    /// The status code.
    pub status: u16,
    /// The headers to replay, in order (names as given, values as bytes).
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body's exact bytes.
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// Builds a response.
    #[must_use]
    pub fn new(status: u16, headers: Vec<(String, Vec<u8>)>, body: Vec<u8>) -> Self {
        Self {
            status,
            headers,
            body,
        }
    }

    /// Appends a header (a repeated name is kept, in order).
    #[must_use]
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The values of `name` (ASCII case-insensitive), in order.
    pub fn header_values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }
}

/// `IDH2`: header values as bytes (`IDH1`, from before, had UTF-8 values and
/// the same layout, so it decodes too).
const HTTP_MAGIC: &[u8; 4] = b"IDH2";
const HTTP_MAGIC_V1: &[u8; 4] = b"IDH1";

fn corrupt(what: &str) -> BoxDynError {
    format!("stored HTTP response is malformed: {what}").into()
}

impl Storable for HttpResponse {
    fn encode(&self) -> Result<Vec<u8>, BoxDynError> {
        let header_bytes: usize = self
            .headers
            .iter()
            .map(|(n, v)| 8 + n.len() + v.len())
            .sum();
        let mut out = Vec::with_capacity(10 + header_bytes + self.body.len());
        out.extend_from_slice(HTTP_MAGIC);
        out.extend_from_slice(&self.status.to_be_bytes());
        out.extend_from_slice(&u32::try_from(self.headers.len())?.to_be_bytes());
        for (name, value) in &self.headers {
            out.extend_from_slice(&u32::try_from(name.len())?.to_be_bytes());
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(&u32::try_from(value.len())?.to_be_bytes());
            out.extend_from_slice(value);
        }
        out.extend_from_slice(&self.body);
        Ok(out)
    }

    fn decode(bytes: &[u8]) -> Result<Self, BoxDynError> {
        let (status, headers, body_at) = decode_head(bytes)?;
        Ok(Self {
            status,
            headers,
            body: bytes[body_at..].to_vec(),
        })
    }

    /// The body keeps the stored buffer (its head is cut off in place):
    /// no second allocation of the body.
    fn decode_owned(mut bytes: Vec<u8>) -> Result<Self, BoxDynError> {
        let (status, headers, body_at) = decode_head(&bytes)?;
        bytes.drain(..body_at);
        Ok(Self {
            status,
            headers,
            body: bytes,
        })
    }
}

/// A decoded head: the status, the headers, and where the body starts.
type Head = (u16, Vec<(String, Vec<u8>)>, usize);

/// Decodes the head of a stored [`HttpResponse`].
fn decode_head(bytes: &[u8]) -> Result<Head, BoxDynError> {
    let mut rest = bytes
        .strip_prefix(HTTP_MAGIC.as_slice())
        .or_else(|| bytes.strip_prefix(HTTP_MAGIC_V1.as_slice()))
        .ok_or_else(|| corrupt("bad magic"))?;
    let mut take = |n: usize| -> Result<&[u8], BoxDynError> {
        if rest.len() < n {
            return Err(corrupt("truncated"));
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Ok(head)
    };
    let status = u16::from_be_bytes(take(2)?.try_into()?);
    let count = u32::from_be_bytes(take(4)?.try_into()?);
    let mut headers = Vec::new();
    for _ in 0..count {
        let n = u32::from_be_bytes(take(4)?.try_into()?) as usize;
        let name = String::from_utf8(take(n)?.to_vec())?;
        let n = u32::from_be_bytes(take(4)?.try_into()?) as usize;
        let value = take(n)?.to_vec();
        headers.push((name, value));
    }
    Ok((status, headers, bytes.len() - rest.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(HttpResponse::decode(b"").is_err());
        assert!(HttpResponse::decode(b"IDH1\x00").is_err());
        assert!(HttpResponse::decode(b"IDH1\x00\xc8\xff\xff\xff\xff").is_err());
        assert!(<serde_json::Value as Storable>::decode(b"{nope").is_err());
        assert!(String::decode(b"\xff").is_err());
        assert!(<()>::decode(b"x").is_err());
    }

    #[test]
    fn bytes_and_strings_are_stored_as_themselves() {
        assert_eq!(b"\x00\x01".to_vec().encode().unwrap(), b"\x00\x01");
        assert_eq!("h\u{e9}".to_owned().encode().unwrap(), "h\u{e9}".as_bytes());
        assert_eq!(String::decode("h\u{e9}".as_bytes()).unwrap(), "h\u{e9}");
    }

    #[test]
    fn owned_decoding_agrees_with_borrowed() {
        fn agree<T: Storable + PartialEq + std::fmt::Debug>(bytes: &[u8]) {
            let borrowed = T::decode(bytes);
            let owned = T::decode_owned(bytes.to_vec());
            match (borrowed, owned) {
                (Ok(a), Ok(b)) => assert_eq!(a, b),
                (Err(_), Err(_)) => {}
                (a, b) => panic!("{bytes:?}: {a:?} / {b:?}"),
            }
        }
        let r = HttpResponse::new(201, vec![("a".into(), b"b".to_vec())], b"body".to_vec());
        let encoded = r.encode().unwrap();
        assert_eq!(HttpResponse::decode_owned(encoded.clone()).unwrap(), r);
        for cut in 0..=encoded.len() {
            agree::<HttpResponse>(&encoded[..cut]);
            agree::<Vec<u8>>(&encoded[..cut]);
            agree::<String>(&encoded[..cut]);
        }
        agree::<String>(b"\xff");
        agree::<serde_json::Value>(b"{\"a\":1}");
        agree::<()>(b"");
        agree::<()>(b"x");
    }

    #[test]
    fn v1_http_records_still_decode() {
        let mut v1 = b"IDH1\x00\xc9\x00\x00\x00\x01".to_vec();
        v1.extend_from_slice(&1u32.to_be_bytes());
        v1.extend_from_slice(b"a");
        v1.extend_from_slice(&2u32.to_be_bytes());
        v1.extend_from_slice(b"bc");
        v1.extend_from_slice(b"body");
        let r = HttpResponse::decode(&v1).unwrap();
        assert_eq!(r.status, 201);
        assert_eq!(r.headers, vec![("a".to_owned(), b"bc".to_vec())]);
        assert_eq!(r.body, b"body");
    }
}
