//! What Redis ran: `INFO commandstats` deltas around a piece of work, on a
//! throwaway server (`CONFIG RESETSTAT` resets every client's view).

use std::collections::HashMap;

use idem_redis::redis::{self, aio::MultiplexedConnection};

/// Counts of every command Redis ran (from `INFO commandstats`).
pub(crate) async fn commandstats(admin: &mut MultiplexedConnection) -> HashMap<String, u64> {
    idem_test_support::redis_admin::info(admin, "commandstats")
        .await
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// The commands Redis ran (name and calls, sorted) while `f` ran, from a
/// reset of the statistics.
pub(crate) async fn delta<F: std::future::Future>(
    admin: &mut MultiplexedConnection,
    f: F,
) -> Vec<(String, u64)> {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(admin)
        .await
        .expect("RESETSTAT");
    f.await;
    let mut stats: Vec<(String, u64)> = commandstats(admin)
        .await
        .into_iter()
        .filter(|(name, _)| !name.starts_with("config") && name != "info")
        .collect();
    stats.sort();
    stats
}

/// `pairs` sorted, to compare with [`delta`].
pub(crate) fn counts(pairs: &[(&str, u64)]) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = pairs.iter().map(|(n, c)| ((*n).to_owned(), *c)).collect();
    v.sort();
    v
}
