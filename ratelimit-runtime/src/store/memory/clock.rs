//! The memory store's clocks: the [`Clock`] trait and its real, manual and tokio sources.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// A monotonic time source for the memory store: the time elapsed since an arbitrary origin.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Time since the clock's origin; never goes backwards.
    fn now(&self) -> Duration;
}

/// The real clock: monotonic, read from the CPU's time-stamp counter (the `quanta` crate, as
/// governor reads it), calibrated once per process against the OS's monotonic clock, which it
/// reads instead where the counter is not invariant across cores and power states. A read
/// costs under half of `std::time::Instant`'s, and a check reads it once. The first
/// `MonotonicClock` of a process calibrates the counter: a busy loop of about a millisecond
/// (200 ms at most).
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock(quanta::Instant);

/// The process's calibrated source (the calibration runs once, at the first store's start).
fn source() -> &'static quanta::Clock {
    static SOURCE: OnceLock<quanta::Clock> = OnceLock::new();
    SOURCE.get_or_init(quanta::Clock::new)
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self(source().now())
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Duration {
        source().now().saturating_duration_since(self.0)
    }
}

/// A clock that moves only when told to, for tests.
///
/// Clones share one time, so a test keeps a clone and advances the store's clock:
///
/// ```
/// use std::time::Duration;
/// use ratelimit_runtime::store::{Clock, ManualClock};
///
/// let clock = ManualClock::new();
/// let handle = clock.clone();
/// handle.advance(Duration::from_millis(1500));
/// assert_eq!(clock.now(), Duration::from_millis(1500));
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward (saturating at about 584 years).
    pub fn advance(&self, by: Duration) {
        let nanos = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        // `fetch_update` never fails here: the closure always returns `Some`.
        let _ = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(nanos))
            });
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::SeqCst))
    }
}

/// Tokio's clock (`tokio::time::Instant`): it follows tokio's paused and advanced time in tests
/// (`#[tokio::test(start_paused = true)]`, `tokio::time::advance`), and real time otherwise.
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use std::time::Duration;
/// use ratelimit_runtime::store::Clock;
/// use ratelimit_runtime::store::TokioClock;
///
/// let clock = TokioClock::default();
/// tokio::time::sleep(Duration::from_secs(5)).await; // instant under paused time
/// assert!(clock.now() >= Duration::from_secs(5));
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct TokioClock(tokio::time::Instant);

impl Default for TokioClock {
    fn default() -> Self {
        Self(tokio::time::Instant::now())
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }
}
