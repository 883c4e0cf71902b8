//! The blocked-caller cache: callers a remote store rejected are rejected locally, without a
//! round trip, until the store's `retry_after` has passed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::decision::{Decision, Verdict};
use crate::store::Check;

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

    /// Forgets `keys` (an admin reset: the store forgot them too).
    pub(crate) fn remove(&self, keys: &[&str]) {
        for key in keys {
            let Ok(mut map) = self.shard(key).lock() else {
                continue;
            };
            if map.remove(*key).is_some() {
                self.len.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Rejects every call on the keys of `checks` until `until` (an admin block: the store
    /// rejects them until then too).
    pub(crate) fn block(&self, checks: &[Check<'_>], until: Instant) {
        let now = Instant::now();
        if until <= now {
            return;
        }
        for check in checks {
            let entry = Blocked {
                until,
                reset_at: until,
                cost: 1,
                limit: check.policy.capacity(),
                remaining: 0,
            };
            let Ok(mut map) = self.shard(check.key).lock() else {
                continue;
            };
            let before = map.len();
            if before >= self.per_shard && !map.contains_key(check.key) {
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
    use crate::algorithm::Algorithm;
    use crate::policy::Policy;

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
    async fn an_admin_block_rejects_any_cost_until_its_end_and_a_reset_forgets_it() {
        let cache = BlockedCache::new(16);
        let p = Policy::new(Algorithm::Token, 4, Duration::from_secs(1)).unwrap();
        let checks = [Check::new("a", &p)];
        let until = Instant::now() + Duration::from_secs(600);
        cache.block(&checks, until);
        assert_eq!(cache.len(), 1);
        let v = cache.lookup(&checks, Instant::now()).unwrap();
        assert_eq!(v.retry_after(), Some(Duration::from_secs(600)));
        assert_eq!(v.decisions()[0].remaining, 0);
        // A block replaces what was there, and is not counted twice.
        cache.record(&checks, &Verdict::new(vec![rejected(100)]), Instant::now());
        cache.block(&checks, until);
        assert_eq!(cache.len(), 1);
        cache.remove(&["a", "never-held"]);
        assert_eq!(cache.len(), 0);
        assert!(cache.lookup(&checks, Instant::now()).is_none());
        // A block that already ended is not kept.
        cache.block(&checks, Instant::now());
        assert!(cache.lookup(&checks, Instant::now()).is_none());
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
