//! Take/refund receipts: what a call taken with [`crate::Store::take`] holds of each limit,
//! kept by call id until it is refunded, forgotten or expired.

use super::cell::Entry;
use super::{Inner, MemoryStore, lock, write};
use crate::algorithm::{self, Params, Receipt, State};
use crate::decision::Verdict;
use crate::error::StoreError;
use crate::store::Check;

/// Receipts by call id: when they expire (µs) and one per limit of the call, with the key it
/// was taken from; and when the map may next be swept (µs), so that a map full of live
/// receipts is not scanned on every take.
#[derive(Default)]
pub(super) struct Receipts {
    by_call: std::collections::HashMap<Box<str>, (u64, Vec<Taken>)>,
    next_sweep: u64,
}

/// What a call took of one limit: the key and the receipt. A refund or settle that names
/// another key for that limit finds no receipt (it gives nothing back), as on Redis, where a
/// receipt's name holds its key.
type Taken = (Box<str>, Receipt);

/// The receipt `taken` holds for `check`'s key, if that is the key it was taken from.
fn receipt_for<'a>(taken: &'a Taken, check: &Check<'_>) -> Option<&'a Receipt> {
    (*taken.0 == *check.key).then_some(&taken.1)
}

impl Receipts {
    /// Keeps `receipts` of the call `call_id` until `expires`. Receipts live only while their
    /// call runs (a settled call refunds or forgets them), so a full table means as many calls
    /// in flight: the expired ones are swept first (at most every 100 ms), and if the table is
    /// still full, the eighth of it that expires soonest is dropped (those calls stay counted
    /// whatever their outcome: they fail closed). A new take always gets its receipt: a flood
    /// of calls never turns another caller's refund into a count.
    fn insert(&mut self, call_id: &str, expires: u64, receipts: Vec<Taken>, now: u64) {
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

impl MemoryStore {
    /// [`Store::take`](crate::Store::take) without a future: [`MemoryStore::check_now`], and when
    /// the call is admitted, a receipt per limit under `call_id` (kept by the store, at most 10
    /// seconds).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, store::Check, MemoryStore, Policy};
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
        let verdict = Verdict::new(
            self.inner
                .check_many(checks, Some(&mut receipts), call_id)?,
        );
        if verdict.is_admitted() && receipts.len() == checks.len() {
            let now = self.inner.now();
            let ttl = receipts
                .iter()
                .map(|r| r.reset_us)
                .max()
                .unwrap_or(0)
                .min(RECEIPT_TTL_US);
            let taken = checks
                .iter()
                .zip(receipts)
                .map(|(c, r)| (c.key.into(), r))
                .collect();
            lock(&self.inner.receipts).insert(call_id, now.saturating_add(ttl), taken, now);
        }
        Ok(verdict)
    }

    /// [`Store::forget`](crate::Store::forget) without a future: drops the receipts of the call
    /// taken under `call_id`, giving nothing back (the call stays counted).
    pub fn forget_now(&self, call_id: &str) {
        lock(&self.inner.receipts).by_call.remove(call_id);
    }

    /// How many calls hold receipts now (calls taken with [`Store::take`](crate::Store::take) and
    /// not yet refunded or forgotten, expired ones included until a sweep). For tests and
    /// diagnostics.
    pub fn receipts_held(&self) -> usize {
        lock(&self.inner.receipts).by_call.len()
    }

    /// [`Store::refund`](crate::Store::refund) without a future: gives back what the call taken
    /// under `call_id` still holds of its first `checks.len()` limits, at most once (the receipts
    /// are removed).
    pub fn refund_now(&self, checks: &[Check<'_>], call_id: &str) {
        // A concurrency limit gives back by its holder's name, receipt or not.
        self.release_now(checks, call_id);
        let Some((expires, receipts)) = lock(&self.inner.receipts).by_call.remove(call_id) else {
            return;
        };
        let now = self.inner.now();
        if now >= expires {
            return;
        }
        for (check, taken) in checks.iter().zip(&receipts) {
            if let Some(receipt) = receipt_for(taken, check) {
                self.inner.refund_one(check, receipt, now);
            }
        }
    }
}

impl MemoryStore {
    /// [`Store::settle`](crate::Store::settle) without a future: settles the call taken under
    /// `call_id` to the units it used, `actual[i]` for limit `i` (less than the estimate: the
    /// difference back by its receipt; more: the excess charged), and drops its receipts.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, store::Check, MemoryStore, Policy};
    ///
    /// let store = MemoryStore::new();
    /// let minute = Policy::new(Algorithm::Fixed, 10_000, Duration::from_secs(60))?;
    /// let estimate = minute.with_cost(1_000)?;
    /// let checks = [Check::new("tokens:alice", &estimate)];
    /// assert!(store.take_now(&checks, "a1")?.is_admitted());
    /// store.settle_now(&checks, "a1", &[250])?; // it used 250: 750 back
    /// assert!(store.take_now(&checks, "a2")?.is_admitted());
    /// store.settle_now(&checks, "a2", &[9_000])?; // it used 9,000: 8,000 more charged
    /// let read = store.peek_now(&[Check::new("tokens:alice", &minute)]);
    /// assert_eq!(read.decisions()[0].remaining, 750);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreError::Full`] when an excess falls on a key that is gone and the store has no
    /// room for it (the excess is then not charged).
    pub fn settle_now(
        &self,
        checks: &[Check<'_>],
        call_id: &str,
        actual: &[u64],
    ) -> Result<(), StoreError> {
        crate::store::settle_arguments(checks, actual)?;
        let held = lock(&self.inner.receipts).by_call.remove(call_id);
        let now = self.inner.now();
        let receipts = held.filter(|(expires, _)| now < *expires).map(|(_, r)| r);
        let mut result = Ok(());
        for (i, (check, &actual)) in checks.iter().zip(actual).enumerate() {
            let receipt = receipts
                .as_ref()
                .and_then(|r| r.get(i))
                .and_then(|taken| receipt_for(taken, check));
            if let Err(e) = self.inner.settle_one(check, receipt, actual, now) {
                result = Err(e);
            }
        }
        result
    }
}

impl Inner {
    /// Settles one limit of a call by the rule of [`algorithm::settle`].
    fn settle_one(
        &self,
        check: &Check<'_>,
        receipt: Option<&Receipt>,
        actual: u64,
        now: u64,
    ) -> Result<(), StoreError> {
        let p = Params::of(check.policy);
        if actual == receipt.map_or(p.cost, |r| r.cost) {
            return Ok(());
        }
        let algorithm = check.policy.algorithm();
        let hash = self.hash(check.key);
        let mut guard = write(&self.shards[self.shard_of(hash)]);
        let shard = &mut *guard;
        if let Some(cell) = shard.map.get_mut(hash, check.key) {
            let state = cell.live(now).then(|| cell.state().into_owned());
            let had = state.is_some();
            let entry = match algorithm::settle(algorithm, state, receipt, &p, actual, now) {
                Some(state) => Entry::new(state, &p),
                None if had => Entry {
                    idle_at: now,
                    state: cell.state().into_owned(),
                },
                None => return Ok(()),
            };
            let idle_at = entry.idle_at;
            cell.set(entry);
            shard.note_idle(idle_at);
            return Ok(());
        }
        let Some(state) = algorithm::settle(algorithm, None, receipt, &p, actual, now) else {
            return Ok(());
        };
        if !shard.make_room(now, self.max_per_shard(), |_| 1) {
            return Err(self.full());
        }
        shard.insert(hash, check.key, Entry::new(state, &p));
        Ok(())
    }

    /// Gives back what one limit of a call still holds, by its receipt: the rule is
    /// [`algorithm::refund`] (the scripts' `refund`).
    fn refund_one(&self, check: &Check<'_>, receipt: &Receipt, now: u64) {
        let p = Params::of(check.policy);
        let hash = self.hash(check.key);
        let mut guard = write(&self.shards[self.shard_of(hash)]);
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
}

/// The sliding log's first score of the call that left `next` (what its refund removes); 0
/// for the other algorithms.
pub(super) fn sliding_first(next: Option<&State>, p: &Params) -> u64 {
    match next {
        Some(State::Sliding(log)) => log.runs().next_back().map_or(0, |(start, len)| {
            u64::try_from(start)
                .unwrap_or(0)
                .saturating_add(len)
                .saturating_sub(p.cost)
        }),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::testing::{MS, entry, policy};
    use crate::algorithm::Algorithm;
    use crate::algorithm::{self, Params};
    use crate::store::{Check, ManualClock, MemoryStore};

    /// A refund gives back what the take held, of the limits named, once, and only while the
    /// receipt lives.
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
}
