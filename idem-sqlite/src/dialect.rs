//! [`SqliteDialect`]: how every statement of the store is bound and read on
//! one connection, for [`idem_sql::SqlCore`]. The claim logic is here; the
//! SQL text is [`crate::sql`]'s.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use idem_core::clock::Timestamp;
use idem_core::store::{
    ClaimOutcome, ClaimRequest, Claimed, Previous, PurgeReport, RecordSummary, StoreError,
    StoredRecord,
};
use idem_core::{RecordId, TakeoverReason};
use idem_sql::{BatchCompletion, BindRecord, Dialect, SharedStatements};
use sqlx::sqlite::{SqliteArguments, SqliteConnection, SqliteRow};
use sqlx::{Connection, Row, Sqlite};

use crate::error::{BACKEND, corrupt, map, row_error};
use crate::sql::{Statements, bound_rows, q};

/// The SQLite dialect of the SQL store: its statements for one table.
/// [`SqliteStore`](crate::SqliteStore) runs on it; it has no API of its
/// own.
#[derive(Clone)]
pub struct SqliteDialect {
    pub(crate) table: Arc<str>,
    pub(crate) sql: Arc<Statements>,
    /// Where the purge's read of the table goes on from: the last `rowid`
    /// its previous round found, 0 once a round read to the end. Shared by
    /// the store's clones; two purges at once only split the walk.
    purged_to: Arc<AtomicI64>,
}

impl std::fmt::Debug for SqliteDialect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteDialect")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl SqliteDialect {
    /// The text that created the table, if it exists.
    pub(crate) async fn created(
        &self,
        conn: &mut SqliteConnection,
    ) -> Result<Option<String>, sqlx::Error> {
        sqlx::query_scalar(sqlx::AssertSqlSafe(Arc::clone(&self.sql.layout)))
            .fetch_optional(conn)
            .await
    }

    /// The dialect for `table`.
    pub(crate) fn new(table: Arc<str>) -> Self {
        Self {
            sql: Arc::new(Statements::new(&table)),
            table,
            purged_to: Arc::new(AtomicI64::new(0)),
        }
    }

    /// The records of a batch's claims `reqs` as each claim's `fetch` reads
    /// them (at its own `now`), in order, in one statement.
    async fn read_batch(
        &self,
        conn: &mut SqliteConnection,
        reqs: &[ClaimRequest<'_>],
    ) -> Result<Vec<Option<StoredRecord>>, StoreError> {
        let Some((sql, size)) = self.sql.read_batch(reqs.len()) else {
            // More claims than one batch takes: each read alone.
            let mut out = Vec::with_capacity(reqs.len());
            for req in reqs {
                out.push(self.fetch(conn, req.id, req.now).await?);
            }
            return Ok(out);
        };
        let keys: Vec<[u8; 16]> = reqs.iter().map(|r| idem_sql::record_key(r.id)).collect();
        let mut query = q(sql);
        for at in bound_rows(reqs.len(), size) {
            if let (Some(key), Some(req)) = (keys.get(at), reqs.get(at)) {
                query = query.bind(&key[..]).bind(ms(req.now));
            }
        }
        let rows = query.fetch_all(&mut *conn).await.map_err(map)?;
        let mut out = vec![None; reqs.len()];
        for row in &rows {
            let at = idem_sql::batch_position(row, &keys).map_err(row_error)?;
            out[at] = Some(decode_record(row, reqs[at].id)?);
        }
        Ok(out)
    }

    /// The claim's write, for a record that was absent or claimable when
    /// last read: the insert-or-take-over, then, if it lost, the record as
    /// it stands (`None`: claimable again, run the claim once more).
    async fn claim_write(
        &self,
        conn: &mut SqliteConnection,
        req: &ClaimRequest<'_>,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        let id = req.id;
        let won = q(&self.sql.claim)
            .bind_identity(id)
            .bind(req.fingerprint.as_bytes().as_slice())
            .bind(req.token.as_i64())
            .bind(ms(req.lease_until))
            .bind(ms(req.key_expires_at))
            .bind(ms(req.now))
            .bind_id(id)
            .fetch_optional(&mut *conn)
            .await
            .map_err(map)?;
        if let Some(row) = won {
            return Ok(Some(ClaimOutcome::Claimed(decode_claimed(&row)?)));
        }
        match self.fetch(conn, id, req.now).await? {
            Some(r) if !claimable(&r, req) => Ok(Some(ClaimOutcome::Existing(r))),
            // Gone or claimable since the insert ran: claim again.
            _ => {
                tracing::debug!("claim raced with another write; retrying");
                Ok(None)
            }
        }
    }
}

/// What a connection of the store's own pool is after a call that failed
/// with this error: the driver's error inside a [`StoreError`] says whether
/// the connection is still sound; every other failure (a lost lease, a
/// corrupt row, SQLite's own errors such as `SQLITE_BUSY`) comes after
/// complete answers.
fn call_leaves_connection_sound(e: &StoreError) -> bool {
    match e {
        StoreError::Unavailable { source, .. } | StoreError::Backend { source, .. } => source
            .downcast_ref::<sqlx::Error>()
            .is_none_or(sqlx_leaves_connection_sound),
        _ => true,
    }
}

/// [`call_leaves_connection_sound`] for the driver's error: SQLite's own
/// errors never end the session.
pub(crate) fn sqlx_leaves_connection_sound(e: &sqlx::Error) -> bool {
    idem_sql::leaves_connection_sound(e, |_| false)
}

fn ms(t: Timestamp) -> i64 {
    t.as_unix_millis()
}

fn decode_claimed(row: &SqliteRow) -> Result<Claimed, StoreError> {
    let attempt = idem_sql::attempt_of::<_, i64>(row).map_err(row_error)?;
    let takeover: Option<String> = row.try_get("takeover").map_err(map)?;
    let reason = takeover
        .map(|t| {
            TakeoverReason::parse(&t).ok_or_else(|| corrupt(format!("unknown takeover {t:?}")))
        })
        .transpose()?;
    let resource_id: Option<String> = row.try_get("resource_id").map_err(map)?;
    Ok(Claimed {
        attempt,
        previous: reason.map(|reason| Previous {
            reason,
            resource_id,
        }),
    })
}

/// Decodes a row of the `fetch` statement for the record `id`, refusing
/// anything malformed and another identity sharing its key.
fn decode_record(row: &SqliteRow, id: &RecordId) -> Result<StoredRecord, StoreError> {
    idem_sql::check_identity::<_, &str>(row, id).map_err(row_error)?;
    idem_sql::decode_record::<_, i64>(row, BACKEND).map_err(row_error)
}

/// Whether `claim` would have taken this record (it changed under us).
fn claimable(r: &StoredRecord, req: &ClaimRequest<'_>) -> bool {
    r.takeover_reason(&req.fingerprint, req.now).is_some()
}

/// The rows a statement changed.
async fn rows(
    query: sqlx::query::Query<'_, Sqlite, SqliteArguments>,
    conn: &mut SqliteConnection,
) -> Result<u64, StoreError> {
    Ok(query.execute(conn).await.map_err(map)?.rows_affected())
}

/// On SQLite the claim reads first, on one connection: a record that exists
/// and may not be claimed (a replay, a conflict, a mismatch) is answered by
/// that read alone, which under WAL takes no lock and waits for no writer.
/// Only a key that is absent or claimable runs the claim (a write, under
/// SQLite's single write lock); when that claim loses (a concurrent writer
/// got there first), the record is read again. One purge round is one
/// batch of each purge statement, in one `BEGIN IMMEDIATE` transaction.
///
/// The transactional mode: `BEGIN IMMEDIATE` takes the database's one write
/// lock before the claim, so the claim (a read, then a write) cannot lose a
/// race, and a concurrent transactional call waits for that lock up to the
/// busy timeout (5 s by default), then fails with
/// [`StoreError::Unavailable`] (503). Plain calls that write wait the same
/// way; reads do not (WAL). Keep transactional work short: every writer of
/// the file waits for it.
impl Dialect for SqliteDialect {
    /// On: a busy store's writes queue behind one lane
    /// ([`batch_lanes`](Dialect::batch_lanes)), one write transaction at a
    /// time, instead of every connection's writer meeting the file's lock
    /// and sleeping in the busy handler.
    const COALESCING: idem_sql::Coalescing = idem_sql::Coalescing::WhenBusy;
    type Db = Sqlite;
    type Error = StoreError;

    const BACKEND: &'static str = BACKEND;

    fn driver_error(e: sqlx::Error) -> StoreError {
        map(e)
    }

    fn table(&self) -> String {
        self.table.to_string()
    }

    /// The text that created the table (its mark is in it), if the table
    /// exists.
    async fn layout_mark(
        &self,
        conn: &mut SqliteConnection,
    ) -> Result<Option<Option<String>>, StoreError> {
        Ok(self.created(conn).await.map_err(map)?.map(Some))
    }

    fn shared(&self) -> &SharedStatements {
        &self.sql.shared
    }

    fn statement(&self, name: &str) -> Option<&str> {
        Some(match name {
            "claim" => &self.sql.claim,
            "purge_scan" => &self.sql.purge_scan,
            "purge_keys" => &self.sql.purge_keys,
            "purge_bodies" => &self.sql.purge_bodies,
            "layout" => &self.sql.layout,
            _ => return None,
        })
    }

    fn decode_record(row: &SqliteRow, id: &RecordId) -> Result<StoredRecord, StoreError> {
        decode_record(row, id)
    }

    fn decode_summary(row: &SqliteRow) -> Result<RecordSummary, StoreError> {
        idem_sql::decode_summary::<_, i64>(row, idem_sql::text).map_err(row_error)
    }

    fn leaves_connection_sound(e: &StoreError) -> bool {
        call_leaves_connection_sound(e)
    }

    /// The claim on one connection ; `None`: it raced
    /// with another write and must run again.
    async fn claim_once(
        &self,
        conn: &mut SqliteConnection,
        req: &ClaimRequest<'_>,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        match self.fetch(conn, req.id, req.now).await? {
            Some(r) if !claimable(&r, req) => Ok(Some(ClaimOutcome::Existing(r))),
            _ => self.claim_write(conn, req).await,
        }
    }

    /// A round reads the table on from where the last one stopped, outside
    /// the write lock, for at most `limit` records with something due; then
    /// deletes the expired keys among them and drops the expired bodies of
    /// the rest, in one `BEGIN IMMEDIATE` transaction (each row checked
    /// again there). The count it returns is what the read found until the
    /// read reaches the table's end, then 0: one purge call reads the table
    /// at most once.
    async fn purge_round(
        &self,
        conn: &mut SqliteConnection,
        now: Timestamp,
        limit: u32,
    ) -> Result<(PurgeReport, u64), StoreError> {
        let from = self.purged_to.load(Ordering::Relaxed);
        let found: Vec<i64> =
            sqlx::query_scalar(sqlx::AssertSqlSafe(Arc::clone(&self.sql.purge_scan)))
                .bind(from)
                .bind(ms(now))
                .bind(i64::from(limit))
                .fetch_all(&mut *conn)
                .await
                .map_err(map)?;
        let Some(&last) = found.last() else {
            self.purged_to.store(0, Ordering::Relaxed);
            return Ok((PurgeReport::default(), 0));
        };
        let at_end = found.len() < usize::try_from(limit).unwrap_or(usize::MAX);
        let rowids: Vec<String> = found.iter().map(i64::to_string).collect();
        let rowids = format!("[{}]", rowids.join(","));
        let mut tx = sqlx::Connection::begin_with(&mut *conn, "BEGIN IMMEDIATE")
            .await
            .map_err(map)?;
        let mut run =
            async |sql: &Arc<str>| rows(q(sql).bind(rowids.clone()).bind(ms(now)), &mut tx).await;
        let report = PurgeReport {
            keys_removed: run(&self.sql.purge_keys).await?,
            bodies_dropped: run(&self.sql.purge_bodies).await?,
        };
        tx.commit().await.map_err(map)?;
        let (next, more) = if at_end {
            (0, 0)
        } else {
            (last, u64::try_from(found.len()).unwrap_or(u64::MAX))
        };
        self.purged_to.store(next, Ordering::Relaxed);
        Ok((report, more))
    }

    /// One: the file has one write lock, so a second batch would only wait
    /// for it in the busy handler's sleeps.
    fn batch_lanes(&self, _connections: usize) -> usize {
        1
    }

    /// Two, whatever the pool: every write waits for the file's one lock,
    /// so with more calls under way than that they queue behind the one
    /// lane instead of each taking a connection only to wait there (the
    /// 8-task cells measured the same with 1, 2 or 4: fresh keys 0.78 ->
    /// 1.04-1.10 of the minimal pattern, replays 1.15 -> 2.36-2.46).
    fn busy_above(&self, _connections: usize) -> usize {
        2
    }

    fn begin_statement(&self) -> String {
        "BEGIN IMMEDIATE".to_owned()
    }

    /// One statement for all of them (autocommit: one commit); a
    /// completion it did not apply was perhaps applied before (a retry after
    /// a lost reply), which its own read says.
    async fn complete_batch(
        &self,
        conn: &mut SqliteConnection,
        items: &[BatchCompletion<'_>],
    ) -> Result<Vec<bool>, StoreError> {
        let Some((sql, size)) = self.sql.complete_batch(items.len()) else {
            let mut applied = Vec::with_capacity(items.len());
            for item in items {
                let done = self
                    .complete_applied(&mut *conn, item.id, item.token, &item.completion)
                    .await?;
                applied.push(done);
            }
            return Ok(applied);
        };
        let keys: Vec<[u8; 16]> = items.iter().map(|i| idem_sql::record_key(i.id)).collect();
        let mut query = q(sql);
        for at in bound_rows(items.len(), size) {
            if let (Some(key), Some(item)) = (keys.get(at), items.get(at)) {
                let c = &item.completion;
                query = query
                    .bind(&key[..])
                    .bind(item.token.as_i64())
                    .bind(c.outcome.as_str())
                    .bind(c.body)
                    .bind(ms(c.response_expires_at))
                    .bind(ms(c.key_expires_at))
                    .bind(c.resource_id);
            }
        }
        let rows = query.fetch_all(&mut *conn).await.map_err(map)?;
        let mut applied = vec![false; items.len()];
        for row in &rows {
            applied[idem_sql::batch_position(row, &keys).map_err(row_error)?] = true;
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

    /// The reads first, outside any transaction, as one statement (each
    /// claim's key and now in a `VALUES` list joined to the table): each
    /// claim whose record exists and may not be claimed (a replay, a
    /// conflict, a mismatch) is answered by its read, under WAL without a
    /// lock. The others (absent or
    /// claimable) run in one `BEGIN IMMEDIATE` transaction, one commit for
    /// all of them; a race lost in it rolls it back, and they run again
    /// alone.
    async fn claim_batch(
        &self,
        conn: &mut SqliteConnection,
        reqs: &[ClaimRequest<'_>],
    ) -> Result<Vec<Option<ClaimOutcome>>, StoreError> {
        let mut answers: Vec<Option<ClaimOutcome>> = vec![None; reqs.len()];
        let mut writes = Vec::new();
        let read = self.read_batch(conn, reqs).await?;
        for (at, (req, record)) in reqs.iter().zip(read).enumerate() {
            match record {
                Some(r) if !claimable(&r, req) => answers[at] = Some(ClaimOutcome::Existing(r)),
                _ => writes.push(at),
            }
        }
        if writes.is_empty() {
            return Ok(answers);
        }
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.map_err(map)?;
        for &at in &writes {
            // Read above, absent or claimable: straight to the write (its
            // statement decides against whatever changed since).
            match self.claim_write(&mut tx, &reqs[at]).await {
                Ok(Some(answer)) => answers[at] = Some(answer),
                Ok(None) => {
                    tx.rollback().await.map_err(map)?;
                    for &at in &writes {
                        answers[at] = None;
                    }
                    return Ok(answers);
                }
                Err(e) => {
                    drop(tx.rollback().await);
                    return Err(e);
                }
            }
        }
        tx.commit().await.map_err(map)?;
        Ok(answers)
    }
}
