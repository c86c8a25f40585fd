//! The statements every dialect has, run once for all of them: a dialect
//! writes each one's SQL and says in which order it binds the call's values
//! ([`Statement`]); [`Dialect`](crate::Dialect)'s provided methods bind and
//! run them through [`Driver`], the little of sqlx they need.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use idem_core::RecordId;
use idem_core::clock::Timestamp;
use idem_core::store::{Completion, StateCounts, Token};
use sqlx::any::AnyQueryResult;
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Type};

use crate::store::{KeysetAfter, record_key};

/// A boxed statement run.
type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A query on a statement's text, with no value bound yet.
///
/// The text must come from a dialect's statements: fixed SQL around
/// validated, quoted identifiers, every value a bind parameter.
pub fn query<DB: Database>(sql: &Arc<str>) -> Query<'static, DB, DB::Arguments> {
    sqlx::query(AssertSqlSafe(Arc::clone(sql)))
}

/// One value a [`Statement`] binds, named by what it is: the order is the
/// dialect's, the values are the call's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    /// The record's primary key ([`record_key`]).
    Key,
    /// The fencing token.
    Token,
    /// The call's `now`.
    Now,
    /// The completion's outcome.
    Outcome,
    /// The completion's body.
    Body,
    /// The completion's response expiry.
    ResponseExpiresAt,
    /// The completion's key expiry.
    KeyExpiresAt,
    /// The resource id (the completion's, or the one saved), or NULL.
    ResourceId,
    /// The new lease end.
    LeaseUntil,
    /// The attempt an operator release names, or NULL.
    Attempt,
    /// The listing's lease bound.
    LeaseBefore,
    /// The listing's row limit.
    Limit,
    /// The keyset position's lease end.
    AfterLeaseUntil,
    /// The keyset position's record key.
    AfterKey,
}

/// A statement's text and the order of its bind parameters.
#[derive(Debug, Clone)]
pub struct Statement {
    sql: Arc<str>,
    binds: &'static [Param],
}

impl Statement {
    /// `sql`, whose parameters take `binds` in order (a value twice where
    /// the dialect's placeholders cannot name one twice).
    #[must_use]
    pub fn new(sql: impl Into<Arc<str>>, binds: &'static [Param]) -> Self {
        Self {
            sql: sql.into(),
            binds,
        }
    }

    /// The text.
    #[must_use]
    pub fn sql(&self) -> &Arc<str> {
        &self.sql
    }

    /// The query, with the call's values bound in the statement's order.
    pub(crate) fn bind<DB: Driver>(
        &self,
        values: &Values<'_>,
    ) -> Query<'static, DB, DB::Arguments> {
        self.binds
            .iter()
            .fold(query(&self.sql), |q, &p| DB::bind_value(q, values.get(p)))
    }
}

/// What every dialect's statements share, each one's text and bind order.
#[derive(Debug, Clone)]
pub struct SharedStatements {
    /// The completion, fenced (matched rows).
    pub complete: Statement,
    /// A row when the record is completed under the token.
    pub completed_under: Statement,
    /// The holder's release, fenced.
    pub release: Statement,
    /// The resource id saved, fenced.
    pub save_resource_id: Statement,
    /// The lease extended, fenced.
    pub extend_lease: Statement,
    /// The live record (the columns [`decode_record`](crate::decode_record) reads).
    pub fetch: Statement,
    /// The operator listing's first page.
    pub list_in_flight: Statement,
    /// The operator listing's next pages.
    pub list_in_flight_after: Statement,
    /// The operator's release.
    pub release_in_flight: Statement,
    /// The operator's delete of a completed record.
    pub delete_completed: Statement,
    /// The state counts (the columns [`decode_counts`](crate::decode_counts) reads).
    pub count_states: Statement,
}

impl SharedStatements {
    /// Every statement, with its name (its field's).
    #[must_use]
    pub fn all(&self) -> [(&'static str, &Statement); 11] {
        [
            ("complete", &self.complete),
            ("completed_under", &self.completed_under),
            ("release", &self.release),
            ("save_resource_id", &self.save_resource_id),
            ("extend_lease", &self.extend_lease),
            ("fetch", &self.fetch),
            ("list_in_flight", &self.list_in_flight),
            ("list_in_flight_after", &self.list_in_flight_after),
            ("release_in_flight", &self.release_in_flight),
            ("delete_completed", &self.delete_completed),
            ("count_states", &self.count_states),
        ]
    }

    /// The statement named `name` (its field's name), if it is one of these.
    #[must_use]
    pub fn named(&self, name: &str) -> Option<&Statement> {
        self.all()
            .into_iter()
            .find_map(|(n, statement)| (n == name).then_some(statement))
    }
}

/// The text of the statement named `name` that `store` runs, exactly as it
/// runs it, for review, `EXPLAIN` or a raw-driver baseline (the benches use
/// them): one of [`SharedStatements`] (by its field's name), or one of the
/// dialect's own ([`Dialect::statement`](crate::Dialect::statement)). Not
/// part of any stable API.
#[doc(hidden)]
#[must_use]
pub fn statement<'a, S: crate::TxStore>(store: &'a S, name: &str) -> Option<&'a str> {
    use crate::Dialect as _;
    let dialect = store.sql_core().dialect();
    match dialect.shared().named(name) {
        Some(shared) => Some(shared.sql()),
        None => dialect.statement(name),
    }
}

/// A bind parameter's value.
#[derive(Debug, Clone, Copy)]
pub enum Value<'a> {
    /// An integer (a time, a token, a limit).
    Int(i64),
    /// An integer or NULL.
    MaybeInt(Option<i64>),
    /// Text.
    Text(&'a str),
    /// Text or NULL.
    MaybeText(Option<&'a str>),
    /// Bytes.
    Bytes(&'a [u8]),
    /// Bytes or NULL.
    MaybeBytes(Option<&'a [u8]>),
}

/// The values of one call, for [`Statement::bind`].
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Values<'a> {
    pub(crate) key: Option<[u8; 16]>,
    pub(crate) token: Option<Token>,
    pub(crate) now: Option<Timestamp>,
    pub(crate) completion: Option<&'a Completion<'a>>,
    pub(crate) resource_id: Option<&'a str>,
    pub(crate) lease_until: Option<Timestamp>,
    pub(crate) attempt: Option<u32>,
    pub(crate) lease_before: Option<Timestamp>,
    pub(crate) limit: Option<u32>,
    pub(crate) after: Option<&'a KeysetAfter>,
}

impl<'a> Values<'a> {
    /// The values naming the record `id`.
    pub(crate) fn of(id: &RecordId) -> Self {
        Self {
            key: Some(record_key(id)),
            ..Self::default()
        }
    }

    /// The value `p` takes in this call; NULL when the call has none (a
    /// statement naming a value its call does not give, which the suite
    /// would show).
    fn get(&self, p: Param) -> Value<'_> {
        let ms = |t: Option<Timestamp>| Value::MaybeInt(t.map(Timestamp::as_unix_millis));
        let c = self.completion;
        match p {
            Param::Key => self
                .key
                .as_ref()
                .map_or(Value::MaybeInt(None), |k| Value::Bytes(&k[..])),
            Param::Token => Value::MaybeInt(self.token.map(Token::as_i64)),
            Param::Now => ms(self.now),
            Param::Outcome => Value::MaybeText(c.map(|c| c.outcome.as_str())),
            Param::Body => Value::MaybeBytes(c.and_then(|c| c.body)),
            Param::ResponseExpiresAt => ms(c.map(|c| c.response_expires_at)),
            Param::KeyExpiresAt => ms(c.map(|c| c.key_expires_at)),
            Param::ResourceId => Value::MaybeText(c.map_or(self.resource_id, |c| c.resource_id)),
            Param::LeaseUntil => ms(self.lease_until),
            Param::Attempt => Value::MaybeInt(self.attempt.map(i64::from)),
            Param::LeaseBefore => ms(self.lease_before),
            Param::Limit => Value::MaybeInt(self.limit.map(i64::from)),
            Param::AfterLeaseUntil => ms(self.after.map(|a| a.lease_until)),
            Param::AfterKey => self
                .after
                .map_or(Value::MaybeInt(None), |a| Value::Bytes(&a.key[..])),
        }
    }
}

/// The little of a sqlx database the shared statements need: binding a
/// [`Value`], running a query on a connection, decoding the state counts.
/// Every database of sqlx's drivers has it (a blanket implementation): a
/// dialect names its database and never implements this.
pub trait Driver: Database + sqlx::database::HasStatementCache {
    /// `query` with `value` bound as its next parameter.
    fn bind_value<'q>(
        query: Query<'q, Self, Self::Arguments>,
        value: Value<'_>,
    ) -> Query<'q, Self, Self::Arguments>;

    /// Runs `query`; the rows it matched.
    fn execute<'a>(
        query: Query<'a, Self, Self::Arguments>,
        conn: &'a mut Self::Connection,
    ) -> BoxFuture<'a, Result<u64, sqlx::Error>>;

    /// Runs `query`; its row, if any.
    fn fetch_optional<'a>(
        query: Query<'a, Self, Self::Arguments>,
        conn: &'a mut Self::Connection,
    ) -> BoxFuture<'a, Result<Option<Self::Row>, sqlx::Error>>;

    /// Runs `query`; its rows.
    fn fetch_all<'a>(
        query: Query<'a, Self, Self::Arguments>,
        conn: &'a mut Self::Connection,
    ) -> BoxFuture<'a, Result<Vec<Self::Row>, sqlx::Error>>;

    /// The state counts from the counting statement's row.
    ///
    /// # Errors
    ///
    /// The driver's.
    fn decode_counts(row: &Self::Row) -> Result<StateCounts, sqlx::Error>;
}

impl<DB> Driver for DB
where
    DB: Database + sqlx::database::HasStatementCache,
    DB::Arguments: IntoArguments<DB>,
    DB::QueryResult: Into<AnyQueryResult>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    i64: for<'t> Encode<'t, DB> + Type<DB> + for<'r> Decode<'r, DB>,
    for<'t> &'t str: Encode<'t, DB> + Type<DB>,
    for<'t> &'t [u8]: Encode<'t, DB> + Type<DB>,
    Option<i64>: for<'t> Encode<'t, DB> + Type<DB>,
    for<'t> Option<&'t str>: Encode<'t, DB> + Type<DB>,
    for<'t> Option<&'t [u8]>: Encode<'t, DB> + Type<DB>,
    &'static str: ColumnIndex<DB::Row>,
{
    fn bind_value<'q>(
        query: Query<'q, Self, Self::Arguments>,
        value: Value<'_>,
    ) -> Query<'q, Self, Self::Arguments> {
        match value {
            Value::Int(v) => query.bind(v),
            Value::MaybeInt(v) => query.bind(v),
            Value::Text(v) => query.bind(v),
            Value::MaybeText(v) => query.bind(v),
            Value::Bytes(v) => query.bind(v),
            Value::MaybeBytes(v) => query.bind(v),
        }
    }

    fn execute<'a>(
        query: Query<'a, Self, Self::Arguments>,
        conn: &'a mut Self::Connection,
    ) -> BoxFuture<'a, Result<u64, sqlx::Error>> {
        Box::pin(async move {
            let done: AnyQueryResult = query.execute(conn).await?.into();
            Ok(done.rows_affected())
        })
    }

    fn fetch_optional<'a>(
        query: Query<'a, Self, Self::Arguments>,
        conn: &'a mut Self::Connection,
    ) -> BoxFuture<'a, Result<Option<Self::Row>, sqlx::Error>> {
        Box::pin(query.fetch_optional(conn))
    }

    fn fetch_all<'a>(
        query: Query<'a, Self, Self::Arguments>,
        conn: &'a mut Self::Connection,
    ) -> BoxFuture<'a, Result<Vec<Self::Row>, sqlx::Error>> {
        Box::pin(query.fetch_all(conn))
    }

    fn decode_counts(row: &Self::Row) -> Result<StateCounts, sqlx::Error> {
        crate::row::decode_counts(row)
    }
}
