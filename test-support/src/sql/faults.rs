//! The server goes away under the store (every connection dropped, a
//! restart, a failover): typed retryable errors while it is away, never a
//! second execution, and a pool that recovers by itself.

use std::sync::Arc;

use idem_core::Error;
use idem_core::clock::ManualClock;
use idem_core::store::StoreError;
use tokio::sync::Mutex;

use super::{
    Counter, Out, Outage, OutageDialect, SqlFixture, engine, request, scope, with_fixture,
};

/// For a store with pools of its own: see [`recovers_after_an_outage`].
pub async fn pool_recovers_after_connections_are_dropped<D: OutageDialect>(d: D) {
    recovers_after_an_outage(d, true).await;
}

/// For a store over the caller's sqlx pool: see [`recovers_after_an_outage`].
pub async fn a_sqlx_pool_recovers_after_connections_are_dropped<D: OutageDialect>(d: D) {
    recovers_after_an_outage(d, false).await;
}

/// Calls fail with a typed, retryable 503 while the server is away and
/// never run the work twice; once it is back the pool recovers on its own
/// (at most five failed calls), the records completed before the outage
/// replay, and a key whose first call failed runs once.
pub async fn recovers_after_an_outage<D: OutageDialect>(d: D, own_pool: bool) {
    let (fx, outage) = d.outage(own_pool).await;
    // The outage (a throwaway server) outlives the fixture's teardown.
    let outage = Arc::new(Mutex::new(outage));
    let o = Arc::clone(&outage);
    with_fixture(fx, move |fx| async move {
        let clock = ManualClock::starting_now();
        let idem = engine(fx.store(), &clock);
        let (scope, runs) = (scope(), Counter::default());
        let call = |key: String| {
            let (idem, scope, runs) = (idem.clone(), scope.clone(), runs.clone());
            async move {
                idem.execute(&scope, key, &request(), move |_| async move {
                    runs.hit();
                    Out::Success("ok".into())
                })
                .await
            }
        };
        for i in 0..4 {
            call(format!("before-{i}")).await.expect("healthy");
        }
        o.lock().await.down().await;
        for i in 0..3 {
            let err = call(format!("down-{i}")).await.expect_err("server away");
            assert!(
                matches!(err, Error::Store(StoreError::Unavailable { .. })),
                "{err:?}"
            );
            assert!(err.is_retryable());
        }
        o.lock().await.up().await;
        let mut failures = 0;
        let mut i = 0;
        while call(format!("after-{i}")).await.is_err() {
            failures += 1;
            i += 1;
            assert!(failures <= 5, "the pool did not recover");
        }
        for j in 0..10 {
            call(format!("steady-{j}")).await.expect("recovered");
        }
        assert_eq!(runs.get(), 4 + 1 + 10, "every key ran once, none twice");
        for i in 0..4 {
            let r = call(format!("before-{i}")).await.expect("replay");
            assert!(
                r.is_replay(),
                "completed before the outage, still there after"
            );
        }
        // A key whose first call failed is retried and runs once.
        call("down-0".into()).await.expect("retry after recovery");
        assert_eq!(runs.get(), 16);
    })
    .await;
    drop(outage);
}
