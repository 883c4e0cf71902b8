//! The admin block table: [`MemoryStore::block_now`] and [`MemoryStore::reset_now`], and
//! the rejection of a call on a blocked key.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Inner, MemoryStore, read, write};
use crate::decision::{Decision, Verdict};
use crate::store::Check;

impl MemoryStore {
    /// [`Store::reset`](crate::Store::reset) without a future: forgets the state of `keys` and any
    /// block on them.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, store::Check, MemoryStore, Policy};
    ///
    /// let store = MemoryStore::new();
    /// let policy = Policy::new(Algorithm::Fixed, 1, Duration::from_secs(60))?;
    /// let checks = [Check::new("k", &policy)];
    /// assert!(store.check_now(&checks)?.is_admitted());
    /// assert!(!store.check_now(&checks)?.is_admitted());
    /// store.reset_now(&["k"]);
    /// assert!(store.check_now(&checks)?.is_admitted());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reset_now(&self, keys: &[&str]) {
        for key in keys {
            let hash = self.inner.hash(key);
            let mut shard = write(&self.inner.shards[self.inner.shard_of(hash)]);
            shard.map.remove(hash, key);
        }
        let mut blocks = write(&self.inner.blocks);
        for key in keys {
            blocks.remove(*key);
        }
        self.inner.blocks_len.store(blocks.len(), Ordering::Release);
    }

    /// [`Store::block`](crate::Store::block) without a future: every call under `keys` is rejected
    /// for `duration` from now (on the store's clock; whole milliseconds, at least one, to the
    /// millisecond after, as Redis expires the block).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, store::Check, MemoryStore, Policy};
    /// use ratelimit_runtime::store::ManualClock;
    ///
    /// let clock = ManualClock::new();
    /// let store = MemoryStore::with_clock(clock.clone());
    /// let policy = Policy::new(Algorithm::Fixed, 100, Duration::from_secs(1))?;
    /// let checks = [Check::new("k", &policy)];
    /// store.block_now(&["k"], Duration::from_secs(3600));
    /// let wait = store.check_now(&checks)?.retry_after().unwrap();
    /// assert!(wait > Duration::from_secs(3600)); // to the millisecond after, as on Redis
    /// clock.advance(wait - Duration::from_millis(1));
    /// assert!(!store.check_now(&checks)?.is_admitted());
    /// clock.advance(Duration::from_millis(1));
    /// assert!(store.check_now(&checks)?.is_admitted());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn block_now(&self, keys: &[&str], duration: Duration) {
        self.write_blocks(keys, duration, false);
    }

    /// [`Store::extend_block`](crate::Store::extend_block) without a future: as
    /// [`MemoryStore::block_now`], but a key whose block already ends later keeps it (read and
    /// written under one lock, per key).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, store::Check, MemoryStore, Policy};
    ///
    /// let store = MemoryStore::new();
    /// let policy = Policy::new(Algorithm::Fixed, 100, Duration::from_secs(1))?;
    /// store.block_now(&["k"], Duration::from_secs(3600));
    /// store.extend_block_now(&["k", "j"], Duration::from_secs(2));
    /// let wait = |key| store.peek_now(&[Check::new(key, &policy)]).retry_after().unwrap();
    /// assert!(wait("k") > Duration::from_secs(3599)); // the longer block stands
    /// assert!(wait("j") <= Duration::from_secs(3)); // an unblocked key is blocked
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn extend_block_now(&self, keys: &[&str], duration: Duration) {
        self.write_blocks(keys, duration, true);
    }

    /// Writes a block of `duration` on `keys`; `keep_later`: not over a block that ends later.
    fn write_blocks(&self, keys: &[&str], duration: Duration, keep_later: bool) {
        let now = self.inner.now();
        // As Redis expires the block's marker (`SET … PX ms`): it lives through the
        // millisecond `now_ms + ms` and is gone from the next one, so both stores answer the
        // same wait.
        let ms = crate::store::block_ms(duration);
        let until = (now / 1000)
            .saturating_add(ms)
            .saturating_add(1)
            .saturating_mul(1000);
        let mut blocks = write(&self.inner.blocks);
        blocks.retain(|_, end| *end > now);
        for key in keys {
            let end = blocks.entry((*key).into()).or_insert(until);
            if !keep_later || *end < until {
                *end = until;
            }
        }
        let latest = blocks.values().copied().max().unwrap_or(0);
        self.inner.blocks_until.store(latest, Ordering::Release);
        self.inner.blocks_len.store(blocks.len(), Ordering::Release);
    }
}

/// The decision of a blocked limit: rejected, nothing left, until the block's end (`left_us`).
pub(super) fn blocked_decision(capacity: u64, reset_us: u64, left_us: u64) -> Decision {
    Decision::new(
        false,
        capacity,
        0,
        Duration::from_micros(reset_us.max(left_us)),
        Duration::from_micros(left_us),
    )
}

impl Inner {
    /// µs left of a block on `key`, if one holds at `now`.
    pub(super) fn block_left(&self, key: &str, now: u64) -> Option<u64> {
        if self.blocks_len.load(Ordering::Acquire) == 0 {
            return None;
        }
        read(&self.blocks)
            .get(key)
            .filter(|&&until| until > now)
            .map(|&until| until - now)
    }

    /// The verdict of a call of which a limit is blocked: that limit rejects until the
    /// block's end, the others report their state as it is; nothing is taken. `None` when no
    /// limit of the call is blocked (one atomic load while no block exists).
    #[inline]
    pub(super) fn blocked(&self, checks: &[Check<'_>]) -> Option<Verdict> {
        if self.blocks_len.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.blocked_now(checks)
    }

    /// [`Inner::blocked`] while some block is held.
    #[cold]
    fn blocked_now(&self, checks: &[Check<'_>]) -> Option<Verdict> {
        let now = self.now();
        if now >= self.blocks_until.load(Ordering::Acquire) {
            // Every block ended: back to one atomic load per call.
            let mut blocks = write(&self.blocks);
            blocks.retain(|_, end| *end > now);
            self.blocks_len.store(blocks.len(), Ordering::Release);
            return None;
        }
        if !checks.iter().any(|c| self.block_left(c.key, now).is_some()) {
            return None;
        }
        Some(self.peek(checks, now))
    }
}
