//! [`MySqlDialect`]: how every statement of the store is bound and read on
//! one connection, for [`idem_sql::SqlCore`]. The SQL text is
//! [`crate::sql`]'s.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use idem_core::RecordId;
use idem_core::clock::Timestamp;
use idem_core::store::{
    ClaimOutcome, ClaimRequest, Claimed, PurgeReport, RecordSummary, StoreError, StoredRecord,
};
use idem_sql::{BatchCompletion, BindRecord, Coalescing, Dialect, SettleClaim, SharedStatements};
use sqlx::mysql::MySqlRow;
use sqlx::{AssertSqlSafe, MySql, MySqlConnection, MySqlExecutor, Row};
use tracing::debug;

use crate::config::Server;
use crate::error::{BACKEND, Error, code, number};
use crate::sql::{Statements, TableName, q};

/// The MySQL / MariaDB dialect of the SQL store: its statements for one
/// table, the server's flavour, and the transactional mode's lock bound.
/// [`MySqlStore`](crate::MySqlStore) runs on it; it has no API of its own.
#[derive(Clone)]
pub struct MySqlDialect {
    pub(crate) name: Arc<TableName>,
    pub(crate) sql: Arc<Statements>,
    /// Named by `with_server`, or detected once and shared by clones.
    pub(crate) server: Arc<OnceLock<Server>>,
    pub(crate) tx_lock_timeout: Duration,
}

impl std::fmt::Debug for MySqlDialect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlDialect")
            .field("table", &self.name.table)
            .field("server", &self.server.get())
            .field("tx_lock_timeout", &self.tx_lock_timeout)
            .finish_non_exhaustive()
    }
}

impl MySqlDialect {
    /// The dialect for table `name`.
    pub(crate) fn new(
        name: TableName,
        server: Arc<OnceLock<Server>>,
        tx_lock_timeout: Duration,
    ) -> Self {
        Self {
            sql: Arc::new(Statements::new(&name)),
            name: Arc::new(name),
            server,
            tx_lock_timeout,
        }
    }

    /// The server's flavour: named, detected before, or asked now on `conn`.
    pub(crate) async fn server_on(&self, conn: &mut MySqlConnection) -> Result<Server, Error> {
        if let Some(server) = self.server.get() {
            return Ok(*server);
        }
        // Boxed: the rare path keeps its future out of every claim's.
        let server = Box::pin(detect(conn)).await?;
        Ok(*self.server.get_or_init(|| server))
    }
}

/// Asks the server its version, to pick the claim statement.
pub(crate) async fn detect<'c>(conn: impl MySqlExecutor<'c>) -> Result<Server, Error> {
    let version: String = sqlx::query_scalar("SELECT VERSION()")
        .fetch_one(conn)
        .await?;
    let server = Server::from_version(&version);
    debug!(%version, ?server, "detected the server");
    Ok(server)
}

/// A deadlock (InnoDB rolled the statement's transaction back) or a
/// duplicate key: a race with a concurrent writer of the same record, which
/// a second run, seeing the winner's commit, resolves.
fn is_race(e: &sqlx::Error) -> bool {
    matches!(number(e), Some(code::DEADLOCK | code::DUP_ENTRY))
}

/// `query` with one fresh claim's values bound (the ten of the insert's row,
/// in `crate::sql`'s `FRESH_ROW` order).
fn bind_fresh<'q>(
    query: sqlx::query::Query<'q, MySql, sqlx::mysql::MySqlArguments>,
    req: &'q ClaimRequest<'_>,
) -> sqlx::query::Query<'q, MySql, sqlx::mysql::MySqlArguments> {
    let lease = req.lease_until.as_unix_millis();
    query
        .bind_id(req.id)
        .bind_identity(req.id)
        .bind(req.fingerprint.as_bytes().as_slice())
        .bind(req.token.as_i64())
        .bind(lease)
        .bind(req.key_expires_at.as_unix_millis())
        .bind(lease)
        .bind(lease)
}

/// Reads the record `id` from the row, refusing anything a record cannot
/// hold and another identity sharing its key.
fn decode_record(row: &MySqlRow, id: &RecordId) -> Result<StoredRecord, Error> {
    idem_sql::check_identity::<_, &[u8]>(row, id)?;
    Ok(idem_sql::decode_record::<_, i32>(row, BACKEND)?)
}

/// The `attempt` column, refusing a negative one.
fn attempt_of(row: &MySqlRow) -> Result<u32, Error> {
    Ok(idem_sql::attempt_of::<_, i32>(row)?)
}

/// A VARBINARY identity column as text (what was stored was text).
fn text(row: &MySqlRow, col: &'static str) -> Result<String, idem_sql::RowError> {
    let bytes: Vec<u8> = row.try_get(col)?;
    String::from_utf8(bytes)
        .map_err(|_| idem_sql::RowError::Corrupt(format!("stored {col} is not UTF-8")))
}

/// The rows a statement matched (sqlx connects with `CLIENT_FOUND_ROWS`, so
/// an update that matched but changed nothing counts too).
async fn rows(
    query: sqlx::query::Query<'_, MySql, sqlx::mysql::MySqlArguments>,
    conn: &mut MySqlConnection,
) -> Result<u64, Error> {
    Ok(query.execute(conn).await?.rows_affected())
}

/// What a connection is after a statement (a call's, the migration's or
/// the server detection's) failed with this error: sound when every
/// statement was answered and the session goes on (the server's own
/// errors, except those that end the session; decoding, which reads rows a
/// statement already returned in full), otherwise re-validated or replaced
/// (see [`idem_sql::Conn`]).
pub(crate) fn leaves_connection_sound(e: &Error) -> bool {
    match e {
        Error::Sqlx(e) => sqlx_leaves_connection_sound(e),
        _ => true,
    }
}

/// [`leaves_connection_sound`] for the driver's error: a shutdown
/// (`ER_SERVER_SHUTDOWN`), a `KILL` (MariaDB's `ER_CONNECTION_KILLED`),
/// MySQL's inactivity disconnect, a connection exception (SQLSTATE class
/// 08): the server ends the session.
fn sqlx_leaves_connection_sound(e: &sqlx::Error) -> bool {
    idem_sql::leaves_connection_sound(e, |e| {
        let state = match e {
            sqlx::Error::Database(db) => db.code(),
            _ => None,
        };
        matches!(number(e), Some(1053 | 1927 | 4031)) || state.is_some_and(|c| c.starts_with("08"))
    })
}

/// The claim's row, settled as alone (for a batch too): our token names a
/// won claim (our insert or, after a lost reply, our own earlier claim); a
/// takeover is one fenced update of exactly the version read.
impl SettleClaim for MySqlDialect {
    fn won(&self, req: &ClaimRequest<'_>, row: &MySqlRow) -> Result<Option<u32>, Error> {
        let token: i64 = row.try_get("token")?;
        (token == req.token.as_i64())
            .then(|| attempt_of(row))
            .transpose()
    }

    /// A batch's rows carry the body whatever its expiry: an expired one is
    /// dropped here.
    fn standing(&self, req: &ClaimRequest<'_>, row: &MySqlRow) -> Result<StoredRecord, Error> {
        let mut record = decode_record(row, req.id)?;
        if record.response_expires_at.is_some_and(|at| at <= req.now) {
            record.response = None;
        }
        Ok(record)
    }

    async fn take_over(
        &self,
        conn: &mut MySqlConnection,
        req: &ClaimRequest<'_>,
        row: &MySqlRow,
        record: &StoredRecord,
        expired: bool,
    ) -> Result<Option<(u32, Option<String>)>, Error> {
        let lease = req.lease_until.as_unix_millis();
        let token: i64 = row.try_get("token")?;
        // Claimable: take over exactly the version read. An expired key
        // starts over (attempt 1, no resource id, the new key expiry);
        // otherwise the attempt counts on and the resource id stays.
        let (attempt, resource_id, key_expires_at) = if expired {
            (1, None, req.key_expires_at.as_unix_millis().max(lease))
        } else {
            (
                record.attempt.saturating_add(1),
                record.resource_id.clone(),
                record.key_expires_at.as_unix_millis().max(lease),
            )
        };
        let took = q(&self.sql.takeover)
            .bind(req.fingerprint.as_bytes().as_slice())
            .bind(req.token.as_i64())
            .bind(i32::try_from(attempt).unwrap_or(i32::MAX))
            .bind(lease)
            .bind(lease)
            .bind(key_expires_at)
            .bind(resource_id.as_deref())
            .bind_id(req.id)
            .bind(token)
            .bind(record.state.as_str())
            .bind(i32::try_from(record.attempt).unwrap_or(i32::MAX))
            .bind(record.lease_until.as_unix_millis())
            .bind(record.key_expires_at.as_unix_millis())
            .bind(record.resource_id.as_deref())
            .execute(&mut *conn)
            .await;
        match took {
            Ok(done) if done.rows_affected() == 1 => {}
            Ok(_) => return Ok(None),
            Err(e) if is_race(&e) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        Ok(Some((attempt, resource_id)))
    }
}

/// On MySQL and MariaDB. The claim is one statement on MariaDB
/// (`RETURNING`; two for a takeover); on MySQL an insert, plus a read when
/// the key exists (three for a takeover). The purge runs per round the
/// expired keys (one `DELETE`), the expired bodies (one `UPDATE`), then,
/// when those removed nothing, the re-filing of the other records due (one
/// `UPDATE`), each walking the sweep index.
///
/// The transactional mode: MySQL has no `SET LOCAL`, so the bound on the
/// wait for a concurrent duplicate is set with `SET SESSION
/// innodb_lock_wait_timeout` in the same round trip as `BEGIN`, and stays
/// on that pooled connection afterwards, where it also bounds the plain
/// claims that connection runs. InnoDB rolls a deadlock's victim back
/// whole; the claim is the transaction's first statement, so a deadlock (or
/// a record changed between two statements of the claim) starts the
/// transaction again, at most 8 times, before the work ever ran.
impl Dialect for MySqlDialect {
    type Db = MySql;
    type Error = Error;

    const BACKEND: &'static str = BACKEND;

    /// On: on MariaDB a batch is one statement (a multi-row insert
    /// returning every row, a fenced update joined to the batch's values),
    /// one round trip and one commit for all its calls.
    const COALESCING: Coalescing = Coalescing::WhenBusy;

    fn driver_error(e: sqlx::Error) -> Error {
        Error::Sqlx(e)
    }

    fn table(&self) -> String {
        self.name.table.clone()
    }

    /// The table's comment, if the table exists in the connection's
    /// database.
    async fn layout_mark(
        &self,
        conn: &mut MySqlConnection,
    ) -> Result<Option<Option<String>>, Error> {
        let mark: Option<Option<String>> = sqlx::query_scalar(
            "SELECT CAST(TABLE_COMMENT AS CHAR) FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
        )
        .bind(&self.name.table)
        .fetch_optional(conn)
        .await?;
        Ok(mark)
    }

    fn shared(&self) -> &SharedStatements {
        &self.sql.shared
    }

    fn statement(&self, name: &str) -> Option<&str> {
        Some(match name {
            "claim_returning" => &self.sql.claim_returning,
            "insert" => &self.sql.insert,
            "read" => &self.sql.read,
            "takeover" => &self.sql.takeover,
            "purge_delete" => &self.sql.purge_delete,
            "purge_drop_bodies" => &self.sql.purge_drop_bodies,
            "purge_refile" => &self.sql.purge_refile,
            _ => return None,
        })
    }

    fn decode_record(row: &MySqlRow, id: &RecordId) -> Result<StoredRecord, Error> {
        decode_record(row, id)
    }

    fn decode_summary(row: &MySqlRow) -> Result<RecordSummary, Error> {
        Ok(idem_sql::decode_summary::<_, i32>(row, text)?)
    }

    fn leaves_connection_sound(e: &Error) -> bool {
        leaves_connection_sound(e)
    }

    /// Runs the claim once on `conn` (a pooled connection or a
    /// transaction's). `None`: it lost a race (a deadlock, a record that
    /// changed or went between two statements) and must be run again.
    async fn claim_once(
        &self,
        conn: &mut MySqlConnection,
        req: &ClaimRequest<'_>,
    ) -> Result<Option<ClaimOutcome>, Error> {
        let insert = |sql| bind_fresh(q(sql), req);
        let now = req.now.as_unix_millis();
        let row = match self.server_on(&mut *conn).await? {
            Server::MariaDb => {
                match insert(&self.sql.claim_returning)
                    .bind(now)
                    .fetch_one(&mut *conn)
                    .await
                {
                    Ok(row) => row,
                    Err(e) if is_race(&e) => return Ok(None),
                    Err(e) => return Err(e.into()),
                }
            }
            Server::MySql => match insert(&self.sql.insert).execute(&mut *conn).await {
                Ok(_) => {
                    return Ok(Some(ClaimOutcome::Claimed(Claimed {
                        attempt: 1,
                        previous: None,
                    })));
                }
                Err(e) if number(&e) == Some(code::DUP_ENTRY) => {
                    let read = q(&self.sql.read)
                        .bind(now)
                        .bind_id(req.id)
                        .fetch_optional(&mut *conn)
                        .await;
                    match read {
                        Ok(Some(row)) => row,
                        Ok(None) => return Ok(None),
                        Err(e) if is_race(&e) => return Ok(None),
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(e) if is_race(&e) => return Ok(None),
                Err(e) => return Err(e.into()),
            },
        };
        self.settle(conn, req, &row).await
    }

    /// A power of two: the batch statements' text has one row per call, and
    /// sqlx prepares each text once per connection, so a store prepares at
    /// most eight sizes of each.
    fn batch_len(&self, waiting: usize) -> usize {
        match waiting.checked_ilog2() {
            Some(log) => 1 << log,
            None => 1,
        }
    }

    /// MariaDB: one multi-row `INSERT … ON DUPLICATE KEY UPDATE …
    /// RETURNING` for the batch (the records sorted by key, so two batches
    /// take their locks in one order), each claim then settled from its row
    /// as alone. A deadlock rolls the statement back: every claim runs
    /// again alone. MySQL (no `RETURNING`): one transaction over the single
    /// claims ([`idem_sql::claim_batch_in_tx`]).
    async fn claim_batch(
        &self,
        conn: &mut MySqlConnection,
        reqs: &[ClaimRequest<'_>],
    ) -> Result<Vec<Option<ClaimOutcome>>, Error> {
        if self.server_on(&mut *conn).await? == Server::MySql {
            return idem_sql::claim_batch_in_tx(self, conn, reqs).await;
        }
        let sql = self.sql.claim_batch(reqs.len());
        let mut query = q(&sql);
        for req in reqs {
            query = bind_fresh(query, req);
        }
        let rows = match query.fetch_all(&mut *conn).await {
            Ok(rows) => rows,
            Err(e) if is_race(&e) => return Ok(vec![None; reqs.len()]),
            Err(e) => return Err(e.into()),
        };
        let keys: Vec<[u8; 16]> = reqs.iter().map(|r| idem_sql::record_key(r.id)).collect();
        self.settle_batch(conn, reqs, &keys, &rows).await
    }

    /// MariaDB and MySQL: one update of the batch's rows, fenced like the
    /// single completion. When it changed fewer rows than
    /// the batch holds, one read tells each completion applied (now, or
    /// before under the same token) from a lost lease.
    async fn complete_batch(
        &self,
        conn: &mut MySqlConnection,
        items: &[BatchCompletion<'_>],
    ) -> Result<Vec<bool>, Error> {
        let sql = self.sql.complete_batch(items.len());
        let keys: Vec<[u8; 16]> = items.iter().map(|i| idem_sql::record_key(i.id)).collect();
        let mut query = q(&sql);
        for (key, item) in keys.iter().zip(items) {
            query = query.bind(&key[..]).bind(item.completion.outcome.as_str());
        }
        for (key, item) in keys.iter().zip(items) {
            query = query.bind(&key[..]).bind(item.completion.body);
        }
        for (key, item) in keys.iter().zip(items) {
            let at = item.completion.response_expires_at.as_unix_millis();
            query = query.bind(&key[..]).bind(at);
        }
        for (key, item) in keys.iter().zip(items) {
            let at = item.completion.key_expires_at.as_unix_millis();
            query = query.bind(&key[..]).bind(at);
        }
        for (key, item) in keys.iter().zip(items) {
            query = query.bind(&key[..]).bind(item.completion.resource_id);
        }
        for key in &keys {
            query = query.bind(&key[..]);
        }
        for (key, item) in keys.iter().zip(items) {
            query = query.bind(&key[..]).bind(item.token.as_i64());
        }
        let changed = query.execute(&mut *conn).await?.rows_affected();
        if usize::try_from(changed).is_ok_and(|n| n == items.len()) {
            return Ok(vec![true; items.len()]);
        }
        let sql = self.sql.completed_batch(items.len());
        let mut query = q(&sql);
        for item in items {
            query = query.bind_id(item.id);
        }
        let rows = query.fetch_all(&mut *conn).await?;
        let mut applied = vec![false; items.len()];
        for row in &rows {
            let at = idem_sql::batch_position(row, &keys)?;
            let token: i64 = row.try_get("token")?;
            applied[at] = items[at].token.as_i64() == token;
        }
        Ok(applied)
    }

    async fn purge_round(
        &self,
        conn: &mut MySqlConnection,
        now: Timestamp,
        limit: u32,
    ) -> Result<(PurgeReport, u64), Error> {
        let now = now.as_unix_millis();
        let limit = i64::from(limit);
        let mut run = async |sql: &Arc<str>| {
            let query = q(sql).bind(now).bind(now).bind(now).bind(limit);
            rows(query, &mut *conn).await
        };
        let report = PurgeReport {
            keys_removed: run(&self.sql.purge_delete).await?,
            bodies_dropped: run(&self.sql.purge_drop_bodies).await?,
        };
        if report != PurgeReport::default() {
            return Ok((report, 0));
        }
        Ok((report, run(&self.sql.purge_refile).await?))
    }

    fn begin_statement(&self) -> String {
        // An integer from a `Duration`: nothing to escape.
        let secs = self.tx_lock_timeout.as_millis().div_ceil(1000).max(1);
        format!("SET SESSION innodb_lock_wait_timeout = {secs}; BEGIN")
    }

    async fn restart_tx(&self, conn: &mut MySqlConnection) -> Result<bool, sqlx::Error> {
        let restart = format!("ROLLBACK; {}", self.begin_statement());
        sqlx::raw_sql(AssertSqlSafe(restart)).execute(conn).await?;
        Ok(true)
    }

    fn is_lock_timeout(e: &Error) -> bool {
        matches!(e, Error::Sqlx(e) if number(e) == Some(code::LOCK_WAIT_TIMEOUT))
    }

    fn contention(tries: u32) -> StoreError {
        Error::ClaimContention { tries }.into()
    }
}
