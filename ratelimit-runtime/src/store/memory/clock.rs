//! The memory store's clocks: the [`Clock`] trait and its real, manual and tokio sources.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// A monotonic time source for the memory store: the time elapsed since an arbitrary origin.
///
/// Counting from when the clock was made, as the store's own clocks do, keeps the store on its
/// fastest path: it packs a fixed window into one word while the clock reads under 2^36 ms
/// (795 days). A clock counting from further back (the Unix epoch) gets the same answers, with
/// each fixed-window check taking its shard's write lock.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Time since the clock's origin; never goes backwards.
    fn now(&self) -> Duration;

    /// [`Clock::now`] in whole microseconds (saturating), the unit the store's rules count
    /// in: the store reads this once per check. The provided method converts `now()`; a clock
    /// that can count microseconds more cheaply overrides it (the real clock does).
    fn now_micros(&self) -> u64 {
        let t = self.now();
        // `as_micros` saturated to u64, without its u128 arithmetic.
        t.as_secs()
            .saturating_mul(1_000_000)
            .saturating_add(u64::from(t.subsec_micros()))
    }
}

/// The real clock: monotonic, read from the CPU's time-stamp counter (the `quanta` crate, as
/// governor reads it), calibrated once per process against the OS's monotonic clock, which it
/// reads instead where the counter is not invariant across cores and power states. A read
/// costs under half of `std::time::Instant`'s, and a check reads it once. The first
/// `MonotonicClock` of a process calibrates the counter: a busy loop of about a millisecond
/// (200 ms at most).
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    /// The process's calibrated source.
    source: &'static quanta::Clock,
    /// The source's raw reading at the origin.
    origin: u64,
}

/// The process's calibrated source (the calibration runs once, at the first store's start).
fn source() -> &'static quanta::Clock {
    static SOURCE: OnceLock<quanta::Clock> = OnceLock::new();
    SOURCE.get_or_init(quanta::Clock::new)
}

impl MonotonicClock {
    /// Nanoseconds since the origin: one raw reading, scaled (0 before the origin, which a
    /// counter read on another core can seem to be).
    fn nanos(&self) -> u64 {
        self.source.delta_as_nanos(self.origin, self.source.raw())
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        let source = source();
        Self {
            source,
            origin: source.raw(),
        }
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos())
    }

    fn now_micros(&self) -> u64 {
        self.nanos() / 1000
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The real clock's two readings agree: each `now()` lies between the microsecond readings
    /// taken around it. (Within a microsecond: the time-stamp counters of two cores a thread
    /// moves between may differ by a few nanoseconds, which the store's rules absorb as a
    /// clock that stepped back.)
    #[test]
    fn the_real_clock_reads_the_same_time_in_both_units() {
        let clock = MonotonicClock::default();
        let mut last = clock.now_micros();
        for _ in 0..10_000 {
            let between = clock.now();
            let after = clock.now_micros();
            let between = u64::try_from(between.as_micros()).unwrap_or(u64::MAX);
            assert!(
                last <= between + 1 && between <= after + 1,
                "{last} {between} {after}"
            );
            last = after;
        }
    }

    /// The provided `now_micros` is `now()` in whole microseconds, saturated.
    #[test]
    fn the_provided_reading_in_microseconds_truncates_and_saturates() {
        let clock = ManualClock::new();
        clock.advance(Duration::from_nanos(1_234_567_999));
        assert_eq!(clock.now_micros(), 1_234_567);
        clock.advance(Duration::MAX);
        assert_eq!(clock.now_micros(), u64::MAX / 1000);
    }
}
