//! The pool ([`Pool`]), its settings ([`PoolConfig`]) and its counters
//! ([`Stats`]). What a connection is and how one is opened, recycled and
//! re-validated is in `conn` (which knows nothing of this module).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use deadpool::managed::{self, PoolError, QueueMode};
use sqlx::Connection;

mod conn;

pub use conn::{Conn, ConnectCheck, ConnectionError};
use conn::{Counters, Manager};

/// How long a connection whose statement was dropped mid-flight may take to
/// answer it and a ping before it is closed, unless configured otherwise.
const DEFAULT_REVALIDATE_TIMEOUT: Duration = Duration::from_secs(30);

/// The settings of a [`Pool`]: the backends take them from the sqlx
/// `PoolOptions` their users pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    max_size: usize,
    acquire_timeout: Option<Duration>,
    max_lifetime: Option<Duration>,
    idle_timeout: Option<Duration>,
    revalidate_timeout: Option<Duration>,
}

impl PoolConfig {
    /// At most `max_size` connections (at least one), a checkout that waits
    /// without bound, connections kept however old or idle, and a
    /// connection left in flight waited for at most 30 seconds
    /// ([`PoolConfig::revalidate_timeout`]).
    #[must_use]
    pub fn new(max_size: u32) -> Self {
        Self {
            max_size: usize::try_from(max_size.max(1)).unwrap_or(usize::MAX),
            acquire_timeout: None,
            max_lifetime: None,
            idle_timeout: None,
            revalidate_timeout: Some(DEFAULT_REVALIDATE_TIMEOUT),
        }
    }

    /// Bounds the wait for a connection whose statement was dropped
    /// mid-flight (see [`Conn`]): if the server's answers and a ping have
    /// not come back within `timeout`, the connection is closed and its
    /// place freed. Until then it holds a place in the pool, so without a
    /// bound a statement that never ends (a lock wait, a half-open TCP
    /// connection) would take a place away for good. `None` waits without
    /// bound. The backends set it to their pool's acquire timeout: a
    /// checkout would not wait longer for that place anyway.
    #[must_use]
    pub fn revalidate_timeout(self, timeout: Option<Duration>) -> Self {
        Self {
            revalidate_timeout: timeout,
            ..self
        }
    }

    /// The settings sqlx's `options` give: `max_connections`,
    /// `acquire_timeout`, `max_lifetime` and `idle_timeout`, and the
    /// acquire timeout as the [revalidate timeout](Self::revalidate_timeout)
    /// too. What the idem stores built by `connect_with` run their calls on.
    #[must_use]
    pub fn from_pool_options<DB: sqlx::Database>(options: &sqlx::pool::PoolOptions<DB>) -> Self {
        Self::new(options.get_max_connections())
            .acquire_timeout(Some(options.get_acquire_timeout()))
            .revalidate_timeout(Some(options.get_acquire_timeout()))
            .max_lifetime(options.get_max_lifetime())
            .idle_timeout(options.get_idle_timeout())
    }

    /// Bounds a checkout, from the wait for a free place to the new
    /// connection's handshake: [`Pool::get`] then fails with
    /// [`sqlx::Error::PoolTimedOut`] (sqlx's `acquire_timeout`).
    #[must_use]
    pub fn acquire_timeout(self, timeout: Option<Duration>) -> Self {
        Self {
            acquire_timeout: timeout,
            ..self
        }
    }

    /// A connection opened longer ago than this is closed at its next
    /// checkout instead of used (sqlx's `max_lifetime`).
    #[must_use]
    pub fn max_lifetime(self, lifetime: Option<Duration>) -> Self {
        Self {
            max_lifetime: lifetime,
            ..self
        }
    }

    /// A connection idle in the pool longer than this is closed at its next
    /// checkout instead of used (sqlx's `idle_timeout`; no task closes it
    /// earlier).
    #[must_use]
    pub fn idle_timeout(self, timeout: Option<Duration>) -> Self {
        Self {
            idle_timeout: timeout,
            ..self
        }
    }

    /// The most connections the pool holds.
    #[must_use]
    pub fn max_size(&self) -> usize {
        self.max_size
    }
}

/// What a [`Pool`] holds now and what it did so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Stats {
    /// Connections open now, checked out or idle.
    pub size: usize,
    /// Idle connections, ready for a checkout.
    pub idle: usize,
    /// Connections opened so far.
    pub opened: u64,
    /// Checkouts that reused an idle connection as it was (no round trip).
    pub reused: u64,
    /// Connections pinged back to soundness after a dropped statement.
    pub revalidated: u64,
    /// Connections closed because they were broken, in flight without a
    /// runtime to wait for them, too old or idle too long, or new and
    /// refused by the pool's [`ConnectCheck`].
    pub discarded: u64,
}

/// A pool of sqlx connections of type `C` that never pings a connection it
/// takes back or hands out: a connection is re-validated only when a
/// statement may have left it unsound (see [`Conn`]).
///
/// The most recently returned connection is handed out first (LIFO), so
/// consecutive calls of one task usually run on the same connection (warm
/// caches on the server or, for SQLite, in the connection's page cache), and
/// connections beyond what the load needs stay idle. Connections are opened
/// on demand, none at construction. Cheap to clone; clones share the
/// connections.
pub struct Pool<C: Connection + 'static> {
    inner: managed::Pool<Manager<C>>,
    acquire_timeout: Option<Duration>,
    counters: Arc<Counters>,
}

impl<C: Connection + 'static> std::fmt::Debug for Pool<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("stats", &self.stats())
            .field("acquire_timeout", &self.acquire_timeout)
            .finish_non_exhaustive()
    }
}

impl<C: Connection + 'static> Clone for Pool<C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            acquire_timeout: self.acquire_timeout,
            counters: Arc::clone(&self.counters),
        }
    }
}

impl<C: Connection + 'static> Pool<C> {
    /// A pool that opens its connections with `options`. Nothing is opened
    /// here: the first [`Pool::get`] connects.
    #[must_use]
    pub fn new(options: C::Options, config: PoolConfig) -> Self {
        Self::checked(options, config, None)
    }

    /// Like [`Pool::new`], with every new connection passing `check` before
    /// its first checkout (see [`ConnectCheck`]).
    #[must_use]
    pub fn checked(
        options: C::Options,
        config: PoolConfig,
        check: Option<ConnectCheck<C>>,
    ) -> Self {
        let counters = Arc::new(Counters::default());
        let manager = Manager {
            options,
            check,
            max_lifetime: config.max_lifetime,
            idle_timeout: config.idle_timeout,
            revalidate_timeout: config.revalidate_timeout,
            counters: Arc::clone(&counters),
        };
        let inner = managed::Pool::builder(manager)
            .max_size(config.max_size)
            .queue_mode(QueueMode::Lifo)
            .build()
            .expect("no timeouts are configured in deadpool, so no runtime is needed");
        Self {
            inner,
            acquire_timeout: config.acquire_timeout,
            counters,
        }
    }

    /// Checks a connection out: the most recently returned sound one, with
    /// no round trip, or a new one if none is idle and the pool has room;
    /// otherwise waits for one, within the acquire timeout. A connection
    /// being opened is opened to the end even if the caller stops waiting:
    /// it then goes to the pool.
    ///
    /// # Errors
    ///
    /// [`sqlx::Error::PoolTimedOut`] when the acquire timeout passed,
    /// [`sqlx::Error::PoolClosed`] after [`Pool::close`], and the driver's
    /// error when a new connection cannot be opened.
    pub async fn get(&self) -> Result<Conn<C>, sqlx::Error> {
        let (inner, timeout) = (self.inner.clone(), self.acquire_timeout);
        self.detached_if_opening(async move {
            let got = match timeout {
                None => inner.get().await,
                Some(after) => tokio::time::timeout(after, inner.get())
                    .await
                    .map_err(|_| sqlx::Error::PoolTimedOut)?,
            };
            Self::checked_out(got)
        })
        .await
    }

    /// Checks a connection out if one is free now (idle, or room to open
    /// one), without waiting for a busy one: `None` when every connection
    /// is checked out and the pool is full.
    ///
    /// # Errors
    ///
    /// [`sqlx::Error::PoolClosed`] after [`Pool::close`], and the driver's
    /// error when a new connection cannot be opened.
    pub async fn try_get(&self) -> Result<Option<Conn<C>>, sqlx::Error> {
        let inner = self.inner.clone();
        self.detached_if_opening(async move {
            let now = managed::Timeouts {
                wait: Some(Duration::ZERO),
                ..managed::Timeouts::new()
            };
            match inner.timeout_get(&now).await {
                Err(PoolError::Timeout(managed::TimeoutType::Wait)) => Ok(None),
                got => Self::checked_out(got).map(Some),
            }
        })
        .await
    }

    /// Runs `checkout` in a task of its own when it is about to open a
    /// connection (none idle, room in the pool), so that a caller that
    /// stops waiting (its future dropped: a batch took its call meanwhile,
    /// say) leaves the handshake to finish and the new connection to the
    /// pool. Dropped half-way, it would have cost the server a session for
    /// nothing, and the next checkout would open another: under load,
    /// hundreds of sessions a second. Any other checkout runs in place.
    async fn detached_if_opening<T: Send + 'static>(
        &self,
        checkout: impl Future<Output = Result<T, sqlx::Error>> + Send + 'static,
    ) -> Result<T, sqlx::Error> {
        let status = self.inner.status();
        let opens = status.available == 0 && status.size < status.max_size;
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) if opens => runtime.spawn(checkout).await.unwrap_or_else(|e| {
                Err(sqlx::Error::Protocol(format!(
                    "connection pool: the checkout's task failed: {e}"
                )))
            }),
            _ => checkout.await,
        }
    }

    /// A checkout's result, its error as the driver's.
    fn checked_out(
        got: Result<managed::Object<Manager<C>>, PoolError<sqlx::Error>>,
    ) -> Result<Conn<C>, sqlx::Error> {
        match got {
            Ok(obj) => Ok(Conn::new(obj)),
            Err(PoolError::Backend(e)) => Err(e),
            Err(PoolError::Closed) => Err(sqlx::Error::PoolClosed),
            Err(PoolError::Timeout(_)) => Err(sqlx::Error::PoolTimedOut),
            Err(other) => Err(sqlx::Error::Protocol(format!("connection pool: {other}"))),
        }
    }

    /// How long a checkout waits before it fails (`None`: as long as it
    /// takes).
    pub(crate) fn acquire_wait(&self) -> Option<Duration> {
        self.acquire_timeout
    }

    /// The most connections the pool opens.
    pub(crate) fn max_size(&self) -> usize {
        self.inner.status().max_size
    }

    /// Closes the pool: idle connections are closed now, checked-out ones
    /// when they are returned, and every later [`Pool::get`] fails with
    /// [`sqlx::Error::PoolClosed`].
    pub fn close(&self) {
        self.inner.close();
    }

    /// Whether [`Pool::close`] was called.
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// What the pool holds and what it did so far.
    #[must_use]
    pub fn stats(&self) -> Stats {
        let status = self.inner.status();
        let count = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Stats {
            size: status.size,
            idle: status.available,
            opened: count(&self.counters.opened),
            reused: count(&self.counters.reused),
            revalidated: count(&self.counters.revalidated),
            discarded: count(&self.counters.discarded),
        }
    }
}
