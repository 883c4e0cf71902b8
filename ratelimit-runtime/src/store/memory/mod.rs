//! The in-process store: [`MemoryStore`]'s API over sharded maps, integer arithmetic, idle
//! entries evicted.
//!
//! See [`MemoryStore`] for its behaviour and [`Clock`] for where its time comes from. Each
//! concern has its room:
//!
//! * `clock` — the [`Clock`] trait and its sources;
//! * `map` — the key hasher, the shards, sweeping and making room;
//! * `packed` — the states a cell's words hold, and how (one word for a fixed window or GCRA);
//! * `cell` — one key's entry in those words: one compare-and-swap for a one-word state, the
//!   sequence lock over the others;
//! * `engine` — the checks: one limit, many limits as one call, and peeks;
//! * `blocks` — the admin block table and resets;
//! * `receipts` — take/refund receipts;
//! * `slots` — concurrency limits' releases;
//! * `janitor` — the background sweeping task.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockWriteGuard};
use std::time::Duration;

use self::map::{MAX_SHARDS, Padded, key_hasher, shard_count};
use self::receipts::Receipts;
use super::{Check, Store, StoreFuture};
use crate::decision::Verdict;
use crate::error::StoreError;

mod blocks;
mod cell;
mod clock;
mod engine;
mod janitor;
mod map;
mod packed;
mod receipts;
mod slots;

pub use self::clock::{Clock, ManualClock, MonotonicClock, TokioClock};

/// The default bound on the number of keys a [`MemoryStore`] holds ([`MemoryStore::with_max_keys`]).
pub const DEFAULT_MAX_KEYS: usize = 1 << 22;

/// How often the background janitor sweeps idle entries by default
/// ([`MemoryStore::with_sweep_interval`]).
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// The in-process store, the embedded default: no setup.
///
/// # Behaviour
///
/// * **Per process.** Its limits live in this process's memory: several instances of an
///   application (processes, containers, hosts) each keep their own counts, so a quota of 100
///   becomes 100 *per instance*. Instances share limits only through Redis
///   ([`crate::RedisStore`]).
/// * **Exact.** N concurrent calls against a quota of `num` get exactly `num` admissions. The
///   state is split over shards (four per core, from 8 to 64), each behind its own read-write
///   lock (there is no global lock); a key lives in the shard its hash picks. A one-limit check on a key already held
///   takes its shard's read lock and updates the key's entry by compare-and-swap, so calls on
///   one key never wait on each other's lock (a sliding log, a new key, or a key changing
///   algorithm takes the write lock). A check of several limits takes the write locks of its
///   keys' shards in ascending order (each once), so it is atomic against every other check,
///   one-limit checks on the same entries included, and cannot deadlock with another check.
/// * **All or nothing.** The limits of a call are evaluated one after the other (a key named
///   twice sees what the call's earlier limits took); only when all admit are they written. A
///   call that any limit rejects changes nothing.
/// * **The same rules as Redis.** Each check runs the pure rules of [`crate::algorithm`], the
///   mirror of the Lua scripts the Redis stores run: whole microseconds from the [`Clock`], the
///   same integer units (so 50 calls against a burst of 50 admit exactly 50 and fractional
///   rates neither gain nor lose a unit), the same sliding log, the same fixed-window
///   millisecond expiry (a window is gone the millisecond after its end, so a `retry_after` is
///   never early). The arithmetic saturates: no input makes a check panic.
/// * **Idle keys are forgotten.** Each entry knows when it becomes idle, i.e. equal to no entry
///   at all: a fixed window at its end, a sliding window one period after its newest admission,
///   a token bucket when it is full again, a leaky bucket when it is empty.
///   Idle entries are removed by [`MemoryStore::sweep`], by each shard on inserts (amortised:
///   a shard sweeps itself after as many inserts as it held entries at its last sweep), and by
///   a background janitor every [`DEFAULT_SWEEP_INTERVAL`] (configurable). The janitor is a
///   tokio task started at the first check made inside a tokio runtime; it holds only a weak
///   reference and ends when the store is dropped. Forgetting an idle entry never changes an
///   answer.
/// * **Memory bounded, and no caller's state is ever forgotten for room.** A sliding window
///   keeps at most `num` admitted units (as runs of consecutive microseconds, one per call at
///   most), every other entry is a few words. The number of keys is bounded by [`MemoryStore::with_max_keys`] (default
///   [`DEFAULT_MAX_KEYS`], split evenly over the shards). Only idle entries are ever removed: a
///   live entry (a caller who spent part of a quota) stays until its state is back to empty,
///   however many other keys arrive, so minting keys (header values, IPv6 /64s) never resets
///   another caller's limit. When a call needs a new key and the key's shard is full of live
///   entries (after sweeping it), the call is answered [`StoreError::Full`] and changes
///   nothing: no existing entry is touched, and in a call of several limits no key is written
///   either. A [`crate::RateLimiter`] refuses such a call, whatever its
///   [`crate::FailurePolicy`] (`Local` asks its own fallback store): admitting a call it cannot
///   count would let a flood of minted keys switch every new caller's limit off. That refusal
///   concerns that call only (the breaker stays closed) and is logged, throttled. Keys already held
///   keep working normally while the store is full; new keys fit again as soon as entries go
///   idle.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_runtime::{Algorithm, store::Check, MemoryStore, Policy};
/// use ratelimit_runtime::store::ManualClock;
///
/// let clock = ManualClock::new();
/// let store = MemoryStore::with_clock(clock.clone());
/// let policy = Policy::new(Algorithm::Fixed, 2, Duration::from_secs(10))?;
/// let checks = [Check::new("ratelimit:{demo}:fixed:2:10000", &policy)];
/// assert!(store.check_now(&checks)?.is_admitted());
/// assert!(store.check_now(&checks)?.is_admitted());
/// let third = store.check_now(&checks)?;
/// assert!(!third.is_admitted());
/// // As in Redis, the wait runs to the millisecond after the window's expiry: never early.
/// assert_eq!(third.retry_after(), Some(Duration::from_millis(10_001)));
///
/// clock.advance(Duration::from_millis(10_001));
/// assert_eq!(store.len(), 0); // the window ended: the entry is idle
/// assert!(store.check_now(&checks)?.is_admitted());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct MemoryStore {
    inner: Arc<Inner>,
    janitor: Mutex<Option<tokio::task::AbortHandle>>,
}

struct Inner {
    clock: Box<dyn Clock>,
    /// The key hash (see [`key_hasher`]).
    hasher: foldhash::fast::SeedableRandomState,
    /// The shards: a one-limit check on a held key takes a read lock (several run at once,
    /// each updating its key's [`Cell`](cell::Cell) by compare-and-swap), everything else the
    /// write lock.
    shards: Box<[Padded]>,
    /// The shard count less one ([`Inner::shard_of`]).
    shard_mask: u64,
    /// Whether one-limit checks take the read-lock fast path ([`MemoryStore::with_fast_path`]).
    fast: AtomicBool,
    max_per_shard: AtomicUsize,
    sweep_interval_ns: AtomicU64,
    /// Set while a janitor task lives (cleared when its runtime drops it).
    janitor_running: AtomicBool,
    /// The receipts of calls taken with [`Store::take`], by call id: when they expire (µs)
    /// and one per limit. Only outcome-filtered calls (`count = …`) use it.
    receipts: Mutex<Receipts>,
    /// Blocked keys ([`Store::block`]) → until when (µs on the clock). Read on every call
    /// only while a block is in force (`blocks_len > 0`): otherwise one atomic load.
    blocks: std::sync::RwLock<std::collections::HashMap<Box<str>, u64>>,
    /// The number of entries in `blocks`, readable without its lock; 0 once every block ended.
    blocks_len: AtomicUsize,
    /// The latest end of a block held (µs): from then on `blocks` can be emptied.
    blocks_until: AtomicU64,
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("clock", &self.inner.clock)
            .field("shards", &self.inner.shards.len())
            .field("max_keys", &self.max_keys())
            .field("sweep_interval", &self.inner.sweep_interval())
            .finish_non_exhaustive()
    }
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
        let hasher = key_hasher();
        let shards: Box<[Padded]> = (0..shard_count())
            .map(|_| Padded::new(hasher.clone()))
            .collect();
        // The count is a power of two of at most 64.
        let shard_mask = u64::try_from(shards.len() - 1).unwrap_or(0);
        let store = Self {
            inner: Arc::new(Inner {
                clock: Box::new(clock),
                hasher,
                shards,
                shard_mask,
                fast: AtomicBool::new(true),
                max_per_shard: AtomicUsize::new(0),
                sweep_interval_ns: AtomicU64::new(0),
                janitor_running: AtomicBool::new(false),
                receipts: Mutex::new(Receipts::default()),
                blocks: std::sync::RwLock::default(),
                blocks_len: AtomicUsize::new(0),
                blocks_until: AtomicU64::new(0),
            }),
            janitor: Mutex::new(None),
        };
        store
            .with_max_keys(DEFAULT_MAX_KEYS)
            .with_sweep_interval(DEFAULT_SWEEP_INTERVAL)
    }

    /// Bounds the number of keys held (rounded up to a multiple of 64, at least 64; default
    /// [`DEFAULT_MAX_KEYS`]). The bound is kept per shard (an equal share each), so a new key
    /// can find its shard full a little before the whole store is. A full shard never drops a live entry: a call that
    /// needs a new key there is answered [`StoreError::Full`] until entries go idle (see the
    /// type's "Memory bounded" rule).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, store::Check, MemoryStore, Policy, StoreError};
    /// use ratelimit_runtime::store::ManualClock;
    ///
    /// let clock = ManualClock::new();
    /// let store = MemoryStore::with_clock(clock.clone()).with_max_keys(64);
    /// let policy = Policy::new(Algorithm::Fixed, 1, Duration::from_secs(60))?;
    /// let mut full = 0;
    /// for i in 0..2000 {
    ///     let key = format!("minted:{i}");
    ///     match store.check_now(&[Check::new(&key, &policy)]) {
    ///         Ok(verdict) => assert!(verdict.is_admitted()),
    ///         Err(StoreError::Full { max_keys }) => {
    ///             assert_eq!(max_keys, 64);
    ///             full += 1;
    ///         }
    ///         Err(e) => return Err(e.into()),
    ///     }
    /// }
    /// assert_eq!(store.held(), 64); // every shard full, no key dropped for another
    /// assert_eq!(full, 2000 - 64);
    ///
    /// clock.advance(Duration::from_millis(60_001)); // every window ended: the entries are idle
    /// assert!(store.check_now(&[Check::new("new", &policy)])?.is_admitted());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn with_max_keys(self, max_keys: usize) -> Self {
        // Rounded up to a multiple of 64, which every shard count divides: the bound is the
        // same on every machine.
        let bound = max_keys
            .div_ceil(MAX_SHARDS)
            .clamp(1, usize::MAX / MAX_SHARDS)
            * MAX_SHARDS;
        let per_shard = bound / self.inner.shards.len();
        self.inner.max_per_shard.store(per_shard, Ordering::Relaxed);
        self
    }

    /// Turns the one-limit fast path off (`false`) or on (the default): with it off, every
    /// check takes its shards' write locks, as stacked checks do. The answers are the same
    /// either way; this exists so that tests can compare the two paths decision by decision.
    #[doc(hidden)]
    #[must_use]
    pub fn with_fast_path(self, on: bool) -> Self {
        self.inner.fast.store(on, Ordering::Relaxed);
        self
    }

    /// How often the background janitor sweeps (at least 1 ms; default
    /// [`DEFAULT_SWEEP_INTERVAL`]). The interval is measured on tokio's clock.
    #[must_use]
    pub fn with_sweep_interval(self, interval: Duration) -> Self {
        let ns = u64::try_from(interval.as_nanos())
            .unwrap_or(u64::MAX)
            .max(1_000_000);
        self.inner.sweep_interval_ns.store(ns, Ordering::Relaxed);
        self
    }

    /// The bound on the number of keys ([`MemoryStore::with_max_keys`], rounded up to a
    /// multiple of 64).
    pub fn max_keys(&self) -> usize {
        self.inner.max_per_shard.load(Ordering::Relaxed) * self.inner.shards.len()
    }

    /// Removes every idle entry now and returns how many were removed. The janitor and the
    /// shards' own sweeping do this without being asked; calling it is never needed for
    /// correctness (an idle entry answers like no entry).
    pub fn sweep(&self) -> usize {
        let now = self.inner.now();
        self.inner
            .shards
            .iter()
            .map(|shard| write(shard).sweep(now))
            .sum()
    }

    /// The number of live (not yet idle) entries. Takes each shard's lock in turn and scans
    /// it, so it costs O(entries); meant for tests and metrics, not for every request.
    pub fn len(&self) -> usize {
        let now = self.inner.now();
        self.inner
            .shards
            .iter()
            .map(|shard| read(shard).map.values().filter(|c| c.live(now)).count())
            .sum()
    }

    /// The number of entries held in memory, live or idle: what sweeping brings down to
    /// [`MemoryStore::len`].
    pub fn held(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|shard| read(shard).map.len())
            .sum()
    }

    /// Whether no live entry is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The same check as [`Store::check`], without a future: the memory store never waits
    /// for anything but its shards' locks.
    ///
    /// `checks` may be empty (the answer is an admitted verdict with no decisions).
    ///
    /// # Errors
    ///
    /// [`StoreError::Full`] when the call would be admitted but needs a new key in a shard full
    /// of live entries (see the type's "Memory bounded" rule); the call then changes nothing.
    /// A call on keys already held never fails.
    pub fn check_now(&self, checks: &[Check<'_>]) -> Result<Verdict, StoreError> {
        self.start_janitor();
        if let Some(verdict) = self.inner.blocked(checks) {
            return Ok(verdict);
        }
        match checks {
            [] => Ok(Verdict::new(Vec::new())),
            [one] => Ok(Verdict::one(self.inner.check_one(one)?)),
            many => Ok(Verdict::new(self.inner.check_many(many, None, "")?)),
        }
    }

    /// [`Store::peek`] without a future: the state of each limit now, taking nothing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, store::Check, MemoryStore, Policy};
    ///
    /// let store = MemoryStore::new();
    /// let policy = Policy::new(Algorithm::Fixed, 2, Duration::from_secs(10))?;
    /// let checks = [Check::new("k", &policy)];
    /// store.check_now(&checks)?;
    /// for _ in 0..3 {
    ///     assert_eq!(store.peek_now(&checks).decisions()[0].remaining, 1); // unchanged
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peek_now(&self, checks: &[Check<'_>]) -> Verdict {
        self.inner.peek(checks, self.inner.now())
    }
}

impl Store for MemoryStore {
    fn check<'a>(&'a self, checks: &'a [Check<'a>]) -> StoreFuture<'a> {
        Box::pin(async move { self.check_now(checks) })
    }

    fn check_at_once(
        &self,
        checks: &[Check<'_>],
        call_id: Option<&str>,
    ) -> Option<Result<Verdict, StoreError>> {
        Some(match call_id {
            Some(id) => self.take_now(checks, id),
            None => self.check_now(checks),
        })
    }

    fn take<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> StoreFuture<'a> {
        Box::pin(async move { self.take_now(checks, call_id) })
    }

    fn refund<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            self.refund_now(checks, call_id);
            Ok(())
        })
    }

    fn settle<'a>(
        &'a self,
        checks: &'a [Check<'a>],
        call_id: &'a str,
        actual: &'a [u64],
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move { self.settle_now(checks, call_id, actual) })
    }

    fn forget<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            self.forget_now(call_id);
            self.release_now(checks, call_id);
            Ok(())
        })
    }

    fn name(&self) -> &'static str {
        "memory"
    }

    fn is_local(&self) -> bool {
        true
    }

    fn peek<'a>(&'a self, checks: &'a [Check<'a>]) -> StoreFuture<'a> {
        Box::pin(async move { Ok(self.peek_now(checks)) })
    }

    fn reset<'a>(&'a self, keys: &'a [&'a str]) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            self.reset_now(keys);
            Ok(())
        })
    }

    fn block<'a>(&'a self, keys: &'a [&'a str], duration: Duration) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            self.block_now(keys, duration);
            Ok(())
        })
    }

    fn extend_block<'a>(&'a self, keys: &'a [&'a str], duration: Duration) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            self.extend_block_now(keys, duration);
            Ok(())
        })
    }
}

/// Reads a lock, ignoring poisoning (as [`lock`]).
fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

/// Writes a lock, ignoring poisoning (as [`lock`]).
fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

/// Locks a mutex, ignoring poisoning: no code path panics while holding one, and the state
/// stays consistent between statements anyway.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Inner {
    /// The clock, in the whole microseconds the rules count in (as the Redis scripts do).
    fn now(&self) -> u64 {
        self.clock.now_micros()
    }

    fn sweep_interval(&self) -> Duration {
        Duration::from_nanos(self.sweep_interval_ns.load(Ordering::Relaxed))
    }
}

/// What the rooms' tests share: policies, one-limit calls, and reads of the entries held.
#[cfg(test)]
mod testing {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use super::cell::{Cell, Entry};
    use super::{MemoryStore, read};
    use crate::algorithm::Algorithm;
    use crate::decision::Decision;
    use crate::error::StoreError;
    use crate::policy::Policy;
    use crate::store::Check;

    pub(super) const MS: Duration = Duration::from_millis(1);
    pub(super) const HOUR: Duration = Duration::from_secs(3600);

    pub(super) fn policy(algo: Algorithm, limit: u64, period: Duration, burst: u64) -> Policy {
        Policy::new(algo, limit, period)
            .and_then(|p| p.with_burst(burst))
            .unwrap()
    }

    pub(super) fn one(store: &MemoryStore, key: &str, p: &Policy) -> Decision {
        store.check_now(&[Check::new(key, p)]).unwrap().decisions()[0]
    }

    pub(super) fn entry(store: &MemoryStore, key: &str) -> Option<Entry> {
        let hash = store.inner.hash(key);
        let shard = read(&store.inner.shards[store.inner.shard_of(hash)]);
        shard.map.get(hash, key).map(Cell::snapshot)
    }

    pub(super) fn snapshot(store: &MemoryStore) -> Vec<(Box<str>, Entry)> {
        let mut all: Vec<_> = store
            .inner
            .shards
            .iter()
            .flat_map(|s| {
                read(s)
                    .map
                    .iter()
                    .map(|(k, c)| (Box::<str>::from(k), c.snapshot()))
                    .collect::<Vec<_>>()
            })
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    pub(super) fn try_one(
        store: &MemoryStore,
        key: &str,
        p: &Policy,
    ) -> Result<Decision, StoreError> {
        store
            .check_now(&[Check::new(key, p)])
            .map(|v| v.decisions()[0])
    }

    /// `store` bounded to `n` keys per shard, whatever its shard count (the public bound is
    /// a multiple of 64 keys, split over the shards).
    pub(super) fn keys_per_shard(store: MemoryStore, n: usize) -> MemoryStore {
        store.inner.max_per_shard.store(n, Ordering::Relaxed);
        store
    }

    /// `n` keys `{prefix}{i}` that live in shard `shard`.
    pub(super) fn keys_in_shard(
        store: &MemoryStore,
        shard: usize,
        prefix: &str,
        n: usize,
    ) -> Vec<String> {
        (0..)
            .map(|i| format!("{prefix}{i}"))
            .filter(|k| store.inner.shard_of(store.inner.hash(k)) == shard)
            .take(n)
            .collect()
    }
}
