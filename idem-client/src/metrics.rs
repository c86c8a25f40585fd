//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (feature
//! `metrics`). Without the feature every function here is an empty inline
//! function.
//!
//! | name | kind | labels | counts |
//! |---|---|---|---|
//! | `idem_client_sends_total` | counter | `outcome` | logical sends, by how they ended: `fresh`, `replayed`, `already_processed`, `rejected`, `exhausted`, or `refused` (nothing sent: an invalid caller key, a body that cannot be replayed, a key past its lifetime) |
//! | `idem_client_retries_total` | counter | `reason` | attempts after the first: `connect`, `transport`, `in_flight`, `status_NNN` (408, 425, 429, 5xx), `classified` |
//! | `idem_client_attempts` | histogram | | attempts per send that reached the network |
//!
//! Labels are bounded: neither a key nor a URL (nor a host) is ever a label.
//! Requests that are not idempotent sends (other methods, `not_idempotent()`)
//! are not counted.

#[cfg(feature = "metrics")]
mod on {
    use crate::{ReportKind, policy::RetryReason};

    /// A send ended after `attempts` attempts.
    pub(crate) fn record_send(kind: ReportKind, attempts: u32) {
        metrics::counter!("idem_client_sends_total", "outcome" => kind.as_str()).increment(1);
        metrics::histogram!("idem_client_attempts").record(f64::from(attempts));
    }

    /// A send was refused before anything was sent.
    pub(crate) fn record_refused() {
        metrics::counter!("idem_client_sends_total", "outcome" => "refused").increment(1);
    }

    /// One more attempt, for `reason`.
    pub(crate) fn record_retry(reason: RetryReason) {
        let reason: metrics::SharedString = match reason {
            RetryReason::Connect => "connect".into(),
            RetryReason::Transport => "transport".into(),
            RetryReason::InFlight => "in_flight".into(),
            RetryReason::Classified => "classified".into(),
            // Only statuses that say "later" get here: a bounded set.
            RetryReason::Status(s) => format!("status_{s}").into(),
        };
        metrics::counter!("idem_client_retries_total", "reason" => reason).increment(1);
    }
}

#[cfg(not(feature = "metrics"))]
mod on {
    use crate::{ReportKind, policy::RetryReason};

    #[inline(always)]
    pub(crate) fn record_send(_: ReportKind, _: u32) {}
    #[inline(always)]
    pub(crate) fn record_refused() {}
    #[inline(always)]
    pub(crate) fn record_retry(_: RetryReason) {}
}

#[allow(unused_imports)]
pub(crate) use on::*;
