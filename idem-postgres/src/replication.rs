//! The start check: where a commit goes before the server answers it
//! ([`Replication`]), read when a store connects, in
//! [`PgStore::migrate`](crate::PgStore::migrate), and again after a
//! connection failed; a warning when commits are not synchronous to any
//! standby, an error when the store was asked to require it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idem_sql::ConnectCheck;
use sqlx::{PgConnection, PgExecutor};
use tracing::{info, warn};

use crate::error::Error;

/// What the server said about its commits, read with
/// `current_setting('synchronous_commit')`,
/// `current_setting('synchronous_standby_names')` and `pg_is_in_recovery()`
/// on one of the store's connections (so a per-session `synchronous_commit`
/// set in the connect options is what is read).
///
/// Returned by [`PgStore::migrate`](crate::PgStore::migrate) and
/// [`PgStore::check_replication`](crate::PgStore::check_replication); see the
/// crate docs' durability table for what each setting keeps after a crash or
/// a failover.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Replication {
    /// `synchronous_commit`: `on`, `remote_apply`, `remote_write`, `local`
    /// or `off`.
    pub synchronous_commit: String,
    /// `synchronous_standby_names`, as configured (empty: no synchronous
    /// standby).
    pub synchronous_standby_names: String,
    /// Whether the server is a standby in recovery (read-only).
    pub in_recovery: bool,
}

impl Replication {
    /// Whether a commit waits for at least one standby before it returns:
    /// `synchronous_standby_names` names one, and `synchronous_commit` is
    /// `on`, `remote_write` or `remote_apply` (`local` and `off` do not wait
    /// for any standby whatever the names say).
    #[must_use]
    pub fn is_synchronous(&self) -> bool {
        !self.synchronous_standby_names.trim().is_empty()
            && matches!(
                self.synchronous_commit.as_str(),
                "on" | "remote_write" | "remote_apply"
            )
    }

    /// Whether a commit may return before it is flushed to the primary's own
    /// disk (`synchronous_commit = off`): a crash of the server itself can
    /// then lose the last acknowledged commits.
    #[must_use]
    pub fn is_local_flush_skipped(&self) -> bool {
        self.synchronous_commit == "off"
    }

    /// Reads the three settings in one statement.
    pub(crate) async fn read<'c>(conn: impl PgExecutor<'c>) -> Result<Self, sqlx::Error> {
        let (synchronous_commit, synchronous_standby_names, in_recovery) = sqlx::query_as(
            "SELECT current_setting('synchronous_commit'), \
             current_setting('synchronous_standby_names'), pg_is_in_recovery()",
        )
        .fetch_one(conn)
        .await?;
        Ok(Self {
            synchronous_commit,
            synchronous_standby_names,
            in_recovery,
        })
    }
}

/// How often a store that requires synchronous replication checks the
/// server again, unless configured otherwise
/// ([`PgStore::with_replication_check_period`](crate::PgStore::with_replication_check_period)).
pub(crate) const DEFAULT_CHECK_PERIOD: Duration = Duration::from_secs(5);

/// One store's check state, shared by its clones and by its pool's
/// new-connection check.
///
/// A write checks the server first when the guard says so: the server was
/// never checked, a call lost its connection (a failover may have changed
/// the server), the last check failed (latched: every write checks, and is
/// refused, until a check passes), or, on a store that requires
/// synchronous replication, the check period has passed since the last
/// check (one write of the many due at once runs it).
#[derive(Debug)]
pub(crate) struct Guard {
    /// [`PgStore::require_synchronous_replication`](crate::PgStore::require_synchronous_replication).
    require: AtomicBool,
    /// Set when the store has not checked the server it talks to yet, a
    /// call lost its connection, or the last check failed: the next write
    /// checks first.
    recheck: AtomicBool,
    /// The warning is logged once per store.
    warned: AtomicBool,
    /// A store opened for reading ([`PgStore::connect_read_only`](crate::PgStore::connect_read_only)):
    /// a standby in recovery is accepted, and no warning is logged.
    accepts_standby: bool,
    /// The period of the checks of a requiring store, in nanoseconds.
    period_ns: AtomicU64,
    /// When the next periodic check is due, in nanoseconds since `epoch`.
    due_ns: AtomicU64,
    epoch: Instant,
}

impl Guard {
    /// The guard of a store for writes: `checked` when the server was
    /// checked already.
    pub(crate) fn new(checked: bool) -> Self {
        Self {
            require: AtomicBool::new(false),
            recheck: AtomicBool::new(!checked),
            warned: AtomicBool::new(false),
            accepts_standby: false,
            period_ns: AtomicU64::new(nanos(DEFAULT_CHECK_PERIOD)),
            due_ns: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// The guard of a store opened for reading: it accepts a standby in
    /// recovery (a read replica) and logs no replication warning.
    pub(crate) fn for_reads() -> Self {
        Self {
            warned: AtomicBool::new(true),
            accepts_standby: true,
            ..Self::new(false)
        }
    }

    /// Requires synchronous replication from now on; the next write checks.
    pub(crate) fn require(&self) {
        self.require.store(true, Ordering::Release);
        self.suspect();
    }

    /// Takes a requirement back (one whose first check failed); the next
    /// write checks again.
    pub(crate) fn relax(&self) {
        self.require.store(false, Ordering::Release);
        self.suspect();
    }

    pub(crate) fn requires(&self) -> bool {
        self.require.load(Ordering::Acquire)
    }

    /// Checks a requiring store's server every `period` (zero: before
    /// every write).
    pub(crate) fn set_period(&self, period: Duration) {
        self.period_ns.store(nanos(period), Ordering::Release);
    }

    pub(crate) fn period(&self) -> Duration {
        Duration::from_nanos(self.period_ns.load(Ordering::Acquire))
    }

    /// Whether a write at `now` checks the server first. Of the writes of a
    /// requiring store that find the period passed at once, one checks (it
    /// moves the next check a period on); the others go on, as they would
    /// have a moment earlier.
    pub(crate) fn needs_check(&self, now: Instant) -> bool {
        if self.recheck.load(Ordering::Acquire) {
            return true;
        }
        if !self.requires() {
            return false;
        }
        let at = self.since_epoch(now);
        let due = self.due_ns.load(Ordering::Acquire);
        at >= due
            && self
                .due_ns
                .compare_exchange(
                    due,
                    at.saturating_add(self.period_ns.load(Ordering::Acquire)),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
    }

    pub(crate) fn suspect(&self) {
        self.recheck.store(true, Ordering::Release);
    }

    /// Judges what was read at `now`: a standby is always an error, a commit
    /// not synchronous to any standby is one only when required (otherwise
    /// one warning per store). A server that passes clears the recheck flag
    /// and starts a new period; one that fails latches it, so that every
    /// write checks (and is refused) until a check passes.
    pub(crate) fn judge(&self, found: &Replication, now: Instant) -> Result<(), Error> {
        let verdict = self.verdict(found);
        if verdict.is_ok() {
            self.due_ns.store(
                self.since_epoch(now)
                    .saturating_add(self.period_ns.load(Ordering::Acquire)),
                Ordering::Release,
            );
            self.recheck.store(false, Ordering::Release);
        } else {
            self.suspect();
        }
        verdict
    }

    fn verdict(&self, found: &Replication) -> Result<(), Error> {
        if self.accepts_standby {
            return Ok(());
        }
        if found.in_recovery {
            return Err(Error::Standby);
        }
        if !found.is_synchronous() {
            if self.requires() {
                return Err(Error::NotSynchronous {
                    synchronous_commit: found.synchronous_commit.clone(),
                    synchronous_standby_names: found.synchronous_standby_names.clone(),
                });
            }
            if !self.warned.swap(true, Ordering::Relaxed) {
                warn!(
                    synchronous_commit = %found.synchronous_commit,
                    synchronous_standby_names = %found.synchronous_standby_names,
                    "idem-postgres: commits are not synchronous to any standby; a failover to a \
                     standby can lose idempotency records whose calls were already answered, and \
                     their work then runs again{}. See the durability table of idem_postgres, \
                     or call PgStore::require_synchronous_replication to refuse to run without it",
                    if found.is_local_flush_skipped() {
                        "; with synchronous_commit = off a crash of the server itself can too"
                    } else {
                        ""
                    }
                );
            }
        }
        Ok(())
    }

    fn since_epoch(&self, now: Instant) -> u64 {
        nanos(now.saturating_duration_since(self.epoch))
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The check every new connection of a store's own pool passes before it
/// serves a call: where its commits go, judged by the store's guard. A
/// connection opened after a failover, or replacing one past its idle
/// timeout or lifetime, reaches whatever server the address now names; a
/// standby, or a server without a synchronous standby when the store
/// requires one, is refused before a write runs on it (the checkout fails
/// with the guard's error, wrapped for the pool: see [`unwrap_checkout`]).
pub(crate) fn connect_check(guard: &Arc<Guard>) -> ConnectCheck<PgConnection> {
    let guard = Arc::clone(guard);
    Arc::new(move |conn: &mut PgConnection| {
        let guard = Arc::clone(&guard);
        Box::pin(async move {
            let found = Replication::read(&mut *conn).await?;
            guard
                .judge(&found, Instant::now())
                .map_err(|e| sqlx::Error::Configuration(Box::new(e)))
        })
    })
}

/// Refuses a connection to a server whose commits do not wait for a
/// synchronous standby, or to a standby in recovery: the check a store
/// built by [`PgStore::connect_with`](crate::PgStore::connect_with) runs on
/// every new connection, for a pool you build yourself and give to
/// [`PgStore::new`](crate::PgStore::new) (which cannot reach into your
/// pool). Install it as the pool's `after_connect` hook, with
/// [`PgStore::require_synchronous_replication`](crate::PgStore::require_synchronous_replication)
/// on the store:
///
/// ```no_run
/// # async fn f() -> Result<(), idem_postgres::Error> {
/// use idem_postgres::sqlx::postgres::PgPoolOptions;
/// use idem_postgres::{PgStore, refuse_without_synchronous_standby};
///
/// let pool = PgPoolOptions::new()
///     .acquire_timeout(std::time::Duration::from_secs(2))
///     .test_before_acquire(false)
///     .after_connect(|conn, _meta| Box::pin(refuse_without_synchronous_standby(conn)))
///     .connect_lazy("postgres://app@db.internal/app")?;
/// let store = PgStore::new(pool).require_synchronous_replication().await?;
/// # Ok(()) }
/// ```
///
/// sqlx closes a connection its hook refused and tries a new one until the
/// pool's `acquire_timeout`: a store call then fails with `PoolTimedOut`
/// ([`StoreError::Unavailable`](idem_core::store::StoreError), 503), having
/// written nothing. Keep that timeout short (the store's own pool answers
/// [`Error::NotSynchronous`] at once instead).
///
/// # Errors
///
/// [`sqlx::Error::Configuration`] holding [`Error::NotSynchronous`] or
/// [`Error::Standby`], or the driver's error when the settings cannot be
/// read.
pub async fn refuse_without_synchronous_standby(
    conn: &mut PgConnection,
) -> Result<(), sqlx::Error> {
    let found = Replication::read(&mut *conn).await?;
    let refused = if found.in_recovery {
        Some(Error::Standby)
    } else if found.is_synchronous() {
        None
    } else {
        Some(Error::NotSynchronous {
            synchronous_commit: found.synchronous_commit,
            synchronous_standby_names: found.synchronous_standby_names,
        })
    };
    refused.map_or(Ok(()), |e| Err(sqlx::Error::Configuration(Box::new(e))))
}

/// A checkout's error: the new-connection check's own error if it refused
/// the connection, the driver's otherwise.
pub(crate) fn unwrap_checkout(e: sqlx::Error) -> Error {
    match e {
        sqlx::Error::Configuration(inner) => match inner.downcast::<Error>() {
            Ok(refused) => *refused,
            Err(other) => Error::Sqlx(sqlx::Error::Configuration(other)),
        },
        other => Error::Sqlx(other),
    }
}

/// `migrate()`'s report of what it found.
pub(crate) fn report(found: &Replication) {
    info!(
        synchronous_commit = %found.synchronous_commit,
        synchronous_standby_names = %found.synchronous_standby_names,
        in_recovery = found.in_recovery,
        synchronous = found.is_synchronous(),
        "idem-postgres: commit durability"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(commit: &str, names: &str, in_recovery: bool) -> Replication {
        Replication {
            synchronous_commit: commit.to_owned(),
            synchronous_standby_names: names.to_owned(),
            in_recovery,
        }
    }

    /// `guard`'s judgement at `now` of a server at `commit`, `names`,
    /// `in_recovery`.
    fn judge(guard: &Guard, now: Instant, server: (&str, &str, bool)) -> Result<(), Error> {
        guard.judge(&r(server.0, server.1, server.2), now)
    }

    #[test]
    fn synchronous_needs_a_name_and_a_waiting_level() {
        for level in ["on", "remote_write", "remote_apply"] {
            assert!(r(level, "*", false).is_synchronous(), "{level}");
            assert!(r(level, "ANY 1 (a, b)", false).is_synchronous(), "{level}");
            assert!(!r(level, "", false).is_synchronous(), "{level}");
            assert!(!r(level, "  ", false).is_synchronous(), "{level}");
        }
        for level in ["local", "off"] {
            assert!(!r(level, "*", false).is_synchronous(), "{level}");
        }
        assert!(r("off", "", false).is_local_flush_skipped());
        assert!(!r("local", "", false).is_local_flush_skipped());
    }

    #[test]
    fn a_guard_for_reads_accepts_a_standby_and_never_requires_sync() {
        let now = Instant::now();
        let reads = Guard::for_reads();
        assert!(reads.needs_check(now));
        judge(&reads, now, ("on", "", true)).expect("a standby, for reads");
        assert!(!reads.needs_check(now));
        judge(&reads, now, ("on", "", false)).expect("a primary too");
        assert!(!reads.requires());
    }

    #[test]
    fn the_guard_refuses_a_standby_always_and_async_only_when_required() {
        let now = Instant::now();
        let guard = Guard::new(false);
        assert!(guard.needs_check(now));
        assert!(matches!(
            guard.judge(&r("on", "*", true), now),
            Err(Error::Standby)
        ));
        assert!(guard.needs_check(now), "a refused server stays suspect");
        judge(&guard, now, ("on", "", false)).expect("warned, not refused");
        assert!(!guard.needs_check(now));
        guard.require();
        assert!(guard.needs_check(now));
        assert!(matches!(
            guard.judge(&r("local", "*", false), now),
            Err(Error::NotSynchronous { .. })
        ));
        judge(&guard, now, ("remote_apply", "ANY 1 (s1)", false)).expect("synchronous");
        assert!(!guard.needs_check(now));
        guard.suspect();
        assert!(guard.needs_check(now));
    }

    #[test]
    fn a_failed_check_latches_until_one_passes() {
        let now = Instant::now();
        let guard = Guard::new(true);
        guard.require();
        guard.set_period(Duration::from_secs(3600));
        judge(&guard, now, ("on", "s1", false)).expect("synchronous");
        assert!(!guard.needs_check(now));
        // A check outside the write path (check_replication) fails: every
        // write checks again, however early in the period.
        assert!(guard.judge(&r("on", "", false), now).is_err());
        for _ in 0..3 {
            assert!(guard.needs_check(now), "latched");
        }
        guard.judge(&r("on", "s1", false), now).expect("restored");
        assert!(!guard.needs_check(now));
    }

    #[test]
    fn a_requiring_guard_checks_once_per_period() {
        let guard = Guard::new(false);
        let start = Instant::now();
        guard.require();
        guard.set_period(Duration::from_secs(5));
        assert_eq!(guard.period(), Duration::from_secs(5));
        guard
            .judge(&r("on", "s1", false), start)
            .expect("synchronous");
        assert!(!guard.needs_check(start + Duration::from_secs(4)));
        let due = start + Duration::from_secs(5);
        assert!(
            guard.needs_check(due),
            "the first write of the period checks"
        );
        assert!(!guard.needs_check(due), "the others go on");
        assert!(guard.needs_check(due + Duration::from_secs(5)));
        // Not required: no periodic check at all.
        let relaxed = Guard::new(true);
        relaxed.set_period(Duration::ZERO);
        assert!(!relaxed.needs_check(start + Duration::from_secs(3600)));
        // A zero period: every write of a requiring store checks.
        guard.set_period(Duration::ZERO);
        guard
            .judge(&r("on", "s1", false), due)
            .expect("synchronous");
        assert!(guard.needs_check(due));
        assert!(guard.needs_check(due));
    }

    #[test]
    fn a_refused_new_connection_gives_the_guards_error_back() {
        let wrapped = sqlx::Error::Configuration(Box::new(Error::Standby));
        assert!(matches!(unwrap_checkout(wrapped), Error::Standby));
        assert!(matches!(
            unwrap_checkout(sqlx::Error::PoolTimedOut),
            Error::Sqlx(sqlx::Error::PoolTimedOut)
        ));
    }
}
