//! The gRPC framing the layer reads and writes: the one message of a unary
//! request, a string field inside it (a key carried in the body), the
//! handler's answer as stored, and its replay.

use std::convert::Infallible;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response};
use http_body::Frame;
use http_body_util::StreamBody;
use idem_core::HttpResponse;
use tonic::Code;
use tonic::body::Body;
use tracing::warn;

use crate::vocab::{HeaderPolicy, REPLAYED, policy_keeps};

/// The name prefix that marks a trailer entry in the stored form (`:` is
/// not a valid metadata name character, so it never collides).
const TRAILER: &str = ":t:";

/// Never stored: set afresh for every answer.
const NEVER_STORED: &[&str] = &["content-type", "content-length", "date", REPLAYED];

/// Always stored, whatever the metadata policy: the answer's status and how
/// its message is encoded.
const ALWAYS_STORED: &[&str] = &[
    "grpc-status",
    "grpc-message",
    "grpc-status-details-bin",
    "grpc-encoding",
];

/// The one message of a unary request body: `(compressed, bytes)`; `None`
/// when the body is not exactly one length-prefixed message.
pub(crate) fn single_message(body: &[u8]) -> Option<(bool, &[u8])> {
    let (&flag, rest) = body.split_first()?;
    let len_bytes: [u8; 4] = rest.get(..4)?.try_into().ok()?;
    let len = u32::from_be_bytes(len_bytes) as usize;
    let msg = rest.get(4..)?;
    (msg.len() == len && flag <= 1).then_some((flag == 1, msg))
}

fn varint(buf: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = buf.split_first()?;
        *buf = rest;
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Some(v);
        }
    }
    None
}

/// The bytes of length-delimited field `number` at the top level of a
/// protobuf message (the last one, as protobuf merges a repeated scalar);
/// `None` when absent or when the message does not parse.
pub(crate) fn string_field(mut msg: &[u8], number: u32) -> Option<&[u8]> {
    let mut found = None;
    while !msg.is_empty() {
        let tag = varint(&mut msg)?;
        let (field, wire) = (tag >> 3, tag & 7);
        let skip = match wire {
            0 => {
                varint(&mut msg)?;
                0
            }
            1 => 8,
            2 => {
                let len = usize::try_from(varint(&mut msg)?).ok()?;
                let value = msg.get(..len)?;
                if field == u64::from(number) {
                    found = Some(value);
                }
                len
            }
            5 => 4,
            _ => return None,
        };
        msg = msg.get(skip..)?;
    }
    found
}

/// The gRPC status of a header or trailer map (`grpc-status`).
pub(crate) fn status_in(map: &HeaderMap) -> Option<Code> {
    let v = map.get("grpc-status")?.to_str().ok()?;
    v.parse::<i32>().ok().map(Code::from_i32)
}

fn keep<'a>(
    map: &'a HeaderMap,
    policy: &'a HeaderPolicy,
) -> impl Iterator<Item = (&'a HeaderName, &'a HeaderValue)> + 'a {
    map.iter().filter(move |(n, _)| {
        let n = n.as_str();
        ALWAYS_STORED.contains(&n) || (!NEVER_STORED.contains(&n) && policy_keeps(policy, n))
    })
}

/// The stored form of a handler's answer: the gRPC code as the status, the
/// initial metadata, the trailers (names prefixed `:t:`; none for a
/// trailers-only answer) and the body bytes as sent.
pub(crate) fn stored(
    code: Code,
    headers: &HeaderMap,
    trailers: Option<&HeaderMap>,
    body: &[u8],
    policy: &HeaderPolicy,
) -> HttpResponse {
    let mut entries: Vec<(String, Vec<u8>)> = keep(headers, policy)
        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect();
    if let Some(t) = trailers {
        entries
            .extend(keep(t, policy).map(|(n, v)| (format!("{TRAILER}{n}"), v.as_bytes().to_vec())));
    }
    #[allow(clippy::cast_sign_loss, reason = "gRPC codes are 0..=16")]
    let status = code as i32 as u16;
    HttpResponse::new(status, entries, body.to_vec())
}

fn append(map: &mut HeaderMap, name: &str, value: &[u8]) {
    match (
        HeaderName::from_bytes(name.as_bytes()),
        HeaderValue::from_bytes(value),
    ) {
        (Ok(n), Ok(v)) => {
            map.append(n, v);
        }
        _ => warn!("stored metadata not valid: skipped"),
    }
}

/// A body of `data` then `trailers`.
pub(crate) fn body_of(data: Bytes, trailers: Option<HeaderMap>) -> Body {
    let mut frames: Vec<Result<Frame<Bytes>, Infallible>> = Vec::with_capacity(2);
    if !data.is_empty() {
        frames.push(Ok(Frame::data(data)));
    }
    if let Some(t) = trailers {
        frames.push(Ok(Frame::trailers(t)));
    }
    Body::new(StreamBody::new(futures_util::stream::iter(frames)))
}

fn grpc_response(headers: HeaderMap, body: Body) -> Response<Body> {
    let mut res = Response::new(body);
    *res.headers_mut() = headers;
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    res
}

/// A stored answer, replayed: the stored metadata and bytes, and
/// `idempotent-replayed: true` in the initial metadata of an `OK` answer,
/// in the trailers of a non-`OK` one (for a trailers-only answer, tonic's
/// form of every error, those are the same headers).
pub(crate) fn replay(r: HttpResponse) -> Response<Body> {
    let ok = r.status == 0;
    let mut headers = HeaderMap::new();
    let mut trailers = HeaderMap::new();
    for (name, value) in &r.headers {
        match name.strip_prefix(TRAILER) {
            Some(n) => append(&mut trailers, n, value),
            None => append(&mut headers, name, value),
        }
    }
    let marker = (
        HeaderName::from_static(REPLAYED),
        HeaderValue::from_static("true"),
    );
    if trailers.is_empty() && r.body.is_empty() {
        headers.insert(marker.0, marker.1);
        return grpc_response(headers, Body::empty());
    }
    if ok {
        headers.insert(marker.0, marker.1);
    } else {
        trailers.insert(marker.0, marker.1);
    }
    grpc_response(headers, body_of(Bytes::from(r.body), Some(trailers)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_message_is_read_and_others_refused() {
        assert_eq!(
            single_message(&[0, 0, 0, 0, 2, 8, 1]),
            Some((false, &[8u8, 1][..]))
        );
        assert_eq!(single_message(&[1, 0, 0, 0, 0]), Some((true, &[][..])));
        assert_eq!(single_message(&[0, 0, 0, 0, 1, 8, 1]), None, "two messages");
        assert_eq!(single_message(&[0, 0, 0]), None);
        assert_eq!(single_message(&[]), None);
        assert_eq!(single_message(&[2, 0, 0, 0, 0]), None);
    }

    #[test]
    fn string_field_finds_the_last_occurrence_past_other_wire_types() {
        // 1: varint 150; 2: "ab"; 3: fixed64; 4: fixed32; 2: "cd"
        let mut m = vec![0x08, 0x96, 0x01, 0x12, 2, b'a', b'b', 0x19];
        m.extend_from_slice(&[0; 8]);
        m.push(0x25);
        m.extend_from_slice(&[0; 4]);
        m.extend_from_slice(&[0x12, 2, b'c', b'd']);
        assert_eq!(string_field(&m, 2), Some(&b"cd"[..]));
        assert_eq!(string_field(&m, 5), None);
        assert_eq!(string_field(&[0x12, 5, b'a'], 2), None, "truncated");
    }

    #[test]
    fn stored_form_keeps_trailers_apart_and_replays_the_marker_by_status() {
        let mut h = HeaderMap::new();
        h.insert("x-first", HeaderValue::from_static("1"));
        h.insert("traceparent", HeaderValue::from_static("00-1"));
        h.insert("content-type", HeaderValue::from_static("application/grpc"));
        let mut t = HeaderMap::new();
        t.insert("grpc-status", HeaderValue::from_static("0"));
        let s = stored(
            Code::Ok,
            &h,
            Some(&t),
            b"\0\0\0\0\0",
            &HeaderPolicy::default(),
        );
        assert_eq!(s.status, 0);
        assert_eq!(
            s.headers,
            vec![
                ("x-first".to_owned(), b"1".to_vec()),
                (":t:grpc-status".to_owned(), b"0".to_vec())
            ]
        );
        let r = replay(s);
        assert_eq!(r.headers()["idempotent-replayed"], "true");
        assert_eq!(r.headers()["x-first"], "1");

        let mut only = HeaderMap::new();
        only.insert("grpc-status", HeaderValue::from_static("9"));
        only.insert("traceparent", HeaderValue::from_static("00-1"));
        only.insert("x-other", HeaderValue::from_static("1"));
        let allow = HeaderPolicy::allow(["x-kept"]);
        let s = stored(Code::FailedPrecondition, &only, None, b"", &allow);
        assert_eq!(s.headers, vec![("grpc-status".to_owned(), b"9".to_vec())]);
        let r = replay(s);
        assert_eq!(r.headers()["grpc-status"], "9");
        assert_eq!(r.headers()["idempotent-replayed"], "true");
    }
}
