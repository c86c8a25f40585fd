//! `idem`: the operator's command-line tool for an idem store.
//!
//! Run with: `cargo run -p idem-cli -- --url sqlite://idem.db stats`
//!
//! See the crate README for every command, the URL forms and the exit codes.

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use idem_core::Idem;
use idem_core::Scope;
use idem_core::clock::Timestamp;
use idem_core::ops::AdminOutcome;
use idem_core::ops::Cursor;
use idem_core::ops::Page;
use idem_core::ops::RecordSummary;
use idem_core::ops::RecordView;
use idem_core::store::AdminStore;
use serde_json::{Value, json};

/// Operate an idem store: find and release stuck keys, delete records, purge,
/// count, migrate.
///
/// Exit codes: 0 done; 1 store or connection error; 2 bad usage; 3 no such
/// record; 4 refused (the record is in another state, or a destructive
/// action was not confirmed); 5 the store did not answer within `--timeout`.
#[derive(Debug, Parser)]
#[command(name = "idem", version)]
struct Cli {
    /// The store: `sqlite://PATH`, `postgres://…`, `redis://HOST:PORT`,
    /// `redis+cluster://HOST:PORT,HOST:PORT`, or `--url` once per cluster
    /// node (`redis://…` each).
    #[arg(long, env = "IDEM_URL", global = true, value_name = "URL")]
    url: Vec<String>,
    /// Postgres schema.
    #[arg(long, global = true, default_value = idem_postgres::DEFAULT_SCHEMA)]
    schema: String,
    /// Postgres table.
    #[arg(long, global = true, default_value = idem_postgres::DEFAULT_TABLE)]
    table: String,
    /// Redis key prefix.
    #[arg(long, global = true, default_value = "idem:")]
    prefix: String,
    /// Print one JSON document on stdout (errors too) instead of text.
    #[arg(long, global = true)]
    json: bool,
    /// Do not ask before a destructive action (release, delete, purge).
    #[arg(long, short = 'y', global = true)]
    yes: bool,
    /// How long to wait for the store, per call (connecting, each query or
    /// script, each page of a listing, each purge batch): `500ms`, `30s`,
    /// `2m`; a bare number is seconds. When it fires the command stops with
    /// exit code 5.
    #[arg(long, env = "IDEM_TIMEOUT", global = true, default_value = "30s", value_parser = parse_timeout)]
    timeout: Duration,
    #[command(subcommand)]
    command: Command,
}

/// Which record.
#[derive(Debug, Args)]
struct RecordArgs {
    /// The owner (tenant, account) of the record.
    #[arg(long)]
    owner: String,
    /// The operation, e.g. `POST /payments`.
    #[arg(long)]
    operation: String,
    /// The idempotency key.
    #[arg(long)]
    key: String,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show one record: state, attempt, lease, expiry times, resource id.
    Inspect {
        #[command(flatten)]
        record: RecordArgs,
        /// Also print the stored body.
        #[arg(long)]
        body: bool,
    },
    /// List records in flight whose lease has ended (crashed attempts that
    /// nobody retried), or ends within `--within-secs`.
    Stuck {
        /// Also list leases that end within this many seconds (a crashed
        /// attempt holding a long lease).
        #[arg(long, default_value_t = 0)]
        within_secs: u64,
        /// Records per page.
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Continue from a previous page's cursor.
        #[arg(long)]
        cursor: Option<String>,
        /// Walk every page.
        #[arg(long)]
        all: bool,
    },
    /// End an in-flight record's lease now: its next attempt runs as a
    /// recovery, with the saved resource id.
    Release {
        #[command(flatten)]
        record: RecordArgs,
        /// Only if the record is at this attempt (default: the attempt read
        /// just before releasing).
        #[arg(long)]
        attempt: Option<u32>,
    },
    /// Delete a completed record (its key becomes a new operation). Records
    /// in flight or released are refused.
    Delete {
        #[command(flatten)]
        record: RecordArgs,
    },
    /// Delete expired keys and drop expired bodies, in batches.
    Purge {
        /// Records per batch.
        #[arg(long, default_value_t = 1000)]
        batch: u32,
    },
    /// Count records by state.
    Stats,
    /// Create the table and indexes (SQL backends; nothing to do on Redis).
    Migrate,
}

/// `500ms`, `30s`, `2m` or a bare number of seconds; at least 1 ms.
fn parse_timeout(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (digits, unit) = text
        .find(|c: char| !c.is_ascii_digit())
        .map_or((text, "s"), |at| text.split_at(at));
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 500ms, 30s or 2m"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        _ => return Err(format!("{text:?}: the unit is ms, s or m")),
    };
    if d.is_zero() {
        return Err("the timeout must be at least 1ms".to_owned());
    }
    Ok(d)
}

/// Why the tool stops, and its exit code.
#[derive(Debug)]
enum Failure {
    Store(String),
    Usage(String),
    NotFound,
    Refused(String),
    Timeout(String),
}

impl Failure {
    fn code(&self) -> u8 {
        match self {
            Self::Store(_) => 1,
            Self::Usage(_) => 2,
            Self::NotFound => 3,
            Self::Refused(_) => 4,
            Self::Timeout(_) => 5,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Self::Store(_) => "store_error",
            Self::Usage(_) => "usage",
            Self::NotFound => "not_found",
            Self::Refused(_) => "refused",
            Self::Timeout(_) => "timeout",
        }
    }

    fn message(&self) -> String {
        match self {
            Self::Store(m) | Self::Usage(m) | Self::Refused(m) | Self::Timeout(m) => m.clone(),
            Self::NotFound => "no such record".to_owned(),
        }
    }
}

/// Runs a store call that is not an engine operator call (connecting,
/// migrating), abandoning it after `--timeout`.
async fn within<T, E: std::error::Error>(
    cli: &Cli,
    what: &str,
    fut: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(cli.timeout, fut).await {
        Ok(result) => result.map_err(store_failure),
        Err(_) => Err(Failure::Timeout(format!(
            "{what}: the store did not answer within {} ms",
            cli.timeout.as_millis()
        ))),
    }
}

/// A server-side bound a little past `--timeout`, so that a statement this
/// tool abandoned (a lock wait) does not linger on the server either.
fn backstop(cli: &Cli) -> Duration {
    cli.timeout.saturating_add(Duration::from_secs(1))
}

fn store_failure(e: impl std::error::Error) -> Failure {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    Failure::Store(msg)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return report(&cli, &store_failure(e)),
    };
    match runtime.block_on(dispatch(&cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => report(&cli, &f),
    }
}

fn report(cli: &Cli, f: &Failure) -> ExitCode {
    if cli.json {
        println!("{}", json!({"error": f.name(), "message": f.message()}));
    } else {
        eprintln!("idem: {}", f.message());
    }
    ExitCode::from(f.code())
}

/// The backends a URL can name.
enum Target {
    Sqlite(String),
    Postgres(String),
    Redis(String),
    Cluster(Vec<String>),
}

fn target(urls: &[String]) -> Result<Target, Failure> {
    let [first, rest @ ..] = urls else {
        return Err(Failure::Usage(
            "no store given: pass --url (or set IDEM_URL)".to_owned(),
        ));
    };
    let scheme = first.split(':').next().unwrap_or_default();
    if !rest.is_empty() {
        return if urls
            .iter()
            .all(|u| u.starts_with("redis://") || u.starts_with("rediss://"))
        {
            Ok(Target::Cluster(urls.to_vec()))
        } else {
            Err(Failure::Usage(
                "several --url are only for the nodes of a Redis Cluster".to_owned(),
            ))
        };
    }
    match scheme {
        "sqlite" => Ok(Target::Sqlite(first.clone())),
        "postgres" | "postgresql" => Ok(Target::Postgres(first.clone())),
        "redis" | "rediss" => Ok(Target::Redis(first.clone())),
        "redis+cluster" | "rediss+cluster" => {
            let tls = scheme.starts_with("rediss");
            let nodes = first
                .split_once("://")
                .map(|(_, n)| n)
                .unwrap_or_default()
                .split(',')
                .filter(|n| !n.is_empty())
                .map(|n| format!("{}://{n}", if tls { "rediss" } else { "redis" }))
                .collect::<Vec<_>>();
            if nodes.is_empty() {
                return Err(Failure::Usage("redis+cluster:// names no node".to_owned()));
            }
            Ok(Target::Cluster(nodes))
        }
        other => Err(Failure::Usage(format!(
            "unknown store scheme {other:?}: use sqlite://, postgres://, redis:// or redis+cluster://"
        ))),
    }
}

async fn dispatch(cli: &Cli) -> Result<(), Failure> {
    let migrate = matches!(cli.command, Command::Migrate);
    match target(&cli.url)? {
        Target::Sqlite(url) => {
            use idem_sqlite::sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
            let options = SqliteConnectOptions::from_str(&url)
                .map_err(|e| Failure::Usage(format!("bad sqlite URL: {e}")))?
                .create_if_missing(migrate)
                .busy_timeout(backstop(cli));
            let pool = within(
                cli,
                "connecting",
                SqlitePoolOptions::new()
                    .max_connections(2)
                    .acquire_timeout(backstop(cli))
                    .connect_with(options),
            )
            .await?;
            let store = idem_sqlite::SqliteStore::new(pool);
            if migrate {
                within(cli, "migrate", store.migrate()).await?;
                return done(
                    cli,
                    "migrated",
                    json!({"migrated": true, "backend": "sqlite"}),
                );
            }
            run(cli, Idem::new(store)).await
        }
        Target::Postgres(url) => {
            use idem_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
            let statement_timeout = backstop(cli).as_millis().to_string();
            let options = PgConnectOptions::from_str(&url)
                .map_err(|e| Failure::Usage(format!("bad postgres URL: {e}")))?
                .options([("statement_timeout", statement_timeout.as_str())]);
            let pool = PgPoolOptions::new()
                .max_connections(2)
                .acquire_timeout(backstop(cli));
            let store = within(
                cli,
                "connecting",
                idem_postgres::PgStore::connect_with(pool, options),
            )
            .await?
            .with_schema_name(&cli.schema)
            .and_then(|s| s.with_table_name(&cli.table))
            .map_err(|e| Failure::Usage(e.to_string()))?;
            if migrate {
                within(cli, "migrate", store.migrate()).await?;
                return done(
                    cli,
                    "migrated",
                    json!({"migrated": true, "backend": "postgres"}),
                );
            }
            run(cli, Idem::new(store)).await
        }
        Target::Redis(url) => {
            let store = within(cli, "connecting", idem_redis::RedisStore::connect(&url))
                .await?
                .with_prefix(&cli.prefix)
                .map_err(|e| Failure::Usage(e.to_string()))?;
            run_redis(cli, store).await
        }
        Target::Cluster(nodes) => {
            let store = within(
                cli,
                "connecting",
                idem_redis::RedisStore::connect_cluster(&nodes),
            )
            .await?
            .with_prefix(&cli.prefix)
            .map_err(|e| Failure::Usage(e.to_string()))?;
            run_redis(cli, store).await
        }
    }
}

async fn run_redis(cli: &Cli, store: idem_redis::RedisStore) -> Result<(), Failure> {
    if matches!(cli.command, Command::Migrate) {
        return done(
            cli,
            "nothing to migrate: Redis needs no schema",
            json!({"migrated": false, "backend": "redis"}),
        );
    }
    run(cli, Idem::new(store)).await
}

fn done(cli: &Cli, text: &str, doc: Value) -> Result<(), Failure> {
    if cli.json {
        println!("{doc}");
    } else {
        println!("{text}");
    }
    Ok(())
}

fn scope_of(r: &RecordArgs) -> Result<Scope, Failure> {
    Scope::new(r.owner.as_str(), r.operation.as_str()).map_err(|e| Failure::Usage(e.to_string()))
}

fn engine_failure(e: idem_core::Error) -> Failure {
    if let Some(t) = idem_core::ops::AdminTimeout::find(&e) {
        return Failure::Timeout(t.to_string());
    }
    match e {
        idem_core::Error::InvalidKey(k) => Failure::Usage(k.to_string()),
        other => store_failure(other),
    }
}

/// Asks before a destructive action, unless `--yes`. Without a terminal to
/// ask on, refuses.
fn confirm(cli: &Cli, what: &str) -> Result<(), Failure> {
    if cli.yes {
        return Ok(());
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(Failure::Refused(format!(
            "{what}: not confirmed (pass --yes when not on a terminal)"
        )));
    }
    eprint!("{what}? [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    stdin
        .lock()
        .read_line(&mut answer)
        .map_err(|e| Failure::Refused(format!("{what}: {e}")))?;
    if matches!(answer.trim(), "y" | "Y" | "yes") {
        Ok(())
    } else {
        Err(Failure::Refused(format!("{what}: not confirmed")))
    }
}

fn ms(t: Timestamp) -> i64 {
    t.as_unix_millis()
}

/// `in 3s` / `12s ago`, relative to now.
fn relative(t: Timestamp, now: Timestamp) -> String {
    let d = ms(t) - ms(now);
    if d >= 0 {
        format!("in {}s", d / 1000)
    } else {
        format!("{}s ago", -d / 1000)
    }
}

fn view_json(v: &RecordView) -> Value {
    let mut doc = json!({
        "owner": v.id.owner(),
        "operation": v.id.operation(),
        "key": v.id.key().as_str(),
        "state": v.state.as_str(),
        "attempt": v.attempt,
        "lease_until_ms": ms(v.lease_until),
        "lease_expired": v.lease_expired,
        "resource_id": v.resource_id,
        "outcome": v.outcome.map(|o| o.as_str()),
        "response_expires_at_ms": v.response_expires_at.map(ms),
        "key_expires_at_ms": ms(v.key_expires_at),
        "body_len": v.body_len,
        "fingerprint": v.fingerprint.to_hex(),
    });
    if let Some(body) = &v.body {
        doc["body"] = match std::str::from_utf8(body) {
            Ok(text) => json!(text),
            Err(_) => json!({ "hex": body.iter().map(|b| format!("{b:02x}")).collect::<String>() }),
        };
    }
    doc
}

fn print_view(v: &RecordView, now: Timestamp) {
    println!(
        "record      {} / {} / {}",
        v.id.owner(),
        v.id.operation(),
        v.id.key().as_str()
    );
    println!("state       {} (attempt {})", v.state.as_str(), v.attempt);
    println!(
        "lease until {} ({}{})",
        ms(v.lease_until),
        relative(v.lease_until, now),
        if v.lease_expired { ", ended" } else { "" }
    );
    println!("resource id {}", v.resource_id.as_deref().unwrap_or("-"));
    println!("outcome     {}", v.outcome.map_or("-", |o| o.as_str()));
    if let Some(t) = v.response_expires_at {
        println!("body until  {} ({})", ms(t), relative(t, now));
    }
    println!(
        "key until   {} ({})",
        ms(v.key_expires_at),
        relative(v.key_expires_at, now)
    );
    println!(
        "body        {}",
        v.body_len.map_or("-".to_owned(), |n| format!("{n} bytes"))
    );
    if let Some(body) = &v.body {
        println!("{}", String::from_utf8_lossy(body));
    }
}

fn summary_json(r: &RecordSummary) -> Value {
    json!({
        "owner": r.id.owner(),
        "operation": r.id.operation(),
        "key": r.id.key().as_str(),
        "state": r.state.as_str(),
        "attempt": r.attempt,
        "lease_until_ms": ms(r.lease_until),
        "resource_id": r.resource_id,
        "key_expires_at_ms": ms(r.key_expires_at),
    })
}

async fn run<S: AdminStore>(cli: &Cli, idem: Idem<S>) -> Result<(), Failure> {
    let now = idem.clock().now();
    let admin = idem.admin().timeout(cli.timeout);
    match &cli.command {
        Command::Inspect { record, body } => {
            let scope = scope_of(record)?;
            let view = admin
                .inspect(&scope, record.key.as_str(), *body)
                .await
                .map_err(engine_failure)?
                .ok_or(Failure::NotFound)?;
            if cli.json {
                println!("{}", view_json(&view));
            } else {
                print_view(&view, now);
            }
            Ok(())
        }
        Command::Stuck {
            within_secs,
            limit,
            cursor,
            all,
        } => {
            let within = Duration::from_secs(*within_secs);
            let mut cursor = cursor.clone().map(Cursor::new);
            let mut records = Vec::new();
            loop {
                let Page {
                    records: page,
                    next,
                } = admin
                    .list_stuck(within, cursor.as_ref(), *limit)
                    .await
                    .map_err(engine_failure)?;
                records.extend(page);
                cursor = next;
                // A Redis page may come back short while more follow.
                if cursor.is_none() || (!all && records.len() >= *limit as usize) {
                    break;
                }
            }
            if cli.json {
                let list: Vec<Value> = records.iter().map(summary_json).collect();
                println!(
                    "{}",
                    json!({"records": list, "next": cursor.as_ref().map(Cursor::as_str)})
                );
            } else {
                for r in &records {
                    println!(
                        "{}\t{}\t{}\tattempt {}\tlease ended {}\tresource {}",
                        r.id.owner(),
                        r.id.operation(),
                        r.id.key().as_str(),
                        r.attempt,
                        relative(r.lease_until, now),
                        r.resource_id.as_deref().unwrap_or("-")
                    );
                }
                println!("{} record(s)", records.len());
                if let Some(c) = &cursor {
                    println!("more: --cursor '{}'", c.as_str());
                }
            }
            Ok(())
        }
        Command::Release { record, attempt } => {
            let scope = scope_of(record)?;
            let view = admin
                .inspect(&scope, record.key.as_str(), false)
                .await
                .map_err(engine_failure)?
                .ok_or(Failure::NotFound)?;
            let attempt = attempt.unwrap_or(view.attempt);
            confirm(
                cli,
                &format!(
                    "release {} / {} / {} (attempt {attempt}, {})",
                    record.owner,
                    record.operation,
                    record.key,
                    view.state.as_str()
                ),
            )?;
            let outcome = admin
                .release_stuck(&scope, record.key.as_str(), Some(attempt))
                .await
                .map_err(engine_failure)?;
            admin_result(cli, "released", outcome, attempt)
        }
        Command::Delete { record } => {
            let scope = scope_of(record)?;
            confirm(
                cli,
                &format!(
                    "delete {} / {} / {}",
                    record.owner, record.operation, record.key
                ),
            )?;
            let outcome = admin
                .delete_record(&scope, record.key.as_str())
                .await
                .map_err(engine_failure)?;
            admin_result(cli, "deleted", outcome, 0)
        }
        Command::Purge { batch } => {
            let native = idem.store().capabilities().native_expiry;
            if native {
                return done(
                    cli,
                    "nothing to purge: this store expires records natively",
                    json!({"keys_removed": 0, "bodies_dropped": 0, "native_expiry": true}),
                );
            }
            confirm(cli, "purge expired keys and bodies")?;
            let report = admin.purge_expired(*batch).await.map_err(engine_failure)?;
            done(
                cli,
                &format!(
                    "{} key(s) removed, {} body(ies) dropped",
                    report.keys_removed, report.bodies_dropped
                ),
                json!({
                    "keys_removed": report.keys_removed,
                    "bodies_dropped": report.bodies_dropped,
                    "native_expiry": false,
                }),
            )
        }
        Command::Stats => {
            let c = admin.count_states().await.map_err(engine_failure)?;
            done(
                cli,
                &format!(
                    "in_flight {}\nstuck     {}\nreleased  {}\ncompleted {}\nexpired   {}",
                    c.in_flight, c.stuck, c.released, c.completed, c.expired
                ),
                json!({
                    "in_flight": c.in_flight,
                    "stuck": c.stuck,
                    "released": c.released,
                    "completed": c.completed,
                    "expired": c.expired,
                }),
            )
        }
        Command::Migrate => Ok(()),
    }
}

fn admin_result(cli: &Cli, verb: &str, outcome: AdminOutcome, attempt: u32) -> Result<(), Failure> {
    match outcome {
        AdminOutcome::Done => done(cli, verb, json!({ verb: true, "attempt": attempt })),
        AdminOutcome::Absent => Err(Failure::NotFound),
        AdminOutcome::Refused { state, attempt } => Err(Failure::Refused(format!(
            "not {verb}: the record is {} at attempt {attempt}",
            state.as_str()
        ))),
        _ => Err(Failure::Refused(format!("not {verb}"))),
    }
}
