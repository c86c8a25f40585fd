//! What the tool prints: records as text or JSON, times as RFC 3339 UTC
//! with a relative time beside them, stored bodies decoded.

use std::fmt::Write as _;

use idem::clock::Timestamp;
use idem::ops::RecordView;
use idem::store::{RecordState, RecordSummary};
use idem::{HttpResponse, Storable};
use serde_json::{Value, json};

fn ms(t: Timestamp) -> i64 {
    t.as_unix_millis()
}

/// `2026-12-03T12:30:38.428Z`: RFC 3339 in UTC, to the millisecond. A time
/// outside years 0000-9999 (which RFC 3339 cannot write) is shown as its
/// Unix milliseconds.
///
/// No date crate is in the dependency tree (`httpdate` writes HTTP dates,
/// to the second); this is Howard Hinnant's `civil_from_days`, exact over
/// the proleptic Gregorian calendar.
pub(crate) fn rfc3339(t: Timestamp) -> String {
    let millis = ms(t);
    let days = millis.div_euclid(86_400_000);
    let in_day = millis.rem_euclid(86_400_000);
    let (year, month, day) = civil_from_days(days);
    if !(0..=9999).contains(&year) {
        return format!("{millis} ms since the Unix epoch");
    }
    let (h, m, s, frac) = (
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1000 % 60,
        in_day % 1000,
    );
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{frac:03}Z")
}

/// The (year, month, day) of a count of days since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    // Shifted so that an era (400 years) starts on 0000-03-01.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// A duration in the two largest units it has: `450ms`, `59s`, `5m 3s`,
/// `1h 59m`, `29d 23h` (truncated, never rounded up).
fn span(millis: u64) -> String {
    if millis < 1000 {
        return format!("{millis}ms");
    }
    let secs = millis / 1000;
    let units = [
        (secs / 86_400, "d"),
        (secs / 3600 % 24, "h"),
        (secs / 60 % 60, "m"),
        (secs % 60, "s"),
    ];
    let first = units.iter().position(|(n, _)| *n > 0).unwrap_or(3);
    let mut out = format!("{}{}", units[first].0, units[first].1);
    if let Some((n, unit)) = units.get(first + 1).filter(|(n, _)| *n > 0) {
        let _ = write!(out, " {n}{unit}");
    }
    out
}

/// `in 59s` / `59s ago`, relative to `now`.
pub(crate) fn relative(t: Timestamp, now: Timestamp) -> String {
    let d = ms(t).saturating_sub(ms(now));
    if d >= 0 {
        format!("in {}", span(d.unsigned_abs()))
    } else {
        format!("{} ago", span(d.unsigned_abs()))
    }
}

/// `ends in 59s` for a lease still running, `ended 59s ago` for one that
/// ended (`ended` as the store said at the read, or a time past `now`).
pub(crate) fn lease(until: Timestamp, now: Timestamp, ended: bool) -> String {
    let d = ms(until).saturating_sub(ms(now));
    if ended || d < 0 {
        format!("ended {} ago", span(d.min(0).unsigned_abs()))
    } else {
        format!("ends in {}", span(d.unsigned_abs()))
    }
}

/// One line of `stuck`, tab-separated.
pub(crate) fn summary_line(r: &RecordSummary, now: Timestamp) -> String {
    format!(
        "{}\t{}\t{}\tattempt {}\tlease {} ({})\tresource {}",
        r.id.owner(),
        r.id.operation(),
        r.id.key().as_str(),
        r.attempt,
        lease(r.lease_until, now, false),
        rfc3339(r.lease_until),
        r.resource_id.as_deref().unwrap_or("-")
    )
}

pub(crate) fn summary_json(r: &RecordSummary) -> Value {
    json!({
        "owner": r.id.owner(),
        "operation": r.id.operation(),
        "key": r.id.key().as_str(),
        "state": r.state.as_str(),
        "attempt": r.attempt,
        "lease_until_ms": ms(r.lease_until),
        "resource_id": r.resource_id,
        "key_expires_at_ms": ms(r.key_expires_at),
    })
}

/// Printable as it is: UTF-8 with no control character but tab and line
/// breaks (so a body cannot drive the terminal).
fn as_text(bytes: &[u8]) -> Option<&str> {
    std::str::from_utf8(bytes).ok().filter(|s| {
        !s.chars()
            .any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// `xxd`-style lines: offset, 16 bytes in hex, the printable ones.
fn hexdump(bytes: &[u8]) -> String {
    let mut out = String::new();
    for (i, row) in bytes.chunks(16).enumerate() {
        let _ = write!(out, "{:08x} ", i * 16);
        for j in 0..16 {
            if j == 8 {
                out.push(' ');
            }
            match row.get(j) {
                Some(b) => {
                    let _ = write!(out, " {b:02x}");
                }
                None => out.push_str("   "),
            }
        }
        out.push_str("  |");
        out.extend(row.iter().map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                char::from(b)
            } else {
                '.'
            }
        }));
        out.push_str("|\n");
    }
    out
}

/// A JSON value for bytes: a string if they are UTF-8, else `{"hex": …}`.
fn bytes_json(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(text) => json!(text),
        Err(_) => json!({ "hex": hex(bytes) }),
    }
}

/// The stored body as an HTTP response, if it is the encoding of one.
fn http_response(body: &[u8]) -> Option<HttpResponse> {
    HttpResponse::decode(body).ok()
}

pub(crate) fn view_json(v: &RecordView) -> Value {
    let mut doc = json!({
        "owner": v.id.owner(),
        "operation": v.id.operation(),
        "key": v.id.key().as_str(),
        "state": v.state.as_str(),
        "attempt": v.attempt,
        "lease_until_ms": ms(v.lease_until),
        "lease_expired": v.lease_expired,
        "resource_id": v.resource_id,
        "outcome": v.outcome.map(|o| o.as_str()),
        "response_expires_at_ms": v.response_expires_at.map(ms),
        "key_expires_at_ms": ms(v.key_expires_at),
        "body_len": v.body_len,
        "fingerprint": v.fingerprint.to_hex(),
    });
    if let Some(body) = &v.body {
        doc["body"] = bytes_json(body);
        if let Some(r) = http_response(body) {
            let headers: Vec<Value> = r
                .headers
                .iter()
                .map(|(name, value)| json!({"name": name, "value": bytes_json(value)}))
                .collect();
            doc["response"] = json!({
                "status": r.status,
                "headers": headers,
                "body": bytes_json(&r.body),
            });
        }
    }
    doc
}

/// The text form of `inspect`.
pub(crate) fn view_text(v: &RecordView, now: Timestamp) -> String {
    let mut out = String::new();
    let mut line = |label: &str, value: &str| {
        let _ = writeln!(out, "{label:<11} {value}");
    };
    line(
        "record",
        &format!(
            "{} / {} / {}",
            v.id.owner(),
            v.id.operation(),
            v.id.key().as_str()
        ),
    );
    line(
        "state",
        &format!("{} (attempt {})", v.state.as_str(), v.attempt),
    );
    // A completed record's lease is history: saying when it "ends" would
    // suggest an attempt still holds it.
    let held = if v.state == RecordState::Completed {
        "not held: completed".to_owned()
    } else {
        lease(v.lease_until, now, v.lease_expired)
    };
    line(
        "lease until",
        &format!("{} ({held})", rfc3339(v.lease_until)),
    );
    line("resource id", v.resource_id.as_deref().unwrap_or("-"));
    line("outcome", v.outcome.map_or("-", |o| o.as_str()));
    if let Some(t) = v.response_expires_at {
        line(
            "body until",
            &format!("{} ({})", rfc3339(t), relative(t, now)),
        );
    }
    line(
        "key until",
        &format!(
            "{} ({})",
            rfc3339(v.key_expires_at),
            relative(v.key_expires_at, now)
        ),
    );
    line(
        "body",
        &v.body_len.map_or("-".to_owned(), |n| format!("{n} bytes")),
    );
    if let Some(body) = &v.body {
        out.push_str(&body_text(body));
    }
    out
}

/// A stored body: an HTTP response as its status, headers and content;
/// anything else as text if it is, else as a hex dump.
fn body_text(body: &[u8]) -> String {
    let Some(r) = http_response(body) else {
        return match as_text(body) {
            Some(text) => format!("{text}\n"),
            None => hexdump(body),
        };
    };
    let mut out = format!("{:<11} {}\n", "status", r.status);
    for (name, value) in &r.headers {
        let value = as_text(value).map_or_else(|| format!("0x{}", hex(value)), str::to_owned);
        let _ = writeln!(out, "{:<11} {name}: {value}", "header");
    }
    match as_text(&r.body) {
        Some(text) => {
            let _ = writeln!(out, "{:<11} {} bytes, text", "content", r.body.len());
            out.push_str(text);
            out.push('\n');
        }
        None => {
            let _ = writeln!(out, "{:<11} {} bytes, binary", "content", r.body.len());
            out.push_str(&hexdump(&r.body));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_unix_millis(ms)
    }

    #[test]
    fn rfc3339_is_exact() {
        // Checked against `date -u -d @SECONDS`.
        for (ms, text) in [
            (0, "1970-01-01T00:00:00.000Z"),
            (-1, "1969-12-31T23:59:59.999Z"),
            (951_782_400_000, "2000-02-29T00:00:00.000Z"),
            (1_796_285_438_428, "2026-12-03T08:10:38.428Z"),
            (4_107_542_399_999, "2100-02-28T23:59:59.999Z"),
            (4_107_542_400_000, "2100-03-01T00:00:00.000Z"),
            (253_402_300_799_999, "9999-12-31T23:59:59.999Z"),
            (-62_167_219_200_000, "0000-01-01T00:00:00.000Z"),
        ] {
            assert_eq!(rfc3339(at(ms)), text, "{ms}");
        }
        assert_eq!(
            rfc3339(at(253_402_300_800_000)),
            "253402300800000 ms since the Unix epoch"
        );
        // No overflow at the ends of the range.
        for ms in [i64::MIN, i64::MAX] {
            assert!(rfc3339(at(ms)).ends_with("ms since the Unix epoch"));
        }
    }

    #[test]
    fn relative_times_read_right() {
        let now = at(1_000_000_000);
        assert_eq!(lease(at(1_000_059_000), now, false), "ends in 59s");
        assert_eq!(lease(at(999_941_000), now, true), "ended 59s ago");
        // A lease the store saw end, read a moment before it did.
        assert_eq!(lease(at(1_000_000_300), now, true), "ended 0ms ago");
        assert_eq!(lease(at(999_999_000), now, false), "ended 1s ago");
        assert_eq!(relative(at(1_000_000_450), now), "in 450ms");
        assert_eq!(relative(at(1_000_000_000 - 7_161_000), now), "1h 59m ago");
        assert_eq!(relative(at(1_000_000_000 + 7_200_000), now), "in 2h");
        assert_eq!(
            relative(at(1_000_000_000 + 30 * 86_400_000 - 1000), now),
            "in 29d 23h"
        );
        // Saturates instead of overflowing.
        assert_eq!(relative(at(i64::MAX), at(i64::MIN)), "in 106751991167d 7h");
    }

    #[test]
    fn http_response_bodies_are_decoded() {
        let r = HttpResponse::new(201, vec![], br#"{"id":"ch_1"}"#.to_vec())
            .with_header("content-type", b"application/json".to_vec())
            .with_header("x-raw", b"\xff\xfe".to_vec());
        let text = body_text(&r.encode().expect("encode"));
        assert_eq!(
            text,
            "status      201\n\
             header      content-type: application/json\n\
             header      x-raw: 0xfffe\n\
             content     13 bytes, text\n\
             {\"id\":\"ch_1\"}\n"
        );
        let bin = HttpResponse::new(200, vec![], b"\x00\x01ab".to_vec());
        let text = body_text(&bin.encode().expect("encode"));
        assert!(
            text.ends_with(
                "content     4 bytes, binary\n\
                 00000000  00 01 61 62                                       |..ab|\n"
            ),
            "{text}"
        );
        // Not an HTTP response: as before.
        assert_eq!(body_text(b"ch_1"), "ch_1\n");
        assert!(body_text(b"\xc9\x00").starts_with("00000000  c9 00 "));
    }
}
