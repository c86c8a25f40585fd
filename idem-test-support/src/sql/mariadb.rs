//! A throwaway `mariadbd` on a free loopback port, with a temporary data
//! directory of its own: started, stopped, SIGKILLed and restarted by its
//! pid, never the machine's shared server. Extra server options (a binary
//! log, a server id, semi-synchronous replication) make it one side of a
//! [replicated pair](super::mariadb_cluster).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use idem_mysql::sqlx::mysql::MySqlPoolOptions;
use idem_mysql::sqlx::{self, Executor};

use crate::mariadb_server::{install_db, mariadbd};

/// One `mariadbd`, killed and its directory removed when dropped.
#[derive(Debug)]
pub struct Throwaway {
    /// Its loopback port.
    pub port: u16,
    dir: PathBuf,
    options: Vec<String>,
    child: Option<Child>,
}

impl Drop for Throwaway {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

impl Throwaway {
    /// Installs a data directory and starts the server on it, with a `test`
    /// database (root, no password, loopback only).
    ///
    /// # Panics
    ///
    /// When `mariadb-install-db` or `mariadbd` cannot be run or the server
    /// does not answer (that is the test failing).
    pub async fn start() -> Self {
        Self::start_with(Vec::new()).await
    }

    /// Like [`Throwaway::start`], with `options` added to `mariadbd`'s
    /// command line (after the defaults, so they win: `--log-bin=…` turns
    /// the binary log on), on every start.
    ///
    /// # Panics
    ///
    /// As [`Throwaway::start`].
    pub async fn start_with(options: Vec<String>) -> Self {
        let dir = crate::process::scratch_dir("idem-mariadb");
        watchdog(&dir);
        // Its own tmpdir too: bootstraps running side by side in one /tmp
        // collide on their temporary tables' names and abort.
        std::fs::create_dir_all(dir.join("tmp")).expect("temp dir");
        let out = tokio::task::spawn_blocking({
            let mut install = install_db(&dir);
            move || install.output()
        })
        .await
        .expect("join")
        .expect("mariadb-install-db is installed (apt-get install mariadb-server)");
        assert!(
            out.status.success(),
            "mariadb-install-db: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut server = Self {
            port: free_port(),
            dir,
            options,
            child: None,
        };
        server.run().await;
        let pool = server.admin().await;
        pool.execute("CREATE DATABASE IF NOT EXISTS test")
            .await
            .expect("create database");
        pool.close().await;
        server
    }

    /// `mysql://root@127.0.0.1:PORT/test`.
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/test", self.port)
    }

    /// Its loopback address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Where its error log is (for a failing test's message).
    pub fn error_log(&self) -> PathBuf {
        self.dir.join("err.log")
    }

    /// A one-connection pool as root, no default database.
    ///
    /// # Panics
    ///
    /// When the server does not accept it.
    pub async fn admin(&self) -> sqlx::MySqlPool {
        MySqlPoolOptions::new()
            .max_connections(1)
            .connect(&format!("mysql://root@127.0.0.1:{}/", self.port))
            .await
            .expect("admin connection")
    }

    /// Starts `mariadbd` and waits until it answers.
    async fn run(&mut self) {
        let d = &self.dir;
        let child = mariadbd(self.port, d)
            .args(&self.options)
            .spawn()
            .expect("mariadbd is installed");
        self.child = Some(child);
        for _ in 0..600 {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
                && MySqlPoolOptions::new()
                    .max_connections(1)
                    .connect(&format!("mysql://root@127.0.0.1:{}/", self.port))
                    .await
                    .is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "the throwaway mariadbd never answered; see {}",
            d.join("err.log").display()
        );
    }

    /// Stops the server (SIGTERM: a clean shutdown, by its pid) and waits
    /// for it to exit.
    ///
    /// # Panics
    ///
    /// When it does not exit.
    pub async fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = child.id().to_string();
        tokio::task::spawn_blocking(move || {
            let _ = Command::new("kill").args(["-TERM", &pid]).status();
            child.wait()
        })
        .await
        .expect("join")
        .expect("mariadbd exits");
    }

    /// SIGKILLs the server (a crash of its machine, as far as the server
    /// can tell: no shutdown, nothing sent to its replicas) and reaps it.
    ///
    /// # Panics
    ///
    /// When it cannot be reaped.
    pub async fn kill(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        tokio::task::spawn_blocking(move || {
            let _ = child.kill();
            child.wait()
        })
        .await
        .expect("join")
        .expect("mariadbd is reaped");
        // Its pid is free again: the watchdog must not signal it.
        let _ = std::fs::remove_file(self.dir.join("pid"));
    }

    /// Starts it again on the same data directory and port.
    pub async fn restart(&mut self) {
        self.stop().await;
        self.run().await;
    }
}

/// A shell that waits for this process to end, then SIGKILLs the server
/// still running in `dir` (its pid file) and removes `dir`: nothing outlives
/// a test process that panicked or was killed.
fn watchdog(dir: &Path) {
    crate::process::watchdog(&format!(
        "[ -f '{dir}/pid' ] && kill -KILL $(cat '{dir}/pid'); sleep 1; rm -rf '{dir}'",
        dir = dir.display(),
    ));
}

/// Stopped and restarted on the same data directory (InnoDB keeps what was
/// committed): the outage of the MySQL scenarios.
impl super::Outage for Throwaway {
    async fn down(&mut self) {
        self.stop().await;
    }
    async fn up(&mut self) {
        self.restart().await;
    }
}
