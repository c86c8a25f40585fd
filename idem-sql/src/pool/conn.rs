//! A checked-out connection ([`Conn`]) and what it records: whether every
//! statement sent on it was answered ([`ConnectionError`] says which errors
//! are answers); the deadpool [`Manager`](managed::Manager) that opens a
//! connection and lets a checkout reuse it.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use deadpool::managed::{self, Metrics, Object, RecycleError, RecycleResult};
use sqlx::{ConnectOptions, Connection};

/// An error that can tell whether the connection it came from is still in
/// step with the server: whether the server answered the statement
/// completely, so that the next statement finds nothing of this one on the
/// wire.
///
/// A backend implements it for its own error type, so that a call can run
/// several statements and decode their rows inside one [`Conn::run`] and
/// still be judged by what happened on the wire.
pub trait ConnectionError {
    /// `true` when the server answered (the protocol is in sync); `false`
    /// when the connection may be broken or out of step (I/O, TLS,
    /// protocol, a crashed worker, an error the backend cannot place).
    fn leaves_connection_sound(&self) -> bool;
}

/// The server answered a [`sqlx::Error::Database`] (an SQL error: a
/// constraint, a syntax error, a lock timeout, a serialization failure) and a
/// [`sqlx::Error::RowNotFound`] (a complete answer without a row). Anything
/// else may have left the connection out of step.
impl ConnectionError for sqlx::Error {
    fn leaves_connection_sound(&self) -> bool {
        matches!(self, Self::Database(_) | Self::RowNotFound)
    }
}

/// A check every new connection of a [`Pool`](crate::Pool) passes before
/// its first checkout (a backend's: "is this server one I may write to?").
/// A connection that fails it is closed, and the checkout that opened it
/// fails with the check's error.
///
/// A backend that needs its own error back wraps it in
/// [`sqlx::Error::Configuration`] and unwraps it from the checkout's error.
pub type ConnectCheck<C> = Arc<
    dyn for<'c> Fn(&'c mut C) -> Pin<Box<dyn Future<Output = Result<(), sqlx::Error>> + Send + 'c>>
        + Send
        + Sync,
>;

/// What is known of a connection's protocol state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// Every statement sent on it was answered: it is reused as it is.
    Sound,
    /// A statement was sent and its answer not read (its future is
    /// running, or was dropped).
    InFlight,
    /// A statement failed in a way that may have broken the connection.
    Broken,
}

/// A pooled connection and what the pool knows of it.
pub(super) struct Tracked<C> {
    pub(super) conn: C,
    pub(super) state: State,
    pub(super) opened: Instant,
    /// When it last went back to the pool.
    pub(super) returned: Instant,
    /// How long a dropped statement's answers and the ping may take.
    pub(super) revalidate_timeout: Option<Duration>,
    pub(super) counters: Arc<Counters>,
}

/// A connection checked out of a [`Pool`](crate::Pool), returned to it when
/// dropped.
///
/// The connection is lent only through [`Conn::run`], which records whether
/// the statements it ran left it sound. What happens on drop:
///
/// * **sound** (every statement answered): it goes back to the pool at once,
///   and the next checkout uses it with no round trip;
/// * **broken** (a statement failed on the wire): it is closed, and the pool
///   opens a new connection when it needs one;
/// * **in flight** (the [`Conn::run`] future was dropped before its
///   statements were answered: a timeout, a cancelled request): it keeps its
///   place in the pool while a task of the current tokio runtime waits for
///   the server's answers and pings it (the server is not interrupted); it
///   goes back to the pool if the ping is answered within the pool's
///   [revalidate timeout](crate::PoolConfig::revalidate_timeout) and is
///   closed otherwise. Without a runtime it goes back marked, and the next
///   checkout closes it instead of using it.
pub struct Conn<C: Connection + 'static> {
    obj: Option<Object<Manager<C>>>,
}

impl<C: Connection + 'static> std::fmt::Debug for Conn<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("state", &self.obj.as_ref().map(|o| o.state))
            .finish_non_exhaustive()
    }
}

impl<C: Connection + 'static> Conn<C> {
    pub(super) fn new(obj: Object<Manager<C>>) -> Self {
        Self { obj: Some(obj) }
    }

    /// Runs `call` on the connection: one or more statements, and whatever
    /// the caller decodes between them.
    ///
    /// The connection counts as in flight from the moment `call` starts
    /// until it returns: `Ok`, or an error whose
    /// [`leaves_connection_sound`](ConnectionError::leaves_connection_sound)
    /// is `true`, makes it sound again; any other error marks it broken
    /// (for good: a later `run` does not make a broken connection sound).
    ///
    /// # Errors
    ///
    /// What `call` returns.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), sqlx::Error> {
    /// use idem_sql::{Pool, PoolConfig};
    /// use sqlx::SqliteConnection;
    /// use sqlx::sqlite::SqliteConnectOptions;
    ///
    /// let pool: Pool<SqliteConnection> =
    ///     Pool::new("sqlite::memory:".parse::<SqliteConnectOptions>()?, PoolConfig::new(1));
    /// let mut conn = pool.get().await?;
    /// let one: i64 = conn
    ///     .run(|c| sqlx::query_scalar("SELECT 1").fetch_one(c))
    ///     .await?;
    /// assert_eq!(one, 1);
    /// # Ok(()) }
    /// ```
    pub async fn run<'a, T, E, F>(&'a mut self, call: impl FnOnce(&'a mut C) -> F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>> + Send,
        E: ConnectionError + Send,
        T: Send,
    {
        let tracked: &'a mut Tracked<C> = self.obj.as_mut().expect("present until dropped");
        let Tracked { conn, state, .. } = tracked;
        let before = *state;
        *state = State::InFlight;
        let result = call(conn).await;
        *state = match &result {
            _ if before == State::Broken => State::Broken,
            Ok(_) => State::Sound,
            Err(e) if e.leaves_connection_sound() => State::Sound,
            Err(_) => State::Broken,
        };
        result
    }
}

impl<C: Connection + 'static> Drop for Conn<C> {
    fn drop(&mut self) {
        let Some(mut obj) = self.obj.take() else {
            return;
        };
        match obj.state {
            State::Sound => obj.returned = Instant::now(),
            State::Broken => discard(obj),
            State::InFlight => {
                let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                    // Back to the pool marked: the next checkout closes it.
                    return;
                };
                runtime.spawn(revalidate(obj));
            }
        }
    }
}

/// Waits for the answers of the statements a dropped future left on the
/// connection, then for a ping, within the revalidate timeout: sound again,
/// or closed. The connection keeps its place in the pool meanwhile.
async fn revalidate<C: Connection + 'static>(mut obj: Object<Manager<C>>) {
    let pinged = match obj.revalidate_timeout {
        Some(limit) => matches!(
            tokio::time::timeout(limit, obj.conn.ping()).await,
            Ok(Ok(()))
        ),
        None => obj.conn.ping().await.is_ok(),
    };
    if pinged {
        obj.state = State::Sound;
        obj.returned = Instant::now();
        obj.counters.revalidated.fetch_add(1, Ordering::Relaxed);
    } else {
        discard(obj);
    }
}

/// Takes the connection out of the pool (freeing its place) and closes it.
fn discard<C: Connection + 'static>(obj: Object<Manager<C>>) {
    obj.counters.discarded.fetch_add(1, Ordering::Relaxed);
    drop(Object::take(obj));
}

/// What the pool did so far, counted by its connections.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) opened: AtomicU64,
    pub(super) reused: AtomicU64,
    pub(super) revalidated: AtomicU64,
    pub(super) discarded: AtomicU64,
}

/// Opens connections with the options it holds (and runs the pool's
/// [`ConnectCheck`] on each), and lets a checkout reuse an idle one only
/// when it is sound (no round trip) and neither too old nor idle too long.
pub(super) struct Manager<C: Connection + 'static> {
    pub(super) options: C::Options,
    pub(super) check: Option<ConnectCheck<C>>,
    pub(super) max_lifetime: Option<Duration>,
    pub(super) idle_timeout: Option<Duration>,
    pub(super) revalidate_timeout: Option<Duration>,
    pub(super) counters: Arc<Counters>,
}

impl<C: Connection + 'static> managed::Manager for Manager<C> {
    type Type = Tracked<C>;
    type Error = sqlx::Error;

    async fn create(&self) -> Result<Tracked<C>, sqlx::Error> {
        // Boxed: a driver's handshake future is large (TLS, authentication),
        // and every checkout's future would otherwise carry it inline for
        // the rare checkout that connects.
        let mut conn = Box::pin(self.options.connect()).await?;
        self.counters.opened.fetch_add(1, Ordering::Relaxed);
        if let Some(check) = &self.check
            && let Err(e) = check(&mut conn).await
        {
            self.counters.discarded.fetch_add(1, Ordering::Relaxed);
            // Closed politely; a close that fails changes nothing here.
            let _ = conn.close().await;
            return Err(e);
        }
        let now = Instant::now();
        Ok(Tracked {
            conn,
            state: State::Sound,
            opened: now,
            returned: now,
            revalidate_timeout: self.revalidate_timeout,
            counters: Arc::clone(&self.counters),
        })
    }

    async fn recycle(&self, t: &mut Tracked<C>, _: &Metrics) -> RecycleResult<sqlx::Error> {
        let stale =
            |limit: Option<Duration>, since: Instant| limit.is_some_and(|l| since.elapsed() >= l);
        if t.state != State::Sound
            || stale(self.max_lifetime, t.opened)
            || stale(self.idle_timeout, t.returned)
        {
            self.counters.discarded.fetch_add(1, Ordering::Relaxed);
            return Err(RecycleError::message("unsound, too old or idle too long"));
        }
        self.counters.reused.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
