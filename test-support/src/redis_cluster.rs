//! A throwaway Redis Cluster of three primaries on loopback ports (cluster
//! bus ports 20 above), started once per test binary and shut down (without
//! saving) when the binary calls [`stop`], or by a watchdog shell once the
//! binary has ended, however it ends.

use std::net::TcpListener;
use std::ops::Range;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// The cluster's primaries.
#[derive(Debug)]
pub struct Cluster {
    /// Their client ports.
    pub ports: Vec<u16>,
    dir: PathBuf,
}

static CLUSTER: OnceLock<Cluster> = OnceLock::new();

/// The cluster, started on first use: `name` names its scratch directory,
/// and its primaries take the first three free ports of `ports` (each test
/// binary has its own share of the loopback range 7300-7399, so binaries
/// that run at once never meet).
///
/// # Panics
///
/// When `redis-server` cannot be started or the cluster does not form
/// (that is the test failing).
pub fn get(name: &str, ports: Range<u16>) -> &'static Cluster {
    CLUSTER.get_or_init(|| start(name, ports))
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

const BUS_OFFSET: u16 = 20;

fn free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

fn start(name: &str, node_ports: Range<u16>) -> Cluster {
    let mut ports = Vec::new();
    for port in node_ports.clone() {
        if free(port) && free(port + BUS_OFFSET) {
            ports.push(port);
            if ports.len() == 3 {
                break;
            }
        }
    }
    assert_eq!(ports.len(), 3, "no three free ports in {node_ports:?}");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let dir = std::env::temp_dir().join(format!("{name}-cluster-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    watchdog(&ports, &dir);
    for &port in &ports {
        let status = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "yes"])
            .args(["--cluster-enabled", "yes"])
            .args(["--cluster-port", &(port + BUS_OFFSET).to_string()])
            .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
            .arg("--dir")
            .arg(&dir)
            .arg("--logfile")
            .arg(dir.join(format!("{port}.log")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run redis-server (is Redis installed?)");
        assert!(status.success(), "redis-server on {port}: {status}");
        let mut up = false;
        for _ in 0..200 {
            if cli(port, &["ping"]).is_some_and(|o| o.trim() == "PONG") {
                up = true;
                break;
            }
            std::thread::park_timeout(Duration::from_millis(25));
        }
        assert!(up, "redis-server on {port} does not answer");
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
    Cluster { ports, dir }
}

/// `redis-cli -p port args…`; `None` when it failed.
///
/// # Panics
///
/// When `redis-cli` cannot be run.
pub fn cli(port: u16, args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run redis-cli");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.success() && !text.starts_with("Could not connect")).then_some(text)
}

/// Shuts the servers down and removes `dir` once this process has ended,
/// however it ends.
fn watchdog(ports: &[u16], dir: &std::path::Path) {
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 0.2; done; \
         for p in {ports}; do redis-cli -h 127.0.0.1 -p $p shutdown nosave >/dev/null 2>&1; done; \
         rm -rf '{dir}'",
        pid = std::process::id(),
        ports = ports.join(" "),
        dir = dir.display(),
    );
    let status = Command::new("sh")
        .args(["-c", &format!("( {script} ) >/dev/null 2>&1 &")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("spawn the watchdog shell");
    assert!(status.success(), "the watchdog shell failed: {status}");
}
