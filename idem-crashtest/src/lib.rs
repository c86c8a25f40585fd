//! The crash test of issue 10: several OS processes (`crash-worker`) share
//! one store, are SIGKILLed at random points (also between the side effect
//! and the completion) and restarted; [`check`] then proves from their
//! fsynced logs that
//!
//! 1. no record ran its work twice except as a recovery with the same
//!    downstream key (every run of a record has its own attempt number and
//!    all of them the same downstream key);
//! 2. no two clients saw different stored responses for one record;
//! 3. no acknowledged stored response was forgotten: no run of the work has
//!    an attempt number above the one that produced a stored response (a
//!    record reverted to in flight would be taken over as the next attempt;
//!    a record lost altogether starts again at attempt 1, which promise 1
//!    catches). Attempt numbers, not clocks, so a worker descheduled between
//!    its reply and its log line cannot fool the checker.
//!
//! The harness is `tests/crash.rs`; the worker's environment is
//! [`WorkerConfig`]. A worker started with `IDEM_CRASH_BROKEN=1` ignores the
//! downstream key (a fresh one per run), and the checker must catch it.
//!
//! Issue 19's crash tests of the inbound adapters (a JetStream consumer, a
//! webhook receiver, each SIGKILLed mid-work) are `tests/inbound.rs`, with
//! the children `crash-consumer` and `crash-webhook` and the [`inbound`]
//! module.

pub mod backend;
pub mod inbound;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The settings a worker reads from its environment.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// `IDEM_CRASH_BACKEND`: a store as [`backend::open`] reads it.
    pub backend: String,
    /// `IDEM_CRASH_WORKER`: this worker's number.
    pub worker: u32,
    /// `IDEM_CRASH_LOG_DIR`: where the logs go (one file per process).
    pub log_dir: PathBuf,
    /// `IDEM_CRASH_BROKEN=1`: the work ignores the downstream key.
    pub broken: bool,
    /// `IDEM_CRASH_KEYS`: how many idempotency keys the workers share.
    pub keys: u32,
    /// `IDEM_CRASH_LEASE_MS`: the lease, short so recoveries happen soon.
    pub lease: Duration,
}

impl WorkerConfig {
    /// Reads the environment.
    ///
    /// # Errors
    ///
    /// A variable that is missing or does not parse.
    pub fn from_env() -> Result<Self, String> {
        Ok(Self {
            backend: var("IDEM_CRASH_BACKEND")?,
            worker: u32::try_from(num("IDEM_CRASH_WORKER")?).map_err(|e| e.to_string())?,
            log_dir: PathBuf::from(var("IDEM_CRASH_LOG_DIR")?),
            broken: std::env::var("IDEM_CRASH_BROKEN").is_ok_and(|v| v == "1"),
            keys: u32::try_from(num("IDEM_CRASH_KEYS")?).map_err(|e| e.to_string())?,
            lease: Duration::from_millis(num("IDEM_CRASH_LEASE_MS")?),
        })
    }
}

/// The environment variable `name`, which must be set.
///
/// # Errors
///
/// `"<name> is not set"`.
pub fn var(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("{name} is not set"))
}

/// The environment variable `name` as a whole number.
///
/// # Errors
///
/// It is not set, or `"<name> is not a number"`.
pub fn num(name: &str) -> Result<u64, String> {
    var(name)?
        .parse()
        .map_err(|_| format!("{name} is not a number"))
}

/// An append-only log, each line written whole and fsynced before the call
/// returns, so what it holds happened.
#[derive(Debug)]
pub struct DurableLog(File);

impl DurableLog {
    /// Creates this process's log in `dir`.
    ///
    /// # Errors
    ///
    /// The file cannot be created.
    pub fn create(dir: &Path, worker: u32) -> std::io::Result<Self> {
        let path = dir.join(format!("worker-{worker}-{}.log", std::process::id()));
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map(Self)
    }

    /// Appends `fields` as one line, with the time, and fsyncs.
    ///
    /// # Errors
    ///
    /// The write or the fsync failed.
    pub fn line(&mut self, kind: &str, fields: &[&str]) -> std::io::Result<()> {
        let micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros());
        let mut line = format!("{kind} {micros}");
        for f in fields {
            line.push(' ');
            line.push_str(f);
        }
        line.push('\n');
        self.0.write_all(line.as_bytes())?;
        self.0.sync_data()
    }
}

/// One run of the work, logged before it returned.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Effect {
    at: u128,
    attempt: u32,
    downstream_key: String,
}

/// One reply a client got.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    replayed: bool,
    stored: bool,
    attempt: u32,
    response: String,
}

/// What the checker found.
#[derive(Debug, Default)]
pub struct Report {
    /// Runs of the work (side effects).
    pub effects: usize,
    /// Runs that were recoveries (attempt > 1).
    pub recoveries: usize,
    /// Successful replies seen by clients.
    pub replies: usize,
    /// Of which replays.
    pub replays: usize,
    /// Broken promises, one line each; empty when all held.
    pub violations: Vec<String>,
}

/// Reads every log in `dir` and checks the three promises (module docs).
///
/// # Errors
///
/// A log that cannot be read or holds a line that does not parse (a torn
/// last line of a killed process is skipped).
pub fn check(dir: &Path) -> Result<Report, String> {
    let mut effects: BTreeMap<String, Vec<Effect>> = BTreeMap::new();
    let mut seen: BTreeMap<String, Vec<Seen>> = BTreeMap::new();
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        // Only whole lines: the last one may be torn by SIGKILL.
        let whole = text.rfind('\n').map_or("", |end| &text[..end]);
        for line in whole.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            let bad = || format!("{}: bad line {line:?}", path.display());
            let at: u128 = f.get(1).and_then(|v| v.parse().ok()).ok_or_else(bad)?;
            match (f[0], &f[2..]) {
                ("effect", [record, attempt, dk]) => {
                    effects
                        .entry((*record).to_owned())
                        .or_default()
                        .push(Effect {
                            at,
                            attempt: attempt.parse().map_err(|_| bad())?,
                            downstream_key: (*dk).to_owned(),
                        });
                }
                ("reply", [record, replayed, stored, attempt, response]) => {
                    seen.entry((*record).to_owned()).or_default().push(Seen {
                        replayed: *replayed == "1",
                        stored: *stored == "1",
                        attempt: attempt.parse().map_err(|_| bad())?,
                        response: (*response).to_owned(),
                    });
                }
                _ => return Err(bad()),
            }
        }
    }
    let mut report = Report::default();
    for (record, runs) in &mut effects {
        runs.sort_by_key(|e| e.at);
        report.effects += runs.len();
        report.recoveries += runs.iter().filter(|e| e.attempt > 1).count();
        let keys: BTreeSet<&str> = runs.iter().map(|e| e.downstream_key.as_str()).collect();
        if keys.len() > 1 {
            report.violations.push(format!(
                "{record}: the work ran with {} different downstream keys",
                keys.len()
            ));
        }
        let mut attempts = BTreeSet::new();
        for e in runs.iter() {
            if !attempts.insert(e.attempt) {
                report.violations.push(format!(
                    "{record}: attempt {} ran twice (not a recovery)",
                    e.attempt
                ));
            }
        }
    }
    for (record, replies) in &seen {
        report.replies += replies.len();
        report.replays += replies.iter().filter(|s| s.replayed).count();
        let stored: BTreeSet<&str> = replies
            .iter()
            .filter(|s| s.stored)
            .map(|s| s.response.as_str())
            .collect();
        if stored.len() > 1 {
            report.violations.push(format!(
                "{record}: clients saw {} different stored responses: {stored:?}",
                stored.len()
            ));
        }
        let Some(done) = replies.iter().filter(|s| s.stored).map(|s| s.attempt).min() else {
            continue;
        };
        for run in effects.get(record).into_iter().flatten() {
            if run.attempt > done {
                report.violations.push(format!(
                    "{record}: attempt {} ran after attempt {done}'s response was stored (forgotten)",
                    run.attempt
                ));
            }
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logs(lines: &[&str]) -> Report {
        let dir = std::env::temp_dir().join(format!(
            "idem-crash-unit-{}-{}",
            std::process::id(),
            idem_core::IdempotencyKey::random().as_str()
        ));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("w.log"), lines.join("\n") + "\npartial").expect("write");
        let report = check(&dir).expect("parses");
        std::fs::remove_dir_all(&dir).expect("cleanup");
        report
    }

    #[test]
    fn each_promise_broken_is_reported() {
        let ok = logs(&[
            "effect 1 k1 1 dk",
            "effect 5 k1 2 dk",
            "reply 6 k1 0 1 2 r2",
            "reply 7 k1 1 1 2 r2",
        ]);
        assert!(ok.violations.is_empty(), "{:?}", ok.violations);
        assert_eq!((ok.effects, ok.recoveries, ok.replays), (2, 1, 1));
        let other_key = logs(&["effect 1 k1 1 dk", "effect 5 k1 2 other"]);
        assert_eq!(other_key.violations.len(), 1, "{:?}", other_key.violations);
        let twice = logs(&["effect 1 k1 1 dk", "effect 5 k1 1 dk"]);
        assert_eq!(twice.violations.len(), 1, "{:?}", twice.violations);
        let differ = logs(&["reply 1 k1 0 1 1 a", "reply 2 k1 1 1 1 b"]);
        assert_eq!(differ.violations.len(), 1, "{:?}", differ.violations);
        // Reverted to in flight after its completion was acknowledged.
        let forgotten = logs(&["effect 1 k1 1 dk", "reply 2 k1 0 1 1 a", "effect 3 k1 2 dk"]);
        assert_eq!(forgotten.violations.len(), 1, "{:?}", forgotten.violations);
        // Lost altogether: attempt 1 again.
        let lost = logs(&["effect 1 k1 1 dk", "reply 2 k1 0 1 1 a", "effect 3 k1 1 dk"]);
        assert_eq!(lost.violations.len(), 1, "{:?}", lost.violations);
        // Not stored (the store failed), then recovered and stored: fine.
        let recovered = logs(&[
            "effect 1 k1 1 dk",
            "reply 2 k1 0 0 1 a",
            "effect 3 k1 2 dk",
            "reply 4 k1 0 1 2 b",
        ]);
        assert!(
            recovered.violations.is_empty(),
            "{:?}",
            recovered.violations
        );
    }
}
