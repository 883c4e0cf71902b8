//! The check engine: one limit (the read-lock fast path or the write lock), many limits as one
//! all-or-nothing call, and the read-only peek.

use std::sync::RwLockWriteGuard;
use std::sync::atomic::Ordering;

use super::blocks::blocked_decision;
use super::cell::{Cell, Entry};
use super::map::{Map, Shard, lower};
use super::packed::{Packed, PackedState};
use super::receipts::sliding_first;
use super::{Inner, read, write};
use crate::algorithm::{self, Evaluation, Params, Receipt, State};
use crate::algorithm::{bucket, fixed, gcra, sliding_counter};
use crate::decision::{Decision, Verdict};
use crate::error::StoreError;
use crate::store::Check;

impl Inner {
    /// The state of each limit of `checks` at `now`, taking nothing (blocks included).
    pub(super) fn peek(&self, checks: &[Check<'_>], now: u64) -> Verdict {
        let decisions = checks
            .iter()
            .map(|c| {
                let p = Params::of(c.policy);
                let capacity = c.policy.capacity();
                let hash = self.hash(c.key);
                let shard = read(&self.shards[self.shard_of(hash)]);
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

    pub(super) fn max_per_shard(&self) -> usize {
        self.max_per_shard.load(Ordering::Relaxed)
    }

    /// The error of a call whose new key found its shard full of live entries.
    pub(super) fn full(&self) -> StoreError {
        StoreError::Full {
            max_keys: self.max_per_shard().saturating_mul(self.shards.len()),
        }
    }

    /// One limit: one shard, no allocation but a new key's. A key already held in a packed
    /// form takes the fast path ([`Inner::check_packed`], the shard's read lock); a new key, a
    /// sliding log or a key changing algorithm, the shard's write lock.
    pub(super) fn check_one(&self, check: &Check<'_>) -> Result<Decision, StoreError> {
        let p = check.policy.params();
        let algorithm = check.policy.algorithm();
        let capacity = check.policy.capacity();
        let hash = self.hash(check.key);
        let shard = &self.shards[self.shard_of(hash)];
        if self.fast.load(Ordering::Relaxed)
            && let Some(form) = Packed::of(algorithm)
        {
            let guard = read(shard);
            if let Some(cell) = guard.map.get(hash, check.key)
                && cell.packed() == Some(form)
                && let Some(decision) = self.check_packed(&guard, cell, form, p, capacity)
            {
                return Ok(decision);
            }
        }
        let mut guard = write(shard);
        let shard = &mut *guard;
        let now = self.now();
        // One lookup for a known key: evaluate and write through the same reference.
        if let Some(cell) = shard.map.get_mut(hash, check.key) {
            // A restamped entry can go idle sooner: the shard's sweep mark follows it.
            if cell.normalize(p, now) {
                lower(&shard.next_idle, cell.idle_at());
            }
            // A sliding log changes in place: no copy of it per admission.
            if let Some((idle_at, state)) = cell.unpacked_mut() {
                let live = now < *idle_at;
                if let Some(e) = algorithm::evaluate_in_place(algorithm, state, live, p, now) {
                    if !e.admitted {
                        return Ok(e.untaken(capacity, false, e.retry_us));
                    }
                    *idle_at = algorithm::idle_at(state, p);
                    lower(&shard.next_idle, *idle_at);
                    return Ok(e.taken(capacity));
                }
            }
            let state = cell.state();
            let base = cell.live(now).then_some(&*state);
            let (e, next) = algorithm::evaluate(algorithm, base, p, now);
            drop(state);
            return Ok(match next {
                Some(state) => {
                    let entry = Entry::new(state, p);
                    lower(&shard.next_idle, entry.idle_at);
                    cell.set(entry);
                    e.taken(capacity)
                }
                None => e.untaken(capacity, false, e.retry_us),
            });
        }
        let (e, next) = algorithm::evaluate(algorithm, None, p, now);
        match next {
            Some(state) => {
                if !shard.make_room(now, self.max_per_shard(), |_| 1) {
                    return Err(self.full());
                }
                shard.insert(hash, check.key, Entry::new(state, p));
                Ok(e.taken(capacity))
            }
            // A rejection writes nothing, so it needs no room.
            None => Ok(e.untaken(capacity, false, e.retry_us)),
        }
    }

    /// The fast path of one limit on a held, packed key, under the shard's read lock: the same
    /// rule ([`algorithm::evaluate`], after [`algorithm::normalize`]) on a consistent read of
    /// the cell, written back by a compare-and-swap of its sequence, or of its one word for a
    /// fixed window or GCRA ([`Cell::measure_and_replace`]); a write that loses the race
    /// evaluates again on the state that won, at a fresh time. `None` (nothing written) when
    /// the state to write does not fit the cell's one-word form: the call goes to the write
    /// lock.
    fn check_packed(
        &self,
        shard: &Shard,
        cell: &Cell,
        form: Packed,
        p: &Params,
        capacity: u64,
    ) -> Option<Decision> {
        match form {
            Packed::Fixed => self.check_packed_as::<fixed::Window>(shard, cell, p, capacity),
            Packed::Bucket => self.check_packed_as::<bucket::Level>(shard, cell, p, capacity),
            Packed::Gcra => self.check_packed_as::<gcra::Tat>(shard, cell, p, capacity),
            Packed::Counter => {
                self.check_packed_as::<sliding_counter::Counters>(shard, cell, p, capacity)
            }
        }
    }

    /// [`Inner::check_packed`] on the form's own state type: the steps of the slow path's
    /// [`Entry::normalize`] and [`algorithm::evaluate`], with no `State` to dispatch on.
    #[inline]
    fn check_packed_as<S: PackedState>(
        &self,
        shard: &Shard,
        cell: &Cell,
        p: &Params,
        capacity: u64,
    ) -> Option<Decision> {
        let (decision, written) = cell.measure_and_replace::<S, _>(
            || self.now(),
            |mut state, mut idle_at, now| {
                // A stamp ahead of the clock is brought back to it (Entry::normalize).
                let normalized = now < idle_at && state.normalize(p, now);
                if normalized {
                    idle_at = state.idle_at(p);
                }
                let base = (now < idle_at).then_some(&state);
                let (e, next) = S::evaluate(base, p, now);
                match next {
                    Some(next) => (
                        e.taken(capacity),
                        Some((next, S::idle_after(next, &e, now, p))),
                    ),
                    None => (
                        e.untaken(capacity, false, e.retry_us),
                        normalized.then_some((state, idle_at)),
                    ),
                }
            },
        )?;
        if let Some(idle_at) = written {
            shard.note_idle(idle_at);
        }
        Some(decision)
    }

    /// Several limits as one call: lock their shards in ascending order, apply the limits one
    /// after the other (a key named twice sees what the call's earlier limits took), and write
    /// only if all admit and every new key fits. With `receipts`, an admitted call's receipt
    /// per limit is pushed there (for [`MemoryStore::take_now`]); `holder` is the call's id
    /// (empty: none), which names its concurrency leases.
    pub(super) fn check_many(
        &self,
        checks: &[Check<'_>],
        receipts: Option<&mut Vec<Receipt>>,
        holder: &str,
    ) -> Result<Vec<Decision>, StoreError> {
        let params: Vec<Params> = checks.iter().map(|c| Params::of(c.policy)).collect();
        let (mut slots, slot_of) = self.slots_of(checks);
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
            let (e, next) = algorithm::evaluate_for(c.policy.algorithm(), base, p, now, holder);
            drop(held);
            if receipts.is_some() {
                firsts.push(sliding_first(next.as_ref(), p));
            }
            if next.is_some() {
                slot.pending = next;
            }
            outcomes.push(e);
        }
        if !outcomes.iter().all(|e| e.admitted) {
            let locked = Locked {
                order: &order,
                guards: &guards,
                now,
            };
            return Ok(locked.refusals(checks, &params, &slots, &slot_of, &outcomes));
        }

        // Room for every new key first, in every shard: all of the call is written or none of
        // it. Making room only sweeps idle entries, which changes no answer.
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
            push_receipts(receipts, checks, &outcomes, &firsts, now);
        }
        Ok(checks
            .iter()
            .zip(&outcomes)
            .map(|(c, e)| e.taken(c.policy.capacity()))
            .collect())
    }

    /// The distinct keys ("slots") of `checks`, each with its shard, and the slot of each check.
    #[inline]
    fn slots_of<'k>(&self, checks: &[Check<'k>]) -> (Vec<Slot<'k>>, Vec<usize>) {
        let mut slots: Vec<Slot<'k>> = Vec::with_capacity(checks.len());
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
                    shard: self.shard_of(hash),
                    pending: None,
                    last: n,
                });
                slots.len() - 1
            };
            slot_of.push(i);
        }
        (slots, slot_of)
    }
}

/// The receipt of each limit of an admitted call, pushed to `receipts` (for
/// [`MemoryStore::take_now`]).
///
/// [`MemoryStore::take_now`]: super::MemoryStore::take_now
fn push_receipts(
    receipts: &mut Vec<Receipt>,
    checks: &[Check<'_>],
    outcomes: &[Evaluation],
    firsts: &[u64],
    now: u64,
) {
    receipts.extend(
        outcomes
            .iter()
            .zip(firsts)
            .zip(checks)
            .map(|((e, &first), c)| Receipt {
                at_us: now,
                reset_us: e.after_reset_us,
                first,
                cost: c.policy.cost(),
            }),
    );
}

/// The shards a call of several limits holds write-locked ([`Inner::check_many`]): their
/// indices, ascending, each at the index of its guard, and the call's clock.
struct Locked<'a, 's> {
    order: &'a [usize],
    guards: &'a [RwLockWriteGuard<'s, Shard>],
    now: u64,
}

impl Locked<'_, '_> {
    /// The decisions of a refused call. Nothing is written: every decision reports the state
    /// as it is now, with what this limit's own evaluation in the call found.
    fn refusals(
        &self,
        checks: &[Check<'_>],
        params: &[Params],
        slots: &[Slot<'_>],
        slot_of: &[usize],
        outcomes: &[Evaluation],
    ) -> Vec<Decision> {
        checks
            .iter()
            .zip(params)
            .zip(slot_of)
            .zip(outcomes)
            .map(|(((c, p), &s), o)| {
                let slot = &slots[s];
                let guard = self.order.binary_search(&slot.shard).unwrap_or(0);
                let base = self.guards[guard].base(slot.hash, c.key, self.now);
                let (now_e, _) =
                    algorithm::evaluate(c.policy.algorithm(), base.as_deref(), p, self.now);
                now_e.untaken(c.policy.capacity(), o.admitted, o.retry_us)
            })
            .collect()
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use super::super::cell::Entry;
    use super::super::packed::{WINDOW_END_MS, WINDOW_MAX_COUNT};
    use super::super::testing::{HOUR, MS, entry, one, policy, snapshot};
    use crate::algorithm::Algorithm;
    use crate::algorithm::State;
    use crate::policy::Policy;
    use crate::store::{Check, Clock, ManualClock, MemoryStore};

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
            }) => log.runs().collect::<Vec<_>>(),
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

    /// After the clock goes back a minute, state stamped in the future is treated as stamped
    /// now: buckets do not stay empty, nor logs full, for the whole skew while answering a
    /// `retry_after` of one period or less.
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
                // sliding counter's window weighs on through the next one; a bucket cannot tell
                // a stamp ahead from a settled debt, and brings its level back to a full bucket
                // and one capacity of debt (4 calls at 1 per 5 s: the next waits 15 s).
                let most = if algo == Algorithm::SlidingCounter {
                    secs(20)
                } else if matches!(algo, Algorithm::Leaky | Algorithm::Token) {
                    secs(15) + Duration::from_millis(1)
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

    /// One call naming a key twice applies both checks to it, in order.
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

    #[test]
    fn stacked_shards_are_locked_in_order_once() {
        let store = MemoryStore::with_clock(ManualClock::new());
        let p = policy(Algorithm::Token, 100, 1000 * MS, 100);
        // Many keys, several in the same shard (at most 64 shards, 300 keys).
        let keys: Vec<String> = (0..300).map(|i| format!("key{i}")).collect();
        let checks: Vec<Check<'_>> = keys.iter().map(|k| Check::new(k, &p)).collect();
        let v = store.check_now(&checks).unwrap();
        assert!(v.is_admitted());
        assert!(v.decisions().iter().all(|d| d.remaining == 99));
        assert_eq!(store.len(), 300);
    }

    /// The fast path stores every word its form uses: along checks that move every number of
    /// each packed state (a window's count and end, a bucket's level and millisecond, a tat, a
    /// sliding counter's window and both of its counts), the fast store holds, after each
    /// check, exactly the entry the locked store holds.
    #[test]
    fn the_fast_path_writes_the_whole_state() {
        let secs = Duration::from_secs;
        for algo in [
            Algorithm::Fixed,
            Algorithm::Token,
            Algorithm::Leaky,
            Algorithm::Gcra,
            Algorithm::SlidingCounter,
        ] {
            let clock = SettableClock::default();
            let fast = MemoryStore::with_clock(clock.clone());
            let locked = MemoryStore::with_clock(clock.clone()).with_fast_path(false);
            let p = policy(algo, 5, 2000 * MS, 5);
            for at in [
                0, 100, 700, 2_100, 2_300, 2_350, 2_360, 2_370, 4_500, 4_600, 9_000,
            ] {
                clock.set(secs(100) + at * MS);
                assert_eq!(
                    one(&fast, "k", &p),
                    one(&locked, "k", &p),
                    "{algo} at {at} ms"
                );
                assert_eq!(entry(&fast, "k"), entry(&locked, "k"), "{algo} at {at} ms");
            }
        }
    }

    /// A fixed window is one word while its count and end fit ([`WINDOW_MAX_COUNT`] units,
    /// [`WINDOW_END_MS`] of the store's clock); past either, the fast path leaves it to the
    /// write lock, which keeps it unpacked, and a later window that fits is packed again. Every
    /// answer and entry is the locked store's.
    #[test]
    fn windows_past_the_word_are_decided_as_the_locked_path_decides_them() {
        let ms = |n: u64| Duration::from_millis(n);
        // Half the most a word counts, rounded up: the second call's count is past it.
        let half = WINDOW_MAX_COUNT / 2 + 1;
        let cases = [
            // A count past the word's: the second call's.
            (
                policy(Algorithm::Fixed, 5 * half, 2000 * MS, 1),
                half,
                ms(100),
            ),
            // A window ending past the word's last millisecond.
            (
                policy(Algorithm::Fixed, 5, 2000 * MS, 5),
                1,
                ms(WINDOW_END_MS - 3_000),
            ),
        ];
        for (p, cost, start) in cases {
            let p = p.with_cost(cost).unwrap();
            let clock = SettableClock::default();
            let fast = MemoryStore::with_clock(clock.clone());
            let locked = MemoryStore::with_clock(clock.clone()).with_fast_path(false);
            for (i, at) in [0, 10, 20, 30, 40, 2_100, 2_110, 2_120, 4_200, 4_210]
                .into_iter()
                .enumerate()
            {
                clock.set(start + ms(at));
                let (a, b) = (one(&fast, "k", &p), one(&locked, "k", &p));
                assert_eq!(a, b, "{p:?} call {i} at {at} ms");
                assert_eq!(entry(&fast, "k"), entry(&locked, "k"), "{p:?} call {i}");
            }
        }
    }
}
