//! The store workload shared by `benches/store.rs` and
//! `benches/compare_backends.rs`: each backend as the library (`Lib`), as
//! its raw-driver baseline doing the same statements or script calls, and as
//! the minimal pattern a user would hand-write (`min`, `redis_min`).

pub(crate) mod memory;
pub(crate) mod min;
#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "redis")]
pub(crate) mod redis;
#[cfg(feature = "redis")]
pub(crate) mod redis_min;
#[cfg(feature = "redis")]
pub(crate) mod redis_peer;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;
pub(crate) mod workload;

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Response and key lifetime of bench records (library and raw alike): short,
/// so anything a failed run leaves behind expires on its own.
pub(crate) const TTL: Duration = Duration::from_secs(600);
pub(crate) const TTL_MS: i64 = 600_000;

/// Lease of a claim, library and raw alike.
pub(crate) const LEASE: Duration = Duration::from_secs(60);
pub(crate) const LEASE_MS: i64 = 60_000;

/// The engine's policy for bench records: [`LEASE`], and [`TTL`] for
/// responses and keys.
pub(crate) fn policy() -> idem::Policy {
    idem::Policy::builder()
        .response_ttl(TTL)
        .key_ttl(TTL)
        .lease(LEASE)
        .build()
        .expect("valid policy")
}

/// Unix milliseconds now.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The response body sizes measured.
pub(crate) const BODIES: [usize; 2] = [256, 4096];

/// A SQLite database file in the temp directory, deleted (with its WAL and
/// shared-memory files) when dropped.
#[derive(Debug)]
pub(crate) struct TempDb(pub(crate) PathBuf);

impl TempDb {
    pub(crate) fn new(tag: &str) -> Self {
        Self(std::env::temp_dir().join(format!("idem-bench-{tag}-{}.db", std::process::id())))
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        idem_test_support::remove_sqlite(&self.0);
    }
}
