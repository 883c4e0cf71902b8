//! Learning from a partner's answer, for every process sharing the store: a pause of a
//! budget ([`RateLimiter::defer`], on the admin block) and a budget brought down to what the
//! partner says is left ([`RateLimiter::lower`], a take of the difference). Neither ever
//! raises a budget: the configured quota stays the most any process is admitted.

use std::time::Duration;

use crate::error::StoreError;
use crate::limit::Limit;
use crate::store::Check;

use super::RateLimiter;
use super::admin::Target;

/// How many times [`RateLimiter::lower`] reads and takes again when other calls took units
/// between its read and its take.
const LOWER_TRIES: usize = 3;

impl RateLimiter {
    /// "This budget is unavailable for `pause`": every call of `target` on `limits` is
    /// refused until then, in every process sharing the store (on memory, in this process);
    /// a call that waits (`wait = …`, or the client layer's wait) sleeps until then and goes
    /// through, the others are refused with `retry_after` at the pause's end. Made for the
    /// 429 a partner answered with `Retry-After`: code that calls a partner without the
    /// client layer reports what it saw.
    ///
    /// A pause never shortens a longer one, nor an admin [`RateLimiter::block`]: it is a
    /// block underneath ([`RateLimiter::reset`] lifts it), written per limit with
    /// [`Store::extend_block`](crate::Store::extend_block), which keeps a block that ends
    /// later, atomically in the store (a block written by another process in the meantime
    /// is never cut short). `pause` is trusted: bound it before passing a partner's value
    /// (the client layer cuts it to its `max_pause`); past a hundred years, it is cut to a
    /// hundred years, as a block is.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, By, Limit, Policy, RateLimitError, RateLimiter, Target, rate_limit};
    ///
    /// // The partner's budget, as the attribute below writes it.
    /// const PARTNER: Limit = Limit::new(
    ///     match Policy::new(Algorithm::Gcra, 20, Duration::from_secs(1)) { Ok(p) => p, Err(_) => panic!() },
    ///     "partner",
    ///     By::Global,
    /// );
    ///
    /// #[rate_limit(algo = "gcra", num = 20, time = 1, scope = "partner", wait = "30s")]
    /// async fn call_partner() -> Result<u16, RateLimitError> {
    ///     let status = 429; // … the partner answered 429 with `Retry-After: 2`
    ///     if status == 429 {
    ///         let pause = Duration::from_secs(2);
    ///         RateLimiter::current().defer(&[PARTNER], &Target::global(), pause).await
    ///             .map_err(RateLimitError::StoreUnavailable)?;
    ///     }
    ///     Ok(status)
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// RateLimiter::builder().build().await?.install()?;
    /// call_partner().await?;
    /// let now = RateLimiter::current().peek(&[PARTNER], &Target::global()).await?;
    /// assert!(now.retry_after().unwrap() > Duration::from_secs(1), "every caller waits");
    /// # Ok(()) }
    /// ```
    pub async fn defer(
        &self,
        limits: &[Limit],
        target: &Target,
        pause: Duration,
    ) -> Result<(), StoreError> {
        if pause.is_zero() || limits.is_empty() {
            return Ok(());
        }
        let limits = &self.in_force(limits);
        self.write_block(limits, target, pause, true).await?;
        tracing::info!(target: crate::observe::log::ADMIN,
            scope = limits.first().map_or("", |l| l.scope),
            pause_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX),
            "budget deferred"
        );
        Ok(())
    }

    /// Brings each of `limits` down to `left` units for `target`, in every process sharing
    /// the store: takes the difference between what the limit has left and `left`, never
    /// gives back (a limit with `left` or fewer units is left as it is). Made for a partner
    /// that says how much is left of its budget (`RateLimit: "default";r=3;t=1`,
    /// `x-ratelimit-remaining-requests: 3`): the fleet's next calls fit what the partner will
    /// admit, whatever quota was configured.
    ///
    /// Other calls may take units between the read and the take; the take is tried again
    /// with a fresh read, a few times, and otherwise left (the limit is then lower than it
    /// read). Not for limits with leases, whose units are taken ahead.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, By, Limit, Policy, RateLimiter, Target};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RateLimiter::builder().build().await?;
    /// let partner = [Limit::new(Policy::new(Algorithm::Fixed, 100, Duration::from_secs(60))?, "partner", By::Global)];
    /// limiter.lower(&partner, &Target::global(), 5).await?; // the partner says 5 are left
    /// assert_eq!(limiter.peek(&partner, &Target::global()).await?.decisions()[0].remaining, 5);
    /// limiter.lower(&partner, &Target::global(), 50).await?; // never raised
    /// assert_eq!(limiter.peek(&partner, &Target::global()).await?.decisions()[0].remaining, 5);
    /// # Ok(()) }
    /// ```
    pub async fn lower(
        &self,
        limits: &[Limit],
        target: &Target,
        left: u64,
    ) -> Result<(), StoreError> {
        self.lower_taking(limits, target, left).await.map(|_| ())
    }

    /// [`RateLimiter::lower`], answering the units it took (over all of `limits`).
    pub(crate) async fn lower_taking(
        &self,
        limits: &[Limit],
        target: &Target,
        left: u64,
    ) -> Result<u64, StoreError> {
        let limits = &self.in_force(limits);
        let keys = target.keys(self, limits)?;
        let mut took = 0_u64;
        for (limit, key) in limits.iter().zip(&keys) {
            took = took.saturating_add(self.lower_one(limit, key, left).await?);
        }
        Ok(took)
    }

    /// [`RateLimiter::lower`] for one limit under its key: the units taken.
    async fn lower_one(&self, limit: &Limit, key: &str, left: u64) -> Result<u64, StoreError> {
        for _ in 0..LOWER_TRIES {
            let check = [Check::new(key, &limit.policy)];
            let now = self.admin(self.inner.store.peek(&check)).await?;
            let Some(has) = now.decisions().first().map(|d| d.remaining) else {
                return Ok(0);
            };
            let Some(excess) = has.checked_sub(left).filter(|e| *e > 0) else {
                return Ok(0);
            };
            let Ok(policy) = limit.policy.with_cost(excess) else {
                return Ok(0); // more than a call may take: the limit is not below it anyway
            };
            let take = [Check::new(key, &policy).with_scope(limit.scope)];
            if self
                .admin(self.inner.store.check(&take))
                .await?
                .is_admitted()
            {
                return Ok(excess);
            }
        }
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::limit::By;
    use crate::limiter::test_support::limiter;
    use crate::policy::Policy;

    fn partner(algorithm: Algorithm) -> [Limit; 1] {
        let policy = Policy::new(algorithm, 20, Duration::from_secs(1)).unwrap();
        [Limit::new(policy, "partner", By::Global)]
    }

    #[tokio::test(start_paused = true)]
    async fn a_deferred_budget_refuses_until_the_pause_ends_and_never_shortens_a_longer_one() {
        let (limiter, limits) = (limiter().await, partner(Algorithm::Gcra));
        let everyone = Target::global();
        let open = || async { limiter.peek(&limits, &everyone).await.unwrap() };
        let defer = |secs| limiter.defer(&limits, &everyone, Duration::from_secs(secs));
        defer(20).await.unwrap();
        let now = open().await;
        assert!(!now.is_admitted());
        assert!(now.retry_after().unwrap() > Duration::from_secs(19));
        // A shorter pause leaves the longer one.
        defer(2).await.unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(!open().await.is_admitted());
        tokio::time::sleep(Duration::from_secs(18)).await;
        assert!(open().await.is_admitted());
        // Zero is no pause.
        defer(0).await.unwrap();
        assert!(open().await.is_admitted());
    }

    /// An operator's block of an hour on one of two limits, then a 2 s pause of both: the
    /// block still ends in an hour (the pause is written per limit, never over a later block),
    /// and the other limit is paused.
    #[tokio::test(start_paused = true)]
    async fn a_pause_never_shortens_an_operator_s_block_and_pauses_every_other_limit() {
        let limiter = limiter().await;
        let [a] = partner(Algorithm::Gcra);
        let b = Limit::new(a.policy, "partner_b", By::Global);
        let everyone = Target::global();
        limiter
            .block(&[a], &everyone, Duration::from_secs(3600))
            .await
            .unwrap();
        limiter
            .defer(&[a, b], &everyone, Duration::from_secs(2))
            .await
            .unwrap();
        let wait = |v: &crate::decision::Verdict| v.retry_after().unwrap_or_default();
        let peek_a = limiter.peek(&[a], &everyone).await.unwrap();
        assert!(wait(&peek_a) > Duration::from_secs(3599), "{peek_a:?}");
        let peek_b = limiter.peek(&[b], &everyone).await.unwrap();
        assert!(wait(&peek_b) > Duration::from_secs(1), "{peek_b:?}");
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(!limiter.peek(&[a], &everyone).await.unwrap().is_admitted());
        assert!(limiter.peek(&[b], &everyone).await.unwrap().is_admitted());
    }

    #[tokio::test(start_paused = true)]
    async fn lowering_takes_the_difference_on_every_algorithm_and_never_raises() {
        for algorithm in [
            Algorithm::Fixed,
            Algorithm::Sliding,
            Algorithm::Token,
            Algorithm::Gcra,
            Algorithm::Leaky,
            Algorithm::SlidingCounter,
        ] {
            let (limiter, limits) = (limiter().await, partner(algorithm));
            let everyone = Target::global();
            let remaining = |v: crate::decision::Verdict| v.decisions()[0].remaining;
            limiter.lower(&limits, &everyone, 3).await.unwrap();
            let now = limiter.peek(&limits, &everyone).await.unwrap();
            assert_eq!(remaining(now), 3, "{algorithm:?}");
            limiter.lower(&limits, &everyone, 15).await.unwrap();
            let now = limiter.peek(&limits, &everyone).await.unwrap();
            assert_eq!(remaining(now), 3, "{algorithm:?}: never raised");
            limiter.lower(&limits, &everyone, 0).await.unwrap();
            assert!(
                !limiter
                    .peek(&limits, &everyone)
                    .await
                    .unwrap()
                    .is_admitted(),
                "{algorithm:?}"
            );
        }
    }
}
