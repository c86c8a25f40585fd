//! The Redis Cluster under test: `IDEM_REDIS_CLUSTER_URLS` (comma-separated)
//! when set, else three primaries started once per test binary on free
//! loopback ports and shut down by a watchdog when the binary exits.

use std::sync::OnceLock;
use std::time::Duration;

use super::server::{cli, free_port, scratch_dir, start_server, watchdog};

static CLUSTER: OnceLock<Vec<String>> = OnceLock::new();

/// The cluster's node URLs, starting the cluster on first use.
pub(crate) fn urls() -> Vec<String> {
    CLUSTER
        .get_or_init(|| match std::env::var("IDEM_REDIS_CLUSTER_URLS") {
            Ok(list) if !list.trim().is_empty() => {
                list.split(',').map(|u| u.trim().to_owned()).collect()
            }
            _ => start(3),
        })
        .clone()
}

fn start(primaries: usize) -> Vec<String> {
    let mut ports: Vec<u16> = Vec::new();
    while ports.len() < primaries {
        let p = free_port();
        if !ports.contains(&p) {
            ports.push(p);
        }
    }
    let dir = scratch_dir("cluster");
    watchdog(&ports, &dir);
    for &port in &ports {
        let conf = format!("nodes-{port}.conf");
        start_server(
            port,
            &dir,
            &["--cluster-enabled", "yes", "--cluster-config-file", &conf],
        );
    }
    let nodes: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let mut args = vec!["--cluster", "create"];
    args.extend(nodes.iter().map(String::as_str));
    args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
    let out = cli(ports[0], &args).unwrap_or_default();
    assert!(
        out.contains("[OK] All 16384 slots covered"),
        "redis-cli --cluster create failed:\n{out}"
    );
    for &port in &ports {
        let mut ok = false;
        for _ in 0..400 {
            if cli(port, &["cluster", "info"]).is_some_and(|i| i.contains("cluster_state:ok")) {
                ok = true;
                break;
            }
            std::thread::park_timeout(Duration::from_millis(25));
        }
        assert!(ok, "cluster node {port} never reached cluster_state:ok");
    }
    ports
        .iter()
        .map(|p| format!("redis://127.0.0.1:{p}/"))
        .collect()
}
