//! Store benches (placeholder while the workload lands).

fn main() {}
