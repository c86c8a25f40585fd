//! What the examples' interface tests share: the built example binaries,
//! free addresses, fresh names, and the stores they run the examples on.
#![allow(dead_code)] // each test binary uses a different part

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

#[cfg(feature = "sqlite")]
pub(crate) mod queue_example;

/// The built example `name`, next to this test binary; a test built with a
/// `--test` filter finds none (cargo then builds no examples) and says how
/// to build them with `features`.
pub(crate) fn example(name: &str, features: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("this test binary");
    // target/<profile>/deps/<this test> → target/<profile>/examples/<name>
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>")
        .join("examples");
    let path = dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.is_file(),
        "{} is not built: run `cargo test -p idem --features {features}` without a --test \
         filter (cargo then builds the examples), or build them first with \
         `cargo build -p idem --examples --features {features}`",
        path.display()
    );
    path
}

/// Starts the built example `name` (see [`example`]) with `setup`'s
/// settings, then `env`, its stdout and stderr piped.
pub(crate) fn spawn(
    name: &str,
    features: &str,
    env: &[(&str, String)],
    setup: impl FnOnce(&mut Command),
) -> Child {
    let mut cmd = Command::new(example(name, features));
    setup(&mut cmd);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap_or_else(|e| panic!("spawn {name}: {e}"))
}

/// Waits (30 s at most) for the line of `child`'s stdout that `wanted`
/// picks (its stdout read to the end on a thread); if none comes, kills it
/// and panics with `name` and its stderr.
pub(crate) fn await_line(
    child: &mut Child,
    name: &str,
    wanted: impl Fn(&str) -> bool + Send + 'static,
) {
    let stdout = child.stdout.take().expect("stdout piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if wanted(&line) {
                let _ = tx.send(());
            }
        }
    });
    if rx.recv_timeout(Duration::from_secs(30)).is_err() {
        let _ = child.kill();
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        panic!("{name} did not start: {err}");
    }
}

/// A free loopback address.
pub(crate) fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
}

/// A fresh lowercase name part.
pub(crate) fn random_id() -> String {
    idem::IdempotencyKey::random().as_str().to_ascii_lowercase()
}

/// A SQLite file in the temp directory, removed (with its WAL and
/// shared-memory files) when dropped, the test passed or not.
#[derive(Debug)]
pub(crate) struct TempSqlite(pub(crate) PathBuf);

impl TempSqlite {
    /// `idem-<tag>-<random>.db`, not created.
    pub(crate) fn new(tag: &str) -> Self {
        Self(std::env::temp_dir().join(format!("idem-{tag}-{}.db", random_id())))
    }

    /// Its path, as an environment variable holds it.
    pub(crate) fn env(&self) -> String {
        self.0.to_string_lossy().into_owned()
    }

    /// The settings that run an example on it.
    pub(crate) fn store_env(&self) -> [(&'static str, String); 2] {
        [
            ("IDEM_STORE", "sqlite".to_owned()),
            ("IDEM_SQLITE_PATH", self.env()),
        ]
    }
}

impl Drop for TempSqlite {
    fn drop(&mut self) {
        idem_test_support::remove_sqlite(&self.0);
    }
}

/// Runs `stmt` on a connection of its own to `url` (`postgres` or `mysql`,
/// or a sqlx path and the name of its connection type), on a thread and
/// runtime of their own, so that a test on a runtime can run it too;
/// returns the thread's panic, if any.
#[allow(unused_macros, reason = "each test binary uses a different part")]
macro_rules! run_sql {
    (postgres, $url:expr, $stmt:expr) => {
        run_sql!(idem::postgres::sqlx, PgConnection, $url, $stmt)
    };
    (mysql, $url:expr, $stmt:expr) => {
        run_sql!(idem::mysql::sqlx, MySqlConnection, $url, $stmt)
    };
    ($sqlx:path, $conn:ident, $url:expr, $stmt:expr) => {{
        use $sqlx::{self as sqlx, Connection, Executor};
        let (url, stmt): (String, String) = ($url, $stmt);
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let mut c = sqlx::$conn::connect(&url).await.unwrap_or_else(|e| {
                    panic!(
                        "cannot reach {url}: {e}; start it or point IDEM_POSTGRES_URL or \
                         IDEM_MYSQL_URL at a server (this test never skips)"
                    )
                });
                c.execute(sqlx::AssertSqlSafe(stmt)).await.expect("SQL");
                c.close().await.expect("close");
            });
        })
        .join()
    }};
}

/// The settings that run an example on the Redis server at `url`.
pub(crate) fn redis_env(url: String) -> [(&'static str, String); 2] {
    [("IDEM_STORE", "redis".to_owned()), ("IDEM_REDIS_URL", url)]
}

/// The URL in `var`, or `default`.
pub(crate) fn admin_url(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

/// A MySQL/MariaDB table of its own in the database of `IDEM_MYSQL_URL`
/// (an example's default table is fixed), dropped when this is.
#[cfg(feature = "mysql")]
#[derive(Debug)]
pub(crate) struct TempMysqlTable {
    /// The server's URL.
    pub(crate) url: String,
    /// The table's name: `idem_<tag>_<random>`.
    pub(crate) name: String,
}

#[cfg(feature = "mysql")]
impl TempMysqlTable {
    /// Names `idem_<tag>_<random>` (the store creates it).
    pub(crate) fn new(tag: &str) -> Self {
        let url = admin_url("IDEM_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
        let name = format!("idem_{tag}_{}", random_id().replace('-', "_"));
        Self { url, name }
    }

    /// The settings that run an example on it.
    pub(crate) fn env(&self) -> [(&'static str, String); 3] {
        [
            ("IDEM_STORE", "mysql".to_owned()),
            ("IDEM_MYSQL_URL", self.url.clone()),
            ("IDEM_MYSQL_TABLE", self.name.clone()),
        ]
    }
}

#[cfg(feature = "mysql")]
impl Drop for TempMysqlTable {
    fn drop(&mut self) {
        let stmt = format!("DROP TABLE IF EXISTS `{}`", self.name);
        let dropped = run_sql!(mysql, self.url.clone(), stmt);
        // Never a second panic while unwinding: the first one is the news.
        if let Err(p) = dropped
            && !std::thread::panicking()
        {
            std::panic::resume_unwind(p);
        }
    }
}

/// The SQL server a [`TempDatabase`] is made on.
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[derive(Debug, Clone, Copy)]
enum Server {
    #[cfg(feature = "postgres")]
    Postgres,
    #[cfg(feature = "mysql")]
    Mysql,
}

/// A database of its own on the server of `IDEM_POSTGRES_URL` or
/// `IDEM_MYSQL_URL` (an example uses a fixed schema or table name), dropped
/// when this is.
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[derive(Debug)]
pub(crate) struct TempDatabase {
    server: Server,
    admin: String,
    name: String,
    /// Its URL.
    pub(crate) url: String,
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl TempDatabase {
    /// Creates `idem_<tag>_<random>` on the Postgres server.
    #[cfg(feature = "postgres")]
    pub(crate) fn postgres(tag: &str) -> Self {
        let admin = admin_url(
            "IDEM_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432/test",
        );
        Self::create(Server::Postgres, admin, tag)
    }

    /// Creates `idem_<tag>_<random>` on the MySQL/MariaDB server.
    #[cfg(feature = "mysql")]
    pub(crate) fn mysql(tag: &str) -> Self {
        let admin = admin_url("IDEM_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
        Self::create(Server::Mysql, admin, tag)
    }

    fn create(server: Server, admin: String, tag: &str) -> Self {
        let name = format!("idem_{tag}_{}", random_id());
        let url = match admin.rsplit_once('/') {
            Some((host, _)) => format!("{host}/{name}"),
            None => panic!("{admin} names no database"),
        };
        let db = Self {
            server,
            admin,
            name,
            url,
        };
        db.sql(format!("CREATE DATABASE {}", db.quoted()));
        db
    }

    /// The settings that run an example on it.
    pub(crate) fn store_env(&self) -> [(&'static str, String); 2] {
        match self.server {
            #[cfg(feature = "postgres")]
            Server::Postgres => [
                ("IDEM_STORE", "postgres".to_owned()),
                ("IDEM_POSTGRES_URL", self.url.clone()),
            ],
            #[cfg(feature = "mysql")]
            Server::Mysql => [
                ("IDEM_STORE", "mysql".to_owned()),
                ("IDEM_MYSQL_URL", self.url.clone()),
            ],
        }
    }

    /// Its name, quoted for the server.
    fn quoted(&self) -> String {
        match self.server {
            #[cfg(feature = "postgres")]
            Server::Postgres => format!("\"{}\"", self.name),
            #[cfg(feature = "mysql")]
            Server::Mysql => format!("`{}`", self.name),
        }
    }

    /// Runs `stmt` on the admin URL.
    fn sql(&self, stmt: String) {
        let admin = self.admin.clone();
        match self.server {
            #[cfg(feature = "postgres")]
            Server::Postgres => run_sql!(postgres, admin, stmt),
            #[cfg(feature = "mysql")]
            Server::Mysql => run_sql!(mysql, admin, stmt),
        }
        .unwrap_or_else(|p| std::panic::resume_unwind(p));
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl Drop for TempDatabase {
    fn drop(&mut self) {
        let stmt = match self.server {
            #[cfg(feature = "postgres")]
            Server::Postgres => format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.quoted()),
            #[cfg(feature = "mysql")]
            Server::Mysql => format!("DROP DATABASE IF EXISTS {}", self.quoted()),
        };
        if std::thread::panicking() {
            // Never a second panic while unwinding: the first one is the news.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.sql(stmt)));
        } else {
            self.sql(stmt);
        }
    }
}
