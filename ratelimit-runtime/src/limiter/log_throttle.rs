//! Warnings that do not flood the log: one per interval, with the count of those held back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::millis_since;

/// How often a warning about one store may be written.
pub(crate) const LOG_INTERVAL: Duration = Duration::from_secs(5);

/// Lets one event through per interval and counts the ones it holds back.
#[derive(Debug)]
pub(crate) struct LogThrottle {
    origin: Instant,
    interval_ms: u64,
    /// The millisecond (since `origin`, plus one) from which the next event may be written.
    next: AtomicU64,
    suppressed: AtomicU64,
}

impl LogThrottle {
    /// At most one event per `interval`.
    pub(crate) fn new(interval: Duration) -> Self {
        Self {
            origin: Instant::now(),
            interval_ms: u64::try_from(interval.as_millis()).unwrap_or(u64::MAX),
            next: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(n)` when this event should be written, `n` being how many were held back since
    /// the last one written; `None` (and counted) otherwise.
    pub(crate) fn permit(&self) -> Option<u64> {
        let now = millis_since(self.origin, Instant::now()).saturating_add(1);
        let next = self.next.load(Ordering::Acquire);
        if now >= next
            && self
                .next
                .compare_exchange(
                    next,
                    now.saturating_add(self.interval_ms),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
        {
            Some(self.suppressed.swap(0, Ordering::AcqRel))
        } else {
            self.suppressed.fetch_add(1, Ordering::AcqRel);
            None
        }
    }

    /// Lets the next event through at once, returning how many were held back (used when the
    /// store recovers, so the next outage is reported immediately).
    pub(crate) fn reset(&self) -> u64 {
        self.next.store(0, Ordering::Release);
        self.suppressed.swap(0, Ordering::AcqRel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn log_throttle_writes_one_event_per_interval_with_the_count_held_back() {
        let t = LogThrottle::new(Duration::from_secs(5));
        assert_eq!(t.permit(), Some(0));
        for _ in 0..41 {
            assert_eq!(t.permit(), None);
        }
        tokio::time::advance(Duration::from_millis(4999)).await;
        assert_eq!(t.permit(), None);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(t.permit(), Some(42));
        assert_eq!(t.permit(), None);
        assert_eq!(t.reset(), 1);
        assert_eq!(t.permit(), Some(0));
    }
}
