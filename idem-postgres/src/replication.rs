//! The start check: where a commit goes before the server answers it
//! ([`Replication`]), read when a store connects, in
//! [`PgStore::migrate`](crate::PgStore::migrate), and again after a
//! connection failed; a warning when commits are not synchronous to any
//! standby, an error when the store was asked to require it.

use std::sync::atomic::{AtomicBool, Ordering};

use sqlx::PgExecutor;
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

/// One store's check state, shared by its clones.
#[derive(Debug)]
pub(crate) struct Guard {
    /// [`PgStore::require_synchronous_replication`](crate::PgStore::require_synchronous_replication).
    pub(crate) require: bool,
    /// Set when the store has not checked the server it talks to yet, or a
    /// call lost its connection (the server may have changed: a failover);
    /// the next call checks first.
    recheck: AtomicBool,
    /// The warning is logged once per store.
    warned: AtomicBool,
    /// A store opened for reading ([`PgStore::connect_read_only`](crate::PgStore::connect_read_only)):
    /// a standby in recovery is accepted, and no warning is logged.
    accepts_standby: bool,
}

impl Guard {
    pub(crate) fn new(require: bool, checked: bool) -> Self {
        Self {
            require,
            recheck: AtomicBool::new(!checked),
            warned: AtomicBool::new(false),
            accepts_standby: false,
        }
    }

    /// The guard of a store opened for reading: it accepts a standby in
    /// recovery (a read replica) and logs no replication warning.
    pub(crate) fn for_reads() -> Self {
        Self {
            require: false,
            recheck: AtomicBool::new(true),
            warned: AtomicBool::new(true),
            accepts_standby: true,
        }
    }

    /// A guard with another requirement; the next call checks again.
    pub(crate) fn requiring(&self, require: bool) -> Self {
        Self {
            require,
            recheck: AtomicBool::new(true),
            warned: AtomicBool::new(self.warned.load(Ordering::Relaxed)),
            accepts_standby: false,
        }
    }

    pub(crate) fn needs_check(&self) -> bool {
        self.recheck.load(Ordering::Acquire)
    }

    pub(crate) fn suspect(&self) {
        self.recheck.store(true, Ordering::Release);
    }

    /// Judges what was read: a standby is always an error, a commit not
    /// synchronous to any standby is one only when required (otherwise one
    /// warning per store). Clears the recheck flag when the server passes.
    pub(crate) fn judge(&self, found: &Replication) -> Result<(), Error> {
        if found.in_recovery {
            if self.accepts_standby {
                self.recheck.store(false, Ordering::Release);
                return Ok(());
            }
            return Err(Error::Standby);
        }
        if self.accepts_standby {
            self.recheck.store(false, Ordering::Release);
            return Ok(());
        }
        if !found.is_synchronous() {
            if self.require {
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
        self.recheck.store(false, Ordering::Release);
        Ok(())
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
        let reads = Guard::for_reads();
        assert!(reads.needs_check());
        reads
            .judge(&r("on", "", true))
            .expect("a standby, for reads");
        assert!(!reads.needs_check());
        reads.judge(&r("on", "", false)).expect("a primary too");
        assert!(!reads.require);
    }

    #[test]
    fn the_guard_refuses_a_standby_always_and_async_only_when_required() {
        let relaxed = Guard::new(false, false);
        assert!(relaxed.needs_check());
        assert!(matches!(
            relaxed.judge(&r("on", "*", true)),
            Err(Error::Standby)
        ));
        assert!(relaxed.needs_check(), "a refused server stays suspect");
        relaxed
            .judge(&r("on", "", false))
            .expect("warned, not refused");
        assert!(!relaxed.needs_check());
        let strict = relaxed.requiring(true);
        assert!(strict.needs_check());
        assert!(matches!(
            strict.judge(&r("local", "*", false)),
            Err(Error::NotSynchronous { .. })
        ));
        strict
            .judge(&r("remote_apply", "ANY 1 (s1)", false))
            .expect("synchronous");
        assert!(!strict.needs_check());
        strict.suspect();
        assert!(strict.needs_check());
    }
}
