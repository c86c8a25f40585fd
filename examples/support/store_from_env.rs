//! The store an example server runs on, chosen at run time from the
//! environment (`IDEM_STORE`, `IDEM_SQLITE_PATH`, `IDEM_POSTGRES_URL`,
//! `IDEM_POSTGRES_SCHEMA`, `IDEM_MYSQL_URL`, `IDEM_MYSQL_TABLE`,
//! `IDEM_REDIS_URL`, `IDEM_REDIS_PREFIX`, `IDEM_REDIS_INLINE_BODY_LIMIT`):
//! `idem::connect` opens (and migrates) the store a URL names as an
//! `AnyStore`, so one `Idem<AnyStore>` type serves them all.
//! Shared by `http_orders` and `webhook_receiver`, whose documented
//! environment it implements.

use idem::{AnyStore, ConnectError, ConnectOptions};

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
    match which.as_str() {
        "memory" => {
            println!("store: memory (forgotten when the process ends)");
            Ok(AnyStore::new(idem::MemoryStore::new()))
        }
        "sqlite" => {
            let path = std::path::PathBuf::from(var("IDEM_SQLITE_PATH", format!("idem-{name}.db")));
            let url = path.to_string_lossy().into_owned();
            let needs = "the `sqlite` feature (on by default)";
            let store = open(ConnectOptions::new(), &url, &which, needs).await?;
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
            let options = ConnectOptions::new().schema_name(&schema);
            let needs = format!("`--features {features},postgres`");
            let store = open(options, &url, &which, &needs).await?;
            println!("store: postgres, schema {schema}");
            Ok(store)
        }
        "mysql" => {
            let url = var(
                "IDEM_MYSQL_URL",
                "mysql://root@127.0.0.1:3306/test".to_owned(),
            );
            let table = var("IDEM_MYSQL_TABLE", snake);
            let options = ConnectOptions::new().table_name(&table);
            let needs = format!("`--features {features},mysql`");
            let store = open(options, &url, &which, &needs).await?;
            println!("store: mysql, table {table}");
            Ok(store)
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
            let options = ConnectOptions::new()
                .key_prefix(&prefix)
                .redis_inline_body_limit(inline);
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

/// Opens the store `url` names; a backend compiled out says which features
/// the example needs.
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
