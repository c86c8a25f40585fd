//! The Redis Cluster under test: `IDEM_REDIS_CLUSTER_URLS` (comma-separated)
//! when set, else the shared harness's three primaries, started once per test
//! binary.

/// The cluster's node URLs, starting the cluster on first use.
pub(crate) fn urls() -> Vec<String> {
    match std::env::var("IDEM_REDIS_CLUSTER_URLS") {
        Ok(list) if !list.trim().is_empty() => {
            list.split(',').map(|u| u.trim().to_owned()).collect()
        }
        _ => idem_test_support::redis_cluster::get().node_urls(),
    }
}
