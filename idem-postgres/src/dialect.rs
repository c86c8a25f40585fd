//! [`PgDialect`]: how every statement of the store is bound and read on one
//! connection, for [`idem_sql::SqlCore`], and the replication check and
//! call timeout around its writes. The SQL text is [`crate::sql`]'s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::RecordId;
use idem_core::clock::Timestamp;
use idem_core::store::{
    ClaimOutcome, ClaimRequest, PurgeReport, RecordSummary, StoreError, StoredRecord,
};
use idem_sql::{
    BatchCompletion, BindRecord, Coalescing, Dialect, SettleClaim, SharedStatements, SqlCore,
};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Postgres, Row};

use crate::error::{BACKEND, Error, is_lock_timeout, may_have_switched};
use crate::replication::{self, Guard, Replication};
use crate::sql::{Statements, TableName, q};

/// The PostgreSQL dialect of the SQL store: its statements for one schema
/// and table, the replication guard, the call timeout and the
/// transactional mode's lock bound. [`PgStore`](crate::PgStore) runs on
/// it; it has no API of its own.
#[derive(Clone)]
pub struct PgDialect {
    pub(crate) name: Arc<TableName>,
    pub(crate) sql: Arc<Statements>,
    pub(crate) tx_lock_timeout: Duration,
    pub(crate) call_timeout: Option<Duration>,
    pub(crate) guard: Arc<Guard>,
}

impl std::fmt::Debug for PgDialect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgDialect")
            .field("table", &self.name.qualified())
            .field("tx_lock_timeout", &self.tx_lock_timeout)
            .field("call_timeout", &self.call_timeout)
            .field("require_synchronous_replication", &self.guard.requires())
            .field("replication_check_period", &self.guard.period())
            .finish_non_exhaustive()
    }
}

impl PgDialect {
    /// The dialect for table `name`, no call timeout.
    pub(crate) fn new(name: TableName, tx_lock_timeout: Duration, guard: Arc<Guard>) -> Self {
        Self {
            sql: Arc::new(Statements::new(&name)),
            name: Arc::new(name),
            tx_lock_timeout,
            call_timeout: None,
            guard,
        }
    }

    /// The same dialect on another table.
    pub(crate) fn renamed(&self, name: TableName) -> Self {
        Self {
            sql: Arc::new(Statements::new(&name)),
            name: Arc::new(name),
            ..self.clone()
        }
    }

    /// Makes the server suspect if `e` says it may have changed.
    fn suspect_if_switched(&self, e: &StoreError) {
        if may_have_switched(e) {
            self.guard.suspect();
        }
    }

    /// `fut` within the call timeout, if one is set.
    async fn within_call_timeout<T>(
        &self,
        fut: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match self.call_timeout {
            None => fut.await,
            Some(after) => tokio::time::timeout(after, fut)
                .await
                .unwrap_or_else(|_| Err(Error::Timeout { after }.into())),
        }
    }
}

/// Reads where the server's commits go, on one of the store's connections,
/// and judges it (see [`PgStore::check_replication`](crate::PgStore::check_replication)).
pub(crate) async fn check_replication(core: &SqlCore<PgDialect>) -> Result<Replication, Error> {
    let found: Result<Replication, Error> =
        idem_sql::on_conn!(core, |conn| async { Ok(Replication::read(conn).await?) });
    let found = found?;
    core.dialect().guard.judge(&found, Instant::now())?;
    Ok(found)
}

/// The replication check, if the server is unchecked or suspect.
async fn ensure_checked(core: &SqlCore<PgDialect>) -> Result<(), StoreError> {
    if core.dialect().guard.needs_check(Instant::now()) {
        // Boxed: the rare path keeps its (checkout-sized) future out of
        // every call's.
        Box::pin(check_replication(core)).await?;
    }
    Ok(())
}

/// What a connection of the store's own pool is after a call that failed
/// with this error: sound when every statement was answered and the
/// session goes on (the server's own errors, except those that end the
/// session; decoding, which reads rows a statement already returned in
/// full; the replication check's verdicts), otherwise re-validated or
/// replaced (see [`idem_sql::Conn`]).
pub(crate) fn leaves_connection_sound(e: &Error) -> bool {
    match e {
        Error::Sqlx(e) => sqlx_leaves_connection_sound(e),
        Error::Corrupt { .. }
        | Error::Standby
        | Error::NotSynchronous { .. }
        | Error::ClaimContention { .. }
        | Error::InvalidIdentifier { .. }
        | Error::Layout(_) => true,
        Error::Timeout { .. } => false,
    }
}

/// [`leaves_connection_sound`] for the driver's error.
fn sqlx_leaves_connection_sound(e: &sqlx::Error) -> bool {
    idem_sql::leaves_connection_sound(
        e,
        |e| matches!(e, sqlx::Error::Database(db) if ends_session(db.as_ref())),
    )
}

/// Whether the server ends the session after this error: a `FATAL` or
/// `PANIC` (`pg_terminate_backend`, a shutdown, an idle-session timeout),
/// or a connection exception (class `08`).
fn ends_session(db: &dyn sqlx::error::DatabaseError) -> bool {
    let fatal = db
        .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
        .is_some_and(|pg| {
            matches!(
                pg.severity(),
                sqlx::postgres::PgSeverity::Fatal | sqlx::postgres::PgSeverity::Panic
            )
        });
    fatal || db.code().is_some_and(|c| c.starts_with("08"))
}

/// `sql` (the claim or the takeover) with the claim's nine parameters bound.
fn claim_query<'q>(
    sql: &Arc<str>,
    req: &'q ClaimRequest<'_>,
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    q(sql)
        .bind_identity(req.id)
        .bind(req.fingerprint.as_bytes().as_slice())
        .bind(req.token.as_i64())
        .bind(req.now.as_unix_millis())
        .bind(req.lease_until.as_unix_millis())
        .bind(req.key_expires_at.as_unix_millis())
        .bind_id(req.id)
}

/// A batch's length, bound as its statement's `LIMIT` (see the batch
/// statements in `sql.rs`: it removes no row, it shapes the kept plan).
fn batch_len(len: usize) -> i64 {
    i64::try_from(len).unwrap_or(i64::MAX)
}

/// Reads the record `id` from the row, refusing anything a record cannot
/// hold and another identity sharing its key.
fn decode_record(row: &PgRow, id: &RecordId) -> Result<StoredRecord, Error> {
    idem_sql::check_identity::<_, &str>(row, id)?;
    Ok(idem_sql::decode_record::<_, i32>(row, BACKEND)?)
}

/// The `attempt` column, refusing a negative one.
fn attempt_of(row: &PgRow) -> Result<u32, Error> {
    Ok(idem_sql::attempt_of::<_, i32>(row)?)
}

/// The claim's row, settled as alone (for a batch too): `kind` names a
/// won claim; a takeover is one statement on exactly the version read (its
/// token), which returns the new attempt and the resource id it keeps.
impl SettleClaim for PgDialect {
    fn won(&self, _: &ClaimRequest<'_>, row: &PgRow) -> Result<Option<u32>, Error> {
        let kind: String = row.try_get("kind")?;
        (kind == "claimed").then(|| attempt_of(row)).transpose()
    }

    fn standing(&self, req: &ClaimRequest<'_>, row: &PgRow) -> Result<StoredRecord, Error> {
        decode_record(row, req.id)
    }

    async fn take_over(
        &self,
        conn: &mut PgConnection,
        req: &ClaimRequest<'_>,
        row: &PgRow,
        _: &StoredRecord,
        _: bool,
    ) -> Result<Option<(u32, Option<String>)>, Error> {
        let seen: i64 = row.try_get("token")?;
        let took = claim_query(&self.sql.takeover, req)
            .bind(seen)
            .fetch_optional(&mut *conn)
            .await?;
        took.map(|row| Ok((attempt_of(&row)?, row.try_get("resource_id")?)))
            .transpose()
    }
}

/// On PostgreSQL every transition is one statement (two for a takeover),
/// run again only when it lost a race to a concurrent writer on the same
/// record, which the next run, with a fresh snapshot, sees committed. One
/// purge round is one statement over one batch of the sweep index.
///
/// Every write runs within the call timeout, after the replication check
/// when the server is unchecked or suspect; a lost connection makes it
/// suspect. The transactional mode bounds the wait for a concurrent
/// duplicate with `SET LOCAL lock_timeout`, runs a lost race again in the
/// same transaction, checks the server first, and bounds its commit by
/// the call timeout.
impl Dialect for PgDialect {
    type Db = Postgres;
    type Error = Error;

    const BACKEND: &'static str = BACKEND;

    /// On: a batch is one statement (`unnest` arrays into the claim and
    /// the completion), one round trip and one commit for all its calls.
    const COALESCING: Coalescing = Coalescing::WhenBusy;

    fn driver_error(e: sqlx::Error) -> Error {
        Error::Sqlx(e)
    }

    fn checkout_error(e: sqlx::Error) -> Error {
        replication::unwrap_checkout(e)
    }

    fn table(&self) -> String {
        self.name.qualified()
    }

    /// The table's comment, if the table exists.
    async fn layout_mark(&self, conn: &mut PgConnection) -> Result<Option<Option<String>>, Error> {
        Ok(sqlx::query_scalar(
            "SELECT obj_description(c.oid, 'pg_class') FROM pg_class c \
             WHERE c.oid = to_regclass($1)",
        )
        .bind(self.name.qualified())
        .fetch_optional(conn)
        .await?)
    }

    fn shared(&self) -> &SharedStatements {
        &self.sql.shared
    }

    fn statement(&self, name: &str) -> Option<&str> {
        Some(match name {
            "claim" => &self.sql.claim,
            "claim_batch" => &self.sql.claim_batch,
            "takeover" => &self.sql.takeover,
            "complete_batch" => &self.sql.complete_batch,
            "purge" => &self.sql.purge,
            _ => return None,
        })
    }

    fn decode_record(row: &PgRow, id: &RecordId) -> Result<StoredRecord, Error> {
        decode_record(row, id)
    }

    fn decode_summary(row: &PgRow) -> Result<RecordSummary, Error> {
        Ok(idem_sql::decode_summary::<_, i32>(row, idem_sql::text)?)
    }

    fn leaves_connection_sound(e: &Error) -> bool {
        leaves_connection_sound(e)
    }

    /// Runs the claim statement once on `conn` (a pool or a transaction).
    /// `None`: it lost a race and must be run again (see the claim statement in `sql.rs`).
    async fn claim_once(
        &self,
        conn: &mut PgConnection,
        req: &ClaimRequest<'_>,
    ) -> Result<Option<ClaimOutcome>, Error> {
        let claim = claim_query(&self.sql.claim, req);
        let Some(row) = claim.fetch_optional(&mut *conn).await? else {
            return Ok(None);
        };
        self.settle(conn, req, &row).await
    }

    async fn claim_batch(
        &self,
        conn: &mut PgConnection,
        reqs: &[ClaimRequest<'_>],
    ) -> Result<Vec<Option<ClaimOutcome>>, Error> {
        let each = |f: fn(&ClaimRequest<'_>) -> i64| reqs.iter().map(f).collect::<Vec<i64>>();
        let keys: Vec<[u8; 16]> = reqs.iter().map(|r| idem_sql::record_key(r.id)).collect();
        let rows = q(&self.sql.claim_batch)
            .bind(reqs.iter().map(|r| r.id.owner()).collect::<Vec<_>>())
            .bind(reqs.iter().map(|r| r.id.operation()).collect::<Vec<_>>())
            .bind(reqs.iter().map(|r| r.id.key().as_str()).collect::<Vec<_>>())
            .bind(
                reqs.iter()
                    .map(|r| r.fingerprint.as_bytes().as_slice())
                    .collect::<Vec<_>>(),
            )
            .bind(each(|r| r.token.as_i64()))
            .bind(each(|r| r.now.as_unix_millis()))
            .bind(each(|r| r.lease_until.as_unix_millis()))
            .bind(each(|r| r.key_expires_at.as_unix_millis()))
            .bind(keys.iter().map(|k| &k[..]).collect::<Vec<_>>())
            .bind(batch_len(reqs.len()))
            .fetch_all(&mut *conn)
            .await?;
        self.settle_batch(conn, reqs, &keys, &rows).await
    }

    async fn complete_batch(
        &self,
        conn: &mut PgConnection,
        items: &[BatchCompletion<'_>],
    ) -> Result<Vec<bool>, Error> {
        let keys: Vec<[u8; 16]> = items.iter().map(|i| idem_sql::record_key(i.id)).collect();
        let each = |f: fn(&BatchCompletion<'_>) -> i64| items.iter().map(f).collect::<Vec<i64>>();
        let rows = q(&self.sql.complete_batch)
            .bind(keys.iter().map(|k| &k[..]).collect::<Vec<_>>())
            .bind(each(|i| i.token.as_i64()))
            .bind(
                items
                    .iter()
                    .map(|i| i.completion.outcome.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(items.iter().map(|i| i.completion.body).collect::<Vec<_>>())
            .bind(each(|i| i.completion.response_expires_at.as_unix_millis()))
            .bind(each(|i| i.completion.key_expires_at.as_unix_millis()))
            .bind(
                items
                    .iter()
                    .map(|i| i.completion.resource_id)
                    .collect::<Vec<_>>(),
            )
            .bind(batch_len(items.len()))
            .fetch_all(&mut *conn)
            .await?;
        let mut applied = vec![false; items.len()];
        for row in &rows {
            applied[idem_sql::batch_position(row, &keys)?] = true;
        }
        for (at, item) in items.iter().enumerate() {
            if !applied[at] {
                applied[at] = self
                    .completed_under(&mut *conn, item.id, item.token)
                    .await?;
            }
        }
        Ok(applied)
    }

    async fn purge_round(
        &self,
        conn: &mut PgConnection,
        now: Timestamp,
        limit: u32,
    ) -> Result<(PurgeReport, u64), Error> {
        // Planned at every run (an unnamed statement), for the table as it
        // is: a purge is rare, and the plan Postgres would keep, made on a
        // small table, reaches the rows it deletes by reading the whole
        // table, twice a round, at any size after.
        let row = q(&self.sql.purge)
            .persistent(false)
            .bind(now.as_unix_millis())
            .bind(i64::from(limit))
            .fetch_one(conn)
            .await?;
        let count = |col: &str| -> Result<u64, Error> {
            let n: i64 = row.try_get(col)?;
            Ok(u64::try_from(n).unwrap_or(0))
        };
        let report = PurgeReport {
            keys_removed: count("keys_removed")?,
            bodies_dropped: count("bodies_dropped")?,
        };
        Ok((report, count("refiled")?))
    }

    fn begin_statement(&self) -> String {
        // An integer from a `Duration`: nothing to escape.
        let ms = self.tx_lock_timeout.as_millis().max(1);
        format!("BEGIN; SET LOCAL lock_timeout = {ms}")
    }

    fn is_lock_timeout(e: &Error) -> bool {
        matches!(e, Error::Sqlx(e) if is_lock_timeout(e))
    }

    fn contention(tries: u32) -> StoreError {
        Error::ClaimContention { tries }.into()
    }

    /// First the replication check if the server is unchecked or suspect,
    /// then `call`, within the call timeout if one is set; a lost
    /// connection makes the server suspect (checked again before the next
    /// call).
    async fn write<T: Send>(
        core: &SqlCore<Self>,
        call: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> Result<T, StoreError> {
        let run = async {
            ensure_checked(core).await?;
            call.await
        };
        let result = core.dialect().within_call_timeout(run).await;
        if let Err(e) = &result {
            core.dialect().suspect_if_switched(e);
        }
        result
    }

    async fn before_tx(core: &SqlCore<Self>) -> Result<(), StoreError> {
        // The replication check (after a lost connection, or for a store
        // that never checked), as for the store's own calls.
        ensure_checked(core).await
    }

    fn observe(&self, e: &StoreError) {
        self.suspect_if_switched(e);
    }

    async fn bounded<T: Send>(
        &self,
        fut: impl Future<Output = Result<T, StoreError>> + Send,
    ) -> Result<T, StoreError> {
        self.within_call_timeout(fut).await
    }
}
