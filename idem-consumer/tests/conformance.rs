//! The consumer conformance suite (every row of the behaviour table) on
//! every backend: one isolated store per test.

use idem_test_support::fixtures as support;

/// One module per backend, each running the whole suite on the fixture of
/// the same name.
macro_rules! on_every_backend {
    ($($backend:ident),+ $(,)?) => {
        $(
            mod $backend {
                idem_test_support::consumer_conformance!(super::support::$backend());
            }
        )+
    };
}

on_every_backend!(memory, sqlite_memory, sqlite_file, postgres, mysql, redis);
