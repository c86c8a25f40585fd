//! A Redis Cluster with replicas, owned by one test: three primaries and one
//! replica each on loopback ports 17200-17299 (bus ports +10000), made to lag,
//! killed by pid and failed over by the test; every process is SIGKILLed and
//! the directory removed on drop (and by a watchdog if the test process
//! dies first).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::server::{cli, create_cluster, scratch_dir, start_server, watchdog};

/// Where the test cluster's ports are taken from.
const PORTS: std::ops::Range<u16> = 17_200..17_300;

/// One primary, its replica and the slot ranges it serves.
#[derive(Debug, Clone)]
pub(crate) struct Shard {
    pub(crate) primary: u16,
    pub(crate) replica: u16,
    pub(crate) slots: Vec<(u16, u16)>,
}

impl Shard {
    /// Whether `slot` is served by this shard.
    pub(crate) fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
    }
}

/// The cluster; see the module docs.
#[derive(Debug)]
pub(crate) struct ReplicatedCluster {
    ports: Vec<u16>,
    /// The servers' pids, `None` once killed (never signalled twice).
    pids: Mutex<Vec<Option<u32>>>,
    dir: PathBuf,
}

/// Ports handed out by [`free_block`] in this process (tests run in parallel).
static TAKEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());

/// `n` consecutive ports of [`PORTS`] whose bus ports are free too.
fn free_block(n: u16) -> Vec<u16> {
    let mut taken = TAKEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let free = |p: u16| {
        !taken.contains(&p)
            && TcpListener::bind(("127.0.0.1", p)).is_ok()
            && TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok()
    };
    let mut start = PORTS.start;
    while start + n <= PORTS.end {
        match (start..start + n).find(|&p| !free(p)) {
            None => {
                taken.extend(start..start + n);
                return (start..start + n).collect();
            }
            Some(busy) => start = busy + 1,
        }
    }
    panic!("no {n} free loopback ports (and bus ports) in {PORTS:?}");
}

/// Polls `f` every 25 ms until it holds, for at most `limit`.
pub(crate) fn wait_for(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if f() {
            return;
        }
        std::thread::park_timeout(Duration::from_millis(25));
    }
    panic!("timed out after {limit:?} waiting for {what}");
}

/// Whether the server on `port` answers `PING` within `limit` (a raw RESP
/// exchange, so a server blocked by `DEBUG SLEEP` reads as `false`).
pub(crate) fn answers_within(port: u16, limit: Duration) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    if s.set_read_timeout(Some(limit)).is_err() || s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

impl ReplicatedCluster {
    /// Starts it and waits until every replica is in sync.
    pub(crate) fn start() -> Self {
        let ports = free_block(6);
        let dir = scratch_dir("replicated");
        watchdog(&ports, &dir);
        let cluster = Self {
            ports: ports.clone(),
            pids: Mutex::new(Vec::new()),
            dir,
        };
        for &port in &ports {
            let conf = format!("nodes-{port}.conf");
            start_server(
                port,
                &cluster.dir,
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &conf,
                    "--cluster-node-timeout",
                    "5000",
                    // The test decides when a replica takes over.
                    "--cluster-replica-no-failover",
                    "yes",
                    "--enable-debug-command",
                    "local",
                    // Replicas sync at once instead of after 5 s.
                    "--repl-diskless-sync-delay",
                    "0",
                ],
            );
            let pid = std::fs::read_to_string(cluster.dir.join(format!("{port}.pid")))
                .ok()
                .and_then(|p| p.trim().parse().ok())
                .unwrap_or_else(|| panic!("no pid file for the server on {port}"));
            cluster.pids.lock().expect("pids").push(Some(pid));
        }
        create_cluster(&ports, 1);
        wait_for(Duration::from_secs(60), "a replica per primary", || {
            let shards = cluster.shards();
            shards.len() == 3
                && shards.iter().all(|s| {
                    cli(s.replica, &["info", "replication"])
                        .is_some_and(|i| i.contains("master_link_status:up"))
                })
                && ports.iter().all(|&p| {
                    cli(p, &["cluster", "info"]).is_some_and(|i| i.contains("cluster_state:ok"))
                })
        });
        cluster
    }

    /// Every node's URL.
    pub(crate) fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}/"))
            .collect()
    }

    /// The shards as the first node still alive sees them (`CLUSTER NODES`).
    pub(crate) fn shards(&self) -> Vec<Shard> {
        let Some(text) = self
            .ports
            .iter()
            .find_map(|&p| cli(p, &["cluster", "nodes"]))
        else {
            return Vec::new();
        };
        let port_of = |addr: &str| -> Option<u16> { addr.split(['@', ':']).nth(1)?.parse().ok() };
        let lines: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .filter(|f| f.len() >= 8 && !f[2].split(',').any(|g| g.starts_with("fail")))
            .collect();
        let mut shards = Vec::new();
        let flag = |f: &[&str], name: &str| f[2].split(',').any(|g| g == name);
        for primary in lines.iter().filter(|f| flag(f, "master")) {
            let Some(replica) = lines
                .iter()
                .find(|f| flag(f, "slave") && f[3] == primary[0])
            else {
                continue;
            };
            let slots = primary[8..]
                .iter()
                .filter_map(|r| {
                    let (a, b) = r.split_once('-').unwrap_or((r, r));
                    Some((a.parse().ok()?, b.parse().ok()?))
                })
                .collect();
            if let (Some(p), Some(r)) = (port_of(primary[1]), port_of(replica[1])) {
                shards.push(Shard {
                    primary: p,
                    replica: r,
                    slots,
                });
            }
        }
        shards
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`).
    pub(crate) fn slot(&self, key: &str) -> u16 {
        let out = self
            .ports
            .iter()
            .find_map(|&p| cli(p, &["cluster", "keyslot", key]))
            .expect("a node answers CLUSTER KEYSLOT");
        out.trim().parse().expect("a slot number")
    }

    /// Makes `shard`'s replica stop receiving writes: `DEBUG SLEEP secs` on
    /// the replica (in a thread: it blocks), then `CLIENT KILL TYPE replica`
    /// on the primary, so what the primary writes next reaches no replica and
    /// the sleeping replica cannot reconnect before it wakes. Returns the
    /// sleeping thread and the moment the replica wakes.
    pub(crate) fn lag(&self, shard: &Shard, secs: u32) -> (JoinHandle<()>, Instant) {
        assert!(
            self.ports.contains(&shard.primary) && self.ports.contains(&shard.replica),
            "a shard of this cluster"
        );
        let replica = shard.replica;
        let wakes = Instant::now() + Duration::from_secs(secs.into());
        let sleeper = std::thread::spawn(move || {
            let _ = cli(replica, &["debug", "sleep", &secs.to_string()]);
        });
        wait_for(Duration::from_secs(2), "the replica to sleep", || {
            !answers_within(replica, Duration::from_millis(100))
        });
        let killed = cli(shard.primary, &["client", "kill", "type", "replica"]).unwrap_or_default();
        assert_eq!(killed.trim(), "1", "one replication link killed");
        wait_for(
            Duration::from_secs(2),
            "the primary to lose its replica",
            || {
                cli(shard.primary, &["info", "replication"])
                    .is_some_and(|i| i.contains("connected_slaves:0"))
            },
        );
        (sleeper, wakes)
    }

    /// SIGKILLs the server on `port` (no shutdown, no last write to anyone).
    pub(crate) fn kill(&self, port: u16) {
        let i = self
            .ports
            .iter()
            .position(|&p| p == port)
            .expect("a node of this cluster");
        if let Some(pid) = self.pids.lock().expect("pids")[i].take() {
            sigkill(pid);
        }
        wait_for(Duration::from_secs(5), "the killed server to go", || {
            TcpStream::connect(("127.0.0.1", port)).is_err()
        });
    }

    /// Promotes `replica` at once (`CLUSTER FAILOVER TAKEOVER`: no vote, no
    /// handshake with its dead primary) and waits until every live node
    /// routes the shard's slots to it.
    pub(crate) fn take_over(&self, shard: &Shard) {
        wait_for(Duration::from_secs(30), "the replica to wake", || {
            answers_within(shard.replica, Duration::from_millis(200))
        });
        let out = cli(shard.replica, &["cluster", "failover", "takeover"]).unwrap_or_default();
        assert_eq!(out.trim(), "OK", "CLUSTER FAILOVER TAKEOVER: {out}");
        let me = format!("127.0.0.1:{}@", shard.replica);
        wait_for(
            Duration::from_secs(15),
            "every node to see the new primary",
            || {
                self.ports
                    .iter()
                    .filter(|&&p| p != shard.primary)
                    .all(|&p| {
                        cli(p, &["cluster", "nodes"]).is_some_and(|t| {
                            t.lines().any(|l| {
                                let f: Vec<&str> = l.split_whitespace().collect();
                                f.len() > 8
                                    && f[1].starts_with(&me)
                                    && f[2].split(',').any(|g| g == "master")
                            })
                        })
                    })
            },
        );
    }
}

fn sigkill(pid: u32) {
    let _ = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

impl Drop for ReplicatedCluster {
    fn drop(&mut self) {
        let pids = self
            .pids
            .get_mut()
            .map_or_else(|e| e.into_inner().clone(), |p| p.clone());
        for pid in pids.into_iter().flatten() {
            sigkill(pid);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A standalone primary and its replica (`--replicaof`), owned by one test.
#[derive(Debug)]
pub(crate) struct ReplicatedPair {
    pub(crate) primary: u16,
    pub(crate) replica: u16,
    pids: Mutex<[Option<u32>; 2]>,
    dir: PathBuf,
}

impl ReplicatedPair {
    /// Starts both and waits until the replica is in sync.
    pub(crate) fn start() -> Self {
        let ports = free_block(2);
        let (primary, replica) = (ports[0], ports[1]);
        let dir = scratch_dir("pair");
        watchdog(&ports, &dir);
        let pid = |port: u16| {
            std::fs::read_to_string(dir.join(format!("{port}.pid")))
                .ok()
                .and_then(|p| p.trim().parse().ok())
                .unwrap_or_else(|| panic!("no pid file for the server on {port}"))
        };
        start_server(primary, &dir, &["--repl-diskless-sync-delay", "0"]);
        let primary_pid = pid(primary);
        start_server(
            replica,
            &dir,
            &["--replicaof", "127.0.0.1", &primary.to_string()],
        );
        let pair = Self {
            primary,
            replica,
            pids: Mutex::new([Some(primary_pid), Some(pid(replica))]),
            dir,
        };
        wait_for(Duration::from_secs(60), "the replica to sync", || {
            cli(replica, &["info", "replication"])
                .is_some_and(|i| i.contains("master_link_status:up"))
        });
        // The replica's side is up before the primary counts it: WAIT only
        // counts replicas the primary sees online.
        wait_for(
            Duration::from_secs(60),
            "the primary to see its replica online",
            || {
                cli(primary, &["info", "replication"])
                    .is_some_and(|i| i.contains("connected_slaves:1") && i.contains("state=online"))
            },
        );
        pair
    }

    /// The primary's URL.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.primary)
    }

    /// SIGKILLs the replica and waits until the primary has noticed.
    pub(crate) fn kill_replica(&self) {
        if let Some(pid) = self.pids.lock().expect("pids")[1].take() {
            sigkill(pid);
        }
        wait_for(
            Duration::from_secs(10),
            "the primary to lose its replica",
            || {
                cli(self.primary, &["info", "replication"])
                    .is_some_and(|i| i.contains("connected_slaves:0"))
            },
        );
    }
}

impl Drop for ReplicatedPair {
    fn drop(&mut self) {
        let pids = *self
            .pids
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for pid in pids.into_iter().flatten() {
            sigkill(pid);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
