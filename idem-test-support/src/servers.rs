//! The shared SQL servers the tests reach (never skipped: an unreachable
//! server fails the test with what to start), and polling a server for what
//! a test waits to see.

use std::future::Future;
use std::time::Duration;

/// A shared SQL server: where it is, and how to start it.
#[derive(Debug, Clone, Copy)]
pub struct SharedServer {
    /// Its name in messages.
    pub name: &'static str,
    /// The variable naming its URL.
    pub env: &'static str,
    /// The URL without the variable.
    pub default_url: &'static str,
    /// The command that starts the local one.
    pub start: &'static str,
}

/// PostgreSQL: `IDEM_POSTGRES_URL`, or the machine's server.
pub const POSTGRES: SharedServer = SharedServer {
    name: "PostgreSQL",
    env: "IDEM_POSTGRES_URL",
    default_url: "postgres://postgres@127.0.0.1:5432/test",
    start: "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start",
};

/// MySQL / MariaDB: `IDEM_MYSQL_URL`, or the machine's server.
pub const MYSQL: SharedServer = SharedServer {
    name: "MySQL/MariaDB",
    env: "IDEM_MYSQL_URL",
    default_url: "mysql://root@127.0.0.1:3306/test",
    start: "start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql",
};

impl SharedServer {
    /// Its URL: the variable's value, or the default.
    pub fn url(&self) -> String {
        std::env::var(self.env).unwrap_or_else(|_| self.default_url.to_owned())
    }

    /// Fails the test: the server cannot be reached, and how to start it.
    ///
    /// # Panics
    ///
    /// Always.
    pub fn unreachable(&self, e: &dyn std::fmt::Display) -> ! {
        panic!(
            "cannot reach {} at {}: {e}\nStart the local server with:\n    {}\n\
             or point {} at a server (these tests never skip).",
            self.name,
            self.url(),
            self.start,
            self.env
        )
    }

    /// Its connect options, parsed from [`url`](Self::url).
    ///
    /// # Panics
    ///
    /// When the URL is malformed, with the variable to fix.
    #[cfg(feature = "sql")]
    pub fn options<O>(&self) -> O
    where
        O: std::str::FromStr,
        O::Err: std::fmt::Display,
    {
        self.url()
            .parse()
            .unwrap_or_else(|e| panic!("{} is not a valid URL: {e}", self.env))
    }

    /// The tests' pool options: `max` connections, a 10 s acquire timeout.
    #[cfg(feature = "sql")]
    #[must_use]
    pub fn pool_options<DB: sqlx::Database>(max: u32) -> sqlx::pool::PoolOptions<DB> {
        sqlx::pool::PoolOptions::new()
            .max_connections(max)
            .acquire_timeout(Duration::from_secs(10))
    }

    /// A pool of `max` connections on it through `options`, never tested
    /// on acquire (fails the test, never skips, if unreachable).
    ///
    /// # Panics
    ///
    /// When the server cannot be reached.
    #[cfg(feature = "sql")]
    pub async fn pool<DB: sqlx::Database>(
        &self,
        max: u32,
        options: <DB::Connection as sqlx::Connection>::Options,
    ) -> sqlx::Pool<DB> {
        Self::pool_options(max)
            .test_before_acquire(false)
            .connect_with(options)
            .await
            .unwrap_or_else(|e| self.unreachable(&e))
    }

    /// The socket address of `host:port` (for a proxy in front of it).
    #[cfg(feature = "sql")]
    ///
    /// # Panics
    ///
    /// When it does not resolve.
    pub async fn addr(&self, host: &str, port: u16) -> std::net::SocketAddr {
        tokio::net::lookup_host((host, port))
            .await
            .unwrap_or_else(|e| self.unreachable(&e))
            .next()
            .unwrap_or_else(|| self.unreachable(&"the host name resolves to no address"))
    }
}

/// Runs `check` up to `times` times, `every` apart, until it answers
/// `Some`; that answer, or `None`.
pub async fn poll<T, F, Fut>(times: usize, every: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    for _ in 0..times {
        if let Some(t) = check().await {
            return Some(t);
        }
        tokio::time::sleep(every).await;
    }
    None
}
