//! `MemoryStore`: the reference store, for docs, examples and unit tests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::clock::Timestamp;
use crate::scope::RecordId;
use crate::store::{
    Capabilities, ClaimOutcome, ClaimRequest, Claimed, Completion, Previous, PurgeReport,
    RecordState, Store, StoreError, StoredRecord, TakeoverReason, Token,
};

/// An in-process store: one map behind one mutex.
///
/// It follows the [`Store`] contract exactly (it is the first store run
/// through the conformance suite), but it lives and dies with the process and
/// is not shared between processes: use it for tests and examples, not to
/// protect real side effects across restarts or instances.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    records: Arc<Mutex<HashMap<RecordId, Entry>>>,
}

#[derive(Debug, Clone)]
struct Entry {
    record: StoredRecord,
    token: Token,
}

impl MemoryStore {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// How many records (of any state, expired or not) are held.
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no record is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<RecordId, Entry>> {
        // A panic while holding the lock cannot leave a half-written entry
        // (every write is a single assignment), so a poisoned map is usable.
        self.records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn guarded(
        &self,
        id: &RecordId,
        token: Token,
        write: impl FnOnce(&mut StoredRecord),
    ) -> Result<(), StoreError> {
        let mut map = self.lock();
        match map.get_mut(id) {
            Some(e) if e.token == token && e.record.state == RecordState::InFlight => {
                write(&mut e.record);
                Ok(())
            }
            _ => Err(StoreError::LeaseLost),
        }
    }
}

fn visible(record: &StoredRecord, now: Timestamp) -> StoredRecord {
    let mut r = record.clone();
    if r.response_expires_at.is_none_or(|t| t <= now) {
        r.response = None;
    }
    r
}

impl Store for MemoryStore {
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let mut map = self.lock();
        let fresh = Entry {
            token: req.token,
            record: StoredRecord {
                fingerprint: req.fingerprint,
                state: RecordState::InFlight,
                attempt: 1,
                lease_until: req.lease_until,
                resource_id: None,
                outcome: None,
                response: None,
                response_expires_at: None,
                key_expires_at: req.key_expires_at,
            },
        };
        let Some(entry) = map.get_mut(req.id) else {
            map.insert(req.id.clone(), fresh);
            return Ok(ClaimOutcome::Claimed(Claimed {
                attempt: 1,
                previous: None,
            }));
        };
        let r = &mut entry.record;
        if r.key_expires_at <= req.now {
            *entry = fresh;
            return Ok(ClaimOutcome::Claimed(Claimed {
                attempt: 1,
                previous: None,
            }));
        }
        let reason = match r.state {
            _ if r.fingerprint != req.fingerprint => None,
            RecordState::Released => Some(TakeoverReason::Released),
            RecordState::InFlight if r.lease_until <= req.now => Some(TakeoverReason::LeaseExpired),
            _ => None,
        };
        let Some(reason) = reason else {
            return Ok(ClaimOutcome::Existing(visible(r, req.now)));
        };
        entry.token = req.token;
        r.state = RecordState::InFlight;
        r.attempt += 1;
        r.lease_until = req.lease_until;
        Ok(ClaimOutcome::Claimed(Claimed {
            attempt: r.attempt,
            previous: Some(Previous {
                reason,
                resource_id: r.resource_id.clone(),
            }),
        }))
    }

    async fn complete(
        &self,
        id: &RecordId,
        token: Token,
        c: &Completion<'_>,
    ) -> Result<(), StoreError> {
        self.guarded(id, token, |r| {
            r.state = RecordState::Completed;
            r.outcome = Some(c.outcome);
            r.response = c.body.map(<[u8]>::to_vec);
            r.response_expires_at = Some(c.response_expires_at);
            r.key_expires_at = c.key_expires_at;
            if let Some(rid) = c.resource_id {
                r.resource_id = Some(rid.to_owned());
            }
        })
    }

    async fn release(&self, id: &RecordId, token: Token, now: Timestamp) -> Result<(), StoreError> {
        self.guarded(id, token, |r| {
            r.state = RecordState::Released;
            r.lease_until = now;
        })
    }

    async fn checkpoint(
        &self,
        id: &RecordId,
        token: Token,
        resource_id: &str,
    ) -> Result<(), StoreError> {
        self.guarded(id, token, |r| r.resource_id = Some(resource_id.to_owned()))
    }

    async fn extend_lease(
        &self,
        id: &RecordId,
        token: Token,
        lease_until: Timestamp,
    ) -> Result<(), StoreError> {
        self.guarded(id, token, |r| r.lease_until = lease_until)
    }

    async fn fetch(
        &self,
        id: &RecordId,
        now: Timestamp,
    ) -> Result<Option<StoredRecord>, StoreError> {
        Ok(self
            .lock()
            .get(id)
            .filter(|e| e.record.key_expires_at > now)
            .map(|e| visible(&e.record, now)))
    }

    async fn purge_expired(&self, now: Timestamp, limit: u32) -> Result<PurgeReport, StoreError> {
        let mut map = self.lock();
        let limit = limit as usize;
        let expired: Vec<RecordId> = map
            .iter()
            .filter(|(_, e)| e.record.key_expires_at <= now)
            .map(|(id, _)| id.clone())
            .take(limit)
            .collect();
        for id in &expired {
            map.remove(id);
        }
        let mut dropped = 0u64;
        for e in map.values_mut() {
            if dropped as usize >= limit {
                break;
            }
            let r = &mut e.record;
            if r.response.is_some() && r.response_expires_at.is_some_and(|t| t <= now) {
                r.response = None;
                dropped += 1;
            }
        }
        Ok(PurgeReport {
            keys_removed: expired.len() as u64,
            bodies_dropped: dropped,
        })
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::none()
    }
}
