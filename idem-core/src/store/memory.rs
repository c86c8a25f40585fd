//! `MemoryStore`: the reference store, for docs, examples and unit tests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::RecordId;
use crate::clock::Timestamp;
use crate::store::{
    AdminStore, Capabilities, ClaimOutcome, ClaimRequest, Claimed, Completion, Cursor,
    InFlightQuery, Page, Previous, PurgeReport, RecordState, RecordSummary, StateCounts, Store,
    StoreError, StoredRecord, Token,
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

    /// Applies `write` if the record is in flight under `token`. A record
    /// already in the state `done` under `token` (a write retried after a
    /// lost reply) answers `Ok` unchanged; anything else is a lost lease.
    fn guarded(
        &self,
        id: &RecordId,
        token: Token,
        done: Option<RecordState>,
        write: impl FnOnce(&mut StoredRecord),
    ) -> Result<(), StoreError> {
        let mut map = self.lock();
        match map.get_mut(id) {
            Some(e) if e.token == token && e.record.state == RecordState::InFlight => {
                write(&mut e.record);
                Ok(())
            }
            Some(e) if e.token == token && Some(e.record.state) == done => Ok(()),
            _ => Err(StoreError::LeaseLost),
        }
    }
}

/// Whether the record still counts at `now`: its key has not expired, or it
/// is in flight under a lease that has not ended (a lease is never outlived
/// by its key). The shared rule, [`StoredRecord::is_expired`], negated.
fn live(record: &StoredRecord, now: Timestamp) -> bool {
    !record.is_expired(now)
}

fn visible(record: &StoredRecord, now: Timestamp) -> StoredRecord {
    let body_kept = record.response_expires_at.is_some_and(|t| t > now);
    StoredRecord {
        fingerprint: record.fingerprint,
        state: record.state,
        attempt: record.attempt,
        lease_until: record.lease_until,
        resource_id: record.resource_id.clone(),
        outcome: record.outcome,
        // A dropped body is not copied just to be discarded.
        response: record.response.as_ref().filter(|_| body_kept).cloned(),
        response_expires_at: record.response_expires_at,
        key_expires_at: record.key_expires_at,
    }
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
                key_expires_at: req.key_expires_at.max(req.lease_until),
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
        if !live(r, req.now) {
            *entry = fresh;
            return Ok(ClaimOutcome::Claimed(Claimed {
                attempt: 1,
                previous: None,
            }));
        }
        // The shared rule (as SQLite and Postgres use it): released, or a
        // lease that has ended, with the same fingerprint.
        let Some(reason) = r.takeover_reason(&req.fingerprint, req.now) else {
            return Ok(ClaimOutcome::Existing(visible(r, req.now)));
        };
        entry.token = req.token;
        r.state = RecordState::InFlight;
        r.attempt += 1;
        r.lease_until = req.lease_until;
        r.key_expires_at = r.key_expires_at.max(req.lease_until);
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
        self.guarded(id, token, Some(RecordState::Completed), |r| {
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
        self.guarded(id, token, None, |r| {
            r.state = RecordState::Released;
            r.lease_until = now;
        })
    }

    async fn save_resource_id(
        &self,
        id: &RecordId,
        token: Token,
        resource_id: &str,
    ) -> Result<(), StoreError> {
        self.guarded(id, token, None, |r| {
            r.resource_id = Some(resource_id.to_owned())
        })
    }

    async fn extend_lease(
        &self,
        id: &RecordId,
        token: Token,
        lease_until: Timestamp,
    ) -> Result<(), StoreError> {
        self.guarded(id, token, None, |r| {
            r.lease_until = lease_until;
            r.key_expires_at = r.key_expires_at.max(lease_until);
        })
    }

    async fn fetch(
        &self,
        id: &RecordId,
        now: Timestamp,
    ) -> Result<Option<StoredRecord>, StoreError> {
        Ok(self
            .lock()
            .get(id)
            .filter(|e| live(&e.record, now))
            .map(|e| visible(&e.record, now)))
    }

    async fn purge_expired(&self, now: Timestamp, limit: u32) -> Result<PurgeReport, StoreError> {
        let mut map = self.lock();
        let limit = limit as usize;
        let expired: Vec<RecordId> = map
            .iter()
            .filter(|(_, e)| !live(&e.record, now))
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
            // A record whose key expired is deleted (and counted) by a later
            // batch, not counted here as well: each record is counted once.
            if !live(&e.record, now) {
                continue;
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

impl AdminStore for MemoryStore {
    async fn list_in_flight(&self, q: &InFlightQuery<'_>) -> Result<Page, StoreError> {
        let after = q.cursor.map(Cursor::keyset_position).transpose()?;
        let map = self.lock();
        let mut found: Vec<RecordSummary> = map
            .iter()
            .filter(|(id, e)| {
                let r = &e.record;
                r.state == RecordState::InFlight
                    && r.lease_until <= q.lease_before
                    && r.key_expires_at > q.now
                    && after.as_ref().is_none_or(|a| {
                        (r.lease_until, id.owner(), id.operation(), id.key().as_str())
                            > (a.lease_until, &*a.owner, &*a.operation, &*a.key)
                    })
            })
            .map(|(id, e)| summary(id, &e.record))
            .collect();
        drop(map);
        found.sort_by(|a, b| {
            (
                a.lease_until,
                a.id.owner(),
                a.id.operation(),
                a.id.key().as_str(),
            )
                .cmp(&(
                    b.lease_until,
                    b.id.owner(),
                    b.id.operation(),
                    b.id.key().as_str(),
                ))
        });
        Ok(Page::keyset(found, q.limit))
    }

    async fn release_in_flight(
        &self,
        id: &RecordId,
        attempt: Option<u32>,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let mut map = self.lock();
        match map.get_mut(id) {
            Some(e)
                if e.record.state == RecordState::InFlight
                    && e.record.key_expires_at > now
                    && attempt.is_none_or(|a| a == e.record.attempt) =>
            {
                e.record.lease_until = e.record.lease_until.min(now);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn delete_completed(&self, id: &RecordId, now: Timestamp) -> Result<bool, StoreError> {
        let mut map = self.lock();
        let deletable = map.get(id).is_some_and(|e| {
            e.record.state == RecordState::Completed || e.record.key_expires_at <= now
        });
        if deletable {
            map.remove(id);
        }
        Ok(deletable)
    }

    async fn count_states(&self, now: Timestamp) -> Result<StateCounts, StoreError> {
        let mut c = StateCounts::default();
        for e in self.lock().values() {
            let r = &e.record;
            if r.key_expires_at <= now {
                c.expired += 1;
                continue;
            }
            match r.state {
                RecordState::InFlight => {
                    c.in_flight += 1;
                    if r.lease_until <= now {
                        c.stuck += 1;
                    }
                }
                RecordState::Released => c.released += 1,
                RecordState::Completed => c.completed += 1,
            }
        }
        Ok(c)
    }
}

fn summary(id: &RecordId, r: &StoredRecord) -> RecordSummary {
    RecordSummary {
        id: id.clone(),
        state: r.state,
        attempt: r.attempt,
        lease_until: r.lease_until,
        resource_id: r.resource_id.clone(),
        key_expires_at: r.key_expires_at,
    }
}
