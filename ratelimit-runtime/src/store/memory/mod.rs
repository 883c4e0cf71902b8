//! The in-process store: sharded maps, integer arithmetic, idle entries evicted.
//!
//! See [`MemoryStore`] for its behaviour and [`Clock`] for where its time comes from.

use std::borrow::Cow;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockWriteGuard, Weak};
use std::time::Duration;

use hashbrown::HashTable;

use super::{AdminFuture, Check, RefundFuture, Store, StoreFuture};
use crate::algorithm::{self, Evaluation, Params, Receipt, State};
use crate::error::StoreError;
use crate::policy::{Algorithm, Decision, Verdict};

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

/// Number of independently locked shards.
const SHARDS: usize = 64;

/// The default bound on the number of keys a [`MemoryStore`] holds ([`MemoryStore::with_max_keys`]).
pub const DEFAULT_MAX_KEYS: usize = 1 << 22;

/// How often the background janitor sweeps idle entries by default
/// ([`MemoryStore::with_sweep_interval`]).
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// A shard sweeps itself on inserts once it has had this many inserts, or as many as it held
/// after its last sweep, whichever is more (so sweeping costs O(1) per insert, amortised).
const MIN_INSERTS_PER_SWEEP: usize = 64;

/// The in-process store, the embedded default: no setup.
///
/// # Behaviour
///
/// * **Per process.** Its limits live in this process's memory: several instances of an
///   application (processes, containers, hosts) each keep their own counts, so a quota of 100
///   becomes 100 *per instance*. Instances share limits only through Redis
///   ([`crate::RedisStore`]).
/// * **Exact.** N concurrent calls against a quota of `num` get exactly `num` admissions. The
///   state is split over 64 shards, each behind its own read-write lock (there is no global
///   lock); a key lives in the shard its hash picks. A one-limit check on a key already held
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
/// use ratelimit_runtime::{Algorithm, Check, MemoryStore, Policy};
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
    /// each updating its key's [`Cell`] by compare-and-swap), everything else the write lock.
    shards: Box<[Padded]>,
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

/// Receipts by call id: when they expire (µs) and one per limit of the call; and when the map
/// may next be swept (µs), so that a map full of live receipts is not scanned on every take.
#[derive(Default)]
struct Receipts {
    by_call: std::collections::HashMap<Box<str>, (u64, Vec<Receipt>)>,
    next_sweep: u64,
}

impl Receipts {
    /// Keeps `receipts` of the call `call_id` until `expires`. Receipts live only while their
    /// call runs (a settled call refunds or forgets them), so a full table means as many calls
    /// in flight: the expired ones are swept first (at most every 100 ms), and if the table is
    /// still full, the eighth of it that expires soonest is dropped (those calls stay counted
    /// whatever their outcome: they fail closed). A new take always gets its receipt: a flood
    /// of calls never turns another caller's refund into a count.
    fn insert(&mut self, call_id: &str, expires: u64, receipts: Vec<Receipt>, now: u64) {
        if self.by_call.len() >= MAX_RECEIPTS && now >= self.next_sweep {
            self.by_call.retain(|_, (expires, _)| *expires > now);
            self.next_sweep = now.saturating_add(100_000);
        }
        if self.by_call.len() >= MAX_RECEIPTS {
            let mut ends: Vec<u64> = self.by_call.values().map(|(e, _)| *e).collect();
            let cut = ends.len() / 8;
            let (_, &mut threshold, _) = ends.select_nth_unstable(cut);
            let mut dropped = 0;
            self.by_call.retain(|_, (e, _)| {
                let keep = *e > threshold || dropped >= cut.max(1);
                dropped += usize::from(!keep);
                keep
            });
        }
        self.by_call.insert(call_id.into(), (expires, receipts));
    }
}

/// The most calls the memory store keeps receipts for at once (see [`Receipts::insert`]).
const MAX_RECEIPTS: usize = 1 << 16;

/// The longest a receipt lives, µs (as the scripts' `RECEIPT_TTL_US`).
const RECEIPT_TTL_US: u64 = 10_000_000;

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("clock", &self.inner.clock)
            .field("shards", &SHARDS)
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

impl Drop for MemoryStore {
    fn drop(&mut self) {
        let handle = self
            .janitor
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(handle) = handle {
            handle.abort();
        }
    }
}

impl MemoryStore {
    /// A store on the real monotonic clock.
    pub fn new() -> Self {
        Self::with_clock(MonotonicClock::default())
    }

    /// A store on the given clock.
    pub fn with_clock(clock: impl Clock) -> Self {
        let shards = (0..SHARDS)
            .map(|_| Padded(RwLock::new(Shard::default())))
            .collect();
        let store = Self {
            inner: Arc::new(Inner {
                clock: Box::new(clock),
                hasher: key_hasher(),
                shards,
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

    /// Bounds the number of keys held (at least 64; default [`DEFAULT_MAX_KEYS`]). The bound is
    /// kept per shard (`max_keys / 64` each, rounded up), so a new key can find its shard full
    /// a little before the whole store is. A full shard never drops a live entry: a call that
    /// needs a new key there is answered [`StoreError::Full`] until entries go idle (see the
    /// type's "Memory bounded" rule).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, Check, MemoryStore, Policy, StoreError};
    /// use ratelimit_runtime::store::ManualClock;
    ///
    /// let clock = ManualClock::new();
    /// let store = MemoryStore::with_clock(clock.clone()).with_max_keys(64);
    /// let policy = Policy::new(Algorithm::Fixed, 1, Duration::from_secs(60))?;
    /// let mut full = 0;
    /// for i in 0..1000 {
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
    /// assert_eq!(store.held(), 64); // one key per shard, none dropped for another
    /// assert_eq!(full, 1000 - 64);
    ///
    /// clock.advance(Duration::from_millis(60_001)); // every window ended: the entries are idle
    /// assert!(store.check_now(&[Check::new("new", &policy)])?.is_admitted());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn with_max_keys(self, max_keys: usize) -> Self {
        let per_shard = max_keys.div_ceil(SHARDS).max(1);
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
        self.inner.max_per_shard.load(Ordering::Relaxed) * SHARDS
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

    /// Whether the background janitor task is running. It starts at the first check made
    /// inside a tokio runtime, and again at the next such check when its runtime shut down.
    pub fn has_janitor(&self) -> bool {
        self.inner.janitor_running.load(Ordering::Acquire)
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
            many => Ok(Verdict::new(self.inner.check_many(many, None)?)),
        }
    }

    /// [`Store::take`] without a future: [`MemoryStore::check_now`], and when the call is
    /// admitted, a receipt per limit under `call_id` (kept by the store, at most 10 seconds).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, Check, MemoryStore, Policy};
    ///
    /// let store = MemoryStore::new();
    /// let policy = Policy::new(Algorithm::Fixed, 1, Duration::from_secs(60))?;
    /// let checks = [Check::new("login", &policy)];
    /// assert!(store.take_now(&checks, "a1b2c3d4e5f6a7b8c9")?.is_admitted());
    /// assert!(!store.check_now(&checks)?.is_admitted());
    /// store.refund_now(&checks, "a1b2c3d4e5f6a7b8c9"); // the call did not count
    /// store.refund_now(&checks, "a1b2c3d4e5f6a7b8c9"); // a second refund gives back nothing
    /// assert!(store.check_now(&checks)?.is_admitted());
    /// assert!(!store.check_now(&checks)?.is_admitted());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`MemoryStore::check_now`].
    pub fn take_now(&self, checks: &[Check<'_>], call_id: &str) -> Result<Verdict, StoreError> {
        self.start_janitor();
        if checks.is_empty() {
            return Ok(Verdict::new(Vec::new()));
        }
        // A blocked caller is rejected here as in `check_now` (the take of `count = …`).
        if let Some(verdict) = self.inner.blocked(checks) {
            return Ok(verdict);
        }
        let mut receipts = Vec::with_capacity(checks.len());
        let verdict = Verdict::new(self.inner.check_many(checks, Some(&mut receipts))?);
        if verdict.is_admitted() && receipts.len() == checks.len() {
            let now = self.inner.now();
            let ttl = receipts
                .iter()
                .map(|r| r.reset_us)
                .max()
                .unwrap_or(0)
                .min(RECEIPT_TTL_US);
            lock(&self.inner.receipts).insert(call_id, now.saturating_add(ttl), receipts, now);
        }
        Ok(verdict)
    }

    /// [`Store::forget`] without a future: drops the receipts of the call taken under
    /// `call_id`, giving nothing back (the call stays counted).
    pub fn forget_now(&self, call_id: &str) {
        lock(&self.inner.receipts).by_call.remove(call_id);
    }

    /// How many calls hold receipts now (calls taken with [`Store::take`] and not yet refunded
    /// or forgotten, expired ones included until a sweep). For tests and diagnostics.
    pub fn receipts_held(&self) -> usize {
        lock(&self.inner.receipts).by_call.len()
    }

    /// [`Store::refund`] without a future: gives back what the call taken under `call_id`
    /// still holds of its first `checks.len()` limits, at most once (the receipts are removed).
    pub fn refund_now(&self, checks: &[Check<'_>], call_id: &str) {
        let Some((expires, receipts)) = lock(&self.inner.receipts).by_call.remove(call_id) else {
            return;
        };
        let now = self.inner.now();
        if now >= expires {
            return;
        }
        for (check, receipt) in checks.iter().zip(&receipts) {
            self.inner.refund_one(check, receipt, now);
        }
    }

    /// [`Store::peek`] without a future: the state of each limit now, taking nothing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, Check, MemoryStore, Policy};
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

    /// [`Store::reset`] without a future: forgets the state of `keys` and any block on them.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, Check, MemoryStore, Policy};
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
            let mut shard = write(&self.inner.shards[Inner::shard_of(hash)]);
            shard.map.remove(hash, key);
        }
        let mut blocks = write(&self.inner.blocks);
        for key in keys {
            blocks.remove(*key);
        }
        self.inner.blocks_len.store(blocks.len(), Ordering::Release);
    }

    /// [`Store::block`] without a future: every call under `keys` is rejected for
    /// `duration` from now (on the store's clock; whole milliseconds, at least one, to the
    /// millisecond after, as Redis expires the block).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, Check, MemoryStore, Policy};
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
        let now = self.inner.now();
        // As Redis expires the block's marker (`SET … PX ms`): it lives through the
        // millisecond `now_ms + ms` and is gone from the next one, so both stores answer the
        // same wait.
        let ms = u64::try_from(duration.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let until = (now / 1000)
            .saturating_add(ms)
            .saturating_add(1)
            .saturating_mul(1000);
        let mut blocks = write(&self.inner.blocks);
        blocks.retain(|_, end| *end > now);
        for key in keys {
            blocks.insert((*key).into(), until);
        }
        let latest = blocks.values().copied().max().unwrap_or(0);
        self.inner.blocks_until.store(latest, Ordering::Release);
        self.inner.blocks_len.store(blocks.len(), Ordering::Release);
    }

    /// Starts the janitor when none is running and this runs inside a tokio runtime.
    #[inline]
    fn start_janitor(&self) {
        if !self.inner.janitor_running.load(Ordering::Acquire) {
            self.start_janitor_now();
        }
    }

    /// [`MemoryStore::start_janitor`] once it found none running (out of line: the check it
    /// makes on every call stays one load).
    #[cold]
    fn start_janitor_now(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.inner.janitor_running.swap(true, Ordering::AcqRel) {
            return;
        }
        let running = JanitorRunning(Arc::downgrade(&self.inner));
        let handle = runtime.spawn(janitor(running)).abort_handle();
        if let Some(old) = lock(&self.janitor).replace(handle) {
            old.abort();
        }
    }
}

impl Store for MemoryStore {
    fn check<'a>(&'a self, checks: &'a [Check<'a>]) -> StoreFuture<'a> {
        Box::pin(async move { self.check_now(checks) })
    }

    fn take<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> StoreFuture<'a> {
        Box::pin(async move { self.take_now(checks, call_id) })
    }

    fn refund<'a>(&'a self, checks: &'a [Check<'a>], call_id: &'a str) -> RefundFuture<'a> {
        Box::pin(async move {
            self.refund_now(checks, call_id);
            Ok(())
        })
    }

    fn forget<'a>(&'a self, _checks: &'a [Check<'a>], call_id: &'a str) -> RefundFuture<'a> {
        Box::pin(async move {
            self.forget_now(call_id);
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

    fn reset<'a>(&'a self, keys: &'a [&'a str]) -> AdminFuture<'a> {
        Box::pin(async move {
            self.reset_now(keys);
            Ok(())
        })
    }

    fn block<'a>(&'a self, keys: &'a [&'a str], duration: Duration) -> AdminFuture<'a> {
        Box::pin(async move {
            self.block_now(keys, duration);
            Ok(())
        })
    }
}

/// The decision of a blocked limit: rejected, nothing left, until the block's end (`left_us`).
fn blocked_decision(capacity: u64, reset_us: u64, left_us: u64) -> Decision {
    Decision::new(
        false,
        capacity,
        0,
        Duration::from_micros(reset_us.max(left_us)),
        Duration::from_micros(left_us),
    )
}

/// The janitor's hold on the store: weak, and it clears the store's "janitor running" flag
/// when the task ends or is dropped (by an abort or by its runtime shutting down).
struct JanitorRunning(Weak<Inner>);

impl Drop for JanitorRunning {
    fn drop(&mut self) {
        if let Some(inner) = self.0.upgrade() {
            inner.janitor_running.store(false, Ordering::Release);
        }
    }
}

/// Sweeps every shard each interval, one shard's lock at a time, until the store is dropped.
async fn janitor(running: JanitorRunning) {
    let store = &running.0;
    loop {
        let Some(interval) = store.upgrade().map(|s| s.sweep_interval()) else {
            return;
        };
        tokio::time::sleep(interval).await;
        for i in 0..SHARDS {
            let Some(inner) = store.upgrade() else {
                return;
            };
            let now = inner.now();
            write(&inner.shards[i]).sweep(now);
            drop(inner);
            tokio::task::yield_now().await;
        }
    }
}

/// The hash of the store's keys: foldhash (hashbrown's default hasher, a few times cheaper
/// than std's `SipHash` on a key of 50 bytes, which was a third of a check's instructions), with
/// secrets drawn from std's `RandomState` (the OS's randomness): one for the process and one for
/// each store. Keys are caller values (IPs, header values); the secrets keep a caller from
/// choosing keys that collide, which is what `SipHash` guarded against.
fn key_hasher() -> foldhash::fast::SeedableRandomState {
    use std::hash::RandomState;
    use std::sync::LazyLock;
    static SHARED: LazyLock<foldhash::SharedSeed> =
        LazyLock::new(|| foldhash::SharedSeed::from_u64(RandomState::new().hash_one(0_u8)));
    foldhash::fast::SeedableRandomState::with_seed(RandomState::new().hash_one(1_u8), &SHARED)
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
        // `as_micros` saturated to u64, without its u128 arithmetic.
        let t = self.clock.now();
        t.as_secs()
            .saturating_mul(1_000_000)
            .saturating_add(u64::from(t.subsec_micros()))
    }

    fn sweep_interval(&self) -> Duration {
        Duration::from_nanos(self.sweep_interval_ns.load(Ordering::Relaxed))
    }

    /// The key's hash, computed once per check: it picks the shard and the slot in its map.
    fn hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The shard of a key's hash. From bits 32 and up: the map inside the shard indexes by the
    /// low bits and tags by the top seven, which must stay spread within one shard.
    fn shard_of(hash: u64) -> usize {
        // SHARDS is a power of two far below u32::MAX: the remainder always fits.
        usize::try_from((hash >> 32) % SHARDS as u64).unwrap_or(0)
    }

    /// The state of each limit of `checks` at `now`, taking nothing (blocks included).
    fn peek(&self, checks: &[Check<'_>], now: u64) -> Verdict {
        let decisions = checks
            .iter()
            .map(|c| {
                let p = Params::of(c.policy);
                let capacity = c.policy.capacity();
                let hash = self.hash(c.key);
                let shard = read(&self.shards[Self::shard_of(hash)]);
                let mut entry = shard.map.get(hash, c.key).map(Cell::snapshot);
                drop(shard);
                // Read on a copy: a restamp (a clock that went backwards) is not written.
                if let Some(e) = &mut entry {
                    e.normalize(&p, now);
                }
                let base = entry.as_ref().filter(|e| e.live(now)).map(|e| &e.state);
                let (e, _) = algorithm::evaluate(c.policy.algorithm(), base, &p, now);
                match self.block_left(c.key, now) {
                    Some(left) => blocked_decision(capacity, e.now_reset_us, left),
                    None => e.untaken(capacity, e.admitted, e.retry_us),
                }
            })
            .collect();
        Verdict::new(decisions)
    }

    /// µs left of a block on `key`, if one holds at `now`.
    fn block_left(&self, key: &str, now: u64) -> Option<u64> {
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
    fn blocked(&self, checks: &[Check<'_>]) -> Option<Verdict> {
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

    fn max_per_shard(&self) -> usize {
        self.max_per_shard.load(Ordering::Relaxed)
    }

    /// The error of a call whose new key found its shard full of live entries.
    fn full(&self) -> StoreError {
        StoreError::Full {
            max_keys: self.max_per_shard().saturating_mul(SHARDS),
        }
    }

    /// One limit: one shard, no allocation but a new key's. A key already held in a packed
    /// form takes the fast path ([`Inner::check_packed`], the shard's read lock); a new key, a
    /// sliding log or a key changing algorithm, the shard's write lock.
    fn check_one(&self, check: &Check<'_>) -> Result<Decision, StoreError> {
        let p = Params::of(check.policy);
        let algorithm = check.policy.algorithm();
        let capacity = check.policy.capacity();
        let hash = self.hash(check.key);
        let shard = &self.shards[Self::shard_of(hash)];
        if self.fast.load(Ordering::Relaxed)
            && let Some(form) = Packed::of(algorithm)
        {
            let guard = read(shard);
            if let Some(cell) = guard.map.get(hash, check.key)
                && matches!(cell.form, Form::Packed(f) if f == form)
            {
                return Ok(self.check_packed(&guard, cell, form, algorithm, &p, capacity));
            }
        }
        let mut guard = write(shard);
        let shard = &mut *guard;
        let now = self.now();
        // One lookup for a known key: evaluate and write through the same reference.
        if let Some(cell) = shard.map.get_mut(hash, check.key) {
            // A restamped entry can go idle sooner: the shard's sweep mark follows it.
            if cell.normalize(&p, now) {
                lower(&shard.next_idle, cell.idle_at());
            }
            let state = cell.state();
            let base = cell.live(now).then_some(&*state);
            let (e, next) = algorithm::evaluate(algorithm, base, &p, now);
            drop(state);
            return Ok(match next {
                Some(state) => {
                    let entry = Entry::new(state, &p);
                    lower(&shard.next_idle, entry.idle_at);
                    cell.set(entry);
                    e.taken(capacity)
                }
                None => e.untaken(capacity, false, e.retry_us),
            });
        }
        let (e, next) = algorithm::evaluate(algorithm, None, &p, now);
        match next {
            Some(state) => {
                if !shard.make_room(now, self.max_per_shard(), |_| 1) {
                    return Err(self.full());
                }
                shard.insert(hash, check.key, Entry::new(state, &p));
                Ok(e.taken(capacity))
            }
            // A rejection writes nothing, so it needs no room.
            None => Ok(e.untaken(capacity, false, e.retry_us)),
        }
    }

    /// The fast path of one limit on a held, packed key, under the shard's read lock: the same
    /// rule ([`algorithm::evaluate`], after [`algorithm::normalize`]) on a consistent read of
    /// the cell, written back by a compare-and-swap of its sequence (see [`Cell`]); a write that
    /// loses the race evaluates again on the state that won, at a fresh time.
    fn check_packed(
        &self,
        shard: &Shard,
        cell: &Cell,
        form: Packed,
        algorithm: Algorithm,
        p: &Params,
        capacity: u64,
    ) -> Decision {
        let mut spins = 0;
        loop {
            let seq = cell.seq.load(Ordering::Acquire);
            if seq & 1 == 1 {
                backoff(&mut spins);
                continue;
            }
            // The time is read after the state's `seq`: it is no earlier than the time of the
            // write that left the state (that write's clock read happened before its `seq`).
            let now = self.now();
            let (idle_at, words) = cell.load_words();
            if !cell.unchanged_since(seq) {
                continue;
            }
            let mut entry = Entry {
                idle_at,
                state: form.unpack(words),
            };
            let normalized = entry.normalize(p, now);
            let base = entry.live(now).then_some(&entry.state);
            let (e, next) = algorithm::evaluate(algorithm, base, p, now);
            let (decision, write) = match next {
                Some(state) => (e.taken(capacity), Some(Entry::new(state, p))),
                None => (
                    e.untaken(capacity, false, e.retry_us),
                    normalized.then_some(entry),
                ),
            };
            let Some(write) = write else {
                return decision;
            };
            // `evaluate` of an algorithm leaves that algorithm's state: the same form.
            let Some((written, words)) = Packed::pack(&write.state) else {
                unreachable!("a packed algorithm left an unpacked state")
            };
            debug_assert_eq!(written, form);
            if !cell.claim(seq) {
                continue;
            }
            cell.publish(seq, write.idle_at, words);
            shard.note_idle(write.idle_at);
            return decision;
        }
    }

    /// Gives back what one limit of a call still holds, by its receipt: the rule is
    /// [`algorithm::refund`] (the scripts' `refund`).
    fn refund_one(&self, check: &Check<'_>, receipt: &Receipt, now: u64) {
        let p = Params::of(check.policy);
        let hash = self.hash(check.key);
        let mut guard = write(&self.shards[Self::shard_of(hash)]);
        let shard = &mut *guard;
        let Some(cell) = shard.map.get_mut(hash, check.key) else {
            return;
        };
        if !cell.live(now) {
            return;
        }
        let entry = match algorithm::refund(Some(cell.state().into_owned()), receipt, &p, now) {
            Some(state) => Entry::new(state, &p),
            // The call opened the state and nothing else is in it: as if never taken (idle
            // now, swept with the others).
            None => Entry {
                idle_at: now,
                state: cell.state().into_owned(),
            },
        };
        let idle_at = entry.idle_at;
        cell.set(entry);
        shard.note_idle(idle_at);
    }

    /// Several limits as one call: lock their shards in ascending order, apply the limits one
    /// after the other (a key named twice sees what the call's earlier limits took), and write
    /// only if all admit and every new key fits. With `receipts`, an admitted call's receipt
    /// per limit is pushed there (for [`MemoryStore::take_now`]).
    fn check_many(
        &self,
        checks: &[Check<'_>],
        receipts: Option<&mut Vec<Receipt>>,
    ) -> Result<Vec<Decision>, StoreError> {
        let params: Vec<Params> = checks.iter().map(|c| Params::of(c.policy)).collect();
        // Distinct keys ("slots"), each with its shard and what this call would write to it.
        let mut slots: Vec<Slot<'_>> = Vec::with_capacity(checks.len());
        let mut slot_of = Vec::with_capacity(checks.len());
        for (n, c) in checks.iter().enumerate() {
            let i = if let Some(i) = slots.iter().position(|s| s.key == c.key) {
                slots[i].last = n;
                i
            } else {
                let hash = self.hash(c.key);
                slots.push(Slot {
                    key: c.key,
                    hash,
                    shard: Self::shard_of(hash),
                    pending: None,
                    last: n,
                });
                slots.len() - 1
            };
            slot_of.push(i);
        }
        let mut order: Vec<usize> = slots.iter().map(|s| s.shard).collect();
        order.sort_unstable();
        order.dedup();
        // Write locks: no fast write (read lock) runs in these shards while the call holds them.
        let mut guards: Vec<RwLockWriteGuard<'_, Shard>> =
            order.iter().map(|&i| write(&self.shards[i])).collect();
        let guard_of = |shard: usize| order.binary_search(&shard).unwrap_or(0);
        let now = self.now();
        for slot in &slots {
            guards[guard_of(slot.shard)].normalize(slot.hash, slot.key, &params[slot.last], now);
        }

        // Evaluate every limit in order, each on the state the call's earlier limits left.
        let mut outcomes: Vec<Evaluation> = Vec::with_capacity(checks.len());
        let mut firsts: Vec<u64> = Vec::new();
        for ((c, p), &s) in checks.iter().zip(&params).zip(&slot_of) {
            let slot = &mut slots[s];
            let held = match &slot.pending {
                Some(_) => None,
                None => guards[guard_of(slot.shard)].base(slot.hash, c.key, now),
            };
            let base = slot.pending.as_ref().or(held.as_deref());
            let (e, next) = algorithm::evaluate(c.policy.algorithm(), base, p, now);
            drop(held);
            if receipts.is_some() {
                firsts.push(sliding_first(next.as_ref(), p));
            }
            if next.is_some() {
                slot.pending = next;
            }
            outcomes.push(e);
        }

        if outcomes.iter().all(|e| e.admitted) {
            // Room for every new key first, in every shard: all of the call is written or
            // none of it. Making room only sweeps idle entries, which changes no answer.
            let max = self.max_per_shard();
            for (&shard, guard) in order.iter().zip(guards.iter_mut()) {
                let new_keys = |map: &Map| {
                    slots
                        .iter()
                        .filter(|s| s.shard == shard && s.pending.is_some())
                        .filter(|s| map.get(s.hash, s.key).is_none())
                        .count()
                };
                if !guard.make_room(now, max, new_keys) {
                    return Err(self.full());
                }
            }
            for slot in &mut slots {
                if let Some(state) = slot.pending.take() {
                    let entry = Entry::new(state, &params[slot.last]);
                    guards[guard_of(slot.shard)].commit(slot.hash, slot.key, entry);
                }
            }
            if let Some(receipts) = receipts {
                receipts.extend(outcomes.iter().zip(&firsts).map(|(e, &first)| Receipt {
                    at_us: now,
                    reset_us: e.after_reset_us,
                    first,
                }));
            }
            Ok(checks
                .iter()
                .zip(&outcomes)
                .map(|(c, e)| e.taken(c.policy.capacity()))
                .collect())
        } else {
            // Nothing is written: every decision reports the state as it is now, with what this
            // limit's own evaluation in the call found.
            Ok(checks
                .iter()
                .zip(&params)
                .zip(&slot_of)
                .zip(&outcomes)
                .map(|(((c, p), &s), o)| {
                    let slot = &slots[s];
                    let base = guards[guard_of(slot.shard)].base(slot.hash, c.key, now);
                    let (now_e, _) =
                        algorithm::evaluate(c.policy.algorithm(), base.as_deref(), p, now);
                    now_e.untaken(c.policy.capacity(), o.admitted, o.retry_us)
                })
                .collect())
        }
    }
}

/// The sliding log's first score of the call that left `next` (what its refund removes); 0
/// for the other algorithms.
fn sliding_first(next: Option<&State>, p: &Params) -> u64 {
    match next {
        Some(State::Sliding(log)) => log.runs.back().map_or(0, |&(start, len)| {
            u64::try_from(start)
                .unwrap_or(0)
                .saturating_add(len)
                .saturating_sub(p.cost)
        }),
        _ => 0,
    }
}

/// A distinct key of one call and what the call would write to it.
struct Slot<'k> {
    key: &'k str,
    hash: u64,
    shard: usize,
    /// The state the call's limits so far would leave (`None`: untouched).
    pending: Option<State>,
    /// The last check of the call on this key (its policy is the one written).
    last: usize,
}

/// A shard's lock on cache lines of its own (128 bytes: the pair the CPU's adjacent-line
/// prefetcher moves together), so that threads on different shards never write each other's
/// lines (each read lock writes its shard's lock word).
#[repr(align(128))]
struct Padded(RwLock<Shard>);

impl std::ops::Deref for Padded {
    type Target = RwLock<Shard>;

    fn deref(&self) -> &RwLock<Shard> {
        &self.0
    }
}

/// One shard: its entries and its amortised-sweep bookkeeping.
#[derive(Default)]
struct Shard {
    map: Map,
    inserts_since_sweep: usize,
    /// Entries left by the last sweep: the next one comes after as many inserts.
    len_after_sweep: usize,
    /// No entry becomes idle before this instant (a lower bound): sweeping earlier is a no-op,
    /// so an idle janitor or a shard full of live entries costs nothing to sweep. Atomic: a
    /// fast write (under the read lock) lowers it too.
    next_idle: AtomicU64,
}

impl Shard {
    /// The live state under `key`, if any (under the write lock).
    fn base(&self, hash: u64, key: &str, now: u64) -> Option<Cow<'_, State>> {
        self.map
            .get(hash, key)
            .filter(|c| c.live(now))
            .map(Cell::state)
    }

    /// Rewrites the entry under `key` if it was stamped in the future ([`Entry::normalize`]).
    fn normalize(&mut self, hash: u64, key: &str, p: &Params, now: u64) {
        if let Some(cell) = self.map.get_mut(hash, key)
            && cell.normalize(p, now)
        {
            let idle_at = cell.idle_at();
            self.note_idle(idle_at);
        }
    }

    /// Lowers the sweep mark to `idle_at` (an entry that becomes idle then was written).
    fn note_idle(&self, idle_at: u64) {
        lower(&self.next_idle, idle_at);
    }

    /// Removes idle entries; returns how many.
    fn sweep(&mut self, now: u64) -> usize {
        self.inserts_since_sweep = 0;
        if now < *self.next_idle.get_mut() {
            self.len_after_sweep = self.map.len();
            return 0;
        }
        let before = self.map.len();
        let mut next_idle = u64::MAX;
        self.map.retain(|_, c| {
            let idle_at = c.idle_at();
            let live = now < idle_at;
            if live {
                next_idle = next_idle.min(idle_at);
            }
            live
        });
        *self.next_idle.get_mut() = next_idle;
        let len = self.map.len();
        self.len_after_sweep = len;
        if self.map.capacity() > 1024 && len < self.map.capacity() / 4 {
            self.map.shrink_to(len * 2);
        }
        before - len
    }

    /// Writes the entry an admitted call leaves under `key` (whose hash is `hash`). A key not
    /// held yet needs room made first ([`Shard::make_room`]).
    fn commit(&mut self, hash: u64, key: &str, entry: Entry) {
        self.note_idle(entry.idle_at);
        match self.map.get_mut(hash, key) {
            Some(held) => held.set(entry),
            None => self.map.insert(hash, key, entry),
        }
    }

    /// Adds a key that is not held yet, in room made by [`Shard::make_room`].
    fn insert(&mut self, hash: u64, key: &str, entry: Entry) {
        self.note_idle(entry.idle_at);
        self.map.insert(hash, key, entry);
    }

    /// Before adding the keys `new_keys` counts (in the map as it is when called): sweeps when
    /// enough inserts went by or when they would not fit, and tells whether they fit within
    /// `max` entries. Only idle entries are ever removed, never a live one: a shard full of
    /// live entries answers `false` and stays as it was.
    ///
    /// `new_keys` is counted again after a sweep, which may have removed idle entries of the
    /// same call's keys (they then need a slot, in the room their removal made).
    fn make_room(&mut self, now: u64, max: usize, new_keys: impl Fn(&Map) -> usize) -> bool {
        let n = new_keys(&self.map);
        if n == 0 {
            return true;
        }
        self.inserts_since_sweep = self.inserts_since_sweep.saturating_add(n);
        let due = self.inserts_since_sweep >= MIN_INSERTS_PER_SWEEP.max(self.len_after_sweep);
        if !due && self.map.len().saturating_add(n) <= max {
            return true;
        }
        // Costs nothing while no entry can be idle yet (`next_idle`), so a flood of new keys
        // against a full shard does not scan it on every call.
        self.sweep(now);
        self.map.len().saturating_add(new_keys(&self.map)) <= max
    }
}

/// A shard's entries by key, each stored with its key's hash: a check hashes its key once
/// (for the shard and the slot alike), and growing the table rehashes nothing.
#[derive(Default)]
struct Map(HashTable<Held>);

struct Held {
    hash: u64,
    key: Box<str>,
    cell: Cell,
}

impl Map {
    fn get(&self, hash: u64, key: &str) -> Option<&Cell> {
        self.0.find(hash, |h| &*h.key == key).map(|h| &h.cell)
    }

    fn get_mut(&mut self, hash: u64, key: &str) -> Option<&mut Cell> {
        self.0
            .find_mut(hash, |h| &*h.key == key)
            .map(|h| &mut h.cell)
    }

    /// Adds a key the map does not hold.
    fn insert(&mut self, hash: u64, key: &str, entry: Entry) {
        self.0.insert_unique(
            hash,
            Held {
                hash,
                key: key.into(),
                cell: Cell::new(entry),
            },
            |h| h.hash,
        );
    }

    fn remove(&mut self, hash: u64, key: &str) {
        if let Ok(found) = self.0.find_entry(hash, |h| &*h.key == key) {
            found.remove();
        }
    }

    fn retain(&mut self, mut keep: impl FnMut(&str, &Cell) -> bool) {
        self.0.retain(|h| keep(&h.key, &h.cell));
    }

    #[cfg(test)]
    fn iter(&self) -> impl Iterator<Item = (&str, &Cell)> {
        self.0.iter().map(|h| (&*h.key, &h.cell))
    }

    fn values(&self) -> impl Iterator<Item = &Cell> {
        self.0.iter().map(|h| &h.cell)
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn capacity(&self) -> usize {
        self.0.capacity()
    }

    fn shrink_to(&mut self, min_capacity: usize) {
        self.0.shrink_to(min_capacity, |h| h.hash);
    }
}

/// One key's state and when it becomes idle (equal to no state at all), in µs: what the rules
/// read and write. A [`Cell`] holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    idle_at: u64,
    state: State,
}

impl Entry {
    fn new(state: State, p: &Params) -> Self {
        Self {
            idle_at: algorithm::idle_at(&state, p),
            state,
        }
    }

    fn live(&self, now: u64) -> bool {
        now < self.idle_at
    }

    /// State stamped in the future — by a [`Clock`] that went backwards — is treated as
    /// stamped now ([`algorithm::normalize`]), as the Redis scripts treat state written by a
    /// master whose clock was ahead. A monotonic clock never changes anything here.
    /// `true` when it changed (and so did `idle_at`).
    fn normalize(&mut self, p: &Params, now: u64) -> bool {
        let changed = self.live(now) && algorithm::normalize(&mut self.state, p, now);
        if changed {
            self.idle_at = algorithm::idle_at(&self.state, p);
        }
        changed
    }
}

/// The states whose numbers fit in a [`Cell`]'s three words: every algorithm's but the sliding
/// log's. Their one-limit checks take the fast path ([`Inner::check_packed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Packed {
    Fixed,
    Bucket,
    Gcra,
    Counter,
}

impl Packed {
    /// The packed form of `algorithm`'s state, if it has one.
    fn of(algorithm: Algorithm) -> Option<Self> {
        match algorithm {
            Algorithm::Fixed => Some(Self::Fixed),
            Algorithm::Leaky | Algorithm::Token => Some(Self::Bucket),
            Algorithm::Gcra => Some(Self::Gcra),
            Algorithm::SlidingCounter => Some(Self::Counter),
            // `Algorithm` is non-exhaustive within the crate too: a new one starts unpacked.
            _ => None,
        }
    }

    /// `state`'s form and numbers, if it packs.
    fn pack(state: &State) -> Option<(Self, [u64; 3])> {
        Some(match state {
            State::Fixed(w) => (Self::Fixed, [w.count, w.expires_ms, 0]),
            State::Bucket(b) => (Self::Bucket, [b.level, b.at, 0]),
            State::Gcra(t) => (Self::Gcra, [t.0, 0, 0]),
            State::SlidingCounter(c) => (Self::Counter, [c.window, c.cur, c.prev]),
            State::Sliding(_) => return None,
        })
    }

    /// The state of these numbers (the inverse of [`Packed::pack`]).
    fn unpack(self, w: [u64; 3]) -> State {
        match self {
            Self::Fixed => State::Fixed(algorithm::fixed::Window {
                count: w[0],
                expires_ms: w[1],
            }),
            Self::Bucket => State::Bucket(algorithm::bucket::Level {
                level: w[0],
                at: w[1],
            }),
            Self::Gcra => State::Gcra(algorithm::gcra::Tat(w[0])),
            Self::Counter => State::SlidingCounter(algorithm::sliding_counter::Counters {
                window: w[0],
                cur: w[1],
                prev: w[2],
            }),
        }
    }
}

/// How a [`Cell`] holds its state.
enum Form {
    /// In the cell's words ([`Packed`]).
    Packed(Packed),
    /// Beside them (the sliding log); changed only under the shard's write lock.
    Other(Box<State>),
}

/// Where an [`Entry`] lives, so that one-limit checks can update it under the shard's *read*
/// lock, as governor's keyed limiter does: a sequence lock over atomic words.
///
/// * `seq` is even while the words are stable and odd while a writer stores them. A writer
///   holds the shard's read lock, reads the words (after an even `seq`), evaluates, and claims
///   the cell by a compare-and-swap of `seq` from the value it read to the next odd one: it
///   succeeds only when no other write happened since its read, so every write is computed on
///   the state it replaces (a lost race evaluates again on the new state). It then stores the
///   words and makes `seq` even again.
/// * A reader that writes nothing (a rejection) checks that `seq` did not move during its
///   read: its answer is that of a consistent state.
/// * Everything else — stacked checks, takes, refunds, new keys, sweeps, a key changing
///   algorithm — holds the shard's *write* lock, which no fast writer holds a read lock
///   against: it reads and writes the cells through `&mut`, with every fast write either done
///   before it or begun after it. That is how a stacked check stays all or nothing against
///   the same entries.
struct Cell {
    seq: AtomicU64,
    idle_at: AtomicU64,
    words: [AtomicU64; 3],
    form: Form,
}

impl Cell {
    fn new(entry: Entry) -> Self {
        let mut cell = Self {
            seq: AtomicU64::new(0),
            idle_at: AtomicU64::new(0),
            words: Default::default(),
            form: Form::Packed(Packed::Fixed),
        };
        cell.set(entry);
        cell
    }

    fn idle_at(&self) -> u64 {
        self.idle_at.load(Ordering::Acquire)
    }

    fn live(&self, now: u64) -> bool {
        now < self.idle_at()
    }

    /// Replaces the entry (exclusive access: no fast writer is running).
    fn set(&mut self, entry: Entry) {
        *self.idle_at.get_mut() = entry.idle_at;
        if let Some((form, words)) = Packed::pack(&entry.state) {
            for (w, v) in self.words.iter_mut().zip(words) {
                *w.get_mut() = v;
            }
            self.form = Form::Packed(form);
        } else if let Form::Other(held) = &mut self.form {
            **held = entry.state;
        } else {
            self.form = Form::Other(Box::new(entry.state));
        }
    }

    /// [`Entry::normalize`] in place, with exclusive access; `true` when it changed.
    fn normalize(&mut self, p: &Params, now: u64) -> bool {
        match &mut self.form {
            Form::Other(state) => {
                let idle_at = self.idle_at.get_mut();
                let changed = now < *idle_at && algorithm::normalize(state, p, now);
                if changed {
                    *idle_at = algorithm::idle_at(state, p);
                }
                changed
            }
            Form::Packed(_) => {
                let mut entry = Entry {
                    idle_at: self.idle_at(),
                    state: self.state().into_owned(),
                };
                let changed = entry.normalize(p, now);
                if changed {
                    self.set(entry);
                }
                changed
            }
        }
    }

    /// The state held, with exclusive access (the shard's write lock): borrowed when it is
    /// not packed.
    fn state(&self) -> Cow<'_, State> {
        match &self.form {
            Form::Packed(form) => Cow::Owned(form.unpack(self.words.each_ref().map(|w| {
                // Exclusive access: no writer can be storing.
                w.load(Ordering::Relaxed)
            }))),
            Form::Other(state) => Cow::Borrowed(state),
        }
    }

    /// A copy of the entry, consistent even while fast writers run (under a read lock).
    fn snapshot(&self) -> Entry {
        match &self.form {
            Form::Packed(form) => {
                let (idle_at, words) = self.read_packed();
                Entry {
                    idle_at,
                    state: form.unpack(words),
                }
            }
            Form::Other(state) => Entry {
                idle_at: self.idle_at(),
                state: (**state).clone(),
            },
        }
    }

    /// The packed numbers: a read that waits out any write under way.
    fn read_packed(&self) -> (u64, [u64; 3]) {
        let mut spins = 0;
        loop {
            let seq = self.seq.load(Ordering::Acquire);
            if seq & 1 == 0 {
                let read = self.load_words();
                if self.unchanged_since(seq) {
                    return read;
                }
            }
            backoff(&mut spins);
        }
    }

    /// `idle_at` and the words, as they are (checked by [`Cell::unchanged_since`]).
    fn load_words(&self) -> (u64, [u64; 3]) {
        (
            self.idle_at.load(Ordering::Relaxed),
            self.words.each_ref().map(|w| w.load(Ordering::Relaxed)),
        )
    }

    /// Whether no write began since `seq` was read (the loads before it saw one state).
    fn unchanged_since(&self, seq: u64) -> bool {
        fence(Ordering::Acquire);
        self.seq.load(Ordering::Relaxed) == seq
    }

    /// Claims the cell for a write, if it is still at `seq` (even); then [`Cell::publish`].
    fn claim(&self, seq: u64) -> bool {
        let claimed = self
            .seq
            .compare_exchange(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed)
            .is_ok();
        if claimed {
            // The words' stores below come after the odd `seq` for any reader that sees them.
            fence(Ordering::Release);
        }
        claimed
    }

    /// Stores a claimed cell's new entry (same packed form) and releases it.
    fn publish(&self, seq: u64, idle_at: u64, words: [u64; 3]) {
        self.idle_at.store(idle_at, Ordering::Relaxed);
        for (w, v) in self.words.iter().zip(words) {
            w.store(v, Ordering::Relaxed);
        }
        self.seq.store(seq + 2, Ordering::Release);
    }
}

/// Lowers a shard's sweep mark to `idle_at`: a load, and a write only when it moves.
fn lower(next_idle: &AtomicU64, idle_at: u64) {
    if idle_at < next_idle.load(Ordering::Relaxed) {
        next_idle.fetch_min(idle_at, Ordering::Relaxed);
    }
}

/// Waits a little for a write under way to finish: spins, then yields (the writer may have
/// been preempted between its few stores).
fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 32 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Algorithm, Policy};

    const MS: Duration = Duration::from_millis(1);
    const HOUR: Duration = Duration::from_secs(3600);

    fn policy(algo: Algorithm, limit: u64, period: Duration, burst: u64) -> Policy {
        Policy::new(algo, limit, period)
            .and_then(|p| p.with_burst(burst))
            .unwrap()
    }

    fn one(store: &MemoryStore, key: &str, p: &Policy) -> Decision {
        store.check_now(&[Check::new(key, p)]).unwrap().decisions()[0]
    }

    fn entry(store: &MemoryStore, key: &str) -> Option<Entry> {
        let hash = store.inner.hash(key);
        let shard = read(&store.inner.shards[Inner::shard_of(hash)]);
        shard.map.get(hash, key).map(Cell::snapshot)
    }

    fn snapshot(store: &MemoryStore) -> Vec<(Box<str>, Entry)> {
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

    /// 3 units per 10 ms is 3,333.3 µs per unit: the integer state neither loses nor gains a
    /// unit, however the time is cut.
    #[test]
    fn fractional_rates_stay_exact() {
        let us = Duration::from_micros;
        for algo in [Algorithm::Token, Algorithm::Leaky] {
            let clock = ManualClock::new();
            let store = MemoryStore::with_clock(clock.clone());
            let p = policy(algo, 3, 10 * MS, 50);
            for left in (0..50).rev() {
                let d = one(&store, "k", &p);
                assert!(d.admitted, "{algo}");
                assert_eq!(d.remaining, left, "{algo}");
            }
            let d = one(&store, "k", &p);
            assert_eq!(d.retry_after, Some(us(3_334)), "{algo}");
            assert_eq!(d.reset_after, us(166_667), "{algo}");
            clock.advance(us(3_333));
            let d = one(&store, "k", &p);
            assert_eq!(d.retry_after, Some(us(1)), "{algo}");
            clock.advance(us(1));
            assert!(one(&store, "k", &p).admitted, "{algo}");
            assert!(!one(&store, "k", &p).admitted, "{algo}");
            // Uneven steps: the total admitted is exactly the burst plus what flowed.
            let mut seed = 0x2545_F491_4F6C_DD1D_u64;
            let mut elapsed: u64 = 0;
            let mut admitted: u64 = 0;
            for _ in 0..500 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let step = seed % 7_000;
                clock.advance(us(step));
                elapsed += step;
                while one(&store, "k", &p).admitted {
                    admitted += 1;
                }
            }
            // 3 units per 10_000 µs; the first unit above was taken at 3_334 µs.
            let flowed = (u128::from(elapsed) + 10_000 / 3 + 1) * 3 / 10_000 - 1;
            assert_eq!(u128::from(admitted), flowed, "{algo} after {elapsed} µs");
        }
    }

    /// Each entry becomes idle exactly when its state is back to none, and not a microsecond
    /// before.
    #[test]
    fn entries_become_idle_at_their_ttl() {
        let us = Duration::from_micros;
        let cases = [
            // fixed: the millisecond after the window's last
            (
                policy(Algorithm::Fixed, 5, 1000 * MS, 5),
                1,
                vec![0],
                1001 * MS,
            ),
            // sliding: newest + period
            (
                policy(Algorithm::Sliding, 5, 1000 * MS, 5),
                1,
                vec![0, 300],
                1300 * MS,
            ),
            // token: until full (3 units at 10/s)
            (
                policy(Algorithm::Token, 10, 1000 * MS, 10),
                3,
                vec![0],
                300 * MS,
            ),
            // leaky: until empty (3 units at 10/s)
            (
                policy(Algorithm::Leaky, 10, 1000 * MS, 10),
                3,
                vec![0],
                300 * MS,
            ),
            // leaky: 1 unit at 10 per ms drains in 0.1 ms
            (
                policy(Algorithm::Leaky, 10, MS, 10),
                1,
                vec![0],
                Duration::from_micros(100),
            ),
        ];
        for (p, cost, at_ms, ttl) in cases {
            let p = p.with_cost(cost).unwrap();
            let clock = ManualClock::new();
            let store = MemoryStore::with_clock(clock.clone());
            let mut now = Duration::ZERO;
            for t in at_ms {
                clock.advance((t * MS).saturating_sub(now));
                now = t * MS;
                assert!(one(&store, "k", &p).admitted);
            }
            clock.advance(ttl.saturating_sub(now).saturating_sub(us(1)));
            assert_eq!(store.len(), 1, "{p:?} idle too early");
            assert_eq!(store.sweep(), 0);
            clock.advance(us(1));
            assert_eq!(store.len(), 0, "{p:?} still live at its TTL");
            assert_eq!(store.held(), 1);
            assert_eq!(store.sweep(), 1);
            assert_eq!(store.held(), 0);
            assert!(store.is_empty());
        }
    }

    /// A shard skips sweeping until its earliest entry can be idle, and a write that becomes
    /// idle sooner than everything else moves that instant forward.
    #[test]
    fn sweeping_tracks_the_earliest_idle_entry() {
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(clock.clone());
        let long = policy(Algorithm::Fixed, 1, HOUR, 1);
        let short = policy(Algorithm::Token, 1000, MS, 1000);
        for i in 0..200 {
            assert!(one(&store, &format!("long{i}"), &long).admitted);
        }
        assert_eq!(store.sweep(), 0);
        for i in 0..200 {
            assert!(one(&store, &format!("short{i}"), &short).admitted);
        }
        clock.advance(MS);
        assert_eq!(store.len(), 200);
        assert_eq!(store.sweep(), 200, "the short entries are idle");
        assert_eq!(store.held(), 200);
        // Re-using an idle key that no sweep removed yet starts it fresh.
        let fixed = policy(Algorithm::Fixed, 2, MS, 2);
        assert_eq!(one(&store, "again", &fixed).remaining, 1);
        clock.advance(2 * MS);
        assert_eq!(one(&store, "again", &fixed).remaining, 1);
    }

    /// A sliding window keeps at most `limit` admitted units, however many calls are made, and
    /// one call of any cost is one run.
    #[test]
    fn sliding_entries_are_bounded_by_limit() {
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(clock.clone());
        let p = policy(Algorithm::Sliding, 5, 1000 * MS, 5);
        let runs = |store: &MemoryStore, key: &str| match entry(store, key) {
            Some(Entry {
                state: State::Sliding(log),
                ..
            }) => log.runs,
            other => panic!("no sliding entry: {other:?}"),
        };
        for _ in 0..10_000 {
            clock.advance(Duration::from_micros(37_123));
            let _ = one(&store, "k", &p);
            let runs = runs(&store, "k");
            let units: u64 = runs.iter().map(|r| r.1).sum();
            assert!(runs.len() <= 5 && units <= 5, "{runs:?}");
        }
        let p5 = policy(Algorithm::Sliding, 5, 1000 * MS, 5)
            .with_cost(5)
            .unwrap();
        assert!(one(&store, "other", &p5).admitted);
        assert_eq!(runs(&store, "other").len(), 1);
    }

    /// A stacked call that one limit rejects leaves every entry byte for byte as it was.
    #[test]
    fn refunds_give_back_what_the_take_held_once_and_only_while_the_receipt_lives() {
        let clock = ManualClock::new();
        clock.advance(MS);
        let store = MemoryStore::with_clock(clock.clone());
        for algo in Algorithm::ALL {
            let p = policy(algo, 2, Duration::from_secs(60), 2);
            let other = policy(algo, 3, Duration::from_secs(60), 3);
            let (a, b) = (format!("{algo}:a"), format!("{algo}:b"));
            let checks = [Check::new(&a, &p), Check::new(&b, &other)];
            let remaining = |store: &MemoryStore| {
                let now = store.inner.now();
                let held = entry(store, &a).filter(|e| e.live(now));
                let d = algorithm::evaluate(
                    algo,
                    held.as_ref().map(|e| &e.state),
                    &Params::of(&p),
                    now,
                )
                .0;
                d.now_remaining
            };
            assert!(store.take_now(&checks, "1").unwrap().is_admitted());
            assert_eq!(remaining(&store), 1, "{algo}");
            // The prefix only: limit `b` keeps its unit.
            store.refund_now(&checks[..1], "1");
            assert_eq!(remaining(&store), 2, "{algo}");
            store.refund_now(&checks[..1], "1");
            assert_eq!(remaining(&store), 2, "{algo}: never twice");
            let bv = store.check_now(&[Check::new(&b, &other)]).unwrap();
            assert_eq!(bv.decisions()[0].remaining, 1, "{algo}: b kept the take");
            // A receipt that expired (10 s at most) gives back nothing.
            assert!(store.take_now(&checks[..1], "2").unwrap().is_admitted());
            clock.advance(Duration::from_secs(11));
            store.refund_now(&checks[..1], "2");
            assert!(remaining(&store) < 2, "{algo}: stays counted");
            // An unknown call id gives back nothing.
            store.refund_now(&checks[..1], "3");
            assert!(remaining(&store) < 2, "{algo}");
        }
    }

    #[test]
    fn a_rejected_stacked_call_writes_nothing() {
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(clock.clone());
        let limits: Vec<(String, Policy)> = Algorithm::ALL
            .into_iter()
            .enumerate()
            .map(|(i, a)| (format!("k{i}"), policy(a, 10, 1000 * MS, 10)))
            .collect();
        let tight = policy(Algorithm::Fixed, 1, 1000 * MS, 1);
        let mut checks: Vec<Check<'_>> = limits.iter().map(|(k, p)| Check::new(k, p)).collect();
        checks.push(Check::new("tight", &tight));
        assert!(store.check_now(&checks).unwrap().is_admitted());
        clock.advance(50 * MS);
        let before = snapshot(&store);
        let v = store.check_now(&checks).unwrap();
        assert!(!v.is_admitted());
        assert_eq!(snapshot(&store), before);
        for d in &v.decisions()[..4] {
            assert!(d.admitted && d.remaining == 9, "{d:?}");
        }
    }

    /// One call naming a key twice applies both checks to it, in order.
    /// A clock that can be set back, as a user's wall clock can be.
    #[derive(Debug, Clone, Default)]
    struct SettableClock(Arc<AtomicU64>);

    impl Clock for SettableClock {
        fn now(&self) -> Duration {
            Duration::from_nanos(self.0.load(Ordering::SeqCst))
        }
    }

    impl SettableClock {
        fn set(&self, at: Duration) {
            self.0
                .store(u64::try_from(at.as_nanos()).unwrap(), Ordering::SeqCst);
        }
    }

    /// Issue 10, point 5: after the clock goes back a minute, state stamped in the future is
    /// treated as stamped now. Before, buckets stayed empty and logs stayed full for the whole
    /// skew while answering a `retry_after` of one period or less.
    #[test]
    fn state_stamped_in_the_future_is_treated_as_stamped_now() {
        let secs = Duration::from_secs;
        for algo in Algorithm::ALL {
            for stacked in [false, true] {
                let clock = SettableClock::default();
                let store = MemoryStore::with_clock(clock.clone());
                let p = policy(algo, 2, secs(10), 2);
                let other = policy(Algorithm::Fixed, 1000, HOUR, 1000);
                let check = |store: &MemoryStore| {
                    let mut checks = vec![Check::new("k", &p)];
                    if stacked {
                        checks.push(Check::new("other", &other));
                    }
                    store.check_now(&checks).unwrap().decisions()[0]
                };
                clock.set(secs(100));
                assert!(check(&store).admitted && check(&store).admitted, "{algo}");
                assert!(!check(&store).admitted, "{algo}");
                clock.set(secs(40));
                let d = check(&store);
                assert!(!d.admitted, "{algo} (stacked: {stacked})");
                let retry = d.retry_after.unwrap();
                // A fixed window is gone the millisecond after its key's expiry (as in Redis); a
                // sliding counter's window weighs on through the next one.
                let most = if algo == Algorithm::SlidingCounter {
                    secs(20)
                } else {
                    secs(10) + Duration::from_millis(1)
                };
                assert!(retry <= most, "{algo} (stacked: {stacked}): {retry:?}");
                clock.set(secs(40) + retry);
                let d = check(&store);
                assert!(
                    d.admitted,
                    "{algo} (stacked: {stacked}): locked out past retry_after: {d:?}"
                );
            }
        }
    }

    #[test]
    fn the_same_key_twice_in_one_call_applies_in_order() {
        for algo in Algorithm::ALL {
            let store = MemoryStore::with_clock(ManualClock::new());
            let p = policy(algo, 3, 1000 * MS, 3);
            let twice = [Check::new("k", &p), Check::new("k", &p)];
            let v = store.check_now(&twice).unwrap();
            assert!(v.is_admitted(), "{algo}");
            let left: Vec<u64> = v.decisions().iter().map(|d| d.remaining).collect();
            assert_eq!(left, [2, 1], "{algo}");
            let v = store.check_now(&twice).unwrap();
            assert!(!v.is_admitted(), "{algo}");
            assert!(
                v.decisions()[0].admitted && !v.decisions()[1].admitted,
                "{algo}"
            );
            assert_eq!(v.decisions()[0].remaining, 1, "{algo}: nothing was taken");
            let d = one(&store, "k", &p);
            assert!(d.admitted && d.remaining == 0, "{algo}: {d:?}");
        }
    }

    /// The largest numbers a policy allows, a clock at the end of time, a key reused by another
    /// algorithm: answers, never a panic.
    #[test]
    fn extreme_inputs_never_panic() {
        use crate::policy::{MAX_BUCKET_SCALE, MAX_UNITS};
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(clock.clone());
        let longest = 100 * 365 * 24 * HOUR;
        let mut policies = Vec::new();
        for algo in Algorithm::ALL {
            for (limit, burst, cost) in [
                (MAX_UNITS, MAX_UNITS, MAX_UNITS),
                (MAX_UNITS, MAX_UNITS, 1),
                (1, MAX_UNITS, MAX_UNITS / 2),
                (7, MAX_BUCKET_SCALE / 1000, MAX_BUCKET_SCALE / 2000),
                (1, 1, 1),
            ] {
                for period in [MS, longest] {
                    let p = Policy::new(algo, limit, period)
                        .and_then(|p| p.with_burst(burst))
                        .and_then(|p| p.with_cost(cost));
                    policies.extend(p);
                }
            }
        }
        assert!(policies.len() >= 18, "{}", policies.len());
        for step in [Duration::ZERO, MS, longest, Duration::MAX, Duration::MAX] {
            clock.advance(step);
            for p in &policies {
                // The same key under every policy, and each policy under its own key.
                for _ in 0..3 {
                    let d = one(&store, "shared", p);
                    assert_eq!(d.limit, p.capacity());
                    let _ = one(&store, &format!("{p:?}"), p);
                }
            }
            let checks: Vec<Check<'_>> = policies.iter().map(|p| Check::new("s", p)).collect();
            let v = store.check_now(&checks).unwrap();
            assert_eq!(v.decisions().len(), policies.len());
        }
        assert_eq!(clock.now(), Duration::from_nanos(u64::MAX));
        let _ = store.sweep();
        assert!(store.check_now(&[]).unwrap().is_admitted());
    }

    /// Under tokio's paused time the janitor sweeps on its own, and it ends with the store.
    #[tokio::test(start_paused = true)]
    async fn the_janitor_sweeps_and_ends_with_the_store() {
        let store = MemoryStore::with_clock(TokioClock::default());
        let p = policy(Algorithm::Fixed, 1, 1000 * MS, 1);
        let tasks = tokio::runtime::Handle::current().metrics();
        let before = tasks.num_alive_tasks();
        for i in 0..1000 {
            assert!(one(&store, &format!("k{i}"), &p).admitted);
        }
        assert!(store.has_janitor());
        assert_eq!(tasks.num_alive_tasks(), before + 1, "one janitor");
        assert_eq!(store.held(), 1000);
        tokio::time::sleep(999 * MS).await;
        assert_eq!(store.len(), 1000);
        // The window ends at 1 s; the janitor sweeps every second: by 2 s all are gone,
        // without a call.
        tokio::time::sleep(1001 * MS + MS).await;
        assert_eq!(store.held(), 0);
        drop(store);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            tasks.num_alive_tasks(),
            before,
            "the janitor outlived its store"
        );
    }

    /// A janitor whose runtime shut down is started again in the next runtime.
    #[test]
    fn the_janitor_restarts_in_a_new_runtime() {
        let store = MemoryStore::with_clock(ManualClock::new());
        let p = policy(Algorithm::Fixed, 100, 1000 * MS, 100);
        assert!(one(&store, "k", &p).admitted);
        assert!(!store.has_janitor(), "no runtime, no janitor");
        for _ in 0..2 {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            rt.block_on(async {
                assert!(one(&store, "k", &p).admitted);
                tokio::task::yield_now().await;
                assert!(store.has_janitor());
            });
            drop(rt);
            assert!(!store.has_janitor(), "the janitor died with its runtime");
        }
    }

    fn try_one(store: &MemoryStore, key: &str, p: &Policy) -> Result<Decision, StoreError> {
        store
            .check_now(&[Check::new(key, p)])
            .map(|v| v.decisions()[0])
    }

    /// `n` keys `{prefix}{i}` that live in shard `shard`.
    fn keys_in_shard(store: &MemoryStore, shard: usize, prefix: &str, n: usize) -> Vec<String> {
        (0..)
            .map(|i| format!("{prefix}{i}"))
            .filter(|k| Inner::shard_of(store.inner.hash(k)) == shard)
            .take(n)
            .collect()
    }

    /// A client minting keys (header values, IPv6 /64s) used to fill a shard and make it drop
    /// the entries nearest to idle, resetting other callers' spent limits. Now only idle
    /// entries leave: the minted keys beyond the bound get `Full`, the spent callers stay
    /// rejected with their state untouched, and the keys already held keep answering.
    #[test]
    fn a_full_store_never_evicts_a_spent_caller() {
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(clock.clone()).with_max_keys(256);
        let spent: Vec<(String, Policy)> = Algorithm::ALL
            .into_iter()
            .map(|a| (format!("spent:{a}"), policy(a, 2, HOUR, 2)))
            .collect();
        for (key, p) in &spent {
            while try_one(&store, key, p).unwrap().admitted {}
        }
        let before: Vec<Option<Entry>> = spent.iter().map(|(k, _)| entry(&store, k)).collect();
        assert!(before.iter().all(Option::is_some));

        let minted = policy(Algorithm::Fixed, 1, HOUR, 1);
        let (mut held, mut full) = (Vec::new(), 0);
        for i in 0..10_000 {
            let key = format!("minted:{i}");
            match try_one(&store, &key, &minted) {
                Ok(d) => {
                    assert!(d.admitted, "{key}: {d:?}");
                    held.push(key);
                }
                Err(StoreError::Full { max_keys }) => {
                    assert_eq!(max_keys, 256);
                    full += 1;
                }
                Err(e) => panic!("{key}: {e}"),
            }
        }
        assert_eq!(store.held(), 256, "every shard filled up to its bound");
        assert_eq!(held.len() + spent.len(), 256);
        assert_eq!(full, 10_000 - held.len());

        for ((key, p), was) in spent.iter().zip(&before) {
            let d = try_one(&store, key, p).unwrap();
            assert!(!d.admitted, "{key} was reset: {d:?}");
            assert_eq!(&entry(&store, key), was, "{key} changed");
        }
        // Keys already held keep working in a full store: never `Full`.
        for key in &held {
            assert!(!try_one(&store, key, &minted).unwrap().admitted, "{key}");
        }

        // Two hours on (a sliding counter's window weighs for one more period), every entry is
        // back to empty: new keys fit again (one per shard here, so that none finds its shard
        // full of the new keys themselves).
        clock.advance(2 * HOUR + MS);
        for shard in 0..SHARDS {
            for key in keys_in_shard(&store, shard, "fresh:", 1) {
                assert!(try_one(&store, &key, &minted).unwrap().admitted, "{key}");
            }
        }
        for (key, p) in &spent {
            assert!(
                try_one(&store, key, p).unwrap().admitted,
                "{key} after its period"
            );
        }
    }

    /// A stacked call whose new keys do not all fit writes none of them, and touches none of
    /// its known keys; a call that is rejected anyway, or one on known keys only, needs no room.
    #[test]
    fn a_stacked_call_whose_new_keys_do_not_fit_writes_nothing() {
        let clock = ManualClock::new();
        // Two keys per shard.
        let store = MemoryStore::with_clock(clock.clone()).with_max_keys(128);
        let zero = keys_in_shard(&store, 0, "zero:", 3);
        let (a, b, c) = (&zero[0], &zero[1], &zero[2]);
        let other = &keys_in_shard(&store, 1, "one:", 1)[0];
        let quota = policy(Algorithm::Fixed, 3, HOUR, 3);
        let stacked = |keys: &[&String]| {
            let checks: Vec<Check<'_>> = keys.iter().map(|k| Check::new(k, &quota)).collect();
            store.check_now(&checks)
        };
        let full =
            |r: Result<Verdict, StoreError>| matches!(r, Err(StoreError::Full { max_keys: 128 }));

        assert_eq!(try_one(&store, a, &quota).unwrap().remaining, 2);
        // Shard 0 has room for one more key; this call brings two.
        let before = snapshot(&store);
        assert!(full(stacked(&[a, b, c])));
        assert!(full(stacked(&[b, other, c])));
        assert_eq!(snapshot(&store), before, "a refused call wrote something");
        assert_eq!(store.held(), 1);

        // One new key in shard 0, one in shard 1: it fits.
        let verdict = stacked(&[a, b, other]).unwrap();
        assert!(verdict.is_admitted());
        assert_eq!(verdict.decisions()[0].remaining, 1);
        // Shard 0 is full now: a call bringing `c` is refused, one on known keys is not, even
        // naming a key twice.
        let before = snapshot(&store);
        assert!(full(stacked(&[a, c])));
        assert_eq!(snapshot(&store), before);
        let verdict = stacked(&[a, b, b]).unwrap();
        assert!(verdict.is_admitted());
        assert_eq!(verdict.decisions()[0].remaining, 0);
        // Rejected by `a` anyway: nothing would be written, so no room is needed.
        let verdict = stacked(&[a, c]).unwrap();
        assert!(!verdict.is_admitted());
        assert!(verdict.decisions()[1].admitted);
        assert!(entry(&store, c).is_none());

        // Idle entries make room: once the hour is over, `c` fits beside the swept ones.
        clock.advance(HOUR + MS);
        assert!(stacked(&[a, c]).unwrap().is_admitted());
        assert_eq!(store.len(), 2);
    }

    /// A shard full of live entries refuses a new key, and one idle entry in it is enough: the
    /// sweep removes it (and only it) to make room.
    #[test]
    fn a_full_shard_makes_room_only_from_idle_entries() {
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(clock.clone()).with_max_keys(128);
        let keys = keys_in_shard(&store, 7, "seven:", 3);
        let short = policy(Algorithm::Fixed, 5, 1000 * MS, 5);
        let long = policy(Algorithm::Fixed, 5, HOUR, 5);
        assert!(try_one(&store, &keys[0], &short).unwrap().admitted);
        assert!(try_one(&store, &keys[1], &long).unwrap().admitted);
        assert!(matches!(
            try_one(&store, &keys[2], &long),
            Err(StoreError::Full { .. })
        ));
        clock.advance(1001 * MS);
        assert_eq!(try_one(&store, &keys[2], &long).unwrap().remaining, 4);
        assert!(
            entry(&store, &keys[0]).is_none(),
            "the idle entry made room"
        );
        assert_eq!(try_one(&store, &keys[1], &long).unwrap().remaining, 3);
    }

    #[test]
    fn stacked_shards_are_locked_in_order_once() {
        let store = MemoryStore::with_clock(ManualClock::new());
        let p = policy(Algorithm::Token, 100, 1000 * MS, 100);
        // Many keys, several in the same shard (64 shards, 300 keys).
        let keys: Vec<String> = (0..300).map(|i| format!("key{i}")).collect();
        let checks: Vec<Check<'_>> = keys.iter().map(|k| Check::new(k, &p)).collect();
        let v = store.check_now(&checks).unwrap();
        assert!(v.is_admitted());
        assert!(v.decisions().iter().all(|d| d.remaining == 99));
        assert_eq!(store.len(), 300);
    }
}
