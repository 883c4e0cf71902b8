//! The lease step of a check ([`crate::lease`]): a hot key's calls served from units this
//! process took a lease at a time.
//!
//! Per key, a [`Slot`] keeps the lease the process holds (if any) and the demand it saw since
//! its last take. A call takes a unit from the lease under the slot's lock (no await); a call
//! that finds none waits for the slot's refill lock, so that one call per key and process
//! takes the next lease while the others wait for it, then serve from it. The refilling call
//! retires the old lease (what it did not use goes back by receipt, in the background) and
//! takes `k` units as one take of cost `k`; at `k` = the call's cost it makes the ordinary
//! check instead.
//!
//! An admin call ([`RateLimiter::block`], [`RateLimiter::reset`]) ends the key's lease at once
//! (`block_leases`, `resetting_leases`) and moves the slot's epoch on: a take that was in flight
//! then is never held, and a lease taken before a reset gives nothing back after it (its units
//! were counted in the state the reset deleted). A reset waits for the returns in flight first.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

use tokio::time::Instant;

use super::{Asked, RateLimiter};
use crate::algorithm::Algorithm;
use crate::decision::{Decision, Verdict};
use crate::error::StoreError;
use crate::lease::Lease;
use crate::limit::Limit;
use crate::policy::Policy;
use crate::store::Check;

/// The keys a limiter keeps lease state for. A key past it (a flood of minted keys on a leased
/// limit) is checked at the store call by call, exactly as without leases.
const MAX_KEYS: usize = 4096;

/// How long a key with no lease keeps its state before a full table may drop it, and the
/// least time between two such sweeps (a full table of busy keys is not scanned per call).
const IDLE: Duration = Duration::from_secs(2);

/// How long a key whose last take no replica acknowledged is checked call by call (no lease)
/// before trying again: a master that lost its replica (the one a failover promoted) would
/// otherwise cost every take the wait.
const UNREPLICATED: Duration = Duration::from_secs(1);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The lease state of a limiter: one slot per leased key, and the units unused in all of them.
#[derive(Default)]
pub(super) struct Leases {
    table: RwLock<Table>,
    held: AtomicU64,
}

#[derive(Default)]
struct Table {
    slots: HashMap<Box<str>, Arc<Slot>>,
    swept_at: Option<Instant>,
}

impl Leases {
    /// The slot of `key`, or `None` when the table is full of keys in use.
    fn slot(&self, key: &str, now: Instant) -> Option<Arc<Slot>> {
        // Calls on known keys share the read lock; a new key takes the write lock.
        if let Some(slot) = self
            .table
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .slots
            .get(key)
        {
            return Some(Arc::clone(slot));
        }
        let mut table = self.table.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = table.slots.get(key) {
            return Some(Arc::clone(slot));
        }
        if table.slots.len() >= MAX_KEYS {
            if table.swept_at.is_some_and(|t| now.duration_since(t) < IDLE) {
                return None;
            }
            table.swept_at = Some(now);
            // A slot someone else holds (a call, a take, a return, a lease's timer, a reset)
            // is in use: dropped, its key would get a second slot that the holder's
            // bookkeeping never sees (a reset's epoch, a lease taken across it).
            table
                .slots
                .retain(|_, slot| Arc::strong_count(slot) > 1 || !lock(&slot.state).idle(now));
            if table.slots.len() >= MAX_KEYS {
                return None;
            }
        }
        let slot = Arc::new(Slot::default());
        table.slots.insert(key.into(), Arc::clone(&slot));
        Some(slot)
    }

    /// Units held in leases now.
    pub(super) fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// The slot of `key`, made even when the table is full: the keys of an admin call (a
    /// reset), which must stay in the table while it runs, so that no lease of them is taken
    /// or held meanwhile. A reset names a few keys; the sweep drops them once idle.
    fn slot_of_admin(&self, key: &str) -> Arc<Slot> {
        if let Some(slot) = self.existing(key) {
            return slot;
        }
        let mut table = self.table.write().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(table.slots.entry(key.into()).or_default())
    }

    /// The slot of `key` if it has one.
    fn existing(&self, key: &str) -> Option<Arc<Slot>> {
        let table = self.table.read().unwrap_or_else(PoisonError::into_inner);
        table.slots.get(key).map(Arc::clone)
    }
}

/// A reset of leased keys running ([`RateLimiter::resetting_leases`]): until it is dropped,
/// no lease of those keys is served, taken or held, and no return of unused units runs.
/// Dropped, it ends the leases taken meanwhile (giving nothing back) and lets leases start
/// again from the fresh state.
pub(super) struct Resetting {
    limiter: RateLimiter,
    keys: Vec<(Arc<Slot>, &'static str, String)>,
    /// The returns of unused units on the keys, paused until the reset is done.
    paused_returns: Vec<tokio::sync::OwnedRwLockWriteGuard<()>>,
}

impl Drop for Resetting {
    fn drop(&mut self) {
        for (slot, scope, key) in &self.keys {
            let retired = {
                let mut state = slot.lock();
                state.resetting -= 1;
                state.epoch += 1;
                state.room = None;
                state.held.take()
            };
            if let Some(held) = retired {
                self.limiter.retire(slot, scope, key, held, true);
            }
        }
        // The returns held back judge their leases by the epoch set above.
        self.paused_returns.clear();
    }
}

/// One key's lease and demand.
#[derive(Default)]
struct Slot {
    state: Mutex<State>,
    /// Held by the one call that takes the next lease for this key (and by its task).
    refill: Arc<tokio::sync::Mutex<()>>,
    /// Read by each return of unused units while it runs, written by a reset while it runs:
    /// a return lands before the reset or is judged after it (by the epoch), never on top of
    /// the fresh state.
    returns: Arc<tokio::sync::RwLock<()>>,
}

#[derive(Default)]
struct State {
    held: Option<Held>,
    /// Units asked for since `since` (served from the lease or not): the rate `k` follows.
    demand: u64,
    since: Option<Instant>,
    /// The units of the last take (the next is at most twice as many).
    last_k: u64,
    /// The units the store said were left at its last answer: a take never asks for more.
    room: Option<u64>,
    /// Until then, no lease: the last take was not replicated in time.
    unreplicated_until: Option<Instant>,
    touched: Option<Instant>,
    /// Moved on by every admin call on the key: a lease whose epoch is older was taken before
    /// one, and is neither held nor given back.
    epoch: u64,
    /// Resets of the key running now: no lease is served, taken or held meanwhile.
    resetting: u32,
}

/// A lease this process holds.
struct Held {
    /// The limit's scope (the return's labels).
    scope: &'static str,
    /// The take's receipts.
    call_id: String,
    /// The limit's policy with the take's units as its cost.
    policy: Policy,
    /// Units not used yet.
    left: u64,
    /// Units it had when this process began to hold it (the gauge's share of it).
    granted: u64,
    /// The key's epoch when it was taken (or when a block ended it, to give back by).
    epoch: u64,
    /// When it ends: its life, never past the window its units were counted in.
    until: Instant,
    /// The store's answer to the take.
    limit: u64,
    remaining: u64,
    reset_at: Instant,
}

impl State {
    /// A call of `cost` served from the lease, if it holds enough until `now` (`unused`: the
    /// limiter's count of units unused in leases).
    fn serve(&mut self, cost: u64, now: Instant, unused: &AtomicU64) -> Option<Decision> {
        if self.resetting > 0 {
            return None;
        }
        let held = self
            .held
            .as_mut()
            .filter(|h| now < h.until && h.left >= cost)?;
        held.left -= cost;
        unused.fetch_sub(cost, Ordering::Relaxed);
        Some(Decision::new(
            true,
            held.limit,
            held.remaining.saturating_add(held.left),
            held.reset_at.saturating_duration_since(now),
            Duration::ZERO,
        ))
    }

    /// Whether the table may drop this key: no lease, no reset running, untouched for `IDLE`.
    fn idle(&self, now: Instant) -> bool {
        self.held.is_none()
            && self.resetting == 0
            && self.touched.is_none_or(|t| now.duration_since(t) >= IDLE)
    }

    /// The units of the next take for a call of `policy`'s cost: what one lease's life would
    /// serve at the rate seen since the last take, at most twice the last take (or the calls
    /// waiting now), at most what the lease allows and what the store had left; at least the
    /// cost (which means: no lease, an ordinary check).
    fn units(&mut self, lease: Lease, policy: &Policy, now: Instant) -> u64 {
        let cost = policy.cost();
        let demand = std::mem::take(&mut self.demand);
        let Some(since) = self.since.replace(now) else {
            return cost; // the first call seen: nothing to go by
        };
        if self.unreplicated_until.is_some_and(|t| now < t) {
            return cost;
        }
        let elapsed = now.duration_since(since).as_nanos().max(1);
        let ttl = lease.ttl().as_nanos();
        let want = (u128::from(demand) * ttl).div_ceil(elapsed);
        let want = u64::try_from(want).unwrap_or(u64::MAX);
        let mut k = want
            .min(self.last_k.saturating_mul(2).max(demand))
            .min(lease.units_for(policy));
        if let Some(room) = self.room {
            k = k.min(room);
        }
        let k = k.max(cost);
        self.last_k = k;
        k
    }
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

/// One take of a lease, owned, for its task.
struct Take {
    limiter: RateLimiter,
    slot: Arc<Slot>,
    scope: &'static str,
    key: String,
    failure_policy: Option<crate::limit::FailurePolicy>,
    /// The limit's policy with the take's units as its cost.
    policy: Policy,
    lease: Lease,
    /// The cost of the call the take serves first.
    cost: u64,
    /// When the call asked (a lease's life counts from before the round trip).
    now: Instant,
    /// The key's epoch when the call asked.
    epoch: u64,
}

impl Take {
    /// Takes the lease (the refill lock held until it is in the slot): the answer of the call
    /// it served first, or `None` when the store did not grant it (fewer units left than the
    /// take, or no answer: the failure policy's answer never makes a lease).
    async fn run(self, refill: tokio::sync::OwnedMutexGuard<()>) -> Option<Verdict> {
        let Self {
            limiter,
            slot,
            scope,
            key,
            failure_policy,
            policy,
            lease,
            cost,
            now,
            epoch,
        } = self;
        let call_id = crate::store::new_call_id();
        let mut take = Check::new(&key, &policy).with_scope(scope);
        take.failure_policy = failure_policy;
        let Asked::Store(verdict) = limiter.ask(&[take], Some(&call_id)).await else {
            return None;
        };
        let [d] = verdict.decisions() else {
            return None;
        };
        slot.lock().room = Some(d.remaining);
        if !d.admitted {
            return None;
        }
        let k = policy.cost();
        // Kept only once a replica has the take: a failover must not forget `k` units that
        // this process goes on serving. Not replicated in time, the take serves this call
        // only (as an ordinary check would) and gives the rest back now.
        let replicated = limiter.replicated(&key).await;
        let held = Held {
            scope,
            call_id,
            policy,
            left: k - cost,
            granted: k - cost,
            epoch,
            until: now + life(lease, policy.algorithm(), policy.period(), d),
            limit: d.limit,
            remaining: d.remaining,
            reset_at: now + d.reset_after,
        };
        let answer = Decision::new(
            true,
            d.limit,
            d.remaining.saturating_add(held.left),
            d.reset_after,
            Duration::ZERO,
        );
        if replicated {
            limiter.hold(&slot, scope, &key, held);
        } else {
            slot.lock().unreplicated_until = Some(now + UNREPLICATED);
            limiter.retire(&slot, scope, &key, held, false);
        }
        drop(refill);
        Some(Verdict::new(vec![answer]))
    }
}

/// How long a lease taken for `policy`'s algorithm with the store's answer `d` may live: its
/// ttl, and never past the window its units were counted in (a fixed window's end; the
/// sliding counter's aligned window, which ends one period before its `reset_after`).
fn life(lease: Lease, algorithm: Algorithm, period: Duration, d: &Decision) -> Duration {
    let ttl = lease.ttl();
    match algorithm {
        Algorithm::Fixed => ttl.min(d.reset_after),
        Algorithm::SlidingCounter => ttl.min(d.reset_after.saturating_sub(period)),
        _ => ttl,
    }
}

impl RateLimiter {
    /// Whether `limits` (one call's, checked without receipts) go through the lease step: one
    /// enforced limit with a lease, on a store that is not in this process.
    pub(super) fn leased<'l>(
        &self,
        limits: &'l [Limit],
        call_id: Option<&str>,
    ) -> Option<&'l Limit> {
        let [limit] = limits else {
            return None;
        };
        (call_id.is_none()
            && !self.is_shut_down()
            && limit.lease.is_some()
            && Lease::supports(limit.policy.algorithm())
            && !self.is_shadow(limit)
            && !self.inner.store.is_local())
        .then_some(limit)
    }

    /// The lease step: `check` (the check of `limit`, whose lease is `lease`) served from this
    /// process's lease of its key, or by taking the next lease, or by an ordinary check.
    pub(super) async fn check_leased(
        &self,
        limit: &Limit,
        check: Check<'_>,
        lease: Lease,
    ) -> Result<Verdict, StoreError> {
        let now = Instant::now();
        // Blocks first: a caller this process blocked (or saw rejected) is not served from
        // a lease taken before.
        if let Some(blocked) = &self.inner.blocked
            && let Some(verdict) = blocked.lookup(&[check], now)
        {
            super::log_rejection(&[check], &verdict, "blocked-cache");
            return Ok(verdict);
        }
        let Some(slot) = self.inner.leases.slot(check.key, now) else {
            return self.check_as(&[check], None).await;
        };
        let cost = check.policy.cost();
        let spent = {
            let mut state = slot.lock();
            state.demand = state.demand.saturating_add(cost);
            state.touched = Some(now);
            if let Some(d) = state.serve(cost, now, &self.inner.leases.held) {
                return Ok(Verdict::new(vec![d]));
            }
            // The store had too little left for a lease, or a reset runs: the call's own
            // check (which the blocked-caller cache answers while the quota is spent), without
            // waiting in line for the refill.
            state.resetting > 0 || state.room.is_some_and(|room| room < cost.saturating_mul(2))
        };
        if spent {
            return self.check_room(&slot, check).await;
        }
        let refill = Arc::clone(&slot.refill).lock_owned().await;
        let now = Instant::now();
        let (retired, k, epoch) = {
            let mut state = slot.lock();
            // Another call took a lease while this one waited.
            if let Some(d) = state.serve(cost, now, &self.inner.leases.held) {
                return Ok(Verdict::new(vec![d]));
            }
            let retired = state.held.take();
            let k = if state.resetting > 0 {
                cost
            } else {
                state.units(lease, check.policy, now)
            };
            (retired, k, state.epoch)
        };
        if let Some(held) = retired {
            self.retire(&slot, limit.scope, check.key, held, true);
        }
        if k > cost
            && !self.is_shut_down()
            && let Ok(policy) = check.policy.with_cost(k)
        {
            // The take runs on a task of its own, holding the refill lock: a caller cancelled
            // while it is in flight (a client that hangs up) leaves the lease to the next
            // calls, instead of `k` units counted and never used.
            let take = Take {
                limiter: self.clone(),
                slot: Arc::clone(&slot),
                scope: limit.scope,
                key: check.key.to_owned(),
                failure_policy: check.failure_policy,
                policy,
                lease,
                cost,
                now,
                epoch,
            };
            if let Ok(Some(verdict)) = self.spawn_tracked(take.run(refill)).await {
                return Ok(verdict);
            }
            // Fewer than `k` units left, or no answer from the store: the call's own check
            // decides (the failure policy answers it, never a lease).
        } else {
            drop(refill);
        }
        self.check_room(&slot, check).await
    }

    /// Starts a reset of `keys` (the keys of `limits`, in order) for this process's leases:
    /// ends the leases held (their units were counted in the state the reset deletes: nothing
    /// goes back), waits for the returns in flight, and keeps leases off the keys until the
    /// guard is dropped, once the store's reset is done (or failed).
    pub(super) async fn resetting_leases(&self, limits: &[Limit], keys: &[&str]) -> Resetting {
        let mut resetting = Resetting {
            limiter: self.clone(),
            keys: Vec::new(),
            paused_returns: Vec::new(),
        };
        for (limit, key) in self.leased_keys(limits, keys) {
            let slot = self.inner.leases.slot_of_admin(key);
            let retired = {
                let mut state = slot.lock();
                state.resetting += 1;
                state.epoch += 1;
                state.held.take()
            };
            if let Some(held) = retired {
                self.retire(&slot, limit.scope, key, held, true);
            }
            resetting
                .keys
                .push((Arc::clone(&slot), limit.scope, key.to_owned()));
        }
        // Each slot's returns once, in one order for every reset: a key named twice, or two
        // resets naming keys in opposite orders, never wait on a lock they hold.
        let mut slots: Vec<_> = resetting.keys.iter().map(|(slot, _, _)| slot).collect();
        slots.sort_by_key(|slot| Arc::as_ptr(slot).addr());
        slots.dedup_by_key(|slot| Arc::as_ptr(slot).addr());
        let mut paused_returns = Vec::with_capacity(slots.len());
        for slot in slots {
            paused_returns.push(Arc::clone(&slot.returns).write_owned().await);
        }
        resetting.paused_returns = paused_returns;
        resetting
    }

    /// Ends this process's leases of `keys` (the keys of `limits`, in order) at a block: what
    /// they did not use goes back (the block rejects the calls they would have served), and a
    /// take in flight is not held.
    pub(super) fn block_leases(&self, limits: &[Limit], keys: &[&str]) {
        for (limit, key) in self.leased_keys(limits, keys) {
            let Some(slot) = self.inner.leases.existing(key) else {
                continue;
            };
            let retired = {
                let mut state = slot.lock();
                state.epoch += 1;
                state.held.take().map(|mut held| {
                    held.epoch = state.epoch;
                    held
                })
            };
            if let Some(held) = retired {
                self.retire(&slot, limit.scope, key, held, true);
            }
        }
    }

    /// The keys among `keys` (those of `limits`, in order) that this process may lease.
    fn leased_keys<'a>(
        &self,
        limits: &'a [Limit],
        keys: &'a [&'a str],
    ) -> impl Iterator<Item = (&'a Limit, &'a str)> {
        let remote = !self.inner.store.is_local();
        limits
            .iter()
            .zip(keys.iter().copied())
            .filter(move |(l, _)| remote && l.lease.is_some())
    }

    /// The call's own check (no lease), noting what the store said was left.
    async fn check_room(&self, slot: &Slot, check: Check<'_>) -> Result<Verdict, StoreError> {
        let asked = self.ask(&[check], None).await;
        if let Asked::Store(verdict) = &asked
            && let [d] = verdict.decisions()
        {
            slot.lock().room = Some(d.remaining);
        }
        asked.into_result()
    }

    /// Keeps `held` in `slot` until it ends (then retires it), or retires it at once when its
    /// life is over already (a window ending now) or it has nothing left.
    /// A lease taken before an admin call on the key (an older epoch, or a reset running) is
    /// not held: it is retired at once, by the rule of its epoch.
    /// After shutdown, a take that was in flight gives its lease back at once.
    fn hold(&self, slot: &Arc<Slot>, scope: &'static str, key: &str, held: Held) {
        if held.left == 0 || held.until <= Instant::now() {
            self.retire(slot, scope, key, held, false);
            return;
        }
        let (until, call_id) = (held.until, held.call_id.clone());
        let earlier = {
            let mut state = slot.lock();
            // Read under the slot's lock: shutdown sets its flag before it takes each slot's
            // lease (under the same lock), so a lease put here unseen by shutdown is none.
            if self.is_shut_down() || state.epoch != held.epoch || state.resetting > 0 {
                drop(state);
                self.retire(slot, scope, key, held, false);
                return;
            }
            self.count_held(scope, &held, true);
            state.held.replace(held)
        };
        if let Some(earlier) = earlier {
            self.retire(slot, scope, key, earlier, true);
        }
        // The lease's end, tracked by shutdown, which it ends at once: shutdown gives back
        // every lease held, this one too if it is held where shutdown did not look.
        let (limiter, slot, key) = (self.clone(), Arc::clone(slot), key.to_owned());
        self.spawn_tracked(async move {
            tokio::select! {
                () = tokio::time::sleep_until(until) => {}
                () = limiter.shut_down() => {}
            }
            let ended = {
                let mut state = slot.lock();
                if state.held.as_ref().is_some_and(|h| h.call_id == call_id) {
                    state.held.take()
                } else {
                    None // retired by a call that took the next lease
                }
            };
            if let Some(held) = ended {
                limiter.retire(&slot, scope, &key, held, true);
            }
        });
    }

    /// Counts `held`'s units as held in leases (`held_now`), in the limiter's count and the
    /// gauge, or no longer.
    fn count_held(&self, scope: &'static str, held: &Held, held_now: bool) {
        let granted = i64::try_from(held.granted).unwrap_or(i64::MAX);
        let units = &self.inner.leases.held;
        if held_now {
            units.fetch_add(held.left, Ordering::Relaxed);
            crate::observe::lease_units_held(scope, granted);
        } else {
            units.fetch_sub(held.left, Ordering::Relaxed);
            crate::observe::lease_units_held(scope, -granted);
        }
    }

    /// Ends a lease: what it did not use goes back by its receipt (a settle to the units used),
    /// in the background; a lease used up, or one of an epoch the key has left (taken before a
    /// reset, or in flight at a block), only drops its receipt. A return that fails leaves the
    /// units counted (never more admitted than the quota). `counted`: the lease was held (its
    /// units are in the gauge).
    fn retire(&self, slot: &Arc<Slot>, scope: &'static str, key: &str, held: Held, counted: bool) {
        if counted {
            self.count_held(scope, &held, false);
        }
        let (limiter, slot, key) = (self.clone(), Arc::clone(slot), key.to_owned());
        self.spawn_tracked(async move {
            let _returning = Arc::clone(&slot.returns).read_owned().await;
            let current = slot.lock().epoch == held.epoch;
            let check = Check::new(&key, &held.policy).with_scope(scope);
            let taken = held.policy.cost();
            if held.left == 0 || !current {
                limiter.forget(&[check], &held.call_id).await;
            } else {
                limiter
                    .settle(&[check], &held.call_id, &[taken - held.left])
                    .await;
                crate::observe::lease_units_returned(scope, held.left);
            }
        });
    }

    /// Gives back every lease this process holds ([`RateLimiter::shutdown`]): each ends now,
    /// and what it did not use goes back by its receipt, in the background.
    pub(super) fn return_leases(&self) {
        let slots: Vec<(Box<str>, Arc<Slot>)> = {
            let table = self.inner.leases.table.read();
            let table = table.unwrap_or_else(PoisonError::into_inner);
            (table.slots.iter())
                .map(|(key, slot)| (key.clone(), Arc::clone(slot)))
                .collect()
        };
        for (key, slot) in slots {
            let held = slot.lock().held.take();
            if let Some(held) = held {
                self.retire(&slot, held.scope, &key, held, true);
            }
        }
    }

    /// Units this process holds in leases now ([`crate::lease`]): taken from their quotas and
    /// not used yet, so that other processes may be refused them until this one uses them or
    /// its leases end (at most each lease's life). The gauge `ratelimit_lease_units_held`
    /// reports the same, by scope.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use ratelimit_runtime::RateLimiter;
    /// let limiter = RateLimiter::builder().build().await?;
    /// assert_eq!(limiter.lease_units_held(), 0); // the memory store never leases
    /// # Ok(()) }
    /// ```
    pub fn lease_units_held(&self) -> u64 {
        self.inner.leases.held()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::By;
    use crate::limiter::admin::Target;
    use crate::test_support::remote_limiter;

    fn policy(algorithm: Algorithm, num: u64) -> Policy {
        Policy::new(algorithm, num, Duration::from_secs(60)).expect("a policy")
    }

    fn lease() -> Lease {
        Lease::new(Duration::from_millis(100)).expect("a lease")
    }

    /// The units of the take a call of `state` makes at `now` after `demand` calls.
    fn take_after(state: &mut State, demand: u64, now: Instant, p: &Policy) -> u64 {
        state.demand += demand;
        state.units(lease(), p, now)
    }

    /// A key called once a second, or ten times a second, never leases (k = the cost: an
    /// ordinary check); nor does the first call a process makes on a key.
    #[test]
    fn a_quiet_key_takes_one_unit_at_a_time() {
        let p = policy(Algorithm::Fixed, 100_000);
        let start = Instant::now();
        let mut state = State::default();
        assert_eq!(take_after(&mut state, 1, start, &p), 1, "the first call");
        let mut now = start;
        for (i, gap) in [1000, 1000, 300, 100, 120].into_iter().enumerate() {
            now += Duration::from_millis(gap);
            assert_eq!(
                take_after(&mut state, 1, now, &p),
                1,
                "call {i}, {gap} ms after"
            );
        }
    }

    /// Under load, k follows the rate (the units one lease's life serves at it), at most
    /// doubling per take, bounded by `lease_max`, a tenth of the capacity and what the store
    /// said was left; never below the cost.
    #[test]
    fn k_follows_the_rate_within_its_bounds() {
        let p = policy(Algorithm::Token, 100_000);
        let start = Instant::now();
        let mut state = State::default();
        let mut now = start;
        let mut takes = vec![take_after(&mut state, 1, now, &p)];
        // 1,000 calls in every 10 ms (100,000 a second): a lease's 100 ms serves 10,000.
        for _ in 0..14 {
            now += Duration::from_millis(10);
            takes.push(take_after(&mut state, 1000, now, &p));
        }
        assert_eq!(
            takes,
            [
                1, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000,
                1000
            ],
            "a burst of waiting calls sizes the take at once (bounded by lease_max)"
        );
        // Two calls per 10 ms (200 a second): 20 per lease, reached by doubling from 1.
        let mut state = State::default();
        let mut now = start;
        let mut takes = vec![take_after(&mut state, 1, now, &p)];
        for _ in 0..6 {
            now += Duration::from_millis(10);
            takes.push(take_after(&mut state, 2, now, &p));
        }
        assert_eq!(takes, [1, 2, 4, 8, 16, 20, 20]);
        // A tenth of the capacity, and the room the store reported.
        let small = policy(Algorithm::Fixed, 50);
        let mut state = State::default();
        let _ = take_after(&mut state, 1, start, &small);
        assert_eq!(
            take_after(&mut state, 1000, start + Duration::from_millis(1), &small),
            5
        );
        state.room = Some(3);
        assert_eq!(
            take_after(&mut state, 1000, start + Duration::from_millis(2), &small),
            3
        );
        state.room = Some(0);
        assert_eq!(
            take_after(&mut state, 1000, start + Duration::from_millis(3), &small),
            1
        );
        let costly = small.with_cost(2).expect("cost 2");
        assert_eq!(
            take_after(&mut state, 1000, start + Duration::from_millis(4), &costly),
            2
        );
    }

    /// A lease never outlives the window its units were counted in: a fixed window's end
    /// (`reset_after`), the sliding counter's aligned window (one period before its
    /// `reset_after`); a bucket's lease lives its ttl.
    #[test]
    fn a_lease_ends_with_its_window() {
        let period = Duration::from_secs(60);
        let d =
            |reset_ms| Decision::new(true, 10, 5, Duration::from_millis(reset_ms), Duration::ZERO);
        let ms = Duration::from_millis;
        assert_eq!(life(lease(), Algorithm::Fixed, period, &d(40)), ms(40));
        assert_eq!(life(lease(), Algorithm::Fixed, period, &d(59_000)), ms(100));
        assert_eq!(
            life(lease(), Algorithm::SlidingCounter, period, &d(60_030)),
            ms(30)
        );
        assert_eq!(
            life(lease(), Algorithm::SlidingCounter, period, &d(90_000)),
            ms(100)
        );
        assert_eq!(
            life(lease(), Algorithm::SlidingCounter, period, &d(50_000)),
            ms(0)
        );
        for bucket in [Algorithm::Token, Algorithm::Leaky, Algorithm::Gcra] {
            assert_eq!(life(lease(), bucket, period, &d(3)), ms(100));
        }
    }

    /// A limit of 100,000 a minute with a lease of 100 ms.
    fn leased_limits() -> [Limit; 1] {
        let limit = Limit::new(policy(Algorithm::Fixed, 100_000), "lease_tests", By::Global);
        [limit.with_lease(lease()).expect("a leased limit")]
    }

    /// The store key of `limits` for the caller `name`.
    fn key_of(limiter: &RateLimiter, limits: &[Limit], name: &str) -> String {
        let keys = Target::global().key(name).keys(limiter, limits);
        keys.expect("a key").remove(0)
    }

    /// One call of `limits` by the caller `name`: admitted or not.
    async fn call(limiter: &RateLimiter, limits: &[Limit], name: &str) -> bool {
        let verdict = limiter
            .decide(limits, &[key_of(limiter, limits, name)])
            .await;
        verdict.expect("the store answers").is_admitted()
    }

    /// What the store counts of `limits` for the caller `name` (a quota of 100,000).
    async fn counted(limiter: &RateLimiter, limits: &[Limit], name: &str) -> u64 {
        let peeked = limiter.peek(limits, &Target::global().key(name)).await;
        100_000 - peeked.expect("peek").decisions()[0].remaining
    }

    /// A reset's key keeps its slot through a flood of minted keys that fills the table and
    /// sweeps it: the reset's bookkeeping and the key's calls meet in one slot, so no lease of
    /// the key is taken or held while the reset runs (its units would be counted in the state
    /// the reset deletes, and served on top of the fresh quota).
    #[tokio::test(start_paused = true)]
    async fn a_flood_of_keys_during_a_reset_never_parts_the_reset_from_its_key() {
        let (limiter, limits) = (remote_limiter().await, leased_limits());
        let victim = key_of(&limiter, &limits, "victim");
        let resetting = limiter.resetting_leases(&limits, &[&victim]).await;
        for i in 0..MAX_KEYS {
            assert!(call(&limiter, &limits, &format!("minted-{i}")).await);
        }
        tokio::time::advance(IDLE).await;
        assert!(call(&limiter, &limits, "minted-sweeps").await);
        for _ in 0..100 {
            assert!(call(&limiter, &limits, "victim").await);
        }
        let held = limiter.lease_units_held();
        drop(resetting);
        assert_eq!(held, 0, "a lease of the key was held while its reset ran");
    }

    /// A reset of a key the full table has no slot for still keeps leases off it while it
    /// runs, even when a sweep makes room meanwhile.
    #[tokio::test(start_paused = true)]
    async fn a_reset_reaches_a_key_the_full_table_had_no_slot_for() {
        let (limiter, limits) = (remote_limiter().await, leased_limits());
        for i in 0..MAX_KEYS {
            assert!(call(&limiter, &limits, &format!("minted-{i}")).await);
        }
        let victim = key_of(&limiter, &limits, "victim");
        let resetting = limiter.resetting_leases(&limits, &[&victim]).await;
        tokio::time::advance(IDLE).await;
        for _ in 0..100 {
            assert!(call(&limiter, &limits, "victim").await);
        }
        let held = limiter.lease_units_held();
        drop(resetting);
        assert_eq!(held, 0, "a lease of the key was held while its reset ran");
    }

    /// A take whose lease reaches its slot while shutdown runs (the hold read the flag before
    /// shutdown set it, and waits for the slot's lock) gives the lease back: after shutdown,
    /// the store counts exactly the unit the take's call used.
    #[test]
    fn a_lease_held_across_a_shutdown_is_given_back() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let limits = leased_limits();
        let limiter = runtime.block_on(remote_limiter());
        let p = limits[0].policy.with_cost(10).expect("cost 10");
        let call_id = crate::store::new_call_id();
        let key = key_of(&limiter, &limits, "k");
        let take = Check::new(&key, &p).with_scope("lease_tests");
        let verdict = runtime.block_on(limiter.check_as(&[take], Some(&call_id)));
        let verdict = verdict.expect("the take");
        let d = &verdict.decisions()[0];
        let now = Instant::now();
        let held = Held {
            scope: "lease_tests",
            call_id,
            policy: p,
            left: 9,
            granted: 9,
            epoch: 0,
            until: now + Duration::from_secs(1),
            limit: d.limit,
            remaining: d.remaining,
            reset_at: now + d.reset_after,
        };
        // A slot shutdown's sweep does not see (as one it passed before the lease came).
        let slot = Arc::new(Slot::default());
        let holding = slot.lock();
        let holder = std::thread::spawn({
            let (limiter, slot, handle) =
                (limiter.clone(), Arc::clone(&slot), runtime.handle().clone());
            move || {
                let _entered = handle.enter();
                limiter.hold(&slot, "lease_tests", &key, held);
            }
        });
        // Long enough for the hold to pass its first checks and wait for the slot's lock.
        std::thread::sleep(Duration::from_millis(200));
        runtime
            .block_on(limiter.shutdown(Duration::from_secs(5)))
            .expect("shut down");
        drop(holding);
        holder.join().expect("the hold");
        runtime
            .block_on(limiter.shutdown(Duration::from_secs(5)))
            .expect("the returns finish");
        let left = (limiter.lease_units_held(), slot.lock().held.is_some());
        let counted = runtime.block_on(counted(&limiter, &limits, "k"));
        assert_eq!(left, (0, false), "a lease outlived shutdown");
        assert_eq!(counted, 1, "the store counts the unit used, no more");
    }

    /// Shutdown ends a lease's timer at once (it does not wait for the lease's life), and
    /// gives back what the lease did not use.
    #[tokio::test(start_paused = true)]
    async fn shutdown_gives_back_a_held_lease_without_waiting_for_its_end() {
        let (limiter, limits) = (remote_limiter().await, leased_limits());
        let mut admitted = 0;
        while limiter.lease_units_held() == 0 {
            admitted += u64::from(call(&limiter, &limits, "k").await);
            assert!(admitted < 100, "no lease was taken");
        }
        let shutdown = limiter.shutdown(Duration::from_millis(1)).await;
        assert_eq!(shutdown, Ok(()));
        assert_eq!(counted(&limiter, &limits, "k").await, admitted);
    }

    /// A block ends this process's lease and gives its unused units back into the key's
    /// state; the key stays refused until the block ends (a block is a marker of its own in
    /// each store, which a return of units does not touch), then admits from the state.
    #[tokio::test(start_paused = true)]
    async fn a_lease_given_back_at_a_block_never_lets_the_key_through_before_its_end() {
        let (limiter, limits) = (remote_limiter().await, leased_limits());
        let mut admitted = 0;
        while limiter.lease_units_held() == 0 {
            admitted += u64::from(call(&limiter, &limits, "k").await);
            assert!(admitted < 100, "no lease was taken");
        }
        let target = Target::global().key("k");
        let block = limiter
            .block(&limits, &target, Duration::from_secs(10))
            .await;
        block.expect("block");
        tokio::time::sleep(Duration::from_millis(1)).await; // the return lands
        assert_eq!(limiter.lease_units_held(), 0);
        let mut through = 0;
        for _ in 0..500 {
            through += u64::from(call(&limiter, &limits, "k").await);
            tokio::time::advance(Duration::from_millis(10)).await;
        }
        assert_eq!(through, 0, "admitted while blocked");
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(
            counted(&limiter, &limits, "k").await,
            admitted,
            "the lease's unused units went back, nothing else was taken"
        );
        assert!(
            call(&limiter, &limits, "k").await,
            "admitted after the block"
        );
    }

    /// A full table takes no new key until one goes idle (its calls are then checked at the
    /// store one by one), and sweeps at most once per `IDLE`.
    #[test]
    fn a_full_table_refuses_new_keys_and_sweeps_idle_ones() {
        let leases = Leases::default();
        let start = Instant::now();
        for i in 0..MAX_KEYS {
            let slot = leases.slot(&format!("k{i}"), start).expect("room");
            lock(&slot.state).touched = Some(start);
        }
        assert!(
            leases.slot("k0", start).is_some(),
            "a known key keeps its slot"
        );
        assert!(leases.slot("new", start).is_none());
        let later = start + IDLE;
        assert!(
            leases.slot("new", later).is_some(),
            "the idle keys were swept"
        );
        assert_eq!(leases.table.read().expect("the table").slots.len(), 1);
    }
}
