//! `idem`: the operator's command-line tool for an idem store.
//!
//! Run with: `cargo run -p idem-cli -- --url sqlite://idem.db stats`
//!
//! See the crate README for every command, the URL forms and the exit codes.

mod show;

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use idem::ops::AdminOutcome;
use idem::store::Store;
use idem::store::{Cursor, Page};
use idem::{AnyStore, ConnectError, ConnectOptions, Idem, Scope};
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
    /// The store: `sqlite://PATH` (or a file path), `postgres://…`,
    /// `mysql://…` or `mariadb://…`, `redis://HOST:PORT`, `redis+cluster://HOST:PORT,HOST:PORT`, or
    /// `--url` once per cluster node (`redis://…` each).
    #[arg(long, env = "IDEM_URL", global = true, value_name = "URL")]
    url: Vec<String>,
    /// Postgres schema.
    #[arg(long, global = true, default_value = idem::postgres::DEFAULT_SCHEMA)]
    schema: String,
    /// The table (Postgres, MySQL/MariaDB, SQLite).
    #[arg(long, global = true, default_value = idem::postgres::DEFAULT_TABLE)]
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
    /// Open the store for reading only: no migration, and a Postgres
    /// standby (a read replica) is accepted, so `inspect`, `stuck` and
    /// `stats` can read a replica. `release`, `delete`, `purge` and
    /// `migrate` are refused (exit code 2).
    #[arg(long, global = true)]
    read_only: bool,
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

/// A server-side bound a little past `--timeout`, so that a statement this
/// tool abandoned (a lock wait) does not linger on the server either.
fn backstop(cli: &Cli) -> Duration {
    cli.timeout.saturating_add(Duration::from_secs(1))
}

fn store_failure(e: impl std::error::Error) -> Failure {
    Failure::Store(chain(&e))
}

/// The error and its causes, each said once: a cause whose text the message
/// already holds (drivers often repeat their source in their own text) is
/// skipped.
fn chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !text.is_empty() && !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        source = cause.source();
    }
    msg
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

/// The one store URL the `--url`s name: the URL itself, or several Redis
/// node URLs as one `redis+cluster://` URL.
fn store_url(urls: &[String]) -> Result<String, Failure> {
    let [first, rest @ ..] = urls else {
        return Err(Failure::Usage(
            "no store given: pass --url (or set IDEM_URL)".to_owned(),
        ));
    };
    if rest.is_empty() {
        return Ok(first.clone());
    }
    let mut scheme = None;
    let mut nodes = Vec::new();
    for url in urls {
        let Some((s @ ("redis" | "rediss"), node)) = url.split_once("://") else {
            return Err(Failure::Usage(
                "several --url are only for the nodes of a Redis Cluster".to_owned(),
            ));
        };
        if scheme.is_some_and(|first| first != s) {
            return Err(Failure::Usage(
                "the nodes of one Redis Cluster are all redis:// or all rediss://".to_owned(),
            ));
        }
        scheme = Some(s);
        let node = node.strip_suffix('/').unwrap_or(node);
        if node.contains(',') {
            return Err(Failure::Usage(format!(
                "a cluster node URL with a comma: give the nodes as one {s}+cluster:// URL"
            )));
        }
        nodes.push(node);
    }
    Ok(format!(
        "{}+cluster://{}",
        scheme.unwrap_or("redis"),
        nodes.join(",")
    ))
}

/// The backend a URL that [`idem::connect`] accepted names, for the report
/// of `migrate`.
fn backend_name(url: &str) -> &'static str {
    let url = url.to_ascii_lowercase();
    if url.starts_with("postgres") {
        "postgres"
    } else if url.starts_with("mysql") || url.starts_with("mariadb") {
        "mysql"
    } else if url.starts_with("redis") {
        "redis"
    } else {
        "sqlite"
    }
}

fn connect_failure(e: ConnectError) -> Failure {
    match e {
        ConnectError::UnknownScheme { .. }
        | ConnectError::FeatureDisabled { .. }
        | ConnectError::Invalid { .. } => Failure::Usage(chain(&e)),
        other => store_failure(other),
    }
}

async fn dispatch(cli: &Cli) -> Result<(), Failure> {
    let url = store_url(&cli.url)?;
    if cli.read_only {
        let writes = match cli.command {
            Command::Release { .. } => Some("release"),
            Command::Delete { .. } => Some("delete"),
            Command::Purge { .. } => Some("purge"),
            Command::Migrate => Some("migrate"),
            _ => None,
        };
        if let Some(name) = writes {
            return Err(Failure::Usage(format!(
                "{name} writes to the store: refused with --read-only"
            )));
        }
    }
    let migrate = matches!(cli.command, Command::Migrate);
    // The schema, table and prefix apply where the backend has them; the
    // server-side backstop bounds each wait on the server (see the README).
    let options = ConnectOptions::new()
        .migrate(migrate)
        .schema_name(&cli.schema)
        .table_name(&cli.table)
        .key_prefix(&cli.prefix)
        .timeout(backstop(cli))
        .read_only(cli.read_only);
    let store = match tokio::time::timeout(cli.timeout, options.connect(&url)).await {
        Ok(store) => store.map_err(connect_failure)?,
        Err(_) => {
            return Err(Failure::Timeout(format!(
                "{}: the store did not answer within {} ms",
                if migrate { "migrate" } else { "connecting" },
                cli.timeout.as_millis()
            )));
        }
    };
    if migrate {
        return match backend_name(&url) {
            "redis" => done(
                cli,
                "nothing to migrate: Redis needs no schema",
                json!({"migrated": false, "backend": "redis"}),
            ),
            backend => done(
                cli,
                "migrated",
                json!({"migrated": true, "backend": backend}),
            ),
        };
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

fn engine_failure(e: idem::Error) -> Failure {
    if let Some(t) = idem::ops::AdminTimeout::find(&e) {
        return Failure::Timeout(t.to_string());
    }
    match e {
        idem::Error::InvalidKey(k) => Failure::Usage(k.to_string()),
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

async fn run(cli: &Cli, idem: Idem<AnyStore>) -> Result<(), Failure> {
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
                println!("{}", show::view_json(&view));
            } else {
                print!("{}", show::view_text(&view, now));
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
                let list: Vec<Value> = records.iter().map(show::summary_json).collect();
                println!(
                    "{}",
                    json!({"records": list, "next": cursor.as_ref().map(Cursor::as_str)})
                );
            } else {
                for r in &records {
                    println!("{}", show::summary_line(r, now));
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
