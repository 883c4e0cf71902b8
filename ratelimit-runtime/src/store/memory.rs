//! The in-process store. (Skeleton: filled in by the memory-store work.)

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{Check, Store, StoreFuture};

/// A monotonic time source for the memory store: the time elapsed since an arbitrary origin.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Time since the clock's origin; never goes backwards.
    fn now(&self) -> Duration;
}

/// The real clock (`std::time::Instant`).
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock(std::time::Instant);

impl Default for MonotonicClock {
    fn default() -> Self {
        Self(std::time::Instant::now())
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }
}

/// A clock that moves only when told to, for tests.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<std::sync::atomic::AtomicU64>);

impl ManualClock {
    /// A clock at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        let nanos = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.0.fetch_add(nanos, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.0.load(std::sync::atomic::Ordering::SeqCst))
    }
}

/// The in-process store.
#[derive(Debug)]
pub struct MemoryStore {
    clock: Arc<dyn Clock>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A store on the real monotonic clock.
    pub fn new() -> Self {
        Self::with_clock(MonotonicClock::default())
    }

    /// A store on the given clock.
    pub fn with_clock(clock: impl Clock) -> Self {
        Self {
            clock: Arc::new(clock),
        }
    }
}

impl Store for MemoryStore {
    fn check<'a>(&'a self, _checks: &'a [Check<'a>]) -> StoreFuture<'a> {
        let _ = &self.clock;
        todo!("memory store")
    }

    fn name(&self) -> &'static str {
        "memory"
    }
}
