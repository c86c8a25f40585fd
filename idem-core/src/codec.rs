//! How responses become stored bytes and come back unchanged.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::store::BoxDynError;

/// A value that can be stored as bytes and replayed.
///
/// Every `Serialize + DeserializeOwned` type is stored as its JSON (serde_json).
/// [`HttpResponse`] is stored as is: status, headers and the body's exact bytes.
pub trait Storable: Sized + Send + 'static {
    /// The bytes to store.
    ///
    /// # Errors
    ///
    /// When the value cannot be encoded.
    fn encode(&self) -> Result<Vec<u8>, BoxDynError>;

    /// The value back from stored bytes.
    ///
    /// # Errors
    ///
    /// When the bytes are not a valid encoding (a corrupted record).
    fn decode(bytes: &[u8]) -> Result<Self, BoxDynError>;
}

impl<T: Serialize + DeserializeOwned + Send + 'static> Storable for T {
    fn encode(&self) -> Result<Vec<u8>, BoxDynError> {
        Ok(serde_json::to_vec(self)?)
    }

    fn decode(bytes: &[u8]) -> Result<Self, BoxDynError> {
        Ok(serde_json::from_slice(bytes)?)
    }
}

/// A raw HTTP response, stored and replayed byte for byte.
///
/// ```
/// use idem_core::{HttpResponse, Storable};
///
/// let r = HttpResponse::new(201, vec![("location".into(), "/charges/ch_1".into())], b"\x00{\"id\":1}".to_vec());
/// let back = HttpResponse::decode(&r.encode().unwrap()).unwrap();
/// assert_eq!(back, r);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    /// The status code.
    pub status: u16,
    /// The headers to replay, in order (names as given).
    pub headers: Vec<(String, String)>,
    /// The body's exact bytes.
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// Builds a response.
    #[must_use]
    pub fn new(status: u16, headers: Vec<(String, String)>, body: Vec<u8>) -> Self {
        Self {
            status,
            headers,
            body,
        }
    }
}

const HTTP_MAGIC: &[u8; 4] = b"IDH1";

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
            out.extend_from_slice(value.as_bytes());
        }
        out.extend_from_slice(&self.body);
        Ok(out)
    }

    fn decode(bytes: &[u8]) -> Result<Self, BoxDynError> {
        let mut rest = bytes
            .strip_prefix(HTTP_MAGIC.as_slice())
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
            let value = String::from_utf8(take(n)?.to_vec())?;
            headers.push((name, value));
        }
        let body = rest.to_vec();
        Ok(Self {
            status,
            headers,
            body,
        })
    }
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
    }
}
