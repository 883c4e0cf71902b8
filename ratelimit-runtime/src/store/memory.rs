//! The in-process store: sharded maps, integer arithmetic, idle entries evicted.
//!
//! See [`MemoryStore`] for its behaviour and [`Clock`] for where its time comes from.

use std::collections::VecDeque;
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use hashbrown::HashTable;

use super::{Check, Store, StoreFuture};
use crate::error::StoreError;
use crate::policy::{Algorithm, Decision, Policy, Verdict};

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
/// use ratelimit_runtime::store::memory::TokioClock;
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

/// The shortest time a leaky bucket's entry is kept (SPEC: "at least 1 ms").
const MIN_LEAKY_TTL_NS: u64 = 1_000_000;

/// The in-process store, the embedded default: no setup.
///
/// # Behaviour
///
/// * **Per process.** Its limits live in this process's memory: several instances of an
///   application (processes, containers, hosts) each keep their own counts, so a quota of 100
///   becomes 100 *per instance*. Instances share limits only through Redis
///   ([`crate::RedisStore`]).
/// * **Exact.** N concurrent calls against a quota of `num` get exactly `num` admissions. The
///   state is split over 64 shards, each behind its own mutex (there is no global lock); a key
///   lives in the shard its hash picks. A check of several limits locks the shards of its keys
///   in ascending order (each once), so it is atomic and cannot deadlock with another check.
/// * **All or nothing.** Every limit of a call is evaluated first; only when all admit are
///   they written. A call that any limit rejects changes nothing. When one call names the same
///   key twice, its checks apply one after the other to that key.
/// * **Integer arithmetic.** Time is whole nanoseconds from the [`Clock`]; bucket levels are
///   kept as `units × period_ns` in `u128`, so 50 calls against a burst of 50 admit exactly
///   50, and the arithmetic saturates instead of overflowing: no input makes a check panic.
///   Reported durations are rounded up to the nanosecond.
/// * **Idle keys are forgotten.** Each entry knows when it becomes idle, i.e. equal to no entry
///   at all: a fixed window at its end, a sliding window one period after its newest admission,
///   a token bucket when it is full again, a leaky bucket when it is empty (kept at least 1 ms).
///   Idle entries are removed by [`MemoryStore::sweep`], by each shard on inserts (amortised:
///   a shard sweeps itself after as many inserts as it held entries at its last sweep), and by
///   a background janitor every [`DEFAULT_SWEEP_INTERVAL`] (configurable). The janitor is a
///   tokio task started at the first check made inside a tokio runtime; it holds only a weak
///   reference and ends when the store is dropped. Forgetting an idle entry never changes an
///   answer.
/// * **Memory bounded, and no caller's state is ever forgotten for room.** A sliding window
///   keeps at most `num` admission times (as `(time, count)` pairs), every other entry is a few
///   words. The number of keys is bounded by [`MemoryStore::with_max_keys`] (default
///   [`DEFAULT_MAX_KEYS`], split evenly over the shards). Only idle entries are ever removed: a
///   live entry (a caller who spent part of a quota) stays until its state is back to empty,
///   however many other keys arrive, so minting keys (header values, IPv6 /64s) never resets
///   another caller's limit. When a call needs a new key and the key's shard is full of live
///   entries (after sweeping it), the call is answered [`StoreError::Full`] and changes
///   nothing: no existing entry is touched, and in a call of several limits no key is written
///   either. A [`crate::RateLimiter`] answers such a call with its [`crate::FailurePolicy`]
///   (for that call only; the breaker stays closed) and logs it, throttled. Keys already held
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
/// assert_eq!(third.retry_after(), Some(Duration::from_secs(10)));
///
/// clock.advance(Duration::from_secs(10));
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
    hasher: RandomState,
    shards: Box<[Mutex<Shard>]>,
    max_per_shard: AtomicUsize,
    sweep_interval_ns: AtomicU64,
    /// Set while a janitor task lives (cleared when its runtime drops it).
    janitor_running: AtomicBool,
}

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
        let shards = (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect();
        let store = Self {
            inner: Arc::new(Inner {
                clock: Box::new(clock),
                hasher: RandomState::new(),
                shards,
                max_per_shard: AtomicUsize::new(0),
                sweep_interval_ns: AtomicU64::new(0),
                janitor_running: AtomicBool::new(false),
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
    /// clock.advance(Duration::from_secs(60)); // every window ended: the entries are idle
    /// assert!(store.check_now(&[Check::new("new", &policy)])?.is_admitted());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn with_max_keys(self, max_keys: usize) -> Self {
        let per_shard = max_keys.div_ceil(SHARDS).max(1);
        self.inner.max_per_shard.store(per_shard, Ordering::Relaxed);
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
            .map(|shard| lock(shard).sweep(now))
            .sum()
    }

    /// The number of live (not yet idle) entries. Takes each shard's lock in turn and scans
    /// it, so it costs O(entries); meant for tests and metrics, not for every request.
    pub fn len(&self) -> usize {
        let now = self.inner.now();
        self.inner
            .shards
            .iter()
            .map(|shard| lock(shard).map.values().filter(|e| e.live(now)).count())
            .sum()
    }

    /// The number of entries held in memory, live or idle: what sweeping brings down to
    /// [`MemoryStore::len`].
    pub fn held(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|shard| lock(shard).map.len())
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
        match checks {
            [] => Ok(Verdict::new(Vec::new())),
            [one] => Ok(Verdict::new(vec![self.inner.check_one(one)?])),
            many => Ok(Verdict::new(self.inner.check_many(many)?)),
        }
    }

    /// Starts the janitor when none is running and this runs inside a tokio runtime.
    fn start_janitor(&self) {
        if self.inner.janitor_running.load(Ordering::Acquire) {
            return;
        }
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

    fn name(&self) -> &'static str {
        "memory"
    }
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
            lock(&inner.shards[i]).sweep(now);
            drop(inner);
            tokio::task::yield_now().await;
        }
    }
}

/// Locks a mutex, ignoring poisoning: no code path panics while holding one, and the state
/// stays consistent between statements anyway.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Inner {
    fn now(&self) -> u64 {
        u64::try_from(self.clock.now().as_nanos()).unwrap_or(u64::MAX)
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

    fn max_per_shard(&self) -> usize {
        self.max_per_shard.load(Ordering::Relaxed)
    }

    /// The error of a call whose new key found its shard full of live entries.
    fn full(&self) -> StoreError {
        StoreError::Full {
            max_keys: self.max_per_shard().saturating_mul(SHARDS),
        }
    }

    /// One limit: one shard, no allocation but a new key's.
    fn check_one(&self, check: &Check<'_>) -> Result<Decision, StoreError> {
        let p = Params::new(check.policy);
        let hash = self.hash(check.key);
        let mut guard = lock(&self.shards[Self::shard_of(hash)]);
        let shard = &mut *guard;
        let now = self.now();
        // One lookup for a known key: evaluate and write through the same reference.
        if let Some(entry) = shard.map.get_mut(hash, check.key) {
            unstamp_future(entry, &p, now);
            let base = entry.live(now).then_some(&entry.state);
            return Ok(match take(base, Pending::Untouched, &p, now) {
                Ok(pending) => {
                    let (remaining, reset) = numbers(base, pending, &p, now);
                    update(entry, pending, &p, now);
                    shard.next_idle = shard.next_idle.min(entry.idle_at);
                    decision(true, &p, remaining, reset, 0)
                }
                Err(retry) => {
                    let (remaining, reset) = numbers(base, Pending::Untouched, &p, now);
                    decision(false, &p, remaining, reset, retry)
                }
            });
        }
        match take(None, Pending::Untouched, &p, now) {
            Ok(pending) => {
                if !shard.make_room(now, self.max_per_shard(), |_| 1) {
                    return Err(self.full());
                }
                let (remaining, reset) = numbers(None, pending, &p, now);
                shard.insert(hash, check.key, pending, &p, now);
                Ok(decision(true, &p, remaining, reset, 0))
            }
            // A rejection writes nothing, so it needs no room.
            Err(retry) => {
                let (remaining, reset) = numbers(None, Pending::Untouched, &p, now);
                Ok(decision(false, &p, remaining, reset, retry))
            }
        }
    }

    /// Several limits as one call: lock their shards in ascending order, evaluate all, write
    /// only if all admit and every new key fits.
    fn check_many(&self, checks: &[Check<'_>]) -> Result<Vec<Decision>, StoreError> {
        let params: Vec<Params> = checks.iter().map(|c| Params::new(c.policy)).collect();
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
                    pending: Pending::Untouched,
                    last: n,
                });
                slots.len() - 1
            };
            slot_of.push(i);
        }
        let mut order: Vec<usize> = slots.iter().map(|s| s.shard).collect();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<MutexGuard<'_, Shard>> =
            order.iter().map(|&i| lock(&self.shards[i])).collect();
        let guard_of = |shard: usize| order.binary_search(&shard).unwrap_or(0);
        let now = self.now();
        for slot in &slots {
            let shard = &mut guards[guard_of(slot.shard)];
            if let Some(entry) = shard.map.get_mut(slot.hash, slot.key) {
                unstamp_future(entry, &params[slot.last], now);
            }
        }

        // Evaluate every limit; `Ok` holds the numbers after the call, `Err` the retry time.
        let mut outcomes: Vec<Result<(u64, u64), u64>> = Vec::with_capacity(checks.len());
        for ((c, p), &s) in checks.iter().zip(&params).zip(&slot_of) {
            let slot = &mut slots[s];
            let base = guards[guard_of(slot.shard)].base(slot.hash, c.key, now);
            outcomes.push(match take(base, slot.pending, p, now) {
                Ok(pending) => {
                    slot.pending = pending;
                    Ok(numbers(base, pending, p, now))
                }
                Err(retry) => Err(retry),
            });
        }

        if outcomes.iter().all(Result::is_ok) {
            // Room for every new key first, in every shard: all of the call is written or
            // none of it. Making room only sweeps idle entries, which changes no answer.
            let max = self.max_per_shard();
            for (&shard, guard) in order.iter().zip(guards.iter_mut()) {
                let new_keys = |map: &Map| {
                    slots
                        .iter()
                        .filter(|s| s.shard == shard && !matches!(s.pending, Pending::Untouched))
                        .filter(|s| map.get(s.hash, s.key).is_none())
                        .count()
                };
                if !guard.make_room(now, max, new_keys) {
                    return Err(self.full());
                }
            }
            for slot in &slots {
                guards[guard_of(slot.shard)].commit(
                    slot.hash,
                    slot.key,
                    slot.pending,
                    &params[slot.last],
                    now,
                );
            }
            Ok(params
                .iter()
                .zip(outcomes.into_iter().flatten())
                .map(|(p, (remaining, reset))| decision(true, p, remaining, reset, 0))
                .collect())
        } else {
            // Nothing is written: every decision reports the state as it is now.
            Ok(checks
                .iter()
                .zip(&params)
                .zip(&slot_of)
                .zip(outcomes)
                .map(|(((c, p), &s), o)| {
                    let slot = &slots[s];
                    let base = guards[guard_of(slot.shard)].base(slot.hash, c.key, now);
                    let (remaining, reset) = numbers(base, Pending::Untouched, p, now);
                    match o {
                        Ok(_) => decision(true, p, remaining, reset, 0),
                        Err(retry) => decision(false, p, remaining, reset, retry),
                    }
                })
                .collect())
        }
    }
}

/// A distinct key of one call and what the call would write to it.
struct Slot<'k> {
    key: &'k str,
    hash: u64,
    shard: usize,
    pending: Pending,
    /// The last check of the call on this key (its policy is the one written).
    last: usize,
}

fn decision(admitted: bool, p: &Params, remaining: u64, reset_ns: u64, retry_ns: u64) -> Decision {
    Decision::new(
        admitted,
        p.capacity,
        remaining,
        Duration::from_nanos(reset_ns),
        Duration::from_nanos(retry_ns),
    )
}

/// One shard: its entries and its amortised-sweep bookkeeping.
#[derive(Default)]
struct Shard {
    map: Map,
    inserts_since_sweep: usize,
    /// Entries left by the last sweep: the next one comes after as many inserts.
    len_after_sweep: usize,
    /// No entry becomes idle before this instant (a lower bound): sweeping earlier is a no-op,
    /// so an idle janitor or a shard full of live entries costs nothing to sweep.
    next_idle: u64,
}

impl Shard {
    /// The live state under `key`, if any.
    fn base(&self, hash: u64, key: &str, now: u64) -> Option<&State> {
        self.map
            .get(hash, key)
            .filter(|e| e.live(now))
            .map(|e| &e.state)
    }

    /// Removes idle entries; returns how many.
    fn sweep(&mut self, now: u64) -> usize {
        self.inserts_since_sweep = 0;
        if now < self.next_idle {
            self.len_after_sweep = self.map.len();
            return 0;
        }
        let before = self.map.len();
        let mut next_idle = u64::MAX;
        self.map.retain(|_, e| {
            let live = e.live(now);
            if live {
                next_idle = next_idle.min(e.idle_at);
            }
            live
        });
        self.next_idle = next_idle;
        let len = self.map.len();
        self.len_after_sweep = len;
        if self.map.capacity() > 1024 && len < self.map.capacity() / 4 {
            self.map.shrink_to(len * 2);
        }
        before - len
    }

    /// Writes what an admitted call takes under `key` (whose hash is `hash`). A key not held
    /// yet needs room made first ([`Shard::make_room`]).
    fn commit(&mut self, hash: u64, key: &str, pending: Pending, p: &Params, now: u64) {
        if matches!(pending, Pending::Untouched) {
            return;
        }
        if let Some(entry) = self.map.get_mut(hash, key) {
            update(entry, pending, p, now);
            self.next_idle = self.next_idle.min(entry.idle_at);
        } else {
            self.insert(hash, key, pending, p, now);
        }
    }

    /// Adds a key that is not held yet, in room made by [`Shard::make_room`].
    fn insert(&mut self, hash: u64, key: &str, pending: Pending, p: &Params, now: u64) {
        let entry = written(None, pending, p, now);
        self.next_idle = self.next_idle.min(entry.idle_at);
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
    entry: Entry,
}

impl Map {
    fn get(&self, hash: u64, key: &str) -> Option<&Entry> {
        self.0.find(hash, |h| &*h.key == key).map(|h| &h.entry)
    }

    fn get_mut(&mut self, hash: u64, key: &str) -> Option<&mut Entry> {
        self.0
            .find_mut(hash, |h| &*h.key == key)
            .map(|h| &mut h.entry)
    }

    /// Adds a key the map does not hold.
    fn insert(&mut self, hash: u64, key: &str, entry: Entry) {
        self.0.insert_unique(
            hash,
            Held {
                hash,
                key: key.into(),
                entry,
            },
            |h| h.hash,
        );
    }

    fn retain(&mut self, mut keep: impl FnMut(&str, &Entry) -> bool) {
        self.0.retain(|h| keep(&h.key, &h.entry));
    }

    #[cfg(test)]
    fn iter(&self) -> impl Iterator<Item = (&str, &Entry)> {
        self.0.iter().map(|h| (&*h.key, &h.entry))
    }

    fn values(&self) -> impl Iterator<Item = &Entry> {
        self.0.iter().map(|h| &h.entry)
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

/// One key's state and when it becomes idle (equal to no state at all).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    idle_at: u64,
    state: State,
}

impl Entry {
    fn live(&self, now: u64) -> bool {
        now < self.idle_at
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// A window ending at `end` with `count` units taken.
    Fixed { end: u64, count: u64 },
    /// Admission times.
    Sliding(Window),
    /// Tokens (× period in ns) at `at`.
    Token(Bucket),
    /// Level (× period in ns) at `at`.
    Leaky(Bucket),
}

/// A bucket's content in units × `period_ns`, as of `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Bucket {
    level: u128,
    at: u64,
}

/// A sliding window's admissions, oldest first: `(time, units)` pairs (several units admitted
/// at one instant share a pair), and their total.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Window {
    marks: VecDeque<(u64, u64)>,
    total: u64,
}

impl Window {
    /// Units admitted in `(now - period, now]`, and how many pairs at the front have expired.
    fn live(&self, now: u64, period: u64) -> (u64, usize) {
        let mut expired_units = 0u64;
        let mut expired = 0;
        for &(t, n) in &self.marks {
            if t.saturating_add(period) > now {
                break;
            }
            expired_units = expired_units.saturating_add(n);
            expired += 1;
        }
        (self.total.saturating_sub(expired_units), expired)
    }
}

/// What an admitted call would write to a key: nothing yet, or the new state (fixed, buckets),
/// or units admitted now on top of the window (sliding).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pending {
    Untouched,
    Fixed { end: u64, count: u64 },
    Bucket(Bucket),
    Sliding(u64),
}

/// A policy in the store's units.
struct Params {
    algorithm: Algorithm,
    /// Units per period (`num`).
    limit: u64,
    /// Bucket capacity / window quota.
    capacity: u64,
    cost: u64,
    /// The period in nanoseconds.
    period: u64,
}

impl Params {
    fn new(p: &Policy) -> Self {
        Self {
            algorithm: p.algorithm(),
            limit: p.limit().max(1),
            capacity: p.capacity(),
            cost: p.cost(),
            period: p.period_ms().saturating_mul(1_000_000).max(1),
        }
    }

    /// `units` in the buckets' scale (units × `period_ns`).
    fn scaled(&self, units: u64) -> u128 {
        u128::from(units) * u128::from(self.period)
    }

    /// Nanoseconds for `scaled` to flow at `limit / period`, rounded up.
    fn flow_time(&self, scaled: u128) -> u64 {
        u64::try_from(scaled.div_ceil(u128::from(self.limit))).unwrap_or(u64::MAX)
    }

    /// What flows in `dt` nanoseconds, in the buckets' scale.
    fn flow(&self, dt: u64) -> u128 {
        u128::from(self.limit) * u128::from(dt)
    }
}

/// The live fixed window, seen through what this call already took.
fn fixed_window(base: Option<&State>, pending: Pending, now: u64) -> Option<(u64, u64)> {
    match (pending, base) {
        (Pending::Fixed { end, count }, _) => Some((end, count)),
        (_, Some(&State::Fixed { end, count })) if now < end => Some((end, count)),
        _ => None,
    }
}

/// The bucket's content now (tokens for `token`, level for `leaky`), in units × `period_ns`.
fn bucket_now(base: Option<&State>, pending: Pending, p: &Params, now: u64) -> u128 {
    let token = p.algorithm == Algorithm::Token;
    let full = p.scaled(p.capacity);
    let bucket = match (pending, base) {
        (Pending::Bucket(b), _) => Some(b),
        (_, Some(State::Token(b))) if token => Some(*b),
        (_, Some(State::Leaky(b))) if !token => Some(*b),
        _ => None,
    };
    match bucket {
        None if token => full,
        None => 0,
        Some(b) => {
            let flow = p.flow(now.saturating_sub(b.at));
            if token {
                b.level.saturating_add(flow).min(full)
            } else {
                b.level.saturating_sub(flow).min(full)
            }
        }
    }
}

/// The sliding window of `base`, if it is one.
fn window(base: Option<&State>) -> Option<&Window> {
    match base {
        Some(State::Sliding(w)) => Some(w),
        _ => None,
    }
}

fn sliding_pending(pending: Pending) -> u64 {
    match pending {
        Pending::Sliding(n) => n,
        _ => 0,
    }
}

/// Whether `cost` more units fit on top of `taken` within `capacity` (without overflowing).
fn fits(taken: u64, cost: u64, capacity: u64) -> bool {
    taken.checked_add(cost).is_some_and(|n| n <= capacity)
}

/// Evaluates one limit: `Ok(what the call would write)` or `Err(retry_after in ns)`.
fn take(base: Option<&State>, pending: Pending, p: &Params, now: u64) -> Result<Pending, u64> {
    let cost = p.cost;
    match p.algorithm {
        Algorithm::Fixed => match fixed_window(base, pending, now) {
            Some((end, count)) if fits(count, cost, p.capacity) => Ok(Pending::Fixed {
                end,
                count: count.saturating_add(cost),
            }),
            Some((end, _)) => Err(end.saturating_sub(now)),
            None if cost <= p.capacity => Ok(Pending::Fixed {
                end: now.saturating_add(p.period),
                count: cost,
            }),
            None => Err(p.period),
        },
        Algorithm::Sliding => {
            let win = window(base);
            let (in_base, expired) = win.map_or((0, 0), |w| w.live(now, p.period));
            let added = sliding_pending(pending);
            let count = in_base.saturating_add(added);
            if fits(count, cost, p.capacity) {
                return Ok(Pending::Sliding(added.saturating_add(cost)));
            }
            // The (count + cost - limit)-th oldest admission must leave the window first.
            let mut nth = count.saturating_add(cost) - p.capacity;
            if let Some(w) = win {
                for &(t, units) in w.marks.iter().skip(expired) {
                    if units >= nth {
                        return Err(t.saturating_add(p.period).saturating_sub(now));
                    }
                    nth -= units;
                }
            }
            // Among (or past) this call's own admissions, made now.
            Err(p.period)
        }
        Algorithm::Token => {
            let tokens = bucket_now(base, pending, p, now);
            let units = p.scaled(cost);
            if tokens >= units {
                Ok(Pending::Bucket(Bucket {
                    level: tokens - units,
                    at: now,
                }))
            } else {
                Err(p.flow_time(units - tokens))
            }
        }
        Algorithm::Leaky => {
            let level = bucket_now(base, pending, p, now);
            let after = level.saturating_add(p.scaled(cost));
            let full = p.scaled(p.capacity);
            if after <= full {
                Ok(Pending::Bucket(Bucket {
                    level: after,
                    at: now,
                }))
            } else {
                Err(p.flow_time(after - full))
            }
        }
    }
}

/// `(remaining, reset_after in ns)` of the state seen through `pending`.
fn numbers(base: Option<&State>, pending: Pending, p: &Params, now: u64) -> (u64, u64) {
    match p.algorithm {
        Algorithm::Fixed => match fixed_window(base, pending, now) {
            Some((end, count)) => (p.capacity.saturating_sub(count), end.saturating_sub(now)),
            None => (p.capacity, 0),
        },
        Algorithm::Sliding => {
            let w = window(base);
            let (in_base, expired) = w.map_or((0, 0), |w| w.live(now, p.period));
            let added = sliding_pending(pending);
            let n = in_base.saturating_add(added);
            let newest = if added > 0 {
                Some(now)
            } else {
                w.and_then(|w| w.marks.iter().skip(expired).next_back())
                    .map(|&(t, _)| t)
            };
            let reset = newest.map_or(0, |t| t.saturating_add(p.period).saturating_sub(now));
            (p.capacity.saturating_sub(n), reset)
        }
        Algorithm::Token => {
            let tokens = bucket_now(base, pending, p, now);
            let full = p.scaled(p.capacity);
            (
                whole_units(tokens, p),
                p.flow_time(full.saturating_sub(tokens)),
            )
        }
        Algorithm::Leaky => {
            let level = bucket_now(base, pending, p, now);
            let full = p.scaled(p.capacity);
            (
                whole_units(full.saturating_sub(level), p),
                p.flow_time(level),
            )
        }
    }
}

/// Whole units in a scaled amount (rounded down).
fn whole_units(scaled: u128, p: &Params) -> u64 {
    u64::try_from(scaled / u128::from(p.period)).unwrap_or(u64::MAX)
}

/// Writes what an admitted call takes into a held entry (idle or not).
fn update(entry: &mut Entry, pending: Pending, p: &Params, now: u64) {
    let live = entry.live(now);
    let old = std::mem::replace(&mut entry.state, State::Fixed { end: 0, count: 0 });
    *entry = written(live.then_some(old), pending, p, now);
}

/// When a state becomes idle (equal to no state at all): a fixed window at its end, a sliding
/// window one period after its newest admission, a token bucket when full, a leaky bucket when
/// empty (kept at least 1 ms).
fn idle_at(state: &State, p: &Params) -> u64 {
    match state {
        State::Fixed { end, .. } => *end,
        State::Sliding(w) => w
            .marks
            .back()
            .map_or(0, |&(newest, _)| newest.saturating_add(p.period)),
        State::Token(b) => {
            let missing = p.scaled(p.capacity).saturating_sub(b.level);
            b.at.saturating_add(p.flow_time(missing))
        }
        State::Leaky(b) => {
            b.at.saturating_add(p.flow_time(b.level).max(MIN_LEAKY_TTL_NS))
        }
    }
}

/// State stamped in the future — by a [`Clock`] that went backwards — is treated as stamped
/// now, as the Redis scripts treat state written by a master whose clock was ahead: a bucket
/// flows again from now, a sliding window is shifted to end now (its spacing kept), a fixed
/// window has at most a period left. The skew is never counted as a charge, so no caller is
/// locked out beyond the true `retry_after`. A monotonic clock never takes this path.
fn unstamp_future(entry: &mut Entry, p: &Params, now: u64) {
    let changed = match &mut entry.state {
        State::Fixed { end, .. } if *end > now.saturating_add(p.period) => {
            *end = now.saturating_add(p.period);
            true
        }
        State::Sliding(w) => match w.marks.back() {
            Some(&(newest, _)) if newest > now => {
                let skew = newest - now;
                for mark in &mut w.marks {
                    mark.0 = mark.0.saturating_sub(skew);
                }
                true
            }
            _ => false,
        },
        State::Token(b) | State::Leaky(b) if b.at > now => {
            b.at = now;
            true
        }
        _ => false,
    };
    if changed {
        entry.idle_at = idle_at(&entry.state, p);
    }
}

/// The entry an admitted call leaves: the new state and when it becomes idle.
fn written(base: Option<State>, pending: Pending, p: &Params, now: u64) -> Entry {
    let state = match pending {
        Pending::Fixed { end, count } => State::Fixed { end, count },
        Pending::Bucket(b) if p.algorithm == Algorithm::Token => State::Token(b),
        Pending::Bucket(b) => State::Leaky(b),
        Pending::Sliding(added) => {
            let mut w = match base {
                Some(State::Sliding(w)) => w,
                _ => Window::default(),
            };
            let (_, expired) = w.live(now, p.period);
            for (_, units) in w.marks.drain(..expired) {
                w.total = w.total.saturating_sub(units);
            }
            match w.marks.back_mut() {
                Some((t, units)) if *t >= now => *units = units.saturating_add(added),
                _ => w.marks.push_back((now, added)),
            }
            w.total = w.total.saturating_add(added);
            State::Sliding(w)
        }
        // `commit` never writes an untouched key; an already idle state is harmless.
        Pending::Untouched => State::Fixed { end: now, count: 0 },
    };
    Entry {
        idle_at: idle_at(&state, p),
        state,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let shard = lock(&store.inner.shards[Inner::shard_of(hash)]);
        shard.map.get(hash, key).cloned()
    }

    fn snapshot(store: &MemoryStore) -> Vec<(Box<str>, Entry)> {
        let mut all: Vec<_> = store
            .inner
            .shards
            .iter()
            .flat_map(|s| {
                lock(s)
                    .map
                    .iter()
                    .map(|(k, e)| (Box::<str>::from(k), e.clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// 3 units per 10 ms is 3,333,333.3 ns per unit: the integer state neither loses nor
    /// gains a unit, however the time is cut.
    #[test]
    fn fractional_rates_stay_exact() {
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
            assert_eq!(
                d.retry_after,
                Some(Duration::from_nanos(3_333_334)),
                "{algo}"
            );
            assert_eq!(
                d.reset_after,
                50 * 10 * MS / 3 + Duration::from_nanos(1),
                "{algo}"
            );
            clock.advance(Duration::from_nanos(3_333_333));
            let d = one(&store, "k", &p);
            assert_eq!(d.retry_after, Some(Duration::from_nanos(1)), "{algo}");
            clock.advance(Duration::from_nanos(1));
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
                let step = seed % 7_000_000;
                clock.advance(Duration::from_nanos(step));
                elapsed += step;
                while one(&store, "k", &p).admitted {
                    admitted += 1;
                }
            }
            // 3 units per 10_000_000 ns; the first unit above was taken at 3_333_334 ns.
            let flowed = (u128::from(elapsed) + 10_000_000 / 3 + 1) * 3 / 10_000_000 - 1;
            assert_eq!(u128::from(admitted), flowed, "{algo} after {elapsed} ns");
        }
    }

    /// Each entry becomes idle exactly when semantics.md says, and not a nanosecond before.
    #[test]
    fn entries_become_idle_at_their_ttl() {
        let ns = Duration::from_nanos;
        let cases = [
            // fixed: the window's end
            (
                policy(Algorithm::Fixed, 5, 1000 * MS, 5),
                1,
                vec![0],
                1000 * MS,
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
            // leaky: at least 1 ms (1 unit drains in 0.1 ms)
            (policy(Algorithm::Leaky, 10, MS, 10), 1, vec![0], MS),
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
            clock.advance(ttl.saturating_sub(now).saturating_sub(ns(1)));
            assert_eq!(store.len(), 1, "{p:?} idle too early");
            assert_eq!(store.sweep(), 0);
            clock.advance(ns(1));
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
        clock.advance(MS);
        assert_eq!(one(&store, "again", &fixed).remaining, 1);
    }

    /// A sliding window keeps at most `limit` admission times, however many calls are made.
    #[test]
    fn sliding_entries_are_bounded_by_limit() {
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(clock.clone());
        let p = policy(Algorithm::Sliding, 5, 1000 * MS, 5);
        for _ in 0..10_000 {
            clock.advance(Duration::from_micros(37_123));
            let _ = one(&store, "k", &p);
            let Some(Entry {
                state: State::Sliding(w),
                ..
            }) = entry(&store, "k")
            else {
                panic!("no sliding entry");
            };
            assert!(w.marks.len() <= 5 && w.total <= 5, "{w:?}");
        }
        // A cost of 5 at once is one pair, not five.
        let p5 = policy(Algorithm::Sliding, 5, 1000 * MS, 5)
            .with_cost(5)
            .unwrap();
        assert!(one(&store, "other", &p5).admitted);
        let Some(Entry {
            state: State::Sliding(w),
            ..
        }) = entry(&store, "other")
        else {
            panic!("no sliding entry");
        };
        assert_eq!(w.marks.len(), 1);
    }

    /// A stacked call that one limit rejects leaves every entry byte for byte as it was.
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
                assert!(retry <= secs(10), "{algo} (stacked: {stacked}): {retry:?}");
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

        // An hour on, every entry is back to empty: new keys fit again (one per shard here, so
        // that none finds its shard full of the new keys themselves).
        clock.advance(HOUR);
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
        clock.advance(HOUR);
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
        clock.advance(1000 * MS);
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
