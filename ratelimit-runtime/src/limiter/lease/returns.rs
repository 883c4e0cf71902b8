//! The end of leases: a lease's return of its unused units (by its take's receipt, in the
//! background), and the admin calls and shutdown that end a key's leases at once — a reset
//! (nothing goes back), a block (the unused units go back), shutdown (every lease goes back).

use std::sync::{Arc, PoisonError};

use super::table::{Held, Slot};
use crate::limit::Limit;
use crate::limiter::RateLimiter;
use crate::store::Check;

/// A reset of leased keys running ([`RateLimiter::resetting_leases`]): until it is dropped,
/// no lease of those keys is served, taken or held, and no return of unused units runs.
/// Dropped, it ends the leases taken meanwhile (giving nothing back) and lets leases start
/// again from the fresh state.
pub(in crate::limiter) struct Resetting {
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

impl RateLimiter {
    /// Starts a reset of `keys` (the keys of `limits`, in order) for this process's leases:
    /// ends the leases held (their units were counted in the state the reset deletes: nothing
    /// goes back), waits for the returns in flight, and keeps leases off the keys until the
    /// guard is dropped, once the store's reset is done (or failed).
    pub(in crate::limiter) async fn resetting_leases(
        &self,
        limits: &[Limit],
        keys: &[&str],
    ) -> Resetting {
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
    pub(in crate::limiter) fn block_leases(&self, limits: &[Limit], keys: &[&str]) {
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

    /// Ends a lease: what it did not use goes back by its receipt (a settle to the units used),
    /// in the background; a lease used up, or one of an epoch the key has left (taken before a
    /// reset, or in flight at a block), only drops its receipt. A return that fails leaves the
    /// units counted (never more admitted than the quota). `counted`: the lease was held (its
    /// units are in the gauge).
    pub(super) fn retire(
        &self,
        slot: &Arc<Slot>,
        scope: &'static str,
        key: &str,
        held: Held,
        counted: bool,
    ) {
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
    pub(in crate::limiter) fn return_leases(&self) {
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
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;
    use crate::limiter::admin::Target;
    use crate::limiter::lease::table::{IDLE, MAX_KEYS};
    use crate::limiter::lease::tests::{
        call, counted, key_of, leased_limits, until_a_lease_is_held,
    };
    use crate::limiter::test_support::remote_limiter;

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
        let admitted = until_a_lease_is_held(&limiter, &limits, "k").await;
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
        let admitted = until_a_lease_is_held(&limiter, &limits, "k").await;
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
}
