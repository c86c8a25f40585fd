//! Small helpers below every other module: the log hash and the OS random
//! source (so that key validation, scopes and tokens do not depend on each
//! other for them).

use sha2::{Digest, Sha256};

/// Eight hex characters of SHA-256: enough to correlate log lines, never the value.
pub(crate) fn short_hash(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    hex::encode(&digest[..4])
}

/// Fills an array from the OS generator, falling back to hashing time and pid.
pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut buf = [0u8; N];
    if getrandom::fill(&mut buf).is_err() {
        let mut hasher = Sha256::new();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        hasher.update(nanos.to_be_bytes());
        hasher.update(std::process::id().to_be_bytes());
        let digest = hasher.finalize();
        for (dst, src) in buf.iter_mut().zip(digest.iter().cycle()) {
            *dst = *src;
        }
    }
    buf
}
