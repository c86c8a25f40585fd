//! Reading back what the engine recorded (feature `metrics`): the harness of
//! every crate's scripted metrics tests, so that each execution path (the
//! engine, the transactional mode, the HTTP layer) is counted the same way.

use std::collections::HashMap;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};

/// `name{label=value,…}` → the counter's value or the histogram's sample count.
fn snapshot_map(recorder: &DebuggingRecorder) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    for (key, _, _, value) in recorder.snapshotter().snapshot().into_vec() {
        let key = key.key();
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        let n = match value {
            DebugValue::Counter(n) => n,
            DebugValue::Histogram(samples) => samples.len() as u64,
            DebugValue::Gauge(_) => continue,
        };
        out.insert(name, n);
    }
    out
}

/// Runs `script` on a current-thread runtime with a recording exporter as
/// this thread's recorder, and returns what it recorded.
///
/// # Panics
///
/// When the runtime cannot be built.
pub fn recorded(script: impl std::future::Future<Output = ()>) -> HashMap<String, u64> {
    let recorder = DebuggingRecorder::new();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    metrics::with_local_recorder(&recorder, || runtime.block_on(script));
    snapshot_map(&recorder)
}

/// Every wanted series has exactly its count, and nothing else was recorded.
///
/// # Panics
///
/// When a count differs (that is the test failing).
pub fn assert_exactly(m: &HashMap<String, u64>, want: &[(String, u64)]) {
    for (name, n) in want {
        assert_eq!(m.get(name), Some(n), "{name} in {m:#?}");
    }
    assert_eq!(m.len(), want.len(), "nothing else recorded: {m:#?}");
}
