//! Shared test setup: servers found or started, isolated stores, cleanup.
#![allow(dead_code)] // each test binary uses a different part

pub(crate) mod cluster;
pub(crate) mod replicated;
pub(crate) mod scenario;
pub(crate) mod server;
pub(crate) mod stats;

use idem_core::IdempotencyKey;
use idem_core::testkit::Fixture;
use idem_redis::RedisStore;
use idem_redis::redis::{self, Client, Commands};

/// The standalone server's URL: `IDEM_REDIS_URL`, or the local default.
pub(crate) fn standalone_url() -> String {
    std::env::var("IDEM_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned())
}

/// A prefix no other test uses.
pub(crate) fn unique_prefix() -> String {
    format!("idemtest:{}:", IdempotencyKey::random().as_str())
}

fn unreachable(url: &str, e: &dyn std::error::Error) -> ! {
    panic!(
        "cannot reach Redis at {url}: {e}. Start one with \
         `redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save \"\" --appendonly no` \
         or point IDEM_REDIS_URL at a running server"
    )
}

/// A store over standalone Redis with its own prefix.
pub(crate) async fn standalone_store() -> RedisStore {
    let url = standalone_url();
    let store = RedisStore::connect(&url)
        .await
        .unwrap_or_else(|e| unreachable(&url, &e));
    batched_if_asked(store.with_prefix(&unique_prefix()).expect("valid prefix"))
}

/// `store`, sending every call through the pipelined path when the run asks
/// for it (`IDEM_TEST_BATCH_EVERY_CALL=1`: `.ci/run` runs the fault and
/// failover suites once more that way).
pub(crate) fn batched_if_asked(store: RedisStore) -> RedisStore {
    match idem_test_support::work::forced_coalescing() {
        Some(mode) => store.with_coalescing_mode(mode),
        None => store,
    }
}

/// One test's store, and where its keys must be deleted from.
pub(crate) struct RedisFixture {
    pub(crate) store: RedisStore,
    pub(crate) nodes: Vec<String>,
    cleaned: bool,
}

impl RedisFixture {
    /// A fixture over a store built by the test, whose keys live on `nodes`.
    pub(crate) fn from_store(store: RedisStore, nodes: Vec<String>) -> Self {
        Self::new(store, nodes)
    }

    fn new(store: RedisStore, nodes: Vec<String>) -> Self {
        Self {
            store,
            nodes,
            cleaned: false,
        }
    }
}

/// A test that panicked before its teardown still leaves no keys behind:
/// delete them with a blocking connection (no runtime needed in `drop`).
impl Drop for RedisFixture {
    fn drop(&mut self) {
        if self.cleaned {
            return;
        }
        let pattern = format!("{}*", self.store.prefix().as_str());
        for url in &self.nodes {
            let Ok(mut conn) = Client::open(url.as_str()).and_then(|c| c.get_connection()) else {
                continue;
            };
            let keys: Vec<String> = match conn.scan_match(&pattern) {
                Ok(iter) => iter.filter_map(Result::ok).collect(),
                Err(_) => continue,
            };
            for key in keys {
                let _: redis::RedisResult<i64> = conn.del(&key);
            }
        }
    }
}

impl RedisFixture {
    /// Deletes the test's keys and checks none is left.
    pub(crate) async fn teardown_checked(self) {
        Fixture::teardown(self).await;
    }
}

impl Fixture for RedisFixture {
    type Store = RedisStore;
    fn store(&self) -> RedisStore {
        self.store.clone()
    }
    async fn teardown(mut self) {
        self.cleaned = true;
        let left = delete_keys(&self.nodes, self.store.prefix().as_str()).await;
        assert!(left.is_empty(), "keys left behind: {left:?}");
    }
}

/// The conformance fixture on standalone Redis.
pub(crate) async fn standalone() -> RedisFixture {
    RedisFixture::new(standalone_store().await, vec![standalone_url()])
}

/// The largest body the `*_inline` fixtures keep inside its record: 1 KiB,
/// so that the suite's small bodies are inline and its large ones (up to
/// 1 MiB) go to the body key.
pub(crate) const INLINE_LIMIT: usize = 1024;

/// The conformance fixture on standalone Redis, bodies up to
/// [`INLINE_LIMIT`] kept inside their record.
pub(crate) async fn standalone_inline() -> RedisFixture {
    let mut f = standalone().await;
    f.store = f.store.clone().with_inline_body_limit(INLINE_LIMIT);
    f
}

/// The conformance fixture on the cluster, bodies up to [`INLINE_LIMIT`]
/// kept inside their record.
pub(crate) async fn cluster_inline() -> RedisFixture {
    let mut f = cluster().await;
    f.store = f.store.clone().with_inline_body_limit(INLINE_LIMIT);
    f
}

/// The conformance fixture on the cluster (started once per test binary).
pub(crate) async fn cluster() -> RedisFixture {
    let nodes = cluster::urls();
    let store = RedisStore::connect_cluster(&nodes)
        .await
        .unwrap_or_else(|e| panic!("cannot reach the Redis Cluster at {nodes:?}: {e}"));
    RedisFixture::new(
        store.with_prefix(&unique_prefix()).expect("valid prefix"),
        nodes,
    )
}

/// Every key under `prefix` on each node (`SCAN MATCH`, node by node).
pub(crate) async fn scan_keys(nodes: &[String], prefix: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for url in nodes {
        let keys = idem_test_support::redis_admin::scan(&mut admin(url).await, prefix).await;
        found.extend(keys.into_iter().map(|k| (url.clone(), k)));
    }
    found
}

/// Deletes every key under `prefix` (on the node holding it, one pipelined
/// `DEL` per key, since keys of different slots cannot share a `DEL` on a
/// cluster); returns what is still there afterwards (should be nothing).
pub(crate) async fn delete_keys(nodes: &[String], prefix: &str) -> Vec<(String, String)> {
    let found = scan_keys(nodes, prefix).await;
    for url in nodes {
        let mut conn = admin(url).await;
        let keys: Vec<&String> = found
            .iter()
            .filter(|(u, _)| u == url)
            .map(|(_, k)| k)
            .collect();
        for batch in keys.chunks(1000) {
            let mut pipe = redis::pipe();
            for key in batch {
                pipe.del(*key).ignore();
            }
            let _: () = pipe.query_async(&mut conn).await.expect("DEL");
        }
    }
    scan_keys(nodes, prefix).await
}

/// A plain connection to one node, for administration and inspection.
pub(crate) async fn admin(url: &str) -> redis::aio::MultiplexedConnection {
    let client = Client::open(url).unwrap_or_else(|e| unreachable(url, &e));
    client
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| unreachable(url, &e))
}

/// A connection manager on `url` whose response timeout is `timeout` instead
/// of redis-rs's 500 ms: for stores with a replica acknowledgement, whose
/// `WAIT` must be answered by its own timeout, not cut by the client.
pub(crate) async fn manager_with_response_timeout(
    url: &str,
    timeout: std::time::Duration,
) -> redis::aio::ConnectionManager {
    let config = redis::aio::ConnectionManagerConfig::new().set_response_timeout(Some(timeout));
    Client::open(url)
        .expect("url")
        .get_connection_manager_with_config(config)
        .await
        .expect("connect")
}
