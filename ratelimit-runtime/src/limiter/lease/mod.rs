//! The lease step of a check ([`crate::lease`]): a hot key's calls served from units this
//! process took a lease at a time.
//!
//! Per key, a [`Slot`](table::Slot) keeps the lease the process holds (if any) and the demand it saw since
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
//!
//! The [`table`] keeps a slot per leased key; [`serve`] serves calls from a key's lease and
//! takes the next; [`returns`] gives a lease's unused units back when it ends, and ends a
//! key's leases at an admin call or at shutdown.

use std::sync::{Mutex, MutexGuard, PoisonError};

use super::RateLimiter;

mod returns;
mod serve;
mod table;

pub(super) use self::table::Leases;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl RateLimiter {
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
    //! Helpers for the lease tests.

    use std::time::Duration;

    use crate::algorithm::Algorithm;
    use crate::lease::Lease;
    use crate::limit::{By, Limit};
    use crate::limiter::RateLimiter;
    use crate::limiter::admin::Target;
    use crate::policy::Policy;

    pub(super) fn policy(algorithm: Algorithm, num: u64) -> Policy {
        Policy::new(algorithm, num, Duration::from_secs(60)).expect("a policy")
    }

    pub(super) fn lease() -> Lease {
        Lease::new(Duration::from_millis(100)).expect("a lease")
    }

    /// A limit of 100,000 a minute with a lease of 100 ms.
    pub(super) fn leased_limits() -> [Limit; 1] {
        let limit = Limit::new(policy(Algorithm::Fixed, 100_000), "lease_tests", By::Global);
        [limit.with_lease(lease()).expect("a leased limit")]
    }

    /// The store key of `limits` for the caller `name`.
    pub(super) fn key_of(limiter: &RateLimiter, limits: &[Limit], name: &str) -> String {
        let keys = Target::global().key(name).keys(limiter, limits);
        keys.expect("a key").remove(0)
    }

    /// One call of `limits` by the caller `name`: admitted or not.
    pub(super) async fn call(limiter: &RateLimiter, limits: &[Limit], name: &str) -> bool {
        let verdict = limiter
            .decide(limits, &[key_of(limiter, limits, name)])
            .await;
        verdict.expect("the store answers").is_admitted()
    }

    /// What the store counts of `limits` for the caller `name` (a quota of 100,000).
    pub(super) async fn counted(limiter: &RateLimiter, limits: &[Limit], name: &str) -> u64 {
        let peeked = limiter.peek(limits, &Target::global().key(name)).await;
        100_000 - peeked.expect("peek").decisions()[0].remaining
    }

    /// Calls `limits` by the caller `name` until this process holds a lease of it: how many
    /// calls were admitted.
    pub(super) async fn until_a_lease_is_held(
        limiter: &RateLimiter,
        limits: &[Limit],
        name: &str,
    ) -> u64 {
        let mut admitted = 0;
        while limiter.lease_units_held() == 0 {
            admitted += u64::from(call(limiter, limits, name).await);
            assert!(admitted < 100, "no lease was taken");
        }
        admitted
    }
}
