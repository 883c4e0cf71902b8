//! The breaker: after a transport failure, checks skip the store for a short backoff instead of
//! each waiting for the timeout, then one check probes it.
//!
//! Every time here is a [`tokio::time::Instant`], so tests drive it with tokio's paused clock.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::millis_since;
use crate::error::StoreError;

/// The first backoff after the store fails.
pub(crate) const INITIAL_BACKOFF: Duration = Duration::from_millis(100);

/// The longest backoff: a store that answers again is used again within about this long (plus
/// one check), whatever the length of the outage.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// What the breaker lets a check do.
#[derive(Debug)]
pub(crate) enum Gate<'a> {
    /// The store is healthy: ask it.
    Closed,
    /// The store failed and the backoff has passed: this check asks the store, alone, and tells
    /// the breaker how it went. Dropping the guard (the check was cancelled) lets another check
    /// probe.
    Probe(ProbeGuard<'a>),
    /// The store failed recently: answer with the failure policy without asking it.
    Open,
}

/// Held by the one check that probes a failed store.
#[derive(Debug)]
pub(crate) struct ProbeGuard<'a>(&'a Breaker);

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        self.0.probing.store(false, Ordering::Release);
    }
}

/// A small circuit breaker.
///
/// Closed, every check asks the store (one atomic load of overhead). After a failure it opens
/// for a backoff of [`INITIAL_BACKOFF`], during which checks get the failure policy's answer at
/// once instead of waiting for the timeout; then a single check probes the store. A failed probe
/// doubles the backoff (at most [`MAX_BACKOFF`]); any success closes the breaker.
#[derive(Debug)]
pub(crate) struct Breaker {
    origin: Instant,
    /// 0 when closed; else the millisecond (since `origin`) until which the store is skipped.
    open_until: AtomicU64,
    backoff_ms: AtomicU64,
    probing: AtomicBool,
    last_error: Mutex<Option<StoreError>>,
}

impl Default for Breaker {
    fn default() -> Self {
        Self::new()
    }
}

impl Breaker {
    /// A closed breaker.
    pub(crate) fn new() -> Self {
        Self {
            origin: Instant::now(),
            open_until: AtomicU64::new(0),
            backoff_ms: AtomicU64::new(0),
            probing: AtomicBool::new(false),
            last_error: Mutex::new(None),
        }
    }

    /// What a check may do now.
    pub(crate) fn gate(&self) -> Gate<'_> {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Gate::Closed;
        }
        if millis_since(self.origin, Instant::now()) < until {
            return Gate::Open;
        }
        match self
            .probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Gate::Probe(ProbeGuard(self)),
            Err(_) => Gate::Open,
        }
    }

    /// Whether the breaker is open (the store failed and has not answered since).
    pub(crate) fn is_open(&self) -> bool {
        self.open_until.load(Ordering::Acquire) != 0
    }

    /// The store answered. Returns `true` when this closed an open breaker.
    pub(crate) fn success(&self) -> bool {
        // Read before writing: a healthy store's checks never write the shared cache line.
        if self.open_until.load(Ordering::Acquire) == 0 {
            return false;
        }
        let was_open = self.open_until.swap(0, Ordering::AcqRel) != 0;
        if was_open {
            self.backoff_ms.store(0, Ordering::Release);
        }
        was_open
    }

    /// The store failed or timed out; `probe` tells whether this was the probe.
    pub(crate) fn failure(&self, error: &StoreError, probe: bool) {
        let now = millis_since(self.origin, Instant::now());
        let initial = u64::try_from(INITIAL_BACKOFF.as_millis()).unwrap_or(u64::MAX);
        let max = u64::try_from(MAX_BACKOFF.as_millis()).unwrap_or(u64::MAX);
        if probe {
            let backoff = self
                .backoff_ms
                .load(Ordering::Acquire)
                .max(initial / 2)
                .saturating_mul(2)
                .min(max);
            self.backoff_ms.store(backoff, Ordering::Release);
            self.open_until
                .store(now.saturating_add(backoff).max(1), Ordering::Release);
        } else if self
            .open_until
            .compare_exchange(
                0,
                now.saturating_add(initial).max(1),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            // Checks that were in flight when the store went down fail too; only the first
            // opens the breaker, the others leave the backoff alone.
            self.backoff_ms.store(initial, Ordering::Release);
        }
        if let Ok(mut last) = self.last_error.lock() {
            *last = Some(error.clone());
        }
    }

    /// The last failure seen, for checks answered while the breaker is open.
    pub(crate) fn last_error(&self) -> StoreError {
        self.last_error
            .lock()
            .ok()
            .and_then(|e| e.clone())
            .unwrap_or_else(|| StoreError::connection("the store failed recently"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn breaker_opens_after_a_failure_then_lets_one_probe_through() {
        let b = Breaker::new();
        let e = StoreError::Timeout(Duration::from_millis(50));
        assert!(matches!(b.gate(), Gate::Closed));
        b.failure(&e, false);
        // Late failures of checks that were in flight change nothing.
        b.failure(&e, false);
        assert!(matches!(b.gate(), Gate::Open));
        tokio::time::advance(INITIAL_BACKOFF).await;
        let probe = b.gate();
        assert!(matches!(probe, Gate::Probe(_)));
        // While one check probes, the others do not wait for the store.
        assert!(matches!(b.gate(), Gate::Open));
        b.failure(&e, true);
        drop(probe);
        assert!(matches!(b.gate(), Gate::Open));
        tokio::time::advance(INITIAL_BACKOFF).await;
        assert!(matches!(b.gate(), Gate::Open), "the backoff doubled");
        tokio::time::advance(INITIAL_BACKOFF).await;
        assert!(matches!(b.gate(), Gate::Probe(_)), "dropped probe freed");
        assert!(b.success());
        assert!(!b.success());
        assert!(matches!(b.gate(), Gate::Closed));
    }

    #[tokio::test(start_paused = true)]
    async fn breaker_backoff_never_exceeds_the_maximum() {
        let b = Breaker::new();
        let e = StoreError::connection("down");
        b.failure(&e, false);
        for _ in 0..20 {
            tokio::time::advance(MAX_BACKOFF).await;
            let Gate::Probe(g) = b.gate() else {
                panic!("a probe is due after the longest backoff");
            };
            b.failure(&e, true);
            drop(g);
        }
        assert!(b.last_error().is_connection());
        assert_eq!(
            b.last_error().to_string(),
            StoreError::connection("down").to_string()
        );
    }
}
