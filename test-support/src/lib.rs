//! Test harnesses shared by the workspace's test suites and benches (not
//! published): one copy of each, instead of one per crate.

#[cfg(feature = "fixtures")]
pub mod fixtures;
pub mod process;
pub mod redis_cluster;
pub mod redis_server;
#[cfg(any(feature = "sql", feature = "fixtures"))]
pub mod servers;
#[cfg(feature = "sql")]
pub mod sql;
