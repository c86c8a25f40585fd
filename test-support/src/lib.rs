//! Test harnesses shared by the workspace's test suites and benches (not
//! published): one copy of each, instead of one per crate.

pub mod redis_cluster;
pub mod redis_server;
