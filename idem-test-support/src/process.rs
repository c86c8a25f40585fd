//! What the throwaway-server helpers share: scratch directories unique to
//! the process and call, and a watchdog shell that cleans up after the test
//! process, however it ends.

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// A fresh directory `<tmp>/<prefix>-<pid>-<nanos>-<n>`, unique to this
/// process and call.
///
/// # Panics
///
/// When the directory cannot be created.
pub fn scratch_dir(prefix: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let dir = std::env::temp_dir().join(format!(
        "{prefix}-{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// Spawns a detached shell that waits for this process to end, then runs
/// `cleanup` (shell commands): nothing outlives the test binary, even when
/// it panics or is killed.
///
/// # Panics
///
/// When the shell cannot be spawned.
pub fn watchdog(cleanup: &str) {
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 0.2; done; {cleanup}",
        pid = std::process::id(),
    );
    // `( … ) &` detaches the loop, so the shell we wait for exits at once.
    let status = Command::new("sh")
        .args(["-c", &format!("( {script} ) >/dev/null 2>&1 &")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("spawn the watchdog shell");
    assert!(status.success(), "the watchdog shell failed: {status}");
}
