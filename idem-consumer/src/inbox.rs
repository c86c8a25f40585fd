//! The transactional inbox on a SQL store (feature `sql`: Postgres, MySQL,
//! MariaDB, SQLite): the claim, the work's own writes and the stored outcome
//! commit in one transaction, and the broker is told what to do only after
//! the commit.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use idem_core::{Attempt, Outcome, Storable};
use idem_sql::{SqlIdemExt, TxConnection, TxFuture, TxStore};

use crate::config::Consumer;
use crate::disposition::{Disposition, Processed};
use crate::process::{Delivered, rejected};

impl<S: TxStore> Consumer<S> {
    /// [`Consumer::process`] inside one transaction of a SQL store (Postgres,
    /// MySQL, MariaDB, SQLite): the claim, every write `work` makes on the
    /// connection it is given, and the stored outcome commit together
    /// ([`SqlIdemExt::execute_in_tx`]), so a message's local effect is
    /// applied exactly once. Tell the broker the returned
    /// [`Disposition`] only after this returns: the commit has happened (or
    /// the transaction rolled back, and the disposition is a retry).
    ///
    /// A transient outcome, a dropped future or a crash rolls everything back,
    /// the claim included: the next delivery runs the work again as a fresh
    /// attempt. Write with `&mut *conn` and neither commit nor roll back.
    pub async fn process_in_tx<T, E, O, F>(
        &self,
        message_id: &str,
        payload: &[u8],
        work: F,
    ) -> Processed<T, E>
    where
        T: Storable,
        E: Storable + fmt::Debug,
        O: Into<Outcome<T, E>> + Send,
        F: for<'c> FnOnce(Attempt, &'c mut TxConnection<S>) -> TxFuture<'c, O> + Send,
    {
        self.delivery(1)
            .process_in_tx(message_id, payload, work)
            .await
    }
}

impl<S: TxStore> Delivered<'_, S> {
    /// [`Consumer::process_in_tx`] for this delivery (its count sets a
    /// retry's backoff).
    pub async fn process_in_tx<T, E, O, F>(
        self,
        message_id: &str,
        payload: &[u8],
        work: F,
    ) -> Processed<T, E>
    where
        T: Storable,
        E: Storable + fmt::Debug,
        O: Into<Outcome<T, E>> + Send,
        F: for<'c> FnOnce(Attempt, &'c mut TxConnection<S>) -> TxFuture<'c, O> + Send,
    {
        let consumer = self.consumer();
        let retry = Disposition::Retry {
            after: consumer.backoff(self.count()),
        };
        let prepared = match consumer.prepare(message_id, payload) {
            Ok(p) => p,
            Err(e) => return rejected(message_id, &e, retry),
        };
        let recovery = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&recovery);
        let result = consumer
            .idem()
            .execute_prepared_in_tx(prepared, move |attempt: Attempt, conn| {
                seen.store(attempt.is_recovery(), Ordering::Relaxed);
                work(attempt, conn)
            })
            .await;
        match result {
            Ok(reply) if reply.is_replay() => self.replayed(reply),
            Ok(reply) => self.executed(message_id, reply, recovery.load(Ordering::Relaxed)),
            Err(e) => rejected(message_id, &e, retry),
        }
    }
}
