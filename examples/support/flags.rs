//! The client examples' command-line values: a flag's value read as a
//! number, and `--deadline-ms` as a duration. Shared by `order_client`,
//! `grpc_order_client` and `mcp_order_client`.

use std::time::Duration;

/// `text`, the value of `flag`, as a number (`{flag} {text}: not a number`
/// when it is not one).
pub(crate) fn number<T: std::str::FromStr>(flag: &str, text: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("{flag} {text}: not a number"))
}

/// `text`, the value of `flag`, as a number of milliseconds.
pub(crate) fn millis(flag: &str, text: &str) -> Result<Duration, String> {
    number(flag, text).map(Duration::from_millis)
}
