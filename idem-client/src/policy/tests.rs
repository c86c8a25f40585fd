//! The behaviour table (spec §5), one named test per row, over the policy
//! core alone: no network, a fixed random source, time passed in.

use std::{sync::Arc, time::Duration};

use http::{HeaderMap, HeaderValue, StatusCode};

use super::*;

const NOW: SystemTime = SystemTime::UNIX_EPOCH;

fn state(attempts: u32, elapsed_ms: u64) -> SendState {
    SendState {
        attempts,
        elapsed: Duration::from_millis(elapsed_ms),
        key_age: None,
        now: NOW + Duration::from_secs(1_700_000_000),
    }
}

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (n, v) in pairs {
        h.append(*n, HeaderValue::from_str(v).expect("value"));
    }
    h
}

fn problem(code: &str, retryable: Option<bool>) -> Problem {
    let mut p = Problem::default();
    p.code = Some(code.to_owned());
    p.retryable = retryable;
    p
}

/// Random source at the top of its range: every jitter is at its maximum.
fn max_random() -> u64 {
    u64::MAX
}

fn decide_with(
    policy: &RetryPolicy,
    status: u16,
    h: &[(&'static str, &str)],
    p: Option<Problem>,
    st: SendState,
) -> Step {
    let h = headers(h);
    let view = AttemptView::Response {
        status: StatusCode::from_u16(status).expect("status"),
        headers: &h,
        problem: p.as_ref(),
    };
    policy.decide(&view, st, &mut || 0)
}

fn decide(status: u16, h: &[(&'static str, &str)], p: Option<Problem>) -> Step {
    decide_with(&RetryPolicy::default(), status, h, p, state(1, 0))
}

fn is_retry(step: &Step) -> bool {
    matches!(step, Step::Retry { .. })
}

/// Asserts that each status, with no header and no problem, is the
/// server's fresh answer.
fn assert_fresh(statuses: &[u16]) {
    for &s in statuses {
        assert_eq!(
            decide(s, &[], None),
            Step::Return(SendOutcome::Fresh),
            "{s}"
        );
    }
}

fn retry_reason(step: &Step) -> RetryReason {
    match step {
        Step::Retry { reason, .. } => *reason,
        other => panic!("expected a retry, got {other:?}"),
    }
}

fn retry_delay(step: &Step) -> Duration {
    match step {
        Step::Retry { delay, .. } => *delay,
        other => panic!("expected a retry, got {other:?}"),
    }
}

#[test]
fn row01_connect_failure_retries_then_stops_as_transport() {
    let p = RetryPolicy::default();
    let view = AttemptView::Transport(TransportFailure::Connect);
    let step = p.decide(&view, state(1, 0), &mut || 0);
    assert_eq!(retry_reason(&step), RetryReason::Connect, "{step:?}");
    let spent = p.decide(&view, state(6, 0), &mut || 0);
    assert_eq!(spent, Step::Stop(StopReason::Transport));
}

#[test]
fn row02_ambiguous_transport_failure_retries_same_key_then_stops() {
    let p = RetryPolicy::default();
    let view = AttemptView::Transport(TransportFailure::Ambiguous);
    let step = p.decide(&view, state(2, 0), &mut || 0);
    assert_eq!(retry_reason(&step), RetryReason::Transport, "{step:?}");
    let spent = p.decide(&view, state(1, 59_999), &mut max_random);
    assert_eq!(spent, Step::Stop(StopReason::Transport));
}

#[test]
fn row03_success_without_marker_is_fresh() {
    assert_fresh(&[200, 201, 204, 302]);
}

#[test]
fn row04_replay_marker_on_any_status_is_replayed() {
    for (s, name) in [
        (200, "idempotent-replayed"),
        (422, "x-idempotent-replayed"),
        (500, "idempotent-replayed"),
    ] {
        assert_eq!(
            decide(s, &[(name, "true")], None),
            Step::Return(SendOutcome::Replayed),
            "{s}"
        );
    }
    // "false" is no marker.
    assert_eq!(
        decide(200, &[("idempotent-replayed", "false")], None),
        Step::Return(SendOutcome::Fresh)
    );
}

#[test]
fn row05_request_problems_400_are_rejected() {
    for code in [
        "missing_key",
        "invalid_key",
        "invalid_request",
        "request_body_unreadable",
    ] {
        // Even a (wrong) `retryable: true` does not make a rejection retryable.
        for r in [None, Some(false), Some(true)] {
            assert_eq!(
                decide(400, &[("retry-after", "1")], Some(problem(code, r))),
                Step::Return(SendOutcome::Rejected),
                "{code} {r:?}"
            );
        }
    }
}

#[test]
fn row06_request_too_large_413_is_rejected() {
    assert_eq!(
        decide(413, &[], Some(problem("request_too_large", Some(false)))),
        Step::Return(SendOutcome::Rejected)
    );
}

#[test]
fn row07_fingerprint_mismatch_422_is_never_retried() {
    let step = decide(422, &[], Some(problem("fingerprint_mismatch", Some(false))));
    assert_eq!(step, Step::Return(SendOutcome::Rejected));
}

#[test]
fn row08_handler_4xx_without_idem_problem_is_its_answer() {
    assert_fresh(&[400, 401, 402, 404, 422]);
    // A handler's own problem body: a 422 whose code is not idem's.
    let step = decide(422, &[], Some(problem("validation_failed", Some(false))));
    assert_eq!(step, Step::Return(SendOutcome::Fresh));
    let step = decide(422, &[], Some(problem("validation_failed", None)));
    assert_eq!(step, Step::Return(SendOutcome::Fresh));
}

#[test]
fn row09_408_and_425_retry_after_else_backoff_then_stop() {
    for s in [408, 425] {
        let d = retry_delay(&decide(s, &[("retry-after", "2")], None));
        assert!(d >= Duration::from_secs(2), "{s}: {d:?}");
        assert!(is_retry(&decide(s, &[], None)), "{s}");
        let spent = decide_with(&RetryPolicy::default(), s, &[], None, state(6, 0));
        assert_eq!(spent, Step::Stop(StopReason::MaxAttempts), "{s}");
    }
}

#[test]
fn row10_in_flight_waits_retry_after_plus_jitter_same_key() {
    for code in ["in_flight", "lease_lost"] {
        let p = RetryPolicy::default();
        let h = [("retry-after", "3")];
        let lo = retry_delay(&decide_with(
            &p,
            409,
            &h,
            Some(problem(code, Some(true))),
            state(1, 0),
        ));
        assert_eq!(lo, Duration::from_secs(3), "floor with zero jitter");
        let hv = headers(&h);
        let pr = problem(code, Some(true));
        let view = AttemptView::Response {
            status: StatusCode::CONFLICT,
            headers: &hv,
            problem: Some(&pr),
        };
        let step = p.decide(&view, state(1, 0), &mut max_random);
        assert_eq!(retry_reason(&step), RetryReason::InFlight, "{step:?}");
        // Spread at most min(1 s, 3 s / 10) = 300 ms.
        assert!(
            retry_delay(&step) <= Duration::from_millis(3_300),
            "{step:?}"
        );
        // Spent: the wait alone passes the deadline.
        let spent = decide_with(
            &p,
            409,
            &h,
            Some(problem(code, Some(true))),
            state(1, 57_500),
        );
        assert_eq!(spent, Step::Stop(StopReason::Deadline));
        // Spent: the server asks for more than max_retry_after.
        let long = decide_with(
            &p,
            409,
            &[("retry-after", "61")],
            Some(problem(code, Some(true))),
            state(1, 0),
        );
        assert_eq!(long, Step::Stop(StopReason::RetryAfterTooLong));
    }
}

#[test]
fn row11_response_expired_or_not_stored_is_already_processed() {
    for code in ["response_expired", "response_not_stored"] {
        assert_eq!(
            decide(409, &[], Some(problem(code, Some(false)))),
            Step::Return(SendOutcome::AlreadyProcessed),
            "{code}"
        );
    }
}

#[test]
fn row12_409_with_retry_after_and_no_code_waits_as_in_flight() {
    let step = decide(409, &[("retry-after", "1")], None);
    assert_eq!(retry_reason(&step), RetryReason::InFlight, "{step:?}");
    assert!(retry_delay(&step) >= Duration::from_secs(1));
    let step = decide_with(
        &RetryPolicy::default(),
        409,
        &[("retry-after", "1")],
        None,
        state(1, 59_500),
    );
    assert_eq!(step, Step::Stop(StopReason::Deadline));
}

#[test]
fn row13_other_409_is_returned_unless_retry_conflicts() {
    assert_eq!(decide(409, &[], None), Step::Return(SendOutcome::Fresh));
    let stripe = RetryPolicy {
        retry_conflicts: true,
        ..RetryPolicy::default()
    };
    let step = decide_with(
        &stripe,
        409,
        &[],
        Some(problem("idempotency_key_in_use", None)),
        state(1, 0),
    );
    assert!(is_retry(&step), "{step:?}");
}

#[test]
fn row14_429_retry_after_else_backoff_then_stop() {
    let d = retry_delay(&decide(429, &[("retry-after", "5")], None));
    assert!(d >= Duration::from_secs(5));
    assert!(is_retry(&decide(429, &[], None)));
    let spent = decide_with(&RetryPolicy::default(), 429, &[], None, state(6, 0));
    assert_eq!(spent, Step::Stop(StopReason::MaxAttempts));
}

#[test]
fn row15_500_retryable_problem_is_retried_as_a_recovery() {
    for code in ["handler_panicked", "response_body_failed"] {
        let step = decide(
            500,
            &[("retry-after", "1")],
            Some(problem(code, Some(true))),
        );
        assert!(retry_delay(&step) >= Duration::from_secs(1), "{code}");
        // Without `retryable`, the code alone says the same.
        assert!(
            is_retry(&decide(500, &[], Some(problem(code, None)))),
            "{code}"
        );
        let spent = decide_with(
            &RetryPolicy::default(),
            500,
            &[],
            Some(problem(code, Some(true))),
            state(6, 0),
        );
        assert_eq!(spent, Step::Stop(StopReason::MaxAttempts));
    }
}

#[test]
fn row16_500_non_retryable_server_problem_is_rejected() {
    for code in ["corrupt_record", "store_error", "owner_unavailable"] {
        for r in [Some(false), None] {
            assert_eq!(
                decide(500, &[], Some(problem(code, r))),
                Step::Return(SendOutcome::Rejected),
                "{code} {r:?}"
            );
        }
    }
}

#[test]
fn row17_500_502_504_without_problem_back_off_same_key() {
    for s in [500, 502, 504] {
        let step = decide(s, &[], None);
        assert!(
            matches!(step, Step::Retry { reason: RetryReason::Status(x), .. } if x == s),
            "{s}"
        );
        let spent = decide_with(&RetryPolicy::default(), s, &[], None, state(6, 0));
        assert_eq!(spent, Step::Stop(StopReason::MaxAttempts));
    }
}

#[test]
fn row18_503_honours_retry_after_else_backoff() {
    for code in [Some("store_unavailable"), Some("shutting_down"), None] {
        let p = code.map(|c| problem(c, Some(true)));
        let d = retry_delay(&decide(503, &[("retry-after", "1")], p.clone()));
        assert!(d >= Duration::from_secs(1), "{code:?}");
        assert!(is_retry(&decide(503, &[], p)), "{code:?}");
    }
}

#[test]
fn row19_other_5xx_is_returned() {
    assert_fresh(&[501, 505, 511]);
}

#[test]
fn row20_unknown_problem_follows_retryable_then_status() {
    assert!(is_retry(&decide(
        400,
        &[],
        Some(problem("vendor_busy", Some(true)))
    )));
    assert_eq!(
        decide(503, &[], Some(problem("vendor_gone", Some(false)))),
        Step::Return(SendOutcome::Rejected)
    );
    assert_eq!(
        decide(418, &[], Some(problem("vendor_teapot", Some(false)))),
        Step::Return(SendOutcome::Fresh)
    );
    // No `retryable`: the status decides.
    assert!(is_retry(&decide(
        503,
        &[],
        Some(problem("vendor_busy", None))
    )));
    assert_eq!(
        decide(418, &[], Some(problem("vendor_teapot", None))),
        Step::Return(SendOutcome::Fresh)
    );
}

#[test]
fn row22_key_past_lifetime_minus_margin_is_not_sent() {
    let day = Duration::from_secs(86_400);
    let p = RetryPolicy {
        key_lifetime: Some(30 * day),
        ..RetryPolicy::default()
    };
    // Margin: 1 % of 30 days = 7.2 h (more than the 1 min floor).
    assert_eq!(
        p.usable_key_lifetime(),
        Some(30 * day - Duration::from_secs(25_920))
    );
    assert!(p.key_usable(Some(29 * day)));
    assert!(!p.key_usable(Some(40 * day)));
    assert!(!p.key_usable(Some(30 * day - Duration::from_secs(3600))));
    assert!(
        RetryPolicy::default().key_usable(Some(400 * day)),
        "unknown lifetime: no limit"
    );
    // A short lifetime still keeps a one-minute margin.
    let short = RetryPolicy {
        key_lifetime: Some(Duration::from_secs(90)),
        ..RetryPolicy::default()
    };
    assert_eq!(short.usable_key_lifetime(), Some(Duration::from_secs(30)));
    // And a retry whose wait would cross it stops the send.
    let mut st = state(1, 0);
    st.key_age = Some(Duration::from_secs(29));
    let step = decide_with(&short, 503, &[("retry-after", "2")], None, st);
    assert_eq!(step, Step::Stop(StopReason::KeyLifetime));
}

#[test]
fn classify_overrides_the_table() {
    let p = RetryPolicy {
        classify: Some(Arc::new(|v: &AttemptView<'_>| match v {
            AttemptView::Response { headers, .. }
                if headers.contains_key("stripe-should-retry") =>
            {
                Some(Decision::RetryAfter(Duration::from_millis(700)))
            }
            AttemptView::Response { status, .. } if *status == StatusCode::BAD_GATEWAY => {
                Some(Decision::Return)
            }
            _ => None,
        })),
        ..RetryPolicy::default()
    };
    let step = decide_with(
        &p,
        400,
        &[("stripe-should-retry", "true")],
        None,
        state(1, 0),
    );
    assert_eq!(retry_delay(&step), Duration::from_millis(700));
    assert_eq!(
        decide_with(&p, 502, &[], None, state(1, 0)),
        Step::Return(SendOutcome::Fresh)
    );
    // Limits still bound a classified retry.
    let spent = decide_with(
        &p,
        400,
        &[("stripe-should-retry", "true")],
        None,
        state(6, 0),
    );
    assert_eq!(spent, Step::Stop(StopReason::MaxAttempts));
}

#[test]
fn full_jitter_stays_within_its_cap() {
    let p = RetryPolicy::default();
    // Cap for retry n: min(10 s, 200 ms · 2^n).
    for (n, cap_ms) in [
        (0, 200),
        (1, 400),
        (3, 1_600),
        (5, 6_400),
        (6, 10_000),
        (40, 10_000),
    ] {
        assert_eq!(p.backoff(n, &mut || 0), Duration::ZERO, "{n}");
        let top = p.backoff(n, &mut || u64::MAX);
        assert!(top <= Duration::from_millis(cap_ms), "{n}: {top:?}");
        let mid = p.backoff(n, &mut || 1_000_000_007);
        assert!(mid <= Duration::from_millis(cap_ms), "{n}: {mid:?}");
    }
}

#[test]
fn deadline_counts_the_wait() {
    let p = RetryPolicy {
        deadline: Duration::from_secs(2),
        ..RetryPolicy::default()
    };
    // A 503 asking for 30 s, with 2 s left: stop at once, nothing is waited.
    let step = decide_with(&p, 503, &[("retry-after", "30")], None, state(1, 0));
    assert_eq!(step, Step::Stop(StopReason::Deadline));
    let step = decide_with(&p, 503, &[("retry-after", "1")], None, state(1, 500));
    assert!(is_retry(&step));
    let step = decide_with(&p, 503, &[("retry-after", "1")], None, state(2, 1_000));
    assert_eq!(step, Step::Stop(StopReason::Deadline));
}
