//! This binary's throwaway Redis Cluster: the shared harness
//! (`idem_test_support::redis_cluster`) on this crate's share of the loopback
//! ports, 7300..7320.

pub(crate) use idem_test_support::redis_cluster::{Cluster, cli, stop};

/// The cluster, started on first use.
pub(crate) fn get() -> &'static Cluster {
    idem_test_support::redis_cluster::get("idem-cli", 7300..7320)
}
