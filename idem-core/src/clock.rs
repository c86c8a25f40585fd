//! Time, owned by the engine and passed into every store call.
//!
//! Stores never read their own clock to decide anything: the engine's `now`
//! goes into each call, so tests move time with a [`ManualClock`] instead of
//! sleeping. A backend's native TTL only collects garbage.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point in time: milliseconds since the Unix epoch.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(i64);

impl Timestamp {
    /// From milliseconds since the Unix epoch.
    #[must_use]
    pub const fn from_unix_millis(ms: i64) -> Self {
        Self(ms)
    }

    /// Milliseconds since the Unix epoch.
    #[must_use]
    pub const fn as_unix_millis(self) -> i64 {
        self.0
    }

    /// `self + d`, saturating.
    #[must_use]
    pub fn plus(self, d: Duration) -> Self {
        Self(
            self.0
                .saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        )
    }

    /// How long from `earlier` to `self`; zero if `earlier` is later.
    #[must_use]
    pub fn saturating_since(self, earlier: Self) -> Duration {
        Duration::from_millis(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timestamp({}ms)", self.0)
    }
}

/// A source of `now` for the engine.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The operating system's wall clock (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        Timestamp(ms)
    }
}

/// A clock that moves only when told to; clones share the same time.
///
/// ```
/// use std::time::Duration;
/// use idem_core::clock::{Clock, ManualClock};
///
/// let clock = ManualClock::starting_now();
/// let t0 = clock.now();
/// clock.advance(Duration::from_secs(61));
/// assert_eq!(clock.now().saturating_since(t0), Duration::from_secs(61));
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// A manual clock set to `t`.
    #[must_use]
    pub fn new(t: Timestamp) -> Self {
        Self(Arc::new(AtomicI64::new(t.0)))
    }

    /// A manual clock set to the current wall-clock time (so a backend's
    /// native expiry, if any, sees sensible durations).
    #[must_use]
    pub fn starting_now() -> Self {
        Self::new(SystemClock.now())
    }

    /// Moves time forward (saturating at the largest [`Timestamp`]).
    pub fn advance(&self, d: Duration) {
        let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let _ = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(ms))
            });
    }

    /// Sets the time.
    pub fn set(&self, t: Timestamp) {
        self.0.store(t.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
}

/// A shared clock is a clock (e.g. the `Arc<dyn Clock>` of
/// [`Idem::clock`](crate::Idem::clock), to give a second engine the same time).
impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Timestamp {
        C::now(self)
    }
}
