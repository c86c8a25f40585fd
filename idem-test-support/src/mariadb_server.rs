//! A throwaway `mariadbd` on a free loopback port, in a data directory of
//! its own, with InnoDB's defaults (`innodb_flush_log_at_trx_commit = 1`: a
//! commit is on disk before it is acknowledged): started, SIGKILLed and
//! restarted by its pid (InnoDB's crash recovery replays its redo log on the
//! way up), never the machine's shared server.
//!
//! Every function panics when MariaDB's programs cannot be run or the server
//! does not come up: that is the test failing.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `mariadbd` owned by one test, SIGKILLed and its directory removed when
/// dropped.
#[derive(Debug)]
pub struct Throwaway {
    /// Its client port.
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Throwaway {
    /// Installs a data directory (`mariadb-install-db`) and starts the
    /// server on it, with a `test` database (root, no password, loopback
    /// only).
    pub fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir = std::env::temp_dir().join(format!("idem-mariadb-{}-{port}", std::process::id()));
        // Its own tmpdir: bootstraps side by side in one /tmp collide on
        // their temporary tables' names and abort.
        std::fs::create_dir_all(dir.join("tmp")).expect("create the server's directory");
        let out = install_db(&dir)
            .output()
            .expect("run mariadb-install-db (is MariaDB installed?)");
        assert!(
            out.status.success(),
            "mariadb-install-db: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut server = Self {
            port,
            dir,
            child: None,
        };
        server.restart();
        let created = Command::new("mariadb")
            .args(["-h", "127.0.0.1", "-P", &port.to_string(), "-u", "root"])
            .args(["-e", "CREATE DATABASE IF NOT EXISTS test"])
            .status()
            .expect("run the mariadb client");
        assert!(created.success(), "CREATE DATABASE test");
        server
    }

    /// `mysql://root@127.0.0.1:PORT/test`.
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/test", self.port)
    }

    /// SIGKILLs the server (if running) and starts it again on its data
    /// directory; returns once it answers.
    pub fn restart(&mut self) {
        self.kill();
        self.child = Some(
            mariadbd(self.port, &self.dir)
                .spawn()
                .expect("run mariadbd (is MariaDB installed?)"),
        );
        let until = Instant::now() + Duration::from_secs(30);
        while !self.answers() {
            assert!(
                Instant::now() < until,
                "mariadbd on {} does not answer; see {}",
                self.port,
                self.dir.join("err.log").display()
            );
            std::thread::park_timeout(Duration::from_millis(50));
        }
    }

    /// SIGKILLs the server, if running, and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether `mariadb-admin ping` gets an answer.
    fn answers(&self) -> bool {
        Command::new("mariadb-admin")
            .args(["-h", "127.0.0.1", "-P", &self.port.to_string()])
            .args(["-u", "root", "ping"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for Throwaway {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `mariadb-install-db` command that installs a data directory in
/// `dir/data` (its temporary files in `dir/tmp`, which must exist: installs
/// side by side in one /tmp collide on their temporary tables' names), root
/// without a password, no `test` database.
pub fn install_db(dir: &Path) -> Command {
    let mut cmd = Command::new("mariadb-install-db");
    cmd.args(["--no-defaults", "--user=root", "--skip-test-db"])
        .arg("--auth-root-authentication-method=normal")
        .arg(format!("--datadir={}", dir.join("data").display()))
        .arg(format!("--tmpdir={}", dir.join("tmp").display()));
    cmd
}

/// The `mariadbd` command for a server on `port` whose data directory (and
/// socket, temporary files, pid file and error log) is under `dir`, as
/// `mariadb-install-db` left it in `dir/data`: loopback only, no binary
/// log, a small buffer pool, its output discarded.
pub fn mariadbd(port: u16, dir: &Path) -> Command {
    let mut cmd = Command::new("mariadbd");
    cmd.args(["--no-defaults", "--user=root", "--bind-address=127.0.0.1"])
        .arg(format!("--port={port}"))
        .arg(format!("--datadir={}", dir.join("data").display()))
        .arg(format!("--socket={}", dir.join("sock").display()))
        .arg(format!("--tmpdir={}", dir.join("tmp").display()))
        .arg(format!("--pid-file={}", dir.join("pid").display()))
        .arg(format!("--log-error={}", dir.join("err.log").display()))
        .args(["--skip-log-bin", "--innodb-buffer-pool-size=32M"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}
