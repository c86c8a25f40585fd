//! Canonical JSON and fingerprints: `idem_core::adapter::canonical_json` (+ SHA-256)
//! against `serde_json::to_vec` (not canonical, the speed of plain
//! serialisation) and `serde_json_canonicalizer` (an RFC 8785 crate), on a
//! 1 KiB and a 100 KiB nested request.
//!
//! Run with: `cargo bench --bench fingerprint` (`IDEM_BENCH_QUICK=1` for a short run).

#[allow(dead_code, reason = "each bench uses a part of the shared helpers")]
mod common;

use std::hint::black_box;

use criterion::{BenchmarkId, Throughput};
use idem_core::FieldFilter;
use idem_core::adapter::{canonical_json, fingerprint};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The documented fingerprint of a request without integers beyond 2^53:
/// SHA-256 of `idem-fp-v1\0`, the operation's length (8 bytes, big
/// endian), the operation, and the reference crate's canonical bytes.
fn reference_fingerprint(operation: &str, doc: &Value) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"idem-fp-v1\0");
    h.update((operation.len() as u64).to_be_bytes());
    h.update(operation.as_bytes());
    h.update(serde_json_canonicalizer::to_vec(doc).expect("canonicalizer"));
    h.finalize().into()
}

fn bench(c: &mut criterion::Criterion) {
    for (label, target) in [("1KiB", 1024), ("100KiB", 100 * 1024)] {
        let doc: Value = common::doc::document(target);
        let canonical = canonical_json(&doc);
        // Same bytes as the RFC 8785 crate, or the comparison is meaningless.
        assert_eq!(
            canonical.as_bytes(),
            serde_json_canonicalizer::to_vec(&doc)
                .expect("canonicalizer")
                .as_slice(),
            "canonical_json differs from serde_json_canonicalizer on the bench document"
        );
        // The fingerprint (canonicalised straight from `Serialize`, no
        // `Value` copy) hashes exactly those bytes.
        assert_eq!(
            fingerprint("POST /orders", &doc, &FieldFilter::All)
                .expect("fingerprint")
                .as_bytes(),
            &reference_fingerprint("POST /orders", &doc),
            "fingerprint differs from the hash of serde_json_canonicalizer's bytes"
        );
        let mut group = c.benchmark_group(format!("canonical_json/{label}"));
        group.throughput(Throughput::Bytes(canonical.len() as u64));
        group.bench_function(
            BenchmarkId::new("idem_canonical_json", canonical.len()),
            |b| {
                b.iter(|| canonical_json(black_box(&doc)));
            },
        );
        group.bench_function(
            BenchmarkId::new("idem_canonical_json+sha256", canonical.len()),
            |b| {
                b.iter(|| Sha256::digest(canonical_json(black_box(&doc)).as_bytes()));
            },
        );
        group.bench_function(BenchmarkId::new("idem_fingerprint", canonical.len()), |b| {
            b.iter(|| fingerprint("POST /orders", black_box(&doc), &FieldFilter::All));
        });
        group.bench_function(
            BenchmarkId::new("serde_json_to_vec", canonical.len()),
            |b| {
                b.iter(|| serde_json::to_vec(black_box(&doc)));
            },
        );
        group.bench_function(
            BenchmarkId::new("serde_json_canonicalizer_to_vec", canonical.len()),
            |b| {
                b.iter(|| serde_json_canonicalizer::to_vec(black_box(&doc)));
            },
        );
        group.bench_function(
            BenchmarkId::new("serde_json_canonicalizer+sha256", canonical.len()),
            |b| {
                b.iter(|| {
                    Sha256::digest(
                        serde_json_canonicalizer::to_vec(black_box(&doc)).unwrap_or_default(),
                    )
                });
            },
        );
        group.finish();
    }
}

/// `IDEM_FINGERPRINT_PROFILE=idem|fingerprint|serde|rfc8785` runs 200 serialisations
/// (`fingerprint`: whole fingerprints) of
/// the 100 KiB document and exits, for `valgrind --tool=callgrind`; it also
/// prints the fastest single run, a figure that resists a busy machine better
/// than a mean.
fn profile(which: &str) {
    let doc = common::doc::document(100 * 1024);
    let canonical_len = canonical_json(&doc).len();
    let mut total = 0usize;
    let mut best = std::time::Duration::MAX;
    for _ in 0..200 {
        let start = std::time::Instant::now();
        let len = match which {
            "serde" => serde_json::to_vec(black_box(&doc)).map_or(0, |v| v.len()),
            "rfc8785" => serde_json_canonicalizer::to_vec(black_box(&doc)).map_or(0, |v| v.len()),
            // Counted as the canonical bytes it hashes.
            "fingerprint" => fingerprint("POST /orders", black_box(&doc), &FieldFilter::All)
                .map_or(0, |_| canonical_len),
            _ => canonical_json(black_box(&doc)).len(),
        };
        best = best.min(start.elapsed());
        total += len;
    }
    let mib_s = (total / 200) as f64 / best.as_secs_f64() / (1024.0 * 1024.0);
    println!("{which}: {total} bytes, best run {best:?} = {mib_s:.0} MiB/s");
}

fn main() {
    if let Ok(which) = std::env::var("IDEM_FINGERPRINT_PROFILE") {
        profile(&which);
        return;
    }
    let mut c = common::criterion();
    bench(&mut c);
    c.final_summary();
}
