//! The sharded map: the key hasher, the shards and their locks, sweeping, and making room for
//! new keys without ever dropping a live one.

use std::borrow::Cow;
use std::hash::BuildHasher;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};

use hashbrown::HashTable;

use super::Inner;
use super::cell::{Cell, Entry};
use crate::algorithm::{Params, State};

/// The most shards a store has. The key bound is rounded to a multiple of it, which every
/// shard count divides, so that [`MemoryStore::max_keys`](super::MemoryStore::max_keys) is the
/// same on every machine.
pub(super) const MAX_SHARDS: usize = 64;

/// The fewest shards a store has: at the default bound, at most half a million keys a shard.
const MIN_SHARDS: usize = 8;

/// How many independently locked shards a store has: four per core the process may use
/// (dashmap's default), a power of two from 8 to [`MAX_SHARDS`].
///
/// Enough that cores rarely wait for one another's write lock (a new key, a stacked check, a
/// sweep) or pass one shard's lock word back and forth, and no more: each check reads its
/// shard's lock line, and at 100,000 keys a few lines of locks stay in the L1 cache where 64
/// lines of them (8 KiB, a quarter of a 32 KiB L1) were often evicted by the entries themselves
/// (see BENCHMARKS.md, "The memory store's shards sized to the machine").
///
/// The trade: a shard holds more keys, so what runs under its write lock over all of them (a
/// sweep, the table growing or shrinking) pauses a larger share of callers for longer; at
/// [`DEFAULT_MAX_KEYS`](super::DEFAULT_MAX_KEYS) and 8 shards a full shard holds 2^19 keys.
pub(super) fn shard_count() -> usize {
    std::thread::available_parallelism()
        .map_or(MAX_SHARDS, |cores| cores.get().min(MAX_SHARDS) * 4)
        .next_power_of_two()
        .clamp(MIN_SHARDS, MAX_SHARDS)
}

/// A shard sweeps itself on inserts once it has had this many inserts, or as many as it held
/// after its last sweep, whichever is more (so sweeping costs O(1) per insert, amortised).
const MIN_INSERTS_PER_SWEEP: usize = 64;

/// The hasher of the store's keys ([`key_hasher`]).
pub(super) type KeyHasher = foldhash::fast::SeedableRandomState;

/// The hash of the store's keys: foldhash (hashbrown's default hasher, a few times cheaper
/// than std's `SipHash` on a key of 50 bytes, which was a third of a check's instructions), with
/// secrets drawn from std's `RandomState` (the OS's randomness): one for the process and one for
/// each store. Keys are caller values (IPs, header values); the secrets keep a caller from
/// choosing keys that collide, which is what `SipHash` guarded against.
pub(super) fn key_hasher() -> KeyHasher {
    use std::hash::RandomState;
    use std::sync::LazyLock;
    static SHARED: LazyLock<foldhash::SharedSeed> =
        LazyLock::new(|| foldhash::SharedSeed::from_u64(RandomState::new().hash_one(0_u8)));
    foldhash::fast::SeedableRandomState::with_seed(RandomState::new().hash_one(1_u8), &SHARED)
}

impl Inner {
    /// The key's hash, computed once per check: it picks the shard and the slot in its map.
    pub(super) fn hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The shard of a key's hash. From bits 32 and up: the map inside the shard indexes by the
    /// low bits and tags by the top seven, which must stay spread within one shard.
    pub(super) fn shard_of(&self, hash: u64) -> usize {
        // The mask is the shard count (a power of two, at most 64) less one: the index fits.
        usize::try_from((hash >> 32) & self.shard_mask).unwrap_or(0)
    }
}

/// A shard's lock on cache lines of its own (128 bytes: the pair the CPU's adjacent-line
/// prefetcher moves together), so that threads on different shards never write each other's
/// lines (each read lock writes its shard's lock word).
#[repr(align(128))]
pub(super) struct Padded(RwLock<Shard>);

impl Padded {
    /// An empty shard whose map hashes keys with `hasher` (the store's).
    pub(super) fn new(hasher: KeyHasher) -> Self {
        Self(RwLock::new(Shard {
            map: Map {
                table: HashTable::new(),
                hasher,
            },
            inserts_since_sweep: 0,
            len_after_sweep: 0,
            next_idle: AtomicU64::new(0),
        }))
    }
}

impl std::ops::Deref for Padded {
    type Target = RwLock<Shard>;

    fn deref(&self) -> &RwLock<Shard> {
        &self.0
    }
}

/// One shard: its entries and its amortised-sweep bookkeeping.
pub(super) struct Shard {
    pub(super) map: Map,
    inserts_since_sweep: usize,
    /// Entries left by the last sweep: the next one comes after as many inserts.
    len_after_sweep: usize,
    /// No entry becomes idle before this instant (a lower bound): sweeping earlier is a no-op,
    /// so an idle janitor or a shard full of live entries costs nothing to sweep. Atomic: a
    /// fast write (under the read lock) lowers it too.
    pub(super) next_idle: AtomicU64,
}

impl Shard {
    /// The live state under `key`, if any (under the write lock).
    pub(super) fn base(&self, hash: u64, key: &str, now: u64) -> Option<Cow<'_, State>> {
        self.map
            .get(hash, key)
            .filter(|c| c.live(now))
            .map(Cell::state)
    }

    /// Rewrites the entry under `key` if it was stamped in the future ([`Entry::normalize`]).
    pub(super) fn normalize(&mut self, hash: u64, key: &str, p: &Params, now: u64) {
        if let Some(cell) = self.map.get_mut(hash, key)
            && cell.normalize(p, now)
        {
            let idle_at = cell.idle_at();
            self.note_idle(idle_at);
        }
    }

    /// Lowers the sweep mark to `idle_at` (an entry that becomes idle then was written).
    pub(super) fn note_idle(&self, idle_at: u64) {
        lower(&self.next_idle, idle_at);
    }

    /// Removes idle entries; returns how many.
    pub(super) fn sweep(&mut self, now: u64) -> usize {
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
    pub(super) fn commit(&mut self, hash: u64, key: &str, entry: Entry) {
        self.note_idle(entry.idle_at);
        match self.map.get_mut(hash, key) {
            Some(held) => held.set(entry),
            None => self.map.insert(hash, key, entry),
        }
    }

    /// Adds a key that is not held yet, in room made by [`Shard::make_room`].
    pub(super) fn insert(&mut self, hash: u64, key: &str, entry: Entry) {
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
    pub(super) fn make_room(
        &mut self,
        now: u64,
        max: usize,
        new_keys: impl Fn(&Map) -> usize,
    ) -> bool {
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

/// A shard's entries by key. A check hashes its key once, for the shard and the slot alike;
/// growing the table hashes the keys again with the store's hasher (rare, amortised), so that
/// an entry is its key and its cell alone and fills one cache line: a check at 100,000 keys
/// misses on one line for it, not two.
pub(super) struct Map {
    table: HashTable<Held>,
    hasher: KeyHasher,
}

/// A key and its cell, on a cache line of their own.
#[repr(align(64))]
struct Held {
    key: Box<str>,
    cell: Cell,
}

const _: () = assert!(size_of::<Held>() == 64, "a map entry fills one cache line");

impl Map {
    pub(super) fn get(&self, hash: u64, key: &str) -> Option<&Cell> {
        self.table.find(hash, |h| &*h.key == key).map(|h| &h.cell)
    }

    pub(super) fn get_mut(&mut self, hash: u64, key: &str) -> Option<&mut Cell> {
        self.table
            .find_mut(hash, |h| &*h.key == key)
            .map(|h| &mut h.cell)
    }

    /// Adds a key the map does not hold.
    fn insert(&mut self, hash: u64, key: &str, entry: Entry) {
        let hasher = &self.hasher;
        self.table.insert_unique(
            hash,
            Held {
                key: key.into(),
                cell: Cell::new(entry),
            },
            |h| hasher.hash_one(&*h.key),
        );
    }

    pub(super) fn remove(&mut self, hash: u64, key: &str) {
        if let Ok(found) = self.table.find_entry(hash, |h| &*h.key == key) {
            found.remove();
        }
    }

    fn retain(&mut self, mut keep: impl FnMut(&str, &Cell) -> bool) {
        self.table.retain(|h| keep(&h.key, &h.cell));
    }

    #[cfg(test)]
    pub(super) fn iter(&self) -> impl Iterator<Item = (&str, &Cell)> {
        self.table.iter().map(|h| (&*h.key, &h.cell))
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Cell> {
        self.table.iter().map(|h| &h.cell)
    }

    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    fn capacity(&self) -> usize {
        self.table.capacity()
    }

    fn shrink_to(&mut self, min_capacity: usize) {
        let hasher = &self.hasher;
        self.table
            .shrink_to(min_capacity, |h| hasher.hash_one(&*h.key));
    }
}

/// Lowers a shard's sweep mark to `idle_at`: a load, and a write only when it moves.
pub(super) fn lower(next_idle: &AtomicU64, idle_at: u64) {
    if idle_at < next_idle.load(Ordering::Relaxed) {
        next_idle.fetch_min(idle_at, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::cell::Entry;
    use super::super::testing::{
        HOUR, MS, entry, keys_in_shard, keys_per_shard, one, policy, snapshot, try_one,
    };
    use crate::algorithm::Algorithm;
    use crate::decision::Verdict;
    use crate::error::StoreError;
    use crate::policy::Policy;
    use crate::store::{Check, ManualClock, MemoryStore};

    /// Growing a shard's table and shrinking it after a sweep hash every key again: each
    /// key is still found where its checks look (a key lost would admit its caller afresh).
    #[test]
    fn keys_are_found_after_their_table_grows_and_shrinks() {
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(clock.clone());
        let minute = Policy::new(Algorithm::Fixed, 1, Duration::from_secs(60)).unwrap();
        let second = Policy::new(Algorithm::Gcra, 1, Duration::from_secs(1)).unwrap();
        let admitted = |key: &str, p: &Policy| {
            store
                .check_now(&[Check::new(key, p)])
                .unwrap()
                .is_admitted()
        };
        let keys: Vec<String> = (0..20_000).map(|i| format!("k{i}")).collect();
        let brief: Vec<String> = (0..100_000).map(|i| format!("b{i}")).collect();
        for key in &keys {
            assert!(admitted(key, &minute));
        }
        // Many keys that go idle in a second make the tables grow, then sweeps empty them
        // and shrink the tables.
        for key in &brief {
            assert!(admitted(key, &second));
        }
        clock.advance(Duration::from_secs(2));
        assert_eq!(store.sweep(), brief.len());
        for key in &keys {
            assert!(!admitted(key, &minute), "{key} was lost");
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
            // gcra: the arrival time, moved by the fast path's writes (2 per second: 500 ms a
            // unit; the second and third calls find the key held)
            (
                policy(Algorithm::Gcra, 2, 1000 * MS, 2),
                1,
                vec![0, 0, 600],
                1500 * MS,
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
        for shard in 0..store.inner.shards.len() {
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

    /// The key bound is the one asked rounded up to a multiple of 64, whatever the machine's
    /// shard count (which divides 64), and a bound too large to round is the largest multiple.
    #[test]
    fn the_key_bound_is_the_same_on_every_machine() {
        for asked in [0, 1, 63, 64, 65, 1000, 1 << 22, (1 << 40) + 1] {
            let bound = MemoryStore::new().with_max_keys(asked).max_keys();
            assert_eq!(bound % 64, 0, "{asked}");
            assert!(
                bound >= asked.max(1) && bound - asked.max(1) < 64,
                "{asked}: {bound}"
            );
        }
        for asked in [usize::MAX - 64, usize::MAX] {
            let bound = MemoryStore::new().with_max_keys(asked).max_keys();
            assert_eq!(bound, usize::MAX / 64 * 64, "{asked}");
        }
    }

    /// A stacked call whose new keys do not all fit writes none of them, and touches none of
    /// its known keys; a call that is rejected anyway, or one on known keys only, needs no room.
    #[test]
    fn a_stacked_call_whose_new_keys_do_not_fit_writes_nothing() {
        let clock = ManualClock::new();
        let store = keys_per_shard(MemoryStore::with_clock(clock.clone()), 2);
        let bound = 2 * store.inner.shards.len();
        let zero = keys_in_shard(&store, 0, "zero:", 3);
        let (a, b, c) = (&zero[0], &zero[1], &zero[2]);
        let other = &keys_in_shard(&store, 1, "one:", 1)[0];
        let quota = policy(Algorithm::Fixed, 3, HOUR, 3);
        let stacked = |keys: &[&String]| {
            let checks: Vec<Check<'_>> = keys.iter().map(|k| Check::new(k, &quota)).collect();
            store.check_now(&checks)
        };
        let full = |r: Result<Verdict, StoreError>| matches!(r, Err(StoreError::Full { max_keys }) if max_keys == bound);

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
        let store = keys_per_shard(MemoryStore::with_clock(clock.clone()), 2);
        let keys = keys_in_shard(&store, store.inner.shards.len() - 1, "last:", 3);
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
}
