//! Throwaway `redis-server` processes on free loopback ports, for tests that
//! restart, pause, kill clients or flush scripts (never done to the shared
//! server). A watchdog shell shuts them down if the test process dies first.
//!
//! Every function panics when `redis-server` or `redis-cli` cannot be run or
//! a server does not come up: that is the test failing.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// A free loopback port whose cluster bus port (`+10000`) is free too.
pub fn free_port() -> u16 {
    for _ in 0..200 {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
        let port = l.local_addr().expect("addr").port();
        if !(1024..=55_000).contains(&port) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port pair found");
}

/// A scratch directory for server files, unique to this process and call.
///
/// # Panics
///
/// When the directory cannot be created.
pub fn scratch_dir(what: &str) -> PathBuf {
    crate::process::scratch_dir(&format!("idem-redis-{what}"))
}

/// Starts a daemonized `redis-server` on `port`, without persistence.
pub fn start_server(port: u16, dir: &std::path::Path, extra: &[&str]) {
    let status = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args(["--daemonize", "yes", "--dir"])
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join(format!("{port}.log")))
        .arg("--pidfile")
        .arg(dir.join(format!("{port}.pid")))
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap_or_else(|e| {
            panic!("cannot run redis-server (is Redis installed and on PATH?): {e}")
        });
    assert!(
        status.success(),
        "redis-server on port {port} failed to start: {status}"
    );
    wait_for_ping(port);
}

/// Waits until the server on `port` answers `PING`.
pub fn wait_for_ping(port: u16) {
    for _ in 0..200 {
        if cli(port, &["ping"]).is_some_and(|out| out.trim() == "PONG") {
            return;
        }
        std::thread::park_timeout(Duration::from_millis(25));
    }
    panic!("redis-server on port {port} does not answer");
}

/// Runs `redis-cli -p port args...`; `None` if it could not connect.
pub fn cli(port: u16, args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run redis-cli (is Redis installed and on PATH?): {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.success() && !text.starts_with("Could not connect")).then_some(text)
}

/// Joins the cluster-enabled servers on `ports` into one Redis Cluster with
/// `replicas` replicas per primary (`redis-cli --cluster create`).
///
/// # Panics
///
/// When redis-cli does not report every slot covered.
pub fn create_cluster(ports: &[u16], replicas: usize) {
    let nodes: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let replicas = replicas.to_string();
    let mut args = vec!["--cluster", "create"];
    args.extend(nodes.iter().map(String::as_str));
    args.extend(["--cluster-replicas", replicas.as_str(), "--cluster-yes"]);
    let out = cli(ports[0], &args).unwrap_or_default();
    assert!(
        out.contains("[OK] All 16384 slots covered"),
        "redis-cli --cluster create failed:\n{out}"
    );
}

/// Shuts the server on `port` down without saving.
pub fn shutdown(port: u16) {
    let _ = Command::new("redis-cli")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "shutdown",
            "nosave",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Spawns a shell that waits for this process to end, then shuts the servers
/// on `ports` down and removes `dir`: nothing outlives the test binary, even
/// when it panics or is killed.
pub fn watchdog(ports: &[u16], dir: &std::path::Path) {
    let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
    crate::process::watchdog(&format!(
        "for p in {ports}; do redis-cli -h 127.0.0.1 -p $p shutdown nosave >/dev/null 2>&1; done; \
         rm -rf '{dir}'",
        ports = ports.join(" "),
        dir = dir.display(),
    ));
}

/// A standalone server owned by one test, shut down when dropped.
#[derive(Debug)]
pub struct Throwaway {
    /// Its client port.
    pub port: u16,
    dir: PathBuf,
}

impl Throwaway {
    /// Starts one.
    pub fn start() -> Self {
        let port = free_port();
        let dir = scratch_dir("server");
        watchdog(&[port], &dir);
        start_server(port, &dir, &[]);
        Self { port, dir }
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Stops it (without saving anything).
    pub fn stop(&self) {
        shutdown(self.port);
    }

    /// Starts it again on the same port, empty (no persistence).
    pub fn start_again(&self) {
        start_server(self.port, &self.dir, &[]);
    }
}

impl Drop for Throwaway {
    fn drop(&mut self) {
        shutdown(self.port);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
