//! [`MySqlStore`]: building it, migrating its table, and the [`Store`]
//! implementation. Every transition is one SQL statement of [`crate::sql`],
//! except the claim on MySQL (an insert, then a read when the key exists)
//! and a takeover (the claim, then a guarded update).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use idem_core::RecordId;
use idem_core::clock::Timestamp;
use idem_core::store::PurgeReport;
use idem_core::store::{
    Capabilities, ClaimOutcome, ClaimRequest, Claimed, Completion, Previous, Store, StoreError,
    StoredRecord, Token, retry_claim_race,
};
use idem_sql::{Conns, SqlStore, TxConnection, TxStore, fenced};
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions, MySqlRow};
use sqlx::{AssertSqlSafe, Executor, MySql, MySqlConnection, MySqlExecutor, MySqlPool, Row};
use tracing::debug;

use crate::config::{
    DEFAULT_TABLE, DEFAULT_TX_LOCK_TIMEOUT, MAX_TABLE_NAME_LEN, Server, validate_identifier,
};
use crate::error::{BACKEND, Error, code, number, store_error};
use crate::sql::{Statements, TableName, q};

/// What a connection of the store's own pool is after a call that failed
/// with this error: the driver's error inside a [`StoreError`] says whether
/// the connection is still sound; every other failure (a lost lease, a
/// corrupt row) comes after complete answers.
fn call_leaves_connection_sound(e: &StoreError) -> bool {
    let (StoreError::Unavailable { source, .. } | StoreError::Backend { source, .. }) = e else {
        return true;
    };
    if let Some(e) = source.downcast_ref::<Error>() {
        leaves_connection_sound(e)
    } else {
        source
            .downcast_ref::<sqlx::Error>()
            .is_none_or(sqlx_leaves_connection_sound)
    }
}

/// What a connection of the store's own pool is after a call that failed
/// with this error: sound when every statement was answered and the session
/// goes on (the server's own errors, except those that end the session;
/// decoding, which reads rows a statement already returned in full),
/// otherwise re-validated or replaced (see [`idem_sql::Conn`]).
fn leaves_connection_sound(e: &Error) -> bool {
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

/// The MySQL / MariaDB idempotency store. Cheap to clone (pools and a few
/// `Arc`s; clones share them).
///
/// Build it with [`MySqlStore::new`] (your pool) or [`MySqlStore::connect`],
/// pick the table with [`MySqlStore::with_table_name`], and create it with
/// [`MySqlStore::migrate`]. The server's flavour ([`Server`]), which decides
/// the claim statement, is detected by [`MySqlStore::connect`], or for a
/// store over your pool by [`MySqlStore::migrate`] or its first call.
///
/// # Connections
///
/// A store built by [`MySqlStore::connect`] or [`MySqlStore::connect_with`]
/// runs everything (claim, completion, release, saved resource id, lease
/// extension, fetch, purge, [`MySqlStore::migrate`], the transactional mode
/// and the operator API) on one pool of its own ([`idem_sql::Pool`]) that
/// pings a connection neither before a call nor after it. A connection is
/// re-validated only when a call may have left it unsound (a dropped future:
/// its answer is awaited off the caller's path, then a ping), and replaced
/// when a call failed on the wire or the server ended the session (`KILL`, a
/// shutdown). Up to `max_connections` of the pool options serve them, most
/// recently used first (a transaction holds one for as long as it runs);
/// [`MySqlStore::pool`], a sqlx pool opened lazily with the same options, is
/// for your own queries only: it opens no connection unless you use it.
///
/// A store over your pool ([`MySqlStore::new`]) runs everything on that
/// pool, which pings each connection as it takes it back (sqlx does so
/// unconditionally): one more round trip per call, off the caller's path but
/// holding the connection until it is answered.
#[derive(Clone)]
pub struct MySqlStore {
    conns: Conns<MySql>,
    name: Arc<TableName>,
    sql: Arc<Statements>,
    /// Named by `with_server`, or detected once and shared by clones.
    server: Arc<OnceLock<Server>>,
    tx_lock_timeout: Duration,
}

impl std::fmt::Debug for MySqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MySqlStore")
            .field("table", &self.name.table)
            .field("server", &self.server.get())
            .field("conns", &self.conns)
            .field("tx_lock_timeout", &self.tx_lock_timeout)
            .finish_non_exhaustive()
    }
}

impl MySqlStore {
    /// A store over an existing pool, using the table `idem_records` of the
    /// pool's database. Nothing is asked here (no connection is used): the
    /// server's flavour, which picks the claim statement ([`Server`]), is
    /// detected (`SELECT VERSION()`, once) by [`MySqlStore::migrate`] or
    /// else by the first call, unless [`MySqlStore::with_server`] names it.
    ///
    /// Every call runs on this pool, as given. If you build it yourself,
    /// consider
    /// [`MySqlPoolOptions::test_before_acquire(false)`](MySqlPoolOptions::test_before_acquire):
    /// otherwise sqlx pings every connection before handing it out, which
    /// doubles the round trips of every call. A dead connection then fails
    /// one call with [`StoreError::Unavailable`](idem_core::store::StoreError)
    /// and is replaced. Even so, sqlx pings each connection as it takes it
    /// back after a call (unconditionally): one more round trip per call,
    /// which the caller does not wait for but which keeps the connection
    /// from the next call until it is answered (a fresh key checks out
    /// twice). A store built by [`MySqlStore::connect`] or
    /// [`MySqlStore::connect_with`] does not pay it (see
    /// [Connections](MySqlStore#connections)).
    ///
    /// Run [`MySqlStore::migrate`] (or apply [`MIGRATION`](crate::MIGRATION)
    /// yourself) before the first call.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), idem_mysql::Error> {
    /// use idem_mysql::{MySqlStore, sqlx::mysql::MySqlPoolOptions};
    ///
    /// let pool = MySqlPoolOptions::new()
    ///     .test_before_acquire(false)
    ///     .connect("mysql://root@127.0.0.1:3306/test")
    ///     .await?;
    /// let store = MySqlStore::new(pool).with_table_name("payments_idem")?;
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn new(pool: MySqlPool) -> Self {
        Self::with_server_of(Conns::yours(pool), Arc::new(OnceLock::new()))
    }

    fn with_server_of(conns: Conns<MySql>, server: Arc<OnceLock<Server>>) -> Self {
        let name = TableName {
            table: DEFAULT_TABLE.to_owned(),
        };
        Self::build(conns, name, server, DEFAULT_TX_LOCK_TIMEOUT)
    }

    /// Connects to `url` (`mysql://` or `mariadb://`) and returns a store
    /// with pools of its own (see [Connections](MySqlStore#connections)),
    /// sqlx's default pool options.
    ///
    /// No ping before or after a call, so a claim or a replay is one round
    /// trip on MariaDB. The price: a connection that died while idle fails
    /// the one call that picks it up (a typed
    /// [`StoreError::Unavailable`](idem_core::store::StoreError), HTTP 503),
    /// and the pool replaces it.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlx`] when the URL is invalid or the server unreachable.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let options: MySqlConnectOptions = url.parse()?;
        Self::connect_with(MySqlPoolOptions::new(), options).await
    }

    /// Like [`MySqlStore::connect`], with your pool and connect options.
    ///
    /// The calls' pool takes from `pool` its `max_connections`, its
    /// `acquire_timeout` (a call that waits longer for a connection fails
    /// with [`StoreError::Unavailable`](idem_core::store::StoreError)), its
    /// `max_lifetime` and its `idle_timeout` (a connection past either is
    /// replaced at its next checkout). [`MySqlStore::pool`] is built from
    /// `pool` with `test_before_acquire(false)` and `min_connections(0)`,
    /// and opened lazily; its hooks apply to it only.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlx`] when the server is unreachable.
    pub async fn connect_with(
        pool: MySqlPoolOptions,
        options: MySqlConnectOptions,
    ) -> Result<Self, Error> {
        let conns = Conns::own(pool, options);
        let server =
            idem_sql::on_conn!(conns, Error::Sqlx, leaves_connection_sound, |c| detect(c))?;
        Ok(Self::with_server_of(
            conns,
            Arc::new(OnceLock::from(server)),
        ))
    }

    /// Uses another table name (default `idem_records`), in the pool's
    /// database.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidIdentifier`] unless the name is 1 to 48 ASCII letters,
    /// digits and `_`, not starting with a digit.
    pub fn with_table_name(self, table: &str) -> Result<Self, Error> {
        let table = validate_identifier("table", table, MAX_TABLE_NAME_LEN)?;
        Ok(Self::build(
            self.conns,
            TableName { table },
            self.server,
            self.tx_lock_timeout,
        ))
    }

    /// Uses the claim statement of `server` instead of the detected one
    /// (e.g. the portable MySQL statements on a MariaDB server, which runs
    /// them too: the tests do, to run the MySQL path somewhere).
    #[must_use]
    pub fn with_server(mut self, server: Server) -> Self {
        self.server = Arc::new(OnceLock::from(server));
        self
    }

    /// How long the transactional mode waits for a concurrent duplicate's
    /// transaction to finish before answering 409 (default 5 s; rounded up
    /// to whole seconds, at least 1: it sets the session's
    /// `innodb_lock_wait_timeout`, see
    /// [`MySqlIdemExt`](crate::MySqlIdemExt)).
    #[must_use]
    pub fn with_tx_lock_timeout(mut self, timeout: Duration) -> Self {
        self.tx_lock_timeout = timeout;
        self
    }

    fn build(
        conns: Conns<MySql>,
        name: TableName,
        server: Arc<OnceLock<Server>>,
        tx_lock_timeout: Duration,
    ) -> Self {
        Self {
            conns,
            sql: Arc::new(Statements::new(&name)),
            name: Arc::new(name),
            server,
            tx_lock_timeout,
        }
    }

    /// The migration for this store's table, placeholder filled in, for
    /// applying with your own tool.
    #[must_use]
    pub fn migration_sql(&self) -> String {
        crate::schema::render(&self.name)
    }

    /// Creates the table and its index if missing. Idempotent: safe to call
    /// at every start, from every instance at once (a named lock,
    /// `GET_LOCK`, serializes them: MySQL's DDL is not transactional). It
    /// never touches sqlx's `_sqlx_migrations` table, so it does not
    /// interfere with your application's own migrations.
    ///
    /// # Errors
    ///
    /// [`Error::Sqlx`] when the server refuses (e.g. no `CREATE` privilege,
    /// or the lock not granted within 60 s).
    pub async fn migrate(&self) -> Result<(), Error> {
        idem_sql::on_conn!(self.conns, Error::Sqlx, leaves_connection_sound, |conn| {
            self.migrate_on(conn)
        })
    }

    /// The migration on one connection, under the named lock.
    async fn migrate_on(&self, conn: &mut MySqlConnection) -> Result<(), Error> {
        // Detected now (if not yet), so that the first call does not ask.
        self.server_on(&mut *conn).await?;
        let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 60)")
            .bind(crate::schema::MIGRATE_LOCK)
            .fetch_one(&mut *conn)
            .await?;
        if got != Some(1) {
            return Err(Error::Sqlx(sqlx::Error::Protocol(
                "could not take the migration lock within 60 s".into(),
            )));
        }
        let done = conn
            .execute(sqlx::AssertSqlSafe(self.migration_sql()))
            .await;
        let released = sqlx::query("SELECT RELEASE_LOCK(?)")
            .bind(crate::schema::MIGRATE_LOCK)
            .execute(&mut *conn)
            .await;
        done?;
        released?;
        Ok(())
    }

    /// The sqlx pool of the store, for your own queries on the same
    /// database, for its size and idle connections. A store over your pool
    /// ([`MySqlStore::new`]) runs everything on it; a store built by
    /// [`MySqlStore::connect`] runs on a pool of its own and opens this one
    /// lazily, for you only (see [Connections](MySqlStore#connections)). To
    /// close the store, call [`MySqlStore::close`].
    #[must_use]
    pub fn pool(&self) -> &MySqlPool {
        self.conns.pool()
    }

    /// Closes the store's connections: its own pool (its idle connections
    /// now, the others as their calls end) and [`MySqlStore::pool`], which
    /// for a store over your pool is yours. Every call after it fails with
    /// [`StoreError::Unavailable`], on every clone.
    pub async fn close(&self) {
        self.conns.close().await;
    }

    /// The table holding the records (default `idem_records`), as validated
    /// by [`MySqlStore::with_table_name`].
    #[must_use]
    pub fn table_name(&self) -> &str {
        &self.name.table
    }

    /// The server flavour whose statements the store runs: named by
    /// [`MySqlStore::with_server`], or detected by [`MySqlStore::connect`],
    /// [`MySqlStore::migrate`] or the first call; `None` before that (a
    /// store over your pool that has not run yet).
    #[must_use]
    pub fn server(&self) -> Option<Server> {
        self.server.get().copied()
    }

    /// The server flavour, detected on `conn` (once for the store and its
    /// clones) if nothing named or detected it yet.
    async fn server_on(&self, conn: &mut MySqlConnection) -> Result<Server, Error> {
        if let Some(server) = self.server.get() {
            return Ok(*server);
        }
        // Boxed: the rare path keeps its future out of every claim's.
        let server = Box::pin(detect(conn)).await?;
        Ok(*self.server.get_or_init(|| server))
    }

    pub(crate) fn sql(&self) -> &Statements {
        &self.sql
    }

    /// Runs the claim once on `conn` (a pooled connection or a
    /// transaction's). `None`: it lost a race (a deadlock, a record that
    /// changed or went between two statements) and must be run again.
    pub(crate) async fn claim_once(
        &self,
        conn: &mut MySqlConnection,
        req: &ClaimRequest<'_>,
    ) -> Result<Option<ClaimOutcome>, Error> {
        let lease = req.lease_until.as_unix_millis();
        let insert = |sql| {
            q(sql)
                .bind(req.id.owner())
                .bind(req.id.operation())
                .bind(req.id.key().as_str())
                .bind(req.fingerprint.as_bytes().as_slice())
                .bind(req.token.as_i64())
                .bind(lease)
                .bind(req.key_expires_at.as_unix_millis())
                .bind(lease)
                .bind(lease)
        };
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
                        .bind(req.id.owner())
                        .bind(req.id.operation())
                        .bind(req.id.key().as_str())
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
        let token: i64 = row.try_get("token")?;
        if token == req.token.as_i64() {
            // Our insert (or, after a lost reply, our own earlier claim).
            return Ok(Some(ClaimOutcome::Claimed(Claimed {
                attempt: attempt_of(&row)?,
                previous: None,
            })));
        }
        let record = decode_record(&row)?;
        let reason = record.takeover_reason(&req.fingerprint, req.now);
        let expired = record.is_expired(req.now);
        if !expired && reason.is_none() {
            return Ok(Some(ClaimOutcome::Existing(record)));
        }
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
            .bind(req.id.owner())
            .bind(req.id.operation())
            .bind(req.id.key().as_str())
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
        // A takeover reports the state it read; a holder whose lease ended
        // may have released since (same token, a guard column changed: then
        // this takeover lost and runs again, and reads `Released`).
        let previous = match reason {
            Some(reason) if !expired => Some(Previous {
                reason,
                resource_id,
            }),
            _ => None,
        };
        Ok(Some(ClaimOutcome::Claimed(Claimed { attempt, previous })))
    }

    pub(crate) async fn complete_on<'c>(
        &self,
        conn: impl MySqlExecutor<'c>,
        id: &RecordId,
        token: Token,
        c: &Completion<'_>,
    ) -> Result<(), StoreError> {
        let done = q(&self.sql.complete)
            .bind(c.outcome.as_str())
            .bind(c.body)
            .bind(c.response_expires_at.as_unix_millis())
            .bind(c.key_expires_at.as_unix_millis())
            .bind(c.resource_id)
            .bind(id.owner())
            .bind(id.operation())
            .bind(id.key().as_str())
            .bind(token.as_i64())
            .execute(conn)
            .await
            .map_err(store_error)?;
        // One row matched (sqlx connects with `CLIENT_FOUND_ROWS`, so an
        // update that matched but changed nothing counts too).
        fenced(done.rows_affected())
    }

    /// A statement guarded by the fencing token, as a store call.
    async fn guarded(
        &self,
        sql: &Arc<str>,
        id: &RecordId,
        token: Token,
        value: GuardedValue<'_>,
    ) -> Result<(), StoreError> {
        idem_sql::on_conn!(self, |conn| self.guarded_on(conn, sql, id, token, value))
    }

    async fn guarded_on(
        &self,
        conn: &mut MySqlConnection,
        sql: &Arc<str>,
        id: &RecordId,
        token: Token,
        value: GuardedValue<'_>,
    ) -> Result<(), StoreError> {
        let query = q(sql);
        let query = match value {
            GuardedValue::Int(v, times) => (0..times).fold(query, |q, _| q.bind(v)),
            GuardedValue::Text(v) => query.bind(v),
        };
        let done = query
            .bind(id.owner())
            .bind(id.operation())
            .bind(id.key().as_str())
            .bind(token.as_i64())
            .execute(conn)
            .await
            .map_err(store_error)?;
        fenced(done.rows_affected())
    }

    /// The completion on one connection, and when it changed no row,
    /// whether this completion was already applied (a retry after a lost
    /// reply, which is not an error).
    async fn complete_once(
        &self,
        conn: &mut MySqlConnection,
        id: &RecordId,
        token: Token,
        completion: &Completion<'_>,
    ) -> Result<(), StoreError> {
        let done = self.complete_on(&mut *conn, id, token, completion).await;
        if !matches!(done, Err(StoreError::LeaseLost)) {
            return done;
        }
        let applied = q(&self.sql.completed_under)
            .bind(id.owner())
            .bind(id.operation())
            .bind(id.key().as_str())
            .bind(token.as_i64())
            .fetch_optional(conn)
            .await
            .map_err(store_error)?;
        if applied.is_some() { Ok(()) } else { done }
    }

    /// Purge rounds on one connection (see [`Store::purge_expired`]).
    async fn purge_on(
        &self,
        conn: &mut MySqlConnection,
        now: Timestamp,
        limit: u32,
    ) -> Result<PurgeReport, StoreError> {
        let now = now.as_unix_millis();
        let limit = i64::from(limit);
        let mut run = async |sql: &Arc<str>| {
            q(sql)
                .bind(now)
                .bind(now)
                .bind(now)
                .bind(limit)
                .execute(&mut *conn)
                .await
                .map(|done| done.rows_affected())
                .map_err(store_error)
        };
        loop {
            let keys_removed = run(&self.sql.purge_delete).await?;
            let bodies_dropped = run(&self.sql.purge_drop_bodies).await?;
            let report = PurgeReport {
                keys_removed,
                bodies_dropped,
            };
            if report != PurgeReport::default() {
                return Ok(report);
            }
            let refiled = run(&self.sql.purge_refile).await?;
            if refiled == 0 {
                return Ok(report);
            }
        }
    }
}

/// Asks the server its version, to pick the claim statement.
async fn detect<'c>(conn: impl MySqlExecutor<'c>) -> Result<Server, Error> {
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

/// Reads a record from the row, refusing anything a record cannot hold.
fn decode_record(row: &MySqlRow) -> Result<StoredRecord, Error> {
    Ok(idem_sql::decode_record::<_, i32>(row, BACKEND)?)
}

/// The `attempt` column, refusing a negative one.
fn attempt_of(row: &MySqlRow) -> Result<u32, Error> {
    Ok(idem_sql::attempt_of::<_, i32>(row)?)
}

/// The value(s) a guarded update sets: an integer bound `n` times, or text.
enum GuardedValue<'a> {
    Int(i64, usize),
    Text(&'a str),
}

impl Store for MySqlStore {
    /// One statement on one checkout on MariaDB (two for a takeover); on
    /// MySQL an insert, plus a read when the key exists (three for a
    /// takeover). Run again (at most 8 times in all) only when it lost a
    /// race to a concurrent writer on the same record (a deadlock, a
    /// duplicate key, a record changed between the read and the takeover).
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        retry_claim_race(BACKEND, || async {
            let outcome = idem_sql::on_conn!(self, |conn| async {
                Ok::<_, StoreError>(self.claim_once(conn, req).await?)
            })?;
            if outcome.is_none() {
                debug!("claim lost a race; running it again");
            }
            Ok(outcome)
        })
        .await
    }

    /// One statement; when it changed no row, a read on the same checkout
    /// tells a lost lease from this completion already applied.
    async fn complete(
        &self,
        id: &RecordId,
        token: Token,
        completion: &Completion<'_>,
    ) -> Result<(), StoreError> {
        idem_sql::on_conn!(self, |conn| self.complete_once(conn, id, token, completion))
    }

    async fn release(&self, id: &RecordId, token: Token, now: Timestamp) -> Result<(), StoreError> {
        let now = GuardedValue::Int(now.as_unix_millis(), 1);
        self.guarded(&self.sql.release, id, token, now).await
    }

    async fn save_resource_id(
        &self,
        id: &RecordId,
        token: Token,
        resource_id: &str,
    ) -> Result<(), StoreError> {
        let value = GuardedValue::Text(resource_id);
        self.guarded(&self.sql.save_resource_id, id, token, value)
            .await
    }

    async fn extend_lease(
        &self,
        id: &RecordId,
        token: Token,
        lease_until: Timestamp,
    ) -> Result<(), StoreError> {
        let until = GuardedValue::Int(lease_until.as_unix_millis(), 3);
        self.guarded(&self.sql.extend_lease, id, token, until).await
    }

    async fn fetch(
        &self,
        id: &RecordId,
        now: Timestamp,
    ) -> Result<Option<StoredRecord>, StoreError> {
        let now = now.as_unix_millis();
        idem_sql::on_conn!(self, |conn| async {
            let row = q(&self.sql.fetch)
                .bind(now)
                .bind(id.owner())
                .bind(id.operation())
                .bind(id.key().as_str())
                .bind(now)
                .bind(now)
                .fetch_optional(conn)
                .await
                .map_err(store_error)?;
            Ok::<_, StoreError>(row.as_ref().map(decode_record).transpose()?)
        })
    }

    /// One batch per round: the expired keys (one `DELETE`), the expired
    /// bodies (one `UPDATE`), then the re-filing of the other records due
    /// (one `UPDATE`), each walking the sweep index, at most `limit` rows
    /// each, on one checkout. A round that only re-filed records removed
    /// nothing, and an empty report tells the caller the purge is done; so
    /// the round runs again until it removes something or finds nothing due.
    /// Each round moves every row it re-files past `now`, so this ends.
    async fn purge_expired(&self, now: Timestamp, limit: u32) -> Result<PurgeReport, StoreError> {
        idem_sql::on_conn!(self, |conn| self.purge_on(conn, now, limit))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::none()
    }
}

/// The transactional mode ([`MySqlIdemExt`](crate::MySqlIdemExt)) on MySQL
/// and MariaDB.
///
/// MySQL has no `SET LOCAL`: the bound on the wait for a concurrent
/// duplicate is set with `SET SESSION innodb_lock_wait_timeout` in the same
/// round trip as `BEGIN`, and stays on that pooled connection afterwards,
/// where it also bounds the plain claims that connection runs. Plain calls
/// on the same key wait the same way, bounded by their connection's
/// `innodb_lock_wait_timeout` (server default 50 s). Only InnoDB tables take
/// part in the transaction.
///
/// InnoDB rolls a deadlock's victim back whole; the claim is the
/// transaction's first statement, so a deadlock (or a record changed
/// between two statements of the claim) starts the transaction again, at
/// most 8 times, before the work ever ran. The claim is one round trip on
/// MariaDB, one or two on MySQL.
impl SqlStore for MySqlStore {
    type Db = MySql;
    type CallError = StoreError;

    fn conns(&self) -> &Conns<MySql> {
        &self.conns
    }

    fn checkout_error(e: sqlx::Error) -> StoreError {
        store_error(e)
    }

    fn call_leaves_connection_sound(e: &StoreError) -> bool {
        call_leaves_connection_sound(e)
    }
}

impl TxStore for MySqlStore {
    type Error = Error;

    fn begin_statement(&self) -> String {
        // An integer from a `Duration`: nothing to escape.
        let secs = self.tx_lock_timeout.as_millis().div_ceil(1000).max(1);
        format!("SET SESSION innodb_lock_wait_timeout = {secs}; BEGIN")
    }

    async fn claim_in_tx(
        &self,
        conn: &mut MySqlConnection,
        req: &ClaimRequest<'_>,
    ) -> Result<Option<ClaimOutcome>, Error> {
        self.claim_once(conn, req).await
    }

    async fn complete_in_tx(
        &self,
        conn: &mut MySqlConnection,
        id: &RecordId,
        token: Token,
        completion: &Completion<'_>,
    ) -> Result<(), StoreError> {
        self.complete_on(conn, id, token, completion).await
    }

    async fn restart_tx(&self, conn: &mut TxConnection<Self>) -> Result<bool, sqlx::Error> {
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

    fn store_error(e: sqlx::Error) -> StoreError {
        Error::Sqlx(e).into()
    }

    fn leaves_connection_sound(e: &sqlx::Error) -> bool {
        sqlx_leaves_connection_sound(e)
    }
}
