//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (feature
//! `metrics`). Without the feature every function here is an empty inline
//! function: no clock read, no allocation, nothing.
//!
//! Install any exporter (Prometheus, OpenTelemetry, StatsD, …) as the global
//! recorder and these appear:
//!
//! | name | kind | labels | counts |
//! |---|---|---|---|
//! | `idem_executions_total` | counter | `operation` | a claim was won and the work started (a first attempt or a recovery) |
//! | `idem_replays_total` | counter | `operation` | a stored outcome was returned without running the work |
//! | `idem_rejections_total` | counter | `operation`, `code` | a call was refused: `code` is [`Error::code`](crate::Error::code) (`in_flight`, `fingerprint_mismatch`, `response_expired`, `response_not_stored`, `lease_lost`, `invalid_key`, `invalid_request`, `store_unavailable`, …) |
//! | `idem_recoveries_total` | counter | `operation`, `reason` | a claim took over a record: `lease_expired` (a crash, or an operator release) or `released` (after a transient failure) |
//! | `idem_transient_releases_total` | counter | `operation` | the work failed transiently and the key was released ([`Claim::complete`](crate::Claim::complete) with `Transient`) |
//! | `idem_responses_not_stored_total` | counter | `operation` | the work finished but its outcome was not stored (too large, not encodable, or the store failed): retries get 409 or a recovery |
//! | `idem_background_completions_total` | counter | `operation`, `result` | a completion whose write failed after the store retries, kept and written again in the background: `stored`, `fenced` (a newer attempt took the record over), `expired` (the lease ended first: left to recovery), `failed` (refused by the store), `dropped` (not kept: the backlog was full) |
//! | `idem_completions_pending` | gauge | | completions kept in the background now (see [`Idem::drain_completions`](crate::Idem::drain_completions)) |
//! | `idem_store_errors_total` | counter | `call`, `kind` | a store call failed: `call` is `claim`, `complete`, `release`, `fetch` (an operator's inspect), `purge`; `kind` is `unavailable`, `corrupt` or `backend` (a lost lease is counted as a rejection, not here) |
//! | `idem_store_call_seconds` | histogram | `call` | the latency of each store call the engine makes |
//! | `idem_work_seconds` | histogram | `operation` | how long the work ran: from the won claim to its completion, release or hand-over to a transaction (every path) |
//! | `idem_store_batch_size` | histogram | `store`, `call` | how many calls one statement of a SQL store carried: `call` is `claim` or `complete`; 1 for a call that went alone, more when calls that waited for a busy pool were coalesced (see [`record_batch`](crate::store::record_batch)) |
//! | `idem_store_calls_coalesced_total` | counter | `store`, `call` | calls that found every connection of the store busy, waited, and went in a batch (none while the pool has a connection free) |
//! | `idem_purge_keys_removed_total`, `idem_purge_bodies_dropped_total` | counter | | what purges removed |
//! | `idem_purge_runs_total`, `idem_purge_errors_total` | counter | | purge batches (store calls, by the purger or by [`Admin::purge_expired`](crate::ops::Admin::purge_expired)), and batches that failed |
//!
//! Labels are bounded: `operation` is the scope's
//! [`metrics_label`](crate::Scope::metrics_label), which is its operation
//! name (e.g. `POST /payments`) unless an adapter set a bounded name with
//! [`Scope::with_metrics_label`](crate::Scope::with_metrics_label) (idem-http
//! does when the operation is a concrete path): keep it a route template,
//! never a URL with ids in it. The owner and the key are never labels.

#[cfg(feature = "metrics")]
mod on {
    use std::future::Future;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use metrics::SharedString;

    use crate::store::record::TakeoverReason;
    use crate::store::{PurgeReport, StoreError};

    // Labels cost no allocation of their own: the `operation` label shares
    // the scope's string (a reference count, not a copy), and the store
    // call's labels are literals, which the `metrics` macros turn into
    // static keys. What is left per counted event is the label vector of
    // the `operation` counters.
    fn operation(op: &Arc<str>) -> SharedString {
        SharedString::from_shared(Arc::clone(op))
    }

    /// A call was refused; `code` is the error's [`Error::code`](crate::Error::code).
    pub(crate) fn record_rejection(op: &Arc<str>, code: &'static str) {
        metrics::counter!(
            "idem_rejections_total",
            "operation" => operation(op),
            "code" => code
        )
        .increment(1);
    }

    /// A claim was won: the work runs.
    pub(crate) fn record_run(op: &Arc<str>) {
        metrics::counter!("idem_executions_total", "operation" => operation(op)).increment(1);
    }

    /// A stored outcome was returned without running the work.
    pub(crate) fn record_replay(op: &Arc<str>) {
        metrics::counter!("idem_replays_total", "operation" => operation(op)).increment(1);
    }

    /// The work failed transiently and the key was released.
    pub(crate) fn record_transient_release(op: &Arc<str>) {
        metrics::counter!("idem_transient_releases_total", "operation" => operation(op))
            .increment(1);
    }

    /// The work finished but its outcome was not stored.
    pub(crate) fn record_not_stored(op: &Arc<str>) {
        metrics::counter!("idem_responses_not_stored_total", "operation" => operation(op))
            .increment(1);
    }

    /// What became of a completion kept in the background.
    pub(crate) fn record_background_completion(op: &Arc<str>, result: &'static str) {
        metrics::counter!(
            "idem_background_completions_total",
            "operation" => operation(op),
            "result" => result
        )
        .increment(1);
    }

    /// Completions kept in the background now.
    #[allow(clippy::cast_precision_loss)]
    pub(crate) fn set_completions_pending(n: usize) {
        metrics::gauge!("idem_completions_pending").set(n as f64);
    }

    pub(crate) fn record_recovery(op: &Arc<str>, reason: TakeoverReason) {
        let reason = reason.as_str();
        metrics::counter!(
            "idem_recoveries_total",
            "operation" => operation(op),
            "reason" => reason
        )
        .increment(1);
    }

    /// The store calls the engine times, each with its own static keys.
    macro_rules! store_calls {
        ($($call:literal),+) => {
            fn call_histogram(call: &'static str) -> metrics::Histogram {
                match call {
                    $($call => metrics::histogram!("idem_store_call_seconds", "call" => $call),)+
                    other => metrics::histogram!("idem_store_call_seconds", "call" => other),
                }
            }

            fn error_counter(call: &'static str, kind: &'static str) -> metrics::Counter {
                match (call, kind) {
                    $(
                        ($call, "unavailable") => metrics::counter!(
                            "idem_store_errors_total", "call" => $call, "kind" => "unavailable"
                        ),
                        ($call, "corrupt") => metrics::counter!(
                            "idem_store_errors_total", "call" => $call, "kind" => "corrupt"
                        ),
                    )+
                    (call, kind) => {
                        metrics::counter!("idem_store_errors_total", "call" => call, "kind" => kind)
                    }
                }
            }
        };
    }

    store_calls!("claim", "complete", "release", "fetch", "purge");

    /// Times one store call and counts its failure, without wrapping the
    /// call's future: `start` before the call, `finish` with its result.
    /// (A wrapper future would move the store's whole future into its own
    /// state on every call: measured as about 750 instructions of `memcpy`
    /// per Redis replay.)
    pub(crate) struct StoreTimer {
        call: &'static str,
        start: Instant,
    }

    impl StoreTimer {
        pub(crate) fn start(call: &'static str) -> Self {
            Self {
                call,
                start: Instant::now(),
            }
        }

        pub(crate) fn finish<T>(self, result: &Result<T, StoreError>) {
            call_histogram(self.call).record(self.start.elapsed().as_secs_f64());
            let kind = match result {
                Ok(_) | Err(StoreError::LeaseLost) => None,
                Err(StoreError::Unavailable { .. }) => Some("unavailable"),
                Err(StoreError::Corrupt { .. }) => Some("corrupt"),
                Err(_) => Some("backend"),
            };
            if let Some(kind) = kind {
                error_counter(self.call, kind).increment(1);
            }
        }
    }

    /// [`StoreTimer`] around `fut`, for the operator's calls (off the
    /// request path, where the extra move does not matter).
    pub(crate) async fn time_store<T, F>(call: &'static str, fut: F) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, StoreError>>,
    {
        let timer = StoreTimer::start(call);
        let result = fut.await;
        timer.finish(&result);
        result
    }

    /// How long the work ran: from the claim to its completion.
    pub(crate) fn record_work(op: &Arc<str>, d: Duration) {
        metrics::histogram!("idem_work_seconds", "operation" => operation(op))
            .record(d.as_secs_f64());
    }

    /// How many calls of kind `call` one statement (or transaction) of
    /// store `backend` carried, and whether they waited for a connection.
    pub(crate) fn record_batch(
        backend: &'static str,
        call: &'static str,
        calls: usize,
        waited: bool,
    ) {
        #[allow(
            clippy::cast_precision_loss,
            reason = "a batch holds far fewer than 2^52 calls"
        )]
        metrics::histogram!("idem_store_batch_size", "store" => backend, "call" => call)
            .record(calls as f64);
        if waited {
            metrics::counter!("idem_store_calls_coalesced_total", "store" => backend, "call" => call)
                .increment(u64::try_from(calls).unwrap_or(u64::MAX));
        }
    }

    /// One purge batch: what it removed, or `None` when it failed.
    pub(crate) fn record_purge(report: Option<&PurgeReport>) {
        metrics::counter!("idem_purge_runs_total").increment(1);
        match report {
            Some(r) => {
                metrics::counter!("idem_purge_keys_removed_total").increment(r.keys_removed);
                metrics::counter!("idem_purge_bodies_dropped_total").increment(r.bodies_dropped);
            }
            None => metrics::counter!("idem_purge_errors_total").increment(1),
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod on {
    use std::future::Future;
    use std::sync::Arc;
    use std::time::Duration;

    use crate::store::record::TakeoverReason;
    use crate::store::{PurgeReport, StoreError};

    #[inline(always)]
    pub(crate) fn record_rejection(_op: &Arc<str>, _code: &'static str) {}

    #[inline(always)]
    pub(crate) fn record_run(_op: &Arc<str>) {}

    #[inline(always)]
    pub(crate) fn record_replay(_op: &Arc<str>) {}

    #[inline(always)]
    pub(crate) fn record_transient_release(_op: &Arc<str>) {}

    #[inline(always)]
    pub(crate) fn record_not_stored(_op: &Arc<str>) {}

    #[inline(always)]
    pub(crate) fn record_background_completion(_op: &Arc<str>, _result: &'static str) {}

    #[inline(always)]
    pub(crate) fn set_completions_pending(_n: usize) {}

    #[inline(always)]
    pub(crate) fn record_recovery(_op: &Arc<str>, _reason: TakeoverReason) {}

    /// Nothing to time.
    pub(crate) struct StoreTimer;

    impl StoreTimer {
        #[inline(always)]
        pub(crate) fn start(_call: &'static str) -> Self {
            Self
        }

        #[inline(always)]
        #[allow(
            clippy::unused_self,
            reason = "the same signature as the timer that records, under the metrics feature"
        )]
        pub(crate) fn finish<T>(self, _result: &Result<T, StoreError>) {}
    }

    /// The call itself, untouched.
    #[inline(always)]
    pub(crate) fn time_store<T, F>(_call: &'static str, fut: F) -> F
    where
        F: Future<Output = Result<T, StoreError>>,
    {
        fut
    }

    #[inline(always)]
    pub(crate) fn record_work(_op: &Arc<str>, _d: Duration) {}

    #[inline(always)]
    pub(crate) fn record_batch(
        _backend: &'static str,
        _call: &'static str,
        _calls: usize,
        _waited: bool,
    ) {
    }

    #[inline(always)]
    pub(crate) fn record_purge(_report: Option<&PurgeReport>) {}
}

pub(crate) use on::*;
