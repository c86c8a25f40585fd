//! The consumer conformance suite (every row of the behaviour table) on
//! every backend: one isolated store per test.

use idem_test_support::fixtures as support;

mod memory {
    idem_test_support::consumer_conformance!(super::support::memory());
}

mod sqlite_memory {
    idem_test_support::consumer_conformance!(super::support::sqlite_memory());
}

mod sqlite_file {
    idem_test_support::consumer_conformance!(super::support::sqlite_file());
}

mod postgres {
    idem_test_support::consumer_conformance!(super::support::postgres());
}

mod mysql {
    idem_test_support::consumer_conformance!(super::support::mysql());
}

mod redis {
    idem_test_support::consumer_conformance!(super::support::redis());
}
