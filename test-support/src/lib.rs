//! Test harnesses shared by the workspace's test suites and benches (not
//! published): one copy of each, instead of one per crate.

#[cfg(feature = "fixtures")]
pub mod fixtures;
pub mod mariadb_server;
#[cfg(feature = "redis")]
pub mod redis_admin;
pub mod redis_cluster;
pub mod redis_server;
