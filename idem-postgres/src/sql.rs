//! The SQL: where the records live ([`TableName`]) and every statement the
//! store runs ([`Statements`]), built once per table name. The claim below is
//! the part to read first.

use std::sync::Arc;

use idem_sql::Param::{
    AfterKey, AfterLeaseUntil, Attempt, Body, Key, KeyExpiresAt, LeaseBefore, LeaseUntil, Limit,
    Now, Outcome, ResourceId, ResponseExpiresAt, Token,
};
use idem_sql::{SharedStatements, Statement};

/// Where the records live: a validated schema and table name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableName {
    pub(crate) schema: String,
    pub(crate) table: String,
}

impl TableName {
    /// `"schema"."table"`, safe to splice into SQL: both parts were
    /// validated as plain identifiers, so quoting cannot be escaped.
    pub(crate) fn qualified(&self) -> String {
        format!("\"{}\".\"{}\"", self.schema, self.table)
    }
}

/// The SQL of every transition, built once per table name.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) claim: Arc<str>,
    pub(crate) claim_batch: Arc<str>,
    pub(crate) takeover: Arc<str>,
    pub(crate) complete_batch: Arc<str>,
    pub(crate) purge: Arc<str>,
    /// The statements every dialect has, with their bind order.
    pub(crate) shared: SharedStatements,
}

/// The columns a record is decoded from (`dialect::decode_record`), its
/// identity first (checked on every read).
const RECORD_COLUMNS: &str = "owner, operation, key, fingerprint, state, attempt, lease_until, resource_id, outcome, \
     CASE WHEN response_expires_at > $N THEN response END AS response, response_expires_at, key_expires_at";

/// [`idem_sql::keyed`] for this dialect's `$N` parameters.
fn keyed(sql: &str) -> Arc<str> {
    idem_sql::keyed(sql, '$')
}

impl Statements {
    pub(crate) fn new(name: &TableName) -> Self {
        let t = name.qualified();
        let pk = "id = $1";
        let summary = SUMMARY_COLUMNS;
        let guarded = |set: &str| {
            format!("UPDATE {t} SET {set} WHERE {pk} AND token = $4 AND state = 'in_flight'")
        };
        Self {
            // The claim. Parameters: $1 owner, $2 operation, $3 key,
            // $4 fingerprint, $5 token, $6 now, $7 lease_until,
            // $8 key_expires_at, $9 the record's key (its primary key).
            //
            // * `cur` reads the record as of the statement's snapshot;
            // * absent → `ins` inserts it. `ON CONFLICT DO NOTHING` covers a
            //   concurrent first claim: the insert waits on the unique index
            //   until the other transaction ends; if it committed, nothing is
            //   inserted and the statement returns no row (a race lost: the
            //   store runs it again with a fresh snapshot, which sees the
            //   winner's record);
            // * present → it is returned unchanged, with its token: a pure
            //   read, no row lock, no write (a replay costs this one read).
            //   When the store finds it claimable (key expired, or same
            //   fingerprint and released or lease ended), it runs `takeover`.
            //
            // The takeover is a second statement, on the rare path, so that
            // the statement every fresh key and every replay runs carries one
            // write node, not two (about 1.5× the throughput of the
            // three-part statement it replaced, in pgbench on this table).
            claim: format!(
                "WITH cur AS (
                    SELECT {cols}, token FROM {t} WHERE id = $9
                ),
                ins AS (
                    INSERT INTO {t} (id, owner, operation, key, fingerprint, state, token, attempt, lease_until, key_expires_at, sweep_at)
                    SELECT $9, $1, $2, $3, $4, 'in_flight', $5, 1, $7, GREATEST($8, $7), $7
                    WHERE NOT EXISTS (SELECT 1 FROM cur)
                    ON CONFLICT (id) DO NOTHING
                    RETURNING attempt
                )
                {rows}",
                cols = RECORD_COLUMNS.replace("$N", "$6"),
                rows = claim_rows(""),
            )
            .into(),
            // The claim of a batch: the claim above for N records at once,
            // each parameter an array with one element per claim ($1 owner,
            // $2 operation, $3 key, $4 fingerprint, $5 token, $6 now,
            // $7 lease_until, $8 key_expires_at, $9 the record's key). The
            // records are distinct and sorted by key, and inserted in that
            // order, so two batches take their index locks in one order. A
            // row comes back per claim, named by `id`: `claimed` (inserted)
            // or `existing` (as read); a claim with no row lost a race to a
            // concurrent writer and runs again alone. One statement, one
            // commit, whatever N.
            //
            // The plan. Postgres keeps a generic plan for a prepared
            // statement after five runs, and keeps it as the table grows:
            // * `cur` looks each claim's record up by its key (`LATERAL`,
            //   and `OFFSET 0` so that the planner cannot fold it into a
            //   join it orders freely). A free join planned on a new, small
            //   table is a hash of the whole table, kept as it grows
            //   (measured: 10–15 ms a batch at 40,000 records, against
            //   0.5 ms for the lookups);
            // * `LIMIT $10`, the number of claims, removes nothing: it makes
            //   the generic plan guess one row where it guesses ten for an
            //   array, so that it looks no dearer than a plan for a batch of
            //   two or three, and Postgres keeps it instead of planning every
            //   small batch again (0.26 ms of planning a batch, measured).
            claim_batch: format!(
                "WITH req AS (
                    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[], $5::bigint[],
                                         $6::bigint[], $7::bigint[], $8::bigint[], $9::bytea[])
                        AS r(owner, operation, key, fingerprint, token, now, lease_until, key_expires_at, id)
                    LIMIT $10
                ),
                cur AS (
                    SELECT t.id, t.owner, t.operation, t.key, t.fingerprint, t.state, t.attempt,
                           t.lease_until, t.resource_id, t.outcome,
                           CASE WHEN t.response_expires_at > req.now THEN t.response END AS response,
                           t.response_expires_at, t.key_expires_at, t.token
                    FROM req CROSS JOIN LATERAL (SELECT * FROM {t} WHERE id = req.id OFFSET 0) t
                ),
                ins AS (
                    INSERT INTO {t} (id, owner, operation, key, fingerprint, state, token, attempt, lease_until, key_expires_at, sweep_at)
                    SELECT id, owner, operation, key, fingerprint, 'in_flight', token, 1, lease_until,
                           GREATEST(key_expires_at, lease_until), lease_until
                    FROM req
                    WHERE NOT EXISTS (SELECT 1 FROM cur WHERE cur.id = req.id)
                    ORDER BY id
                    ON CONFLICT (id) DO NOTHING
                    RETURNING id, attempt
                )
                {rows}",
                rows = claim_rows("id, "),
            )
            .into(),
            // The takeover of the record the claim read ($1..$9 as the claim,
            // $10 the token it read): only that version (a new claim changes
            // the token), and only while it is claimable, a condition Postgres
            // re-checks on the newest row version if a concurrent writer
            // changed it, so of two racing takeovers exactly one updates. An
            // expired key starts over at attempt 1. No row: a race lost.
            takeover: format!(
                "UPDATE {t} SET
                    fingerprint = $4,
                    state = 'in_flight',
                    token = $5,
                    lease_until = $7,
                    sweep_at = $7,
                    attempt = CASE WHEN {expired} THEN 1 ELSE attempt + 1 END,
                    resource_id = CASE WHEN {expired} THEN NULL ELSE resource_id END,
                    key_expires_at = CASE WHEN {expired} THEN GREATEST($8, $7) ELSE GREATEST(key_expires_at, $7) END,
                    outcome = NULL,
                    response = NULL,
                    response_expires_at = NULL
                 WHERE id = $9 AND token = $10
                   AND ({expired}
                        OR (fingerprint = $4
                            AND (state = 'released' OR (state = 'in_flight' AND lease_until <= $6))))
                 RETURNING attempt, resource_id",
                expired = "(key_expires_at <= $6 AND (state <> 'in_flight' OR lease_until <= $6))",
            )
            .into(),
            // The completions of a batch, one fenced update: each parameter
            // an array with one element per completion ($1 the record's key,
            // $2 token, $3 outcome, $4 response, $5 response_expires_at,
            // $6 key_expires_at, $7 resource_id), distinct records. The keys
            // of the rows it changed come back; a completion whose row is
            // not among them is asked `completed_under`, alone. `LIMIT $8`
            // (the number of completions: it removes nothing) makes the plan
            // Postgres keeps guess one row for the arrays, so that it
            // reaches each record through the primary key even when it was
            // made on a new, empty table (without it, that plan scanned the
            // whole table for every batch once the table had grown).
            complete_batch: format!(
                "UPDATE {t} AS t SET state = 'completed', outcome = c.outcome, response = c.response,
                        response_expires_at = c.response_expires_at, key_expires_at = c.key_expires_at,
                        resource_id = COALESCE(c.resource_id, t.resource_id)
                 FROM (SELECT * FROM unnest($1::bytea[], $2::bigint[], $3::text[], $4::bytea[], $5::bigint[],
                                            $6::bigint[], $7::text[])
                           AS c(id, token, outcome, response, response_expires_at, key_expires_at, resource_id)
                       LIMIT $8) AS c
                 WHERE t.id = c.id AND t.token = c.token AND t.state = 'in_flight'
                 RETURNING t.id"
            )
            .into(),
            // The purge walks the sweep index up to $1 (now), at most $2
            // rows, skipping rows being written right now (`SKIP LOCKED`)
            // and in-flight records whose key lives on (an in-flight
            // record's `sweep_at` is its lease end). Each row it takes is
            // either deleted (key expired) or re-filed at the time it next
            // has something to do, its body dropped if that expired: the
            // completion never touches an indexed column (so it is a HOT
            // update), and this is where a completed record moves in the
            // index, once, in batches. `due` is materialised once and locks
            // its rows, so the two writes, which reach them by `ctid` (Tid
            // Scans), see them as `due` did; they are disjoint, as one
            // statement may not change a row twice.
            purge: format!(
                "WITH due AS (
                    SELECT ctid AS row_id,
                           key_expires_at <= $1 AND (state <> 'in_flight' OR lease_until <= $1) AS gone,
                           response IS NOT NULL AND response_expires_at <= $1 AS drop_body
                    FROM {t}
                    WHERE sweep_at <= $1
                      AND (state <> 'in_flight' OR (key_expires_at <= $1 AND lease_until <= $1))
                    ORDER BY sweep_at
                    LIMIT $2
                    FOR UPDATE SKIP LOCKED
                ),
                gone AS (
                    DELETE FROM {t}
                    WHERE ctid = ANY(ARRAY(SELECT row_id FROM due WHERE gone))
                    RETURNING 1
                ),
                kept AS (
                    UPDATE {t} SET
                        response = CASE WHEN response_expires_at <= $1 THEN NULL ELSE response END,
                        sweep_at = CASE WHEN response IS NOT NULL AND response_expires_at > $1
                                        THEN LEAST(response_expires_at, key_expires_at)
                                        ELSE key_expires_at END
                    WHERE ctid = ANY(ARRAY(SELECT row_id FROM due WHERE NOT gone))
                    RETURNING 1
                )
                SELECT (SELECT count(*) FROM gone) AS keys_removed,
                       (SELECT count(*) FROM due WHERE NOT gone AND drop_body) AS bodies_dropped,
                       (SELECT count(*) FROM kept) AS refiled"
            )
            .into(),
            shared: SharedStatements {
                complete: Statement::new(
                    keyed(&guarded(
                        "state = 'completed', outcome = $5, response = $6, response_expires_at = $7, \
                         key_expires_at = $8, resource_id = COALESCE($9, resource_id)",
                    )),
                    &[Key, Token, Outcome, Body, ResponseExpiresAt, KeyExpiresAt, ResourceId],
                ),
                // Asked only when a completion changed no row: is the record
                // already completed under this token (a retry after a lost
                // reply, not a lost lease)?
                completed_under: Statement::new(
                    keyed(&format!(
                        "SELECT 1 FROM {t} WHERE {pk} AND token = $4 AND state = 'completed'"
                    )),
                    &[Key, Token],
                ),
                release: Statement::new(
                    keyed(&guarded("state = 'released', lease_until = $5")),
                    &[Key, Token, Now],
                ),
                save_resource_id: Statement::new(
                    keyed(&guarded("resource_id = $5")),
                    &[Key, Token, ResourceId],
                ),
                // The key is kept at least until the lease ends.
                extend_lease: Statement::new(
                    keyed(&guarded(
                        "lease_until = $5, sweep_at = $5, key_expires_at = GREATEST(key_expires_at, $5)",
                    )),
                    &[Key, Token, LeaseUntil],
                ),
                fetch: Statement::new(
                    keyed(&format!(
                        "SELECT {cols} FROM {t} WHERE {pk} \
                         AND (key_expires_at > $4 OR (state = 'in_flight' AND lease_until > $4))",
                        cols = RECORD_COLUMNS.replace("$N", "$4")
                    )),
                    &[Key, Now],
                ),
                // The operator listing ($1 lease bound, $2 now, $3 limit;
                // then $4, $5 the keyset position: lease end and record key),
                // walking the sweep index: an in-flight record's `sweep_at`
                // is its lease end, so the index order is the lease order.
                // It also passes the completed and released records a purge
                // has not re-filed yet (the ones completed since the last
                // purge), which it filters out.
                list_in_flight: Statement::new(
                    format!(
                        "SELECT {summary} FROM {t}
                         WHERE sweep_at <= $1 AND state = 'in_flight' AND lease_until <= $1 AND key_expires_at > $2
                         ORDER BY sweep_at, id LIMIT $3"
                    ),
                    &[LeaseBefore, Now, Limit],
                ),
                list_in_flight_after: Statement::new(
                    format!(
                        "SELECT {summary} FROM {t}
                         WHERE sweep_at <= $1 AND state = 'in_flight' AND lease_until <= $1 AND key_expires_at > $2
                           AND (sweep_at, id) > ($4, $5)
                         ORDER BY sweep_at, id LIMIT $3"
                    ),
                    &[LeaseBefore, Now, Limit, AfterLeaseUntil, AfterKey],
                ),
                // $4 now, $5 the attempt or NULL: the lease ends now; the
                // token, resource id and attempt stay.
                release_in_flight: Statement::new(
                    keyed(&format!(
                        "UPDATE {t} SET lease_until = LEAST(lease_until, $4), sweep_at = LEAST(lease_until, $4)
                         WHERE {pk} AND state = 'in_flight' AND key_expires_at > $4
                           AND ($5::integer IS NULL OR attempt = $5::integer)"
                    )),
                    &[Key, Now, Attempt],
                ),
                delete_completed: Statement::new(
                    keyed(&format!(
                        "DELETE FROM {t} WHERE {pk} AND (state = 'completed' OR key_expires_at <= $4)"
                    )),
                    &[Key, Now],
                ),
                count_states: Statement::new(
                    format!(
                        "SELECT
                           count(*) FILTER (WHERE key_expires_at > $1 AND state = 'in_flight') AS in_flight,
                           count(*) FILTER (WHERE key_expires_at > $1 AND state = 'in_flight' AND lease_until <= $1) AS stuck,
                           count(*) FILTER (WHERE key_expires_at > $1 AND state = 'released') AS released,
                           count(*) FILTER (WHERE key_expires_at > $1 AND state = 'completed') AS completed,
                           count(*) FILTER (WHERE key_expires_at <= $1) AS expired
                         FROM {t}"
                    ),
                    &[Now],
                ),
            },
        }
    }
}

/// What a claim statement returns (each claim's row, after `first`: the
/// batch's `id, `, or nothing): the won claim's attempt from `ins` (kind
/// `claimed`), or the record as `cur` read it (kind `existing`), the same
/// columns either way.
fn claim_rows(first: &str) -> String {
    format!(
        "SELECT 'claimed' AS kind, {first}NULL::text AS owner, NULL::text AS operation, NULL::text AS key,
                NULL::bytea AS fingerprint, NULL::text AS state, attempt,
                NULL::bigint AS lease_until, NULL::text AS resource_id, NULL::text AS outcome,
                NULL::bytea AS response, NULL::bigint AS response_expires_at,
                NULL::bigint AS key_expires_at, NULL::bigint AS token
         FROM ins
         UNION ALL
         SELECT 'existing', {first}owner, operation, key, fingerprint, state, attempt, lease_until, resource_id,
                outcome, response, response_expires_at, key_expires_at, token
         FROM cur"
    )
}

const SUMMARY_COLUMNS: &str =
    "owner, operation, key, state, attempt, lease_until, resource_id, key_expires_at";

pub(crate) fn q(
    sql: &Arc<str>,
) -> sqlx::query::Query<'static, sqlx::Postgres, sqlx::postgres::PgArguments> {
    idem_sql::query(sql)
}
