//! Small helpers below every other module: the log hash and the OS random
//! source (so that key validation, scopes and tokens do not depend on each
//! other for them).

use sha2::{Digest, Sha256};

/// A boxed error source: what a store or a codec wraps a driver's error in.
pub type BoxDynError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Eight hex characters of SHA-256: enough to correlate log lines, never the value.
pub(crate) fn short_hash(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    hex::encode(&digest[..4])
}

/// Fills an array from the OS generator.
///
/// Should the OS generator fail (it does not on any supported platform), the
/// bytes come from SHA-256 of the time, the process id and a process-wide
/// counter: not secret, but never the same twice in one process, so two
/// generated keys or token seeds cannot collide. The fallback is logged once.
pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    use std::sync::atomic::{AtomicU64, Ordering};
    static FALLBACKS: AtomicU64 = AtomicU64::new(0);

    let mut buf = [0u8; N];
    if let Err(err) = getrandom::fill(&mut buf) {
        let n = FALLBACKS.fetch_add(1, Ordering::Relaxed);
        if n == 0 {
            tracing::warn!(error = %err, "OS random source failed: using time, pid and a counter");
        }
        fallback_fill(&mut buf, n);
    }
    buf
}

/// The fallback of [`random_bytes`]: distinct for distinct `n`, whatever the
/// clock says.
fn fallback_fill(buf: &mut [u8], n: u64) {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    for (i, chunk) in buf.chunks_mut(32).enumerate() {
        let mut hasher = Sha256::new();
        hasher.update(nanos.to_be_bytes());
        hasher.update(std::process::id().to_be_bytes());
        hasher.update(n.to_be_bytes());
        hasher.update((i as u64).to_be_bytes());
        let digest = hasher.finalize();
        chunk.copy_from_slice(&digest[..chunk.len()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fallback_never_repeats_within_a_process_and_fills_every_byte() {
        let mut seen = std::collections::HashSet::new();
        for n in 0..1000 {
            let mut buf = [0u8; 40];
            fallback_fill(&mut buf, n);
            // Both 32-byte chunks are written (a zero tail would be the bug).
            assert_ne!(&buf[32..], &[0u8; 8]);
            assert!(seen.insert(buf), "fallback repeated at n = {n}");
        }
        assert_ne!(random_bytes::<16>(), random_bytes::<16>());
    }
}
