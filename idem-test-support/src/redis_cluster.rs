//! A throwaway Redis Cluster of three primaries on free loopback ports,
//! started once per test binary and shut down (without saving) when the
//! binary calls [`stop`], or by a watchdog shell once the binary has ended,
//! however it ends.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use crate::redis_server::{cli, create_cluster, free_port, scratch_dir, start_server, watchdog};

/// The cluster's primaries.
#[derive(Debug)]
pub struct Cluster {
    /// Their client ports.
    pub ports: Vec<u16>,
    dir: PathBuf,
}

static CLUSTER: OnceLock<Cluster> = OnceLock::new();

/// This binary's cluster, started on first use.
///
/// # Panics
///
/// When the cluster does not form (that is the test failing).
pub fn get() -> &'static Cluster {
    CLUSTER.get_or_init(|| {
        let (ports, dir) = start(3);
        Cluster { ports, dir }
    })
}

/// Shuts the cluster down if it was started (the end of the test binary).
pub fn stop() {
    if let Some(c) = CLUSTER.get() {
        for &p in &c.ports {
            let _ = cli(p, &["shutdown", "nosave"]);
        }
        let _ = std::fs::remove_dir_all(&c.dir);
    }
}

impl Cluster {
    /// `redis://h:p/` per node.
    pub fn node_urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}/"))
            .collect()
    }
}

/// Starts `primaries` cluster nodes on free ports (each with its bus port
/// free too), joins them into one cluster with no replicas, and waits until
/// every node reports `cluster_state:ok`. Returns the client ports and the
/// scratch directory (removed by the watchdog when the process ends).
///
/// # Panics
///
/// When a server does not start or the cluster does not form.
pub fn start(primaries: usize) -> (Vec<u16>, PathBuf) {
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
    create_cluster(&ports, 0);
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
    (ports, dir)
}
