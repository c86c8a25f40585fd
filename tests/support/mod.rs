//! What the examples' interface tests share: the built example binaries,
//! free addresses, fresh names, and the stores they run the examples on.
#![allow(dead_code)] // each test binary uses a different part

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

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
}

impl Drop for TempSqlite {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = self.0.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
    }
}

/// A PostgreSQL database of its own on the server of `IDEM_POSTGRES_URL`
/// (an example uses a fixed schema), dropped when this is.
#[cfg(feature = "postgres")]
#[derive(Debug)]
pub(crate) struct TempPgDatabase {
    admin: String,
    name: String,
    /// Its URL.
    pub(crate) url: String,
}

#[cfg(feature = "postgres")]
impl TempPgDatabase {
    /// Creates `idem_<tag>_<random>`.
    pub(crate) fn create(tag: &str) -> Self {
        let admin = std::env::var("IDEM_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let name = format!("idem_{tag}_{}", random_id());
        let url = match admin.rsplit_once('/') {
            Some((server, _)) => format!("{server}/{name}"),
            None => panic!("IDEM_POSTGRES_URL has no database: {admin}"),
        };
        let db = Self { admin, name, url };
        db.sql(format!("CREATE DATABASE \"{}\"", db.name));
        db
    }

    /// Runs `stmt` on the admin URL, on a thread and runtime of its own (so
    /// that a test on a runtime can drop this too).
    fn sql(&self, stmt: String) {
        use idem::postgres::sqlx::{self, Connection, Executor};
        let admin = self.admin.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let mut c = sqlx::PgConnection::connect(&admin)
                    .await
                    .unwrap_or_else(|e| {
                        panic!(
                            "cannot reach PostgreSQL at {admin}: {e}; start it or point \
                             IDEM_POSTGRES_URL at a server (this test never skips)"
                        )
                    });
                c.execute(sqlx::AssertSqlSafe(stmt)).await.expect("SQL");
                c.close().await.expect("close");
            });
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p));
    }
}

#[cfg(feature = "postgres")]
impl Drop for TempPgDatabase {
    fn drop(&mut self) {
        let stmt = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name);
        if std::thread::panicking() {
            // Never a second panic while unwinding: the first one is the news.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.sql(stmt)));
        } else {
            self.sql(stmt);
        }
    }
}
