//! Serving a call from its key's lease, and taking the next lease: how many units (`k`
//! follows the rate the process sees), for how long (never past the window they were counted
//! in), and holding it until it ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::table::{Held, Slot, State};
use crate::algorithm::Algorithm;
use crate::decision::{Decision, Verdict};
use crate::error::StoreError;
use crate::lease::Lease;
use crate::limit::Limit;
use crate::limiter::{Asked, RateLimiter};
use crate::policy::Policy;
use crate::store::Check;

/// How long a key whose last take no replica acknowledged is checked call by call (no lease)
/// before trying again: a master that lost its replica (the one a failover promoted) would
/// otherwise cost every take the wait.
const UNREPLICATED: Duration = Duration::from_secs(1);

impl State {
    /// A call of `cost` served from the lease, if it holds enough until `now` (`unused`: the
    /// limiter's count of units unused in leases).
    pub(super) fn serve(
        &mut self,
        cost: u64,
        now: Instant,
        unused: &AtomicU64,
    ) -> Option<Decision> {
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

    /// The units of the next take for a call of `policy`'s cost: what one lease's life would
    /// serve at the rate seen since the last take, at most twice the last take (or the calls
    /// waiting now), at most what the lease allows and what the store had left; at least the
    /// cost (which means: no lease, an ordinary check).
    pub(super) fn units(&mut self, lease: Lease, policy: &Policy, now: Instant) -> u64 {
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

/// One take of a lease, owned, for its task.
struct Take {
    limiter: RateLimiter,
    slot: Arc<Slot>,
    scope: &'static str,
    key: String,
    failure_policy: Option<crate::limit::FailurePolicy>,
    /// Whether the limit asks for replica acknowledgement ([`Check::replica_ack`]).
    replica_ack: bool,
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
            replica_ack,
            policy,
            lease,
            cost,
            now,
            epoch,
        } = self;
        let call_id = crate::store::new_call_id();
        let mut take = Check::new(&key, &policy).with_scope(scope);
        take.failure_policy = failure_policy;
        take.replica_ack = replica_ack;
        // Kept only once a replica has the take: a failover must not forget `k` units that
        // this process goes on serving. Not replicated in time, the take serves this call
        // only, as an ordinary check would (one asking for replica acknowledgement is
        // answered by the failure policy: `ask_told`), and gives the rest back now.
        let (asked, unacknowledged) = limiter.ask_told(&[take], &call_id).await;
        if unacknowledged {
            slot.lock().unreplicated_until = Some(now + UNREPLICATED);
        }
        let Asked::Store(verdict) = asked else {
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
        if unacknowledged {
            limiter.retire(&slot, scope, &key, held, false);
        } else {
            limiter.hold(&slot, scope, &key, held);
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
    pub(in crate::limiter) fn leased<'l>(
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
    pub(in crate::limiter) async fn check_leased(
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
            crate::limiter::log_rejection(&[check], &verdict, "blocked-cache");
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
        self.take_lease(&slot, limit, check, lease).await
    }

    /// The next lease of `check`'s key, taken in line for the slot's refill lock (another
    /// call may have taken one meanwhile), the lease it replaces retired; the call's own
    /// check when the store has fewer units left than a lease.
    async fn take_lease(
        &self,
        slot: &Arc<Slot>,
        limit: &Limit,
        check: Check<'_>,
        lease: Lease,
    ) -> Result<Verdict, StoreError> {
        let cost = check.policy.cost();
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
            self.retire(slot, limit.scope, check.key, held, true);
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
                slot: Arc::clone(slot),
                scope: limit.scope,
                key: check.key.to_owned(),
                failure_policy: check.failure_policy,
                replica_ack: check.replica_ack,
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
        self.check_room(slot, check).await
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
    pub(super) fn hold(&self, slot: &Arc<Slot>, scope: &'static str, key: &str, held: Held) {
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
    pub(super) fn count_held(&self, scope: &'static str, held: &Held, held_now: bool) {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::lease::tests::{lease, policy};

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
}
