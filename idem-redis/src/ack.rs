//! Replication acknowledgement: `WAIT` after every write the promise rests
//! on, sent in one pipeline with the script, on the connection that wrote.

use std::fmt;
use std::time::Duration;

use idem_core::store::StoreError;

use crate::error::BACKEND;

/// How many replicas must have received a write before the store reports it
/// done, and how long to wait for them (see
/// [`RedisStore::with_replica_ack`](crate::RedisStore::with_replica_ack)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaAck {
    replicas: u32,
    timeout: Duration,
}

impl ReplicaAck {
    /// `replicas` acknowledgements within `timeout`. A zero timeout is taken
    /// as 1 ms (`WAIT … 0` would block for ever).
    #[must_use]
    pub fn new(replicas: u32, timeout: Duration) -> Self {
        Self {
            replicas,
            timeout: timeout.max(Duration::from_millis(1)),
        }
    }

    /// The replicas that must acknowledge each write.
    #[must_use]
    pub fn replicas(&self) -> u32 {
        self.replicas
    }

    /// How long a write waits for them.
    #[must_use]
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The timeout argument of `WAIT`, in milliseconds (at least 1).
    pub(crate) fn timeout_ms(&self) -> u64 {
        u64::try_from(self.timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// `Ok` when `WAIT` answered enough replicas, else the error the caller
    /// gets: [`StoreError::Unavailable`] (503, retryable) with a
    /// [`NotAcknowledged`] source.
    pub(crate) fn check(&self, acknowledged: i64) -> Result<(), StoreError> {
        if acknowledged >= i64::from(self.replicas) {
            return Ok(());
        }
        Err(StoreError::Unavailable {
            backend: BACKEND,
            source: Box::new(NotAcknowledged {
                acknowledged: u32::try_from(acknowledged.max(0)).unwrap_or(0),
                required: self.replicas,
                timeout: self.timeout,
            }),
        })
    }
}

/// A write reached fewer replicas than required within the timeout: it is
/// on the primary but may be lost by a failover, so it was not reported done.
///
/// The source of the [`StoreError::Unavailable`] the store returns then;
/// find it with `std::error::Error::source` and `downcast_ref`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotAcknowledged {
    /// Replicas that confirmed the write in time.
    pub acknowledged: u32,
    /// Replicas required.
    pub required: u32,
    /// How long the store waited.
    pub timeout: Duration,
}

impl fmt::Display for NotAcknowledged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the write reached {} of the {} replicas required within {:?}",
            self.acknowledged, self.required, self.timeout
        )
    }
}

impl std::error::Error for NotAcknowledged {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_few_acknowledgements_are_unavailable_with_the_figures() {
        let ack = ReplicaAck::new(2, Duration::from_millis(250));
        assert!(ack.check(2).is_ok());
        assert!(ack.check(3).is_ok());
        let e = ack.check(1).expect_err("one of two");
        let StoreError::Unavailable { backend, source } = &e else {
            panic!("{e:?}");
        };
        assert_eq!(*backend, "redis");
        let why = source
            .downcast_ref::<NotAcknowledged>()
            .expect("typed source");
        assert_eq!(
            why,
            &NotAcknowledged {
                acknowledged: 1,
                required: 2,
                timeout: Duration::from_millis(250)
            }
        );
        assert!(matches!(ack.check(-1), Err(StoreError::Unavailable { .. })));
        assert_eq!(ReplicaAck::new(1, Duration::ZERO).timeout_ms(), 1);
        assert_eq!(
            ReplicaAck::new(1, Duration::from_secs(2)).timeout_ms(),
            2000
        );
    }
}
