//! The store a crash binary works on, named by `IDEM_CRASH_BACKEND`: one
//! reading of that setting for every binary.

use idem_core::AnyStore;
use idem_mysql::MySqlStore;
use idem_postgres::PgStore;
use idem_redis::RedisStore;
use idem_sqlite::SqliteStore;
use idem_test_support::work::forced_coalescing;

/// `$store` (a SQL store, or a standalone Redis store), sending every call
/// through the batched path when the run asks for it ([`forced_coalescing`]:
/// the crash suite run once more that way).
macro_rules! batched_if_asked {
    ($store:expr) => {
        match forced_coalescing() {
            Some(mode) => $store.with_coalescing_mode(mode),
            None => $store,
        }
    };
}

/// Opens the store `spec` names: `sqlite:<file>`, `postgres:<url>#<schema>`,
/// `mysql:<url>#<table>`, `redis:<url>` (the default prefix) or
/// `redis:<url>#<prefix>`. With `migrate`, a Postgres or MySQL schema is
/// brought up to date first (a SQLite file always is; Redis has none);
/// without it, the parent has migrated it.
///
/// # Errors
///
/// A spec of no such form, or the store's own error, as text.
pub async fn open(spec: &str, migrate: bool) -> Result<AnyStore, String> {
    let unknown = || format!("unknown backend {spec:?}");
    let (kind, rest) = spec.split_once(':').ok_or_else(unknown)?;
    match kind {
        "sqlite" => {
            let store = SqliteStore::open(rest).await.map_err(text)?;
            Ok(AnyStore::new(batched_if_asked!(store)))
        }
        "postgres" => {
            let (url, schema) = rest.split_once('#').ok_or("postgres:<url>#<schema>")?;
            let store = postgres(url, schema).await?;
            if migrate {
                store.migrate().await.map_err(text)?;
            }
            Ok(AnyStore::new(batched_if_asked!(store)))
        }
        "mysql" => {
            let (url, table) = rest.split_once('#').ok_or("mysql:<url>#<table>")?;
            let store = MySqlStore::connect(url)
                .await
                .map_err(text)?
                .with_table_name(table)
                .map_err(text)?;
            if migrate {
                store.migrate().await.map_err(text)?;
            }
            Ok(AnyStore::new(batched_if_asked!(store)))
        }
        "redis" => {
            let (url, prefix) = rest
                .split_once('#')
                .map_or((rest, None), |(u, p)| (u, Some(p)));
            let mut store = RedisStore::connect(url).await.map_err(text)?;
            if let Some(prefix) = prefix {
                store = store.with_prefix(prefix).map_err(text)?;
            }
            Ok(AnyStore::new(batched_if_asked!(store)))
        }
        _ => Err(unknown()),
    }
}

/// The Postgres store in `schema` (not migrated), for the binaries that
/// need it as itself (the consumer's transactional inbox).
///
/// # Errors
///
/// The store's own error, as text.
pub async fn postgres(url: &str, schema: &str) -> Result<PgStore, String> {
    PgStore::connect(url)
        .await
        .map_err(text)?
        .with_schema_name(schema)
        .map_err(text)
}

fn text(e: impl std::fmt::Display) -> String {
    e.to_string()
}
