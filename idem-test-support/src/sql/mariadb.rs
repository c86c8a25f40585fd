//! A throwaway `mariadbd` on a free loopback port, with a temporary data
//! directory of its own: started, stopped and restarted by its pid, never
//! the machine's shared server.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use idem_mysql::sqlx::mysql::MySqlPoolOptions;
use idem_mysql::sqlx::{self, Executor};

/// One `mariadbd`, killed and its directory removed when dropped.
#[derive(Debug)]
pub struct Throwaway {
    /// Its loopback port.
    pub port: u16,
    dir: PathBuf,
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
        let dir = std::env::temp_dir().join(format!(
            "idem-mariadb-{}",
            idem_core::IdempotencyKey::random()
                .as_str()
                .to_ascii_lowercase()
        ));
        // Its own tmpdir too: bootstraps running side by side in one /tmp
        // collide on their temporary tables' names and abort.
        std::fs::create_dir_all(dir.join("tmp")).expect("temp dir");
        let data = dir.join("data");
        let out = tokio::task::spawn_blocking({
            let data = data.clone();
            let tmp = dir.join("tmp");
            move || {
                Command::new("mariadb-install-db")
                    .args(["--no-defaults", "--user=root", "--skip-test-db"])
                    .arg("--auth-root-authentication-method=normal")
                    .arg(format!("--datadir={}", data.display()))
                    .arg(format!("--tmpdir={}", tmp.display()))
                    .output()
            }
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

    async fn admin(&self) -> sqlx::MySqlPool {
        MySqlPoolOptions::new()
            .max_connections(1)
            .connect(&format!("mysql://root@127.0.0.1:{}/", self.port))
            .await
            .expect("admin connection")
    }

    /// Starts `mariadbd` and waits until it answers.
    async fn run(&mut self) {
        let d = &self.dir;
        let child = Command::new("mariadbd")
            .args(["--no-defaults", "--user=root", "--bind-address=127.0.0.1"])
            .arg(format!("--port={}", self.port))
            .arg(format!("--datadir={}", d.join("data").display()))
            .arg(format!("--socket={}", d.join("sock").display()))
            .arg(format!("--tmpdir={}", d.join("tmp").display()))
            .arg(format!("--pid-file={}", d.join("pid").display()))
            .arg(format!("--log-error={}", d.join("err.log").display()))
            .args(["--skip-log-bin", "--innodb-buffer-pool-size=32M"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
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

    /// Starts it again on the same data directory and port.
    pub async fn restart(&mut self) {
        self.stop().await;
        self.run().await;
    }
}
