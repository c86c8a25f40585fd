//! Test harnesses shared by the workspace's test suites and benches (not
//! published): one copy of each, instead of one per crate.

#[cfg(feature = "consumer")]
pub mod consumer;
#[cfg(feature = "fixtures")]
pub mod fixtures;
#[cfg(feature = "http")]
pub mod http;
pub mod mariadb_server;
pub mod process;
#[cfg(feature = "redis")]
pub mod redis_admin;
pub mod redis_cluster;
pub mod redis_server;
mod scenarios;
#[cfg(any(feature = "sql", feature = "fixtures"))]
pub mod servers;
#[cfg(feature = "sql")]
pub mod sql;
#[cfg(any(feature = "sql", feature = "fixtures"))]
pub mod teardown;
#[cfg(feature = "work")]
pub mod work;

/// Removes the SQLite database at `path` and its WAL files, whichever
/// exist.
pub fn remove_sqlite(path: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(p);
    }
}
