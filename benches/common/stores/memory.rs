//! The raw baseline of `MemoryStore`: a `HashMap` behind a `Mutex` doing what
//! the store does for each call (claim, complete, read back), without the
//! engine (no key check, no fingerprinting, no tracing, no random token).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};

use super::workload::{OPERATION, OWNER, Statements, body};

#[derive(Debug)]
struct Record {
    fingerprint: [u8; 32],
    token: i64,
    completed: bool,
    body: Option<Vec<u8>>,
}

/// A map of records keyed by owner, operation and key.
#[derive(Debug)]
pub(crate) struct RawMemory {
    map: Mutex<HashMap<(String, String, String), Record>>,
    fingerprint: [u8; 32],
    body: Vec<u8>,
    tokens: AtomicI64,
}

impl RawMemory {
    pub(crate) fn new(body_len: usize) -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            fingerprint: [7; 32],
            body: body(body_len),
            tokens: AtomicI64::new(1),
        }
    }

    fn id(key: &str) -> (String, String, String) {
        (OWNER.to_owned(), OPERATION.to_owned(), key.to_owned())
    }
}

impl Statements for RawMemory {
    /// `Some(token)` if claimed; `None` with the standing record's state.
    async fn claim(&self, key: &str) -> Result<i64, Option<Vec<u8>>> {
        let token = self.tokens.fetch_add(1, Ordering::Relaxed);
        let mut map = self
            .map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let id = Self::id(key);
        if let Some(r) = map.get(&id) {
            assert_eq!(r.fingerprint, self.fingerprint);
            return Err(if r.completed { r.body.clone() } else { None });
        }
        map.insert(
            id,
            Record {
                fingerprint: self.fingerprint,
                token,
                completed: false,
                body: None,
            },
        );
        Ok(token)
    }

    async fn complete(&self, key: &str, token: i64) {
        let mut map = self
            .map
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let r = map.get_mut(&Self::id(key)).expect("claimed record");
        assert!(r.token == token && !r.completed, "lease lost");
        r.completed = true;
        r.body = Some(self.body.clone());
    }
}
