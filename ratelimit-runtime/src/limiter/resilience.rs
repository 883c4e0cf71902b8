//! Staying useful while the store fails (SPEC §8): a breaker that skips a failing store for a
//! short backoff, warnings that do not flood the log, and a bounded cache of callers known to be
//! over their limit.
//!
//! Every time here is a [`tokio::time::Instant`], so tests drive these types with tokio's paused
//! clock.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::StoreError;
use crate::policy::{Decision, Verdict};
use crate::store::Check;

/// Milliseconds since `origin`, saturating.
fn millis_since(origin: Instant, now: Instant) -> u64 {
    u64::try_from(now.saturating_duration_since(origin).as_millis()).unwrap_or(u64::MAX)
}

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
            .unwrap_or_else(|| StoreError::Redis("the store failed recently".to_owned()))
    }
}

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

/// The default capacity of the blocked-caller cache.
pub const DEFAULT_BLOCKED_CACHE: usize = 10_000;

#[derive(Debug, Clone, Copy)]
struct Blocked {
    /// Until when the store is sure to reject this key (measured from when the rejected
    /// request was sent, so never later than the store's own answer).
    until: Instant,
    /// Until when the quota is whole again (same origin).
    reset_at: Instant,
    /// The smallest cost known to be rejected: a call of this cost or more is rejected.
    cost: u64,
    limit: u64,
    remaining: u64,
}

/// Callers known to be over their limit until some time: such calls are rejected without a
/// round trip to the store.
///
/// When the store rejects a call, each rejecting limit's key is remembered until
/// `sent_at + retry_after`, `sent_at` being when the request was sent: the store measured
/// `retry_after` from a later moment, so the entry expires no later than the store's own
/// rejection would. A rejected call takes nothing from any limit, so only time can make the
/// store admit that key again: the cache only ever rejects, and never rejects a call the store
/// would admit (unless the key was deleted from the store behind the limiter's back).
///
/// Bounded: when full, expired entries go first, then the ones that expire soonest. Split in
/// shards (by a hash of the key) so that checks on many cores do not queue on one lock, and an
/// empty cache costs one atomic load.
#[derive(Debug)]
pub(crate) struct BlockedCache {
    /// The capacity of each shard.
    per_shard: usize,
    /// The number of keys held, readable without a lock.
    len: AtomicUsize,
    shards: Box<[Shard]>,
    hasher: std::hash::RandomState,
}

/// One shard of the cache: key → until when it is blocked.
type Shard = Mutex<HashMap<Box<str>, Blocked>>;

/// The most shards a cache is split into.
const SHARDS: usize = 16;

impl BlockedCache {
    /// An empty cache of at most `capacity` keys (`capacity > 0`).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        let shards = capacity.min(SHARDS);
        Self {
            per_shard: capacity / shards,
            len: AtomicUsize::new(0),
            shards: (0..shards).map(|_| Mutex::default()).collect(),
            hasher: std::hash::RandomState::new(),
        }
    }

    /// Number of keys held (expired ones included until they are swept).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    fn shard(&self, key: &str) -> &Shard {
        let hash = std::hash::BuildHasher::hash_one(&self.hasher, key);
        // The remainder is below the number of shards, so it fits in usize.
        #[allow(clippy::cast_possible_truncation)]
        let i = (hash % self.shards.len() as u64) as usize;
        &self.shards[i]
    }

    /// When a limit of `checks` is known to reject the call at `now`: a rejecting verdict
    /// (the known limits reject with the remaining wait; the others, unknown, are reported as
    /// admitting with their full capacity, since a rejected call takes nothing).
    pub(crate) fn lookup(&self, checks: &[Check<'_>], now: Instant) -> Option<Verdict> {
        if self.len.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut found = false;
        let mut decisions = Vec::with_capacity(checks.len());
        for check in checks {
            let capacity = check.policy.capacity();
            let admit = Decision::new(true, capacity, capacity, Duration::ZERO, Duration::ZERO);
            let Ok(mut map) = self.shard(check.key).lock() else {
                decisions.push(admit);
                continue;
            };
            let decision = match map.get(check.key) {
                Some(b) if b.until > now && check.policy.cost() >= b.cost => {
                    found = true;
                    let retry = b.until - now;
                    let reset = b.reset_at.saturating_duration_since(now).max(retry);
                    Decision::new(false, b.limit, b.remaining, reset, retry)
                }
                Some(b) => {
                    if b.until <= now && map.remove(check.key).is_some() {
                        self.len.fetch_sub(1, Ordering::AcqRel);
                    }
                    admit
                }
                None => admit,
            };
            decisions.push(decision);
        }
        found.then(|| Verdict::new(decisions))
    }

    /// Remembers the keys of the limits that rejected a call whose request was sent at
    /// `sent_at`.
    pub(crate) fn record(&self, checks: &[Check<'_>], verdict: &Verdict, sent_at: Instant) {
        if verdict.is_admitted() {
            return;
        }
        let now = Instant::now();
        for (check, decision) in checks.iter().zip(verdict.decisions()) {
            let Some(retry) = decision.retry_after.filter(|_| !decision.admitted) else {
                continue;
            };
            let until = sent_at + retry;
            if until <= now {
                continue;
            }
            let entry = Blocked {
                until,
                reset_at: sent_at + decision.reset_after,
                cost: check.policy.cost(),
                limit: decision.limit,
                remaining: decision.remaining,
            };
            let Ok(mut map) = self.shard(check.key).lock() else {
                continue;
            };
            if let Some(old) = map.get_mut(check.key) {
                // Keep whichever says more: a later end, or a smaller cost already rejected.
                if old.until <= now || (entry.until >= old.until && entry.cost <= old.cost) {
                    *old = entry;
                }
                continue;
            }
            let before = map.len();
            if before >= self.per_shard {
                Self::evict(&mut map, self.per_shard, now);
            }
            map.insert(check.key.into(), entry);
            let after = map.len();
            if after >= before {
                self.len.fetch_add(after - before, Ordering::AcqRel);
            } else {
                self.len.fetch_sub(before - after, Ordering::AcqRel);
            }
        }
    }

    /// Makes room: drops the expired entries, then, if still full, the eighth of the entries
    /// that expire soonest (so a full cache sweeps once per `capacity / 8` inserts).
    fn evict(map: &mut HashMap<Box<str>, Blocked>, capacity: usize, now: Instant) {
        map.retain(|_, b| b.until > now);
        if map.len() < capacity {
            return;
        }
        let mut ends: Vec<Instant> = map.values().map(|b| b.until).collect();
        let cut = (ends.len() / 8).max(1).min(ends.len() - 1);
        let (_, &mut threshold, _) = ends.select_nth_unstable(cut);
        map.retain(|_, b| b.until > threshold);
        while map.len() >= capacity {
            // Every entry ended at the same moment as the threshold: drop any.
            let Some(key) = map.keys().next().cloned() else {
                break;
            };
            map.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Algorithm, Policy};

    fn rejected(retry_ms: u64) -> Decision {
        Decision::new(
            false,
            3,
            0,
            Duration::from_millis(retry_ms * 2),
            Duration::from_millis(retry_ms),
        )
    }

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
        let e = StoreError::Redis("down".to_owned());
        b.failure(&e, false);
        for _ in 0..20 {
            tokio::time::advance(MAX_BACKOFF).await;
            let Gate::Probe(g) = b.gate() else {
                panic!("a probe is due after the longest backoff");
            };
            b.failure(&e, true);
            drop(g);
        }
        assert!(matches!(b.last_error(), StoreError::Redis(m) if m == "down"));
    }

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

    #[tokio::test(start_paused = true)]
    async fn blocked_cache_rejects_until_the_time_measured_from_sending() {
        let cache = BlockedCache::new(16);
        let p = Policy::new(Algorithm::Fixed, 3, Duration::from_secs(1)).unwrap();
        let checks = [Check::new("a", &p)];
        assert!(cache.lookup(&checks, Instant::now()).is_none());
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(30)).await;
        cache.record(&checks, &Verdict::new(vec![rejected(100)]), sent);
        let v = cache.lookup(&checks, Instant::now()).unwrap();
        assert!(!v.is_admitted());
        assert_eq!(v.retry_after(), Some(Duration::from_millis(70)));
        tokio::time::advance(Duration::from_millis(70)).await;
        assert!(cache.lookup(&checks, Instant::now()).is_none());
        assert_eq!(cache.len(), 0, "the expired entry was dropped");
    }

    #[tokio::test(start_paused = true)]
    async fn blocked_cache_keeps_only_rejecting_limits_and_respects_cost() {
        let cache = BlockedCache::new(16);
        let p = Policy::new(Algorithm::Token, 4, Duration::from_secs(1)).unwrap();
        let p2 = p.with_cost(2).unwrap();
        let admitted = Decision::new(true, 4, 2, Duration::ZERO, Duration::ZERO);
        let now = Instant::now();
        cache.record(
            &[Check::new("a", &p2), Check::new("b", &p2)],
            &Verdict::new(vec![admitted, rejected(100)]),
            now,
        );
        assert!(cache.lookup(&[Check::new("a", &p2)], now).is_none());
        // A call of cost 1 might fit where cost 2 did not: ask the store.
        assert!(cache.lookup(&[Check::new("b", &p)], now).is_none());
        let v = cache
            .lookup(&[Check::new("a", &p), Check::new("b", &p2)], now)
            .unwrap();
        assert!(v.decisions()[0].admitted);
        assert!(!v.decisions()[1].admitted);
    }

    #[tokio::test(start_paused = true)]
    async fn blocked_cache_stays_within_its_capacity() {
        let cache = BlockedCache::new(64);
        let p = Policy::new(Algorithm::Fixed, 1, Duration::from_secs(60)).unwrap();
        let keys: Vec<String> = (0..1000).map(|i| format!("k{i}")).collect();
        for (i, key) in keys.iter().enumerate() {
            let retry = 1000 + u64::try_from(i).unwrap();
            cache.record(
                &[Check::new(key, &p)],
                &Verdict::new(vec![rejected(retry)]),
                Instant::now(),
            );
            assert!(cache.len() <= 64);
        }
        // The latest (longest-lived) entries survive.
        let last = [Check::new(&keys[999], &p)];
        assert!(cache.lookup(&last, Instant::now()).is_some());
        let first = [Check::new(&keys[0], &p)];
        assert!(cache.lookup(&first, Instant::now()).is_none());
    }
}
