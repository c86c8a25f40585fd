//! The SQL suite's scenarios that apply to an embedded database
//! (`idem_test_support::sql`): races over several stores on one file, and
//! the table's values. Not here: the transactional mode (SQLite has none),
//! the wire costs and the outage (no network: `costs.rs` counts the worker
//! thread's hops instead), and the corruption scenario (no check constraint
//! to drop: `sqlite.rs` corrupts rows its own way).

mod support;

idem_test_support::sql_suite!(crate::support::Sqlite; @races);
idem_test_support::sql_suite!(crate::support::Sqlite; @values);
