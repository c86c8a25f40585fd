//! The retry delay: exponential by delivery count, capped, with full jitter.

use std::time::Duration;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff {
    pub(crate) base: Duration,
    pub(crate) cap: Duration,
    pub(crate) jitter: bool,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(300),
            jitter: true,
        }
    }
}

impl Backoff {
    /// `base · 2^(delivery−1)`, capped; with full jitter, uniform in
    /// `[1 ms, that]`.
    pub(crate) fn delay(&self, delivery: u32) -> Duration {
        let exp = delivery.saturating_sub(1).min(31);
        let ceiling = self
            .base
            .checked_mul(1u32 << exp)
            .map_or(self.cap, |d| d.min(self.cap));
        if !self.jitter {
            return ceiling;
        }
        let millis = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
        let r = getrandom::u64().unwrap_or(millis / 2);
        Duration::from_millis((r % millis.saturating_add(1)).max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_per_delivery_up_to_the_cap() {
        let b = Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(300),
            jitter: false,
        };
        assert_eq!(b.delay(0), Duration::from_secs(1));
        assert_eq!(b.delay(1), Duration::from_secs(1));
        assert_eq!(b.delay(2), Duration::from_secs(2));
        assert_eq!(b.delay(4), Duration::from_secs(8));
        assert_eq!(b.delay(9), Duration::from_secs(256));
        assert_eq!(b.delay(10), Duration::from_secs(300));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(300));
    }

    #[test]
    fn jitter_stays_within_the_ceiling() {
        let b = Backoff {
            jitter: true,
            ..Backoff::default()
        };
        let mut distinct = std::collections::HashSet::new();
        for _ in 0..200 {
            let d = b.delay(5);
            assert!(
                d >= Duration::from_millis(1) && d <= Duration::from_secs(16),
                "{d:?}"
            );
            distinct.insert(d);
        }
        assert!(distinct.len() > 10, "jitter is not random: {distinct:?}");
    }
}
