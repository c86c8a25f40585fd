//! What a Redis server says of itself (`INFO`) and which keys it holds under
//! a prefix, over any async connection: for the tests, the examples that
//! measure a server and the benches that clean up after themselves.
//!
//! Every function panics when the server does not answer: that is the test
//! (or the measurement) failing.

use redis::aio::ConnectionLike;

/// The text of `INFO <section>`.
pub async fn info(conn: &mut impl ConnectionLike, section: &str) -> String {
    redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .expect("INFO")
}

/// Every key matching `prefix*` on this server (`SCAN MATCH`, 1,000 a page).
pub async fn scan(conn: &mut impl ConnectionLike, prefix: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .expect("SCAN");
        found.extend(keys);
        if next == 0 {
            return found;
        }
        cursor = next;
    }
}

/// Deletes every key under `prefix` on this server (`UNLINK`, 1,000 at a
/// time; never a flush).
pub async fn unlink_all(conn: &mut impl ConnectionLike, prefix: &str) {
    for keys in scan(conn, prefix).await.chunks(1000) {
        let _: i64 = redis::cmd("UNLINK")
            .arg(keys)
            .query_async(conn)
            .await
            .expect("UNLINK");
    }
}

/// [`unlink_all`] one key at a time: for a node of a Redis Cluster, where
/// one `UNLINK` of keys in several hash slots is refused (`CROSSSLOT`).
pub async fn unlink_each(conn: &mut impl ConnectionLike, prefix: &str) {
    for key in scan(conn, prefix).await {
        let _: i64 = redis::cmd("UNLINK")
            .arg(&key)
            .query_async(conn)
            .await
            .expect("UNLINK");
    }
}
