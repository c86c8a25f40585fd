//! Issue 23's start check on the machine's server, which has no standby:
//! commits are not synchronous to any, so a store says so once (a warning),
//! `migrate` reports it, and a store that requires synchronous replication
//! refuses to start. The standby and the satisfied cases need a replicated
//! pair: `tests/failover.rs`.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem_core::clock::ManualClock;
use idem_core::{Idem, IdempotencyKey, Reply};
use idem_postgres::sqlx::postgres::PgPoolOptions;
use idem_postgres::{Error, PgStore};
use idem_test_support::sql::{Out, policy, request, scope};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// An engine on `store`, one store retry.
fn engine(store: &PgStore) -> Idem<PgStore> {
    Idem::new(store.clone())
        .with_clock(ManualClock::starting_now())
        .with_policy(policy(1))
}

/// One call on a fresh key.
async fn call(engine: &Idem<PgStore>) -> Result<Reply<String, String>, idem_core::Error> {
    engine
        .execute(
            &scope(),
            IdempotencyKey::random().as_str(),
            &request(),
            |_| async { Out::Success("ok".into()) },
        )
        .await
}

/// Counts the warnings idem-postgres logs on this thread.
#[derive(Debug, Clone, Default)]
struct Warnings(Arc<AtomicUsize>);

impl Warnings {
    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Subscriber for Warnings {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let meta = event.metadata();
        if *meta.level() == Level::WARN && meta.target().starts_with("idem_postgres") {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

async fn drop_schema(schema: &str) {
    let admin = support::pool(1, support::options()).await;
    idem_postgres::sqlx::query(idem_postgres::sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
    )))
    .execute(&admin)
    .await
    .expect("drop schema");
    admin.close().await;
}

/// Connect warns once, `migrate` reports what it found (and does not warn
/// again, nor does a store derived from the first), and requiring
/// synchronous replication fails at start, typed, naming the settings.
#[tokio::test(flavor = "current_thread")]
async fn commits_without_a_synchronous_standby_warn_once_and_can_be_refused() {
    let warnings = Warnings::default();
    let _guard = tracing::subscriber::set_default(warnings.clone());
    let schema = support::schema_name();

    let store = PgStore::connect_with(PgPoolOptions::new().max_connections(2), support::options())
        .await
        .expect("connect")
        .with_schema_name(&schema)
        .expect("schema");
    assert_eq!(warnings.count(), 1, "connecting warned");
    let found = store.migrate().await.expect("migrate");
    assert!(!found.is_synchronous(), "{found:?}");
    assert!(!found.in_recovery);
    assert_eq!(found.synchronous_standby_names, "");
    assert_eq!(store.check_replication().await.expect("check"), found);
    let reply = call(&engine(&store))
        .await
        .expect("a store that is not required to be synchronous runs");
    assert!(reply.is_stored());
    assert_eq!(warnings.count(), 1, "once per store");

    assert!(!store.requires_synchronous_replication());
    let refused = store.clone().require_synchronous_replication().await;
    match refused {
        Err(Error::NotSynchronous {
            synchronous_commit,
            synchronous_standby_names,
        }) => {
            assert_eq!(synchronous_commit, found.synchronous_commit);
            assert_eq!(synchronous_standby_names, "");
        }
        other => panic!("expected NotSynchronous, got {other:?}"),
    }
    let message = Error::NotSynchronous {
        synchronous_commit: "on".into(),
        synchronous_standby_names: String::new(),
    }
    .to_string();
    assert!(message.contains("synchronous_standby_names"), "{message}");

    drop_schema(&schema).await;
    store.close().await;
}

/// A store over your own pool checks nothing until asked; its first call
/// checks (and warns, once), and `synchronous_commit = off` set for the
/// session is what it reads.
#[tokio::test(flavor = "current_thread")]
async fn a_store_over_a_pool_checks_before_its_first_call() {
    let warnings = Warnings::default();
    let _guard = tracing::subscriber::set_default(warnings.clone());
    let options = support::options().options([("synchronous_commit", "off")]);
    let store = PgStore::new(support::pool(2, options).await)
        .with_schema_name(&support::schema_name())
        .expect("schema");
    assert_eq!(warnings.count(), 0, "new() uses no connection");
    let found = store.migrate().await.expect("migrate");
    assert_eq!(found.synchronous_commit, "off");
    assert!(found.is_local_flush_skipped() && !found.is_synchronous());
    assert_eq!(warnings.count(), 1);

    let fresh = PgStore::new(store.pool().clone())
        .with_schema_name(store.schema_name())
        .expect("schema");
    let engine = engine(&fresh);
    for _ in 0..3 {
        call(&engine).await.expect("call");
    }
    assert_eq!(
        warnings.count(),
        2,
        "the first call of the new store checked, once"
    );

    drop_schema(store.schema_name()).await;
    store.pool().close().await;
}
