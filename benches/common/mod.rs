//! Helpers shared by the benches (each bench uses a part of them).

#[cfg(any(feature = "consumer", feature = "webhook"))]
pub(crate) mod dedup;
pub(crate) mod doc;
#[cfg(feature = "axum")]
pub(crate) mod http;
pub(crate) mod stores;

use std::time::Duration;

/// The `main` of an adapter bench: its `bench_store(c, rt, name, store)`
/// over the memory store and in-memory SQLite, on one current-thread
/// runtime.
#[allow(unused_macros)] // each bench uses a part of these helpers
macro_rules! adapter_bench_main {
    ($bench_store:ident) => {
        fn main() {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let mut c = common::criterion();
            $bench_store(&mut c, &rt, "memory", idem::MemoryStore::new());
            let sqlite = rt
                .block_on(idem::sqlite::SqliteStore::memory())
                .expect("sqlite memory");
            $bench_store(&mut c, &rt, "sqlite-memory", sqlite);
            c.final_summary();
        }
    };
}
#[allow(unused_imports)]
pub(crate) use adapter_bench_main;

/// `IDEM_BENCH_QUICK=1` asks for a very short run (smoke test of every group).
pub(crate) fn quick() -> bool {
    std::env::var("IDEM_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Small, bounded criterion settings: these benches compare ratios inside
/// one group, so short runs are enough; quick mode shortens them further.
pub(crate) fn criterion() -> criterion::Criterion {
    let c = criterion::Criterion::default().configure_from_args();
    if quick() {
        c.sample_size(10)
            .warm_up_time(Duration::from_millis(100))
            .measurement_time(Duration::from_millis(300))
    } else {
        c.sample_size(20)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(2))
    }
}
