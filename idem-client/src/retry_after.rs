//! `Retry-After` (RFC 9110 §10.2.3) and `retry-after-ms`.

use std::time::{Duration, SystemTime};

use http::HeaderMap;
use idem_core::wire::header;

/// The server's delay hint, from `retry-after-ms` (milliseconds) or
/// `Retry-After` (delta-seconds or an HTTP-date, counted from `now`).
///
/// `0`, a negative value, a date in the past and garbage all count as absent:
/// a hint that asks for nothing gives no floor.
#[must_use]
pub fn parse(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    if let Some(ms) = headers
        .get(header::RETRY_AFTER_MS)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|ms| ms.is_finite() && *ms > 0.0 && *ms < 1e12)
    {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    let raw = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim();
    if raw.bytes().all(|b| b.is_ascii_digit()) {
        let secs: u64 = raw.parse().ok()?;
        return (secs > 0).then(|| Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(raw).ok()?;
    at.duration_since(now).ok().filter(|d| !d.is_zero())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(name: &'static str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, value.parse().expect("header value"));
        h
    }

    #[test]
    fn seconds_dates_zero_negative_garbage() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(
            parse(&with("retry-after", "3"), now),
            Some(Duration::from_secs(3))
        );
        assert_eq!(parse(&with("retry-after", "0"), now), None);
        assert_eq!(parse(&with("retry-after", "-5"), now), None);
        assert_eq!(parse(&with("retry-after", "soon"), now), None);
        assert_eq!(parse(&with("retry-after", ""), now), None);
        let later = httpdate::fmt_http_date(now + Duration::from_secs(90));
        assert_eq!(
            parse(&with("retry-after", &later), now),
            Some(Duration::from_secs(90))
        );
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(90));
        assert_eq!(parse(&with("retry-after", &earlier), now), None);
        assert_eq!(
            parse(&with("retry-after-ms", "250"), now),
            Some(Duration::from_millis(250))
        );
        assert_eq!(parse(&with("retry-after-ms", "-1"), now), None);
        assert_eq!(parse(&HeaderMap::new(), now), None);
    }
}
