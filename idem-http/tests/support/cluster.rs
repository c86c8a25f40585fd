//! This binary's throwaway Redis Cluster: the workspace's shared harness.

pub(crate) use idem_test_support::redis_cluster::get;
