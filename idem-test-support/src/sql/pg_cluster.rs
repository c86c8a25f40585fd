//! A throwaway PostgreSQL primary and streaming standby, owned by one test.
//!
//! Both run from the binaries of `IDEM_PG_BIN` (default
//! `/usr/lib/postgresql/15/bin`) in a scratch directory, on free loopback
//! ports, as the `postgres` OS user when the test runs as root (`initdb` and
//! `postgres` refuse root). The standby streams from the primary through a
//! [`Proxy`] (its `primary_conninfo` names the proxy), so the test can stall
//! its replication link. Every server is stopped by pid and the directory
//! removed on drop, and by a watchdog shell if the test process dies first.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use idem_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use idem_postgres::sqlx::{self, PgPool};

use super::proxy::{Protocol, Proxy};

/// How the primary replicates its commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// No `synchronous_standby_names`: a commit returns once it is flushed
    /// on the primary.
    Asynchronous,
    /// `synchronous_standby_names = '<value>'`, `synchronous_commit = <level>`.
    Synchronous {
        /// e.g. `"standby1"`, `"ANY 1 (standby1)"`.
        names: &'static str,
        /// `on`, `remote_write` or `remote_apply`.
        level: &'static str,
    },
}

/// One server: its port, data directory and postmaster pid (`None` once
/// killed or stopped, so it is never signalled twice).
#[derive(Debug)]
pub struct Node {
    /// Its loopback port.
    pub port: u16,
    data: PathBuf,
    pid: Mutex<Option<u32>>,
}

impl Node {
    /// Connect options for this node (no TLS, trust auth, db `postgres`).
    pub fn options(&self) -> PgConnectOptions {
        PgConnectOptions::new()
            .host("127.0.0.1")
            .port(self.port)
            .username("postgres")
            .database("postgres")
            .ssl_mode(PgSslMode::Disable)
    }

    /// `postgres://…` for this node.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable",
            self.port
        )
    }

    /// Its loopback address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// A small pool on this node.
    pub async fn pool(&self) -> PgPool {
        PgPoolOptions::new()
            .max_connections(2)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(self.options())
            .await
            .unwrap_or_else(|e| panic!("connect to the node on port {}: {e}", self.port))
    }

    /// SIGKILLs the postmaster and every one of its children (backends,
    /// walsender, checkpointer…) at once: a crash of the machine, as far as
    /// the server can tell. Returns the postmaster's pid.
    fn kill(&self) -> Option<u32> {
        let pid = self.pid.lock().expect("lock").take()?;
        let children = run(Command::new("ps").args(["-o", "pid=", "--ppid", &pid.to_string()]));
        let mut pids = vec![pid.to_string()];
        pids.extend(
            String::from_utf8_lossy(&children.stdout)
                .split_whitespace()
                .map(str::to_owned),
        );
        // A child may have exited since `ps` listed it ("No such process"):
        // the exit status is not the check; the caller waits until the
        // postmaster is gone.
        let _ = run(Command::new("kill").arg("-KILL").args(&pids));
        Some(pid)
    }

    fn stop(&self) {
        if let Some(pid) = self.pid.lock().expect("lock").take() {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Whether `pid` runs (a zombie waiting to be reaped does not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // "pid (comm) S …": the state follows the last ')'.
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X']))
    })
}

/// The primary, its standby and the standby's replication link.
#[derive(Debug)]
pub struct Cluster {
    /// The primary.
    pub primary: Node,
    /// Its streaming standby.
    pub standby: Node,
    /// The standby's replication connection goes through this.
    pub link: Proxy,
    dir: PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.primary.stop();
        self.standby.stop();
        // Children of a SIGKILLed postmaster exit on their own (they watch
        // its death pipe); the directory can go at once.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The standby's `application_name`, as `synchronous_standby_names` names it.
pub const STANDBY_NAME: &str = "standby1";

fn bin(name: &str) -> PathBuf {
    let dir = std::env::var("IDEM_PG_BIN").unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".into());
    Path::new(&dir).join(name)
}

fn is_root() -> bool {
    let out = run(Command::new("id").arg("-u"));
    String::from_utf8_lossy(&out.stdout).trim() == "0"
}

/// `program args…`, as `postgres` when we are root.
fn as_postgres(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {cmd:?}: {e}"))
}

fn must(cmd: &mut Command) {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Where the servers' ports are taken from: below Linux's ephemeral range
/// (32768 and up), so no client socket or `bind(0)` takes one between the
/// check and the server's start.
const PORTS: std::ops::Range<u16> = 25_400..25_800;

/// Ports handed out in this process (tests run in parallel).
static TAKEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());

/// A port of [`PORTS`] nothing listens on now, not handed out before.
fn free_port() -> u16 {
    let mut taken = TAKEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // Start at a point that depends on the process, so two test binaries
    // running at once rarely probe the same ports first.
    let len = PORTS.end - PORTS.start;
    let offset = u16::try_from(std::process::id() % u32::from(len)).unwrap_or(0);
    for i in 0..len {
        let port = PORTS.start + (offset + i) % len;
        if !taken.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            taken.push(port);
            return port;
        }
    }
    panic!("no free port in {PORTS:?}");
}

fn scratch_dir() -> PathBuf {
    let dir = crate::process::scratch_dir("idem-pg-failover");
    if is_root() {
        must(Command::new("chown").arg("postgres:").arg(&dir));
    }
    dir
}

/// A shell that waits for this process to end, then kills whatever
/// postmaster still runs in `dir` and removes it.
fn watchdog(dir: &Path) {
    crate::process::watchdog(&format!(
        "for f in '{dir}'/*/postmaster.pid; do [ -f \"$f\" ] && kill -KILL $(head -1 \"$f\"); done; \
         sleep 1; rm -rf '{dir}'",
        dir = dir.display(),
    ));
}

/// A freshly initialized data directory, made once per test process (in
/// its own scratch directory, removed by its watchdog when the process
/// ends) and copied by each cluster. Blocking.
fn template() -> &'static Path {
    static TEMPLATE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let dir = scratch_dir();
        watchdog(&dir);
        let data = dir.join("template");
        must(
            as_postgres(&bin("initdb"))
                .arg("-D")
                .arg(&data)
                .args(["-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"])
                .args(["--locale=C", "--no-instructions"]),
        );
        data
    })
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    f.write_all(text.as_bytes()).expect("append config");
}

fn pg_ctl_start(data: &Path) -> u32 {
    let out = run(as_postgres(&bin("pg_ctl"))
        .arg("-D")
        .arg(data)
        .arg("-l")
        .arg(data.join("server.log"))
        .args(["-w", "-t", "60", "start"]));
    assert!(
        out.status.success(),
        "pg_ctl start {}: {}\nserver.log:\n{}",
        data.display(),
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(data.join("server.log")).unwrap_or_default()
    );
    let text = std::fs::read_to_string(data.join("postmaster.pid")).expect("postmaster.pid");
    text.lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .expect("pid")
}

impl Cluster {
    /// Starts both servers and waits until the standby streams (and, in a
    /// synchronous mode, is the synchronous one).
    pub async fn start(mode: Mode) -> Self {
        let dir = scratch_dir();
        watchdog(&dir);
        let (pp, sp) = (free_port(), free_port());
        let primary = Node {
            port: pp,
            data: dir.join("primary"),
            pid: Mutex::new(None),
        };
        let standby = Node {
            port: sp,
            data: dir.join("standby"),
            pid: Mutex::new(None),
        };
        let link = Proxy::start(primary.addr(), Protocol::Postgres).await;
        let cluster = Self {
            primary,
            standby,
            link,
            dir,
        };
        let (dir, link_port) = (cluster.dir.clone(), cluster.link.addr.port());
        let (pdata, sdata) = (cluster.primary.data.clone(), cluster.standby.data.clone());
        let (ppid, spid) = tokio::task::spawn_blocking(move || {
            // A copy of the process's one `initdb` (the costly step).
            must(
                as_postgres(Path::new("cp"))
                    .arg("-a")
                    .arg(template())
                    .arg(&pdata),
            );
            let (names, level) = match mode {
                Mode::Asynchronous => ("", "on"),
                Mode::Synchronous { names, level } => (names, level),
            };
            append(
                &pdata.join("postgresql.conf"),
                &format!(
                    "\nlisten_addresses = '127.0.0.1'\nport = {pp}\n\
                     unix_socket_directories = '{dir}'\n\
                     shared_buffers = 16MB\nmax_connections = 40\nfsync = off\n\
                     max_wal_senders = 4\nwal_keep_size = 64MB\n\
                     synchronous_standby_names = '{names}'\nsynchronous_commit = {level}\n",
                    dir = dir.display(),
                ),
            );
            let ppid = pg_ctl_start(&pdata);
            must(
                as_postgres(&bin("pg_basebackup"))
                    .args(["-h", "127.0.0.1", "-p", &pp.to_string(), "-U", "postgres"])
                    .arg("-D")
                    .arg(&sdata)
                    .args(["-X", "stream", "-c", "fast", "--no-sync"]),
            );
            // The last setting in the file wins: the standby's own port, a
            // link through the proxy, and no synchronous standby of its own
            // once promoted.
            append(
                &sdata.join("postgresql.conf"),
                &format!(
                    "\nport = {sp}\n\
                     primary_conninfo = 'host=127.0.0.1 port={link_port} user=postgres \
                     application_name={STANDBY_NAME} sslmode=disable'\n\
                     synchronous_standby_names = ''\nsynchronous_commit = on\n\
                     hot_standby = on\nwal_retrieve_retry_interval = 100ms\n\
                     wal_receiver_status_interval = 1s\n"
                ),
            );
            must(as_postgres(Path::new("touch")).arg(sdata.join("standby.signal")));
            let spid = pg_ctl_start(&sdata);
            (ppid, spid)
        })
        .await
        .expect("start the servers");
        *cluster.primary.pid.lock().expect("lock") = Some(ppid);
        *cluster.standby.pid.lock().expect("lock") = Some(spid);
        cluster
            .wait_streaming(matches!(mode, Mode::Synchronous { .. }))
            .await;
        cluster
    }

    /// Waits until the standby streams and has replayed everything the
    /// primary wrote so far (and is the synchronous standby if `sync`).
    pub async fn wait_streaming(&self, sync: bool) {
        let admin = self.primary.pool().await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let caught_up: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_replication \
                 WHERE application_name = $1 AND state = 'streaming' \
                 AND replay_lsn >= pg_current_wal_lsn() \
                 AND (NOT $2 OR sync_state IN ('sync', 'quorum')))",
            )
            .bind(STANDBY_NAME)
            .bind(sync)
            .fetch_one(&admin)
            .await
            .expect("pg_stat_replication");
            if caught_up {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the standby never caught up; see {}",
                self.dir.display()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        admin.close().await;
    }

    /// SIGKILLs the primary (postmaster and children) and waits until the
    /// postmaster is gone.
    pub async fn kill_primary(&self) {
        let Some(pid) = self.primary.kill() else {
            return;
        };
        // The postmaster is our grandchild (pg_ctl daemonizes it), reaped by
        // init; a zombie counts as gone.
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(pid) {
            assert!(
                Instant::now() < deadline,
                "postmaster {pid} survived SIGKILL"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// `pg_ctl promote -w`: the standby becomes a primary.
    pub async fn promote_standby(&self) {
        let data = self.standby.data.clone();
        tokio::task::spawn_blocking(move || {
            must(
                as_postgres(&bin("pg_ctl"))
                    .arg("-D")
                    .arg(&data)
                    .args(["-w", "-t", "60", "promote"]),
            );
        })
        .await
        .expect("promote");
    }
}
