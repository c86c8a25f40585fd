//! Real concurrency over several pools ("several processes"): the SQL
//! suite's races (`idem_test_support::sql::races`), and one key raced by
//! many tasks through a counting proxy, which bounds the statements a race
//! costs.

mod support;

use std::time::Duration;

use idem_core::clock::{Clock, ManualClock};
use idem_core::store::AdminStore;
use idem_core::testkit::race;
use idem_core::{Error, IdempotencyKey};
use idem_test_support::sql::Dialect;
use idem_test_support::sql::{Counter, Out, engine, request, scope, with_fixture};
use support::proxy::{Protocol, Proxy};
use support::{Pg, count_rows};

idem_test_support::sql_suite!(crate::support::Pg; @races);
idem_test_support::sql_suite!(crate::support::Pg; transactional_racers_with_rollbacks);

/// 64 tasks on one key, spread over 8 separate pools ("8 processes"): the
/// work runs exactly once; everyone else gets the replay or a 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_racers_over_eight_pools_run_the_work_once() {
    with_fixture(Pg.open(2).await, |fx| async move {
        let clock = ManualClock::starting_now();
        // All 8 pools go through one counting proxy, to count statements.
        let proxy = Proxy::start(support::upstream().await, Protocol::Postgres).await;
        let mut engines = Vec::new();
        for _ in 0..8 {
            let store = support::connect(8, support::via(&proxy))
                .await
                .with_schema_name(&fx.name)
                .expect("schema");
            // The start checks, before the counted race (a store checks
            // the server and its table's layout at its first call
            // otherwise): the replication check, and a first call.
            store.check_replication().await.expect("check");
            let now = clock.now();
            store.count_states(now).await.expect("layout checked");
            engines.push(engine(&store, &clock));
        }
        // The start checks went through the proxy too: count from here.
        let setup = proxy.snapshot().statements();
        let (scope, key, runs) = (scope(), IdempotencyKey::random(), Counter::default());
        let tasks = race(64, |i| {
            let idem = engines[i % 8].clone();
            let (scope, key, runs) = (scope.clone(), key.clone(), runs.clone());
            async move {
                idem.execute(&scope, &key, &request(), move |_| async move {
                    runs.hit();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Out::Success(format!("ch_{i}"))
                })
                .await
            }
        });
        let (mut executed, mut replayed, mut in_flight) = (0, 0, 0);
        for t in tasks {
            match t.await.expect("join") {
                Ok(r) if r.is_replay() => replayed += 1,
                Ok(_) => executed += 1,
                Err(Error::InFlight { .. }) => in_flight += 1,
                Err(e) => panic!("unexpected error under contention: {e:?}"),
            }
        }
        let statements = proxy.snapshot().statements() - setup;
        println!(
            "64 racers / 8 pools: executed {executed}, replayed {replayed}, 409 {in_flight}; \
             {statements} statements in all (64 calls, 1 completion)"
        );
        // Every call is one claim; only a loser of the race on the fresh key
        // runs its claim a second time (never more under this race).
        assert!(statements > 64 && statements <= 64 * 2 + 1, "{statements}");
        assert_eq!(runs.get(), 1, "the work must run exactly once");
        assert_eq!(executed, 1);
        assert_eq!(executed + replayed + in_flight, 64);
        assert_eq!(count_rows(&fx, "idem_records").await, 1);
        for e in &engines {
            e.store().close().await;
        }
    })
    .await;
}
