//! Issue 19's crash tests: the pieces the parent (`tests/inbound.rs`) and
//! its children (`crash-consumer`, `crash-webhook`) share.
//!
//! * The loopback "provider" [`Stub`]: the side effect the children's work
//!   has outside idem. A child sends one line, its downstream key
//!   ([`call_stub`]); the stub counts it and answers `ok`. The parent then
//!   reads how many calls it saw and how many distinct keys (effects).
//! * [`stop_here`]: a child stops dead at a named point, saying so on
//!   stdout, and waits to be SIGKILLed.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

/// The loopback "provider": counts the calls per downstream key. It serves
/// from a thread of its own until the process ends (one small thread per
/// test).
#[derive(Debug, Clone)]
pub struct Stub {
    addr: SocketAddr,
    calls: Arc<Mutex<BTreeMap<String, usize>>>,
}

impl Stub {
    /// Starts one on a free loopback port.
    ///
    /// # Panics
    ///
    /// No loopback port can be bound.
    #[must_use]
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the stub");
        let addr = listener.local_addr().expect("the stub's address");
        let calls: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
        let seen = Arc::clone(&calls);
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let mut line = String::new();
                let read = BufReader::new(&conn).read_line(&mut line);
                if read.is_err() || !line.ends_with('\n') {
                    continue;
                }
                *seen
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .entry(line.trim().to_owned())
                    .or_default() += 1;
                let _ = conn.write_all(b"ok\n");
            }
        });
        Self { addr, calls }
    }

    /// Where the children call it (`host:port`).
    #[must_use]
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// The calls it saw, per downstream key.
    #[must_use]
    pub fn calls(&self) -> BTreeMap<String, usize> {
        self.calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// The side effect: one line with `downstream_key` to the stub at `addr`,
/// which answers `ok` once it has counted the call.
///
/// # Errors
///
/// The stub cannot be reached or answers something else.
pub async fn call_stub(addr: &str, downstream_key: &str) -> Result<(), String> {
    let mut conn = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    conn.write_all(format!("{downstream_key}\n").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    tokio::io::BufReader::new(conn)
        .read_line(&mut answer)
        .await
        .map_err(|e| e.to_string())?;
    if answer.trim() == "ok" {
        Ok(())
    } else {
        Err(format!("the stub answered {answer:?}"))
    }
}

/// When `point` is the stop point the child was given, prints
/// `stop <point>` and never returns: the parent SIGKILLs it there.
pub async fn stop_here(configured: &str, point: &str) {
    if configured == point {
        println!("stop {point}");
        loop {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
    }
}
