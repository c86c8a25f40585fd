//! The store an example server runs on, chosen at run time from the
//! environment (`IDEM_STORE`, `IDEM_SQLITE_PATH`, `IDEM_POSTGRES_URL`,
//! `IDEM_POSTGRES_SCHEMA`, `IDEM_MYSQL_URL`, `IDEM_MYSQL_TABLE`,
//! `IDEM_REDIS_URL`, `IDEM_REDIS_PREFIX`, `IDEM_REDIS_INLINE_BODY_LIMIT`,
//! `IDEM_CALL_TIMEOUT_MS`, `IDEM_REQUIRE_SYNC_REPLICATION`):
//! `idem::connect` opens (and migrates) the store a URL names as an
//! `AnyStore`, so one `Idem<AnyStore>` type serves them all; and the policy
//! (`IDEM_LEASE_MS`, `IDEM_RESPONSE_TTL_MS`, `IDEM_KEY_TTL_MS`).
//! Shared by `http_orders`, `grpc_orders` and `webhook_receiver`, whose
//! documented environment it implements, and by `mcp_orders` for its policy
//! (it opens its store itself: its stdout is the MCP channel).

use std::time::Duration;

use idem::{AnyStore, ConnectError, ConnectOptions, Policy, PolicyBuilder};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Opens the store `IDEM_STORE` names (`sqlite` by default) and prints one
/// `store: …` line saying which, and where: the example's first line.
/// `name` (kebab case, e.g. `http-orders`) names the default SQLite file
/// (`idem-<name>.db` in the working directory: it outlives the process, so
/// a restarted example still knows what it answered), the default Postgres
/// schema and MySQL table (snake case) and the default Redis key prefix;
/// `features` is what the example is run with, for the error a
/// compiled-out backend gives.
pub(crate) async fn store_from_env(name: &str, features: &str) -> Result<AnyStore, BoxError> {
    let which = std::env::var("IDEM_STORE").unwrap_or_else(|_| "sqlite".to_owned());
    let snake = format!("idem_{}", name.replace('-', "_"));
    let var = |key: &str, default: String| std::env::var(key).unwrap_or(default);
    let base = base_options()?;
    match which.as_str() {
        "memory" => {
            println!("store: memory (forgotten when the process ends)");
            Ok(AnyStore::new(idem::MemoryStore::new()))
        }
        "sqlite" => {
            let path = std::path::PathBuf::from(var("IDEM_SQLITE_PATH", format!("idem-{name}.db")));
            let url = path.to_string_lossy().into_owned();
            let needs = "the `sqlite` feature (on by default)";
            let store = open(base, &url, &which, needs).await?;
            let shown = std::path::absolute(&path).unwrap_or(path);
            println!("store: sqlite {}", shown.display());
            Ok(store)
        }
        "postgres" => {
            let url = var(
                "IDEM_POSTGRES_URL",
                "postgres://postgres@127.0.0.1:5432/test".to_owned(),
            );
            let schema = var("IDEM_POSTGRES_SCHEMA", snake);
            let options = base.schema_name(&schema);
            open_server(options, &url, &which, features, &format!("schema {schema}")).await
        }
        "mysql" => {
            let url = var(
                "IDEM_MYSQL_URL",
                "mysql://root@127.0.0.1:3306/test".to_owned(),
            );
            let table = var("IDEM_MYSQL_TABLE", snake);
            let options = base.table_name(&table);
            open_server(options, &url, &which, features, &format!("table {table}")).await
        }
        "redis" => {
            let url = var("IDEM_REDIS_URL", "redis://127.0.0.1:6379/".to_owned());
            let prefix = var("IDEM_REDIS_PREFIX", format!("idem-{name}:"));
            let inline = match std::env::var("IDEM_REDIS_INLINE_BODY_LIMIT") {
                Ok(v) => v.parse::<usize>().map_err(|e| {
                    format!("IDEM_REDIS_INLINE_BODY_LIMIT={v}: not a number of bytes ({e})")
                })?,
                Err(_) => 0,
            };
            let options = base.key_prefix(&prefix).redis_inline_body_limit(inline);
            let needs = format!("`--features {features},redis`");
            let store = open(options, &url, &which, &needs).await?;
            println!("store: redis, prefix {prefix}");
            Ok(store)
        }
        other => {
            Err(format!("IDEM_STORE={other}: use sqlite, memory, postgres, mysql or redis").into())
        }
    }
}

/// The options every backend shares: `IDEM_CALL_TIMEOUT_MS` (how long one
/// store call may wait on the server: `ConnectOptions::timeout`; unset, the
/// backends' own) and `IDEM_REQUIRE_SYNC_REPLICATION` (`1` or `true`: on
/// Postgres, refuse to start unless commits are synchronous to a standby;
/// unset, a warning on stderr) with `IDEM_REPLICATION_CHECK_MS` (how often
/// such a store checks the server again; unset, the backend's 5 s).
fn base_options() -> Result<ConnectOptions, BoxError> {
    let mut options = ConnectOptions::new();
    if let Some(timeout) = millis("IDEM_CALL_TIMEOUT_MS")? {
        options = options.timeout(timeout);
    }
    match std::env::var("IDEM_REQUIRE_SYNC_REPLICATION").as_deref() {
        Err(_) | Ok("" | "0" | "false") => {}
        Ok("1" | "true") => options = options.require_synchronous_replication(true),
        Ok(other) => {
            return Err(format!("IDEM_REQUIRE_SYNC_REPLICATION={other}: use 1 or 0").into());
        }
    }
    if let Some(period) = millis("IDEM_REPLICATION_CHECK_MS")? {
        options = options.replication_check_period(period);
    }
    Ok(options)
}

/// The environment variable `name` as a number of milliseconds, if set.
fn millis(name: &str) -> Result<Option<Duration>, BoxError> {
    let Ok(ms) = std::env::var(name) else {
        return Ok(None);
    };
    let parsed: u64 = ms
        .parse()
        .map_err(|e| format!("{name}={ms}: not a number of milliseconds ({e})"))?;
    Ok(Some(Duration::from_millis(parsed)))
}

/// The policy `base` sets, with `IDEM_LEASE_MS`, `IDEM_RESPONSE_TTL_MS` and
/// `IDEM_KEY_TTL_MS` (milliseconds) over it where they are set; unset, the
/// defaults (60 s, 24 h, 30 days).
#[allow(dead_code, reason = "webhook_receiver runs on the default policy")]
pub(crate) fn policy_from_env(base: PolicyBuilder) -> Result<Policy, BoxError> {
    type Set = fn(PolicyBuilder, Duration) -> PolicyBuilder;
    let knobs: [(&str, Set); 3] = [
        ("IDEM_LEASE_MS", PolicyBuilder::lease),
        ("IDEM_RESPONSE_TTL_MS", PolicyBuilder::response_ttl),
        ("IDEM_KEY_TTL_MS", PolicyBuilder::key_ttl),
    ];
    let mut b = base;
    for (name, set) in knobs {
        if let Some(ms) = millis(name)? {
            b = set(b, ms);
        }
    }
    Ok(b.build()?)
}

/// Prints the library's warnings (a commit not synchronous to any standby,
/// a completion not stored yet, a shutdown that left work) on stderr, where
/// an operator sees them; `RUST_LOG` is not read.
pub(crate) fn log_warnings_to_stderr() {
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
}

/// Opens the store `url` names; a backend compiled out says which features
/// the example needs.
/// Opens the SQL server store `which` (`postgres`, `mysql`, its feature's
/// name too) at `url` and prints its `store: {which}, {place}` line.
async fn open_server(
    options: ConnectOptions,
    url: &str,
    which: &str,
    features: &str,
    place: &str,
) -> Result<AnyStore, BoxError> {
    let needs = format!("`--features {features},{which}`");
    let store = open(options, url, which, &needs).await?;
    println!("store: {which}, {place}");
    Ok(store)
}

async fn open(
    options: ConnectOptions,
    url: &str,
    which: &str,
    needs: &str,
) -> Result<AnyStore, BoxError> {
    match options.connect(url).await {
        Ok(store) => Ok(store),
        Err(ConnectError::FeatureDisabled { .. }) => {
            Err(format!("IDEM_STORE={which} needs {needs}").into())
        }
        Err(e) => Err(e.into()),
    }
}
