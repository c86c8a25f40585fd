//! The store workload shared by `benches/store.rs` and
//! `examples/compare_backends.rs`: each backend as the library (`Lib`) and as
//! its raw-driver baseline doing the same statements or script calls.

pub(crate) mod memory;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;
pub(crate) mod workload;

use std::path::PathBuf;

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
        for suffix in ["", "-wal", "-shm"] {
            let mut p = self.0.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
    }
}
