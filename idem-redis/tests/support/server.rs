//! Throwaway `redis-server` processes: the workspace's shared harness.

#[allow(unused_imports)] // each test binary uses a different part
pub(crate) use idem_test_support::redis_server::{
    Throwaway, cli, create_cluster, scratch_dir, start_server, watchdog,
};
