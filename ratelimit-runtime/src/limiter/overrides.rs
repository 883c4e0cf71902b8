//! Run-time quotas of the limiter: scope overrides ([`RateLimiter::set_quota`]) and the
//! take-then-refund of outcome-filtered calls ([`RateLimiter::take`], [`RateLimiter::refund`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};

use super::{Inner, RateLimiter};
use crate::decision::Verdict;
use crate::error::{ConfigError, StoreError};
use crate::key;
use crate::quota::Quota;
use crate::store::Check;

/// Quotas that replace the attribute's for whole scopes. `any` is read first, so a limiter
/// without overrides pays one relaxed atomic load per call.
#[derive(Debug, Default)]
pub(crate) struct Overrides {
    any: AtomicBool,
    map: RwLock<HashMap<Box<str>, Quota>>,
    /// Whether the limiter was installed or ran calls in [`RateLimiter::scope`]: where
    /// `#[rate_limit]` can see its overrides.
    used: AtomicBool,
}

/// Limiters given an override before they were installed or scoped: if the default limiter
/// is then built from the environment, their overrides reach no `#[rate_limit]`, and
/// [`warn_unseen_overrides`] says so.
static NOT_YET_USED: Mutex<Vec<Weak<Inner>>> = Mutex::new(Vec::new());

/// Marks `limiter` as one `#[rate_limit]` sees (installed, or around a scope).
pub(super) fn mark_used(limiter: &RateLimiter) {
    limiter.inner.overrides.used.store(true, Ordering::Relaxed);
}

/// The scopes overridden on live limiters that were never installed nor scoped.
fn unseen_overrides() -> Vec<Box<str>> {
    let mut list = NOT_YET_USED.lock().unwrap_or_else(PoisonError::into_inner);
    list.retain(|weak| weak.strong_count() > 0);
    let mut scopes: Vec<Box<str>> = list
        .iter()
        .filter_map(Weak::upgrade)
        .filter(|inner| !inner.overrides.used.load(Ordering::Relaxed))
        .flat_map(|inner| {
            let map = inner
                .overrides
                .map
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            map.keys().cloned().collect::<Vec<_>>()
        })
        .collect();
    scopes.sort_unstable();
    scopes.dedup();
    scopes
}

/// Called when the default limiter is built from the environment, that is when no limiter
/// was installed: overrides set on a limiter nobody installed would silently do nothing.
pub(super) fn warn_unseen_overrides() {
    let scopes = unseen_overrides();
    if !scopes.is_empty() {
        tracing::error!(
            target: crate::observe::log::LIMITER,
            scopes = ?scopes,
            "quota overrides were set on a limiter that was never installed: #[rate_limit] uses \
             the default limiter, which has none; call `.install()` on the limiter that holds them \
             (or run the calls inside its `scope`)"
        );
    }
}

impl Overrides {
    fn get(&self, scope: &str) -> Option<Quota> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        self.map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(scope)
            .copied()
    }

    fn set(&self, scope: &str, quota: Option<Quota>) {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        match quota {
            Some(q) => {
                map.insert(scope.into(), q);
            }
            None => {
                map.remove(scope);
            }
        }
        self.any.store(!map.is_empty(), Ordering::Relaxed);
    }
}

impl RateLimiter {
    /// Replaces the quota of every limit of `scope` (its `num`, period and `burst`; the
    /// algorithm and the cost stay the attribute's) from the next call on, without a restart:
    /// for quotas read from configuration. [`Quota::unlimited`] switches the scope's limits
    /// off. The `RateLimit-Policy` field of HTTP responses shows the quota in force.
    ///
    /// The scope is the attribute's `scope`, or the function's module path and name
    /// (`my_app::handlers::login`) when it has none. A limit written with `quota = …` takes
    /// its quota from the caller and ignores overrides.
    ///
    /// A different quota is a different bucket (the store key holds the quota's numbers): a
    /// caller's next call after a change starts a fresh window under the new quota, and
    /// setting the old quota back finds the old window where it was (until it expires).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use ratelimit_runtime::{Quota, RateLimitError, RateLimiter, rate_limit};
    ///
    /// #[rate_limit(num = 1, time = 60, scope = "reports")]
    /// async fn report() -> Result<(), RateLimitError> {
    ///     Ok(())
    /// }
    ///
    /// let limiter = RateLimiter::builder().build().await?;
    /// limiter.set_quota("reports", Quota::per_minute(3)?)?;
    /// let admitted = limiter
    ///     .clone()
    ///     .scope(async {
    ///         let mut n = 0;
    ///         for _ in 0..5 {
    ///             n += usize::from(report().await.is_ok());
    ///         }
    ///         n
    ///     })
    ///     .await;
    /// assert_eq!(admitted, 3);
    /// assert_eq!(limiter.quota_override("reports"), Some(Quota::per_minute(3)?));
    /// limiter.clear_quota("reports");
    /// assert_eq!(limiter.quota_override("reports"), None);
    /// # Ok(()) }
    /// ```
    ///
    /// Overrides apply to every limit of `scope` on every transport — `#[rate_limit]` on plain
    /// functions, handlers and gRPC methods, a [`crate::RateLimitLayer`]'s limits — and to the
    /// admin calls ([`RateLimiter::peek`] and the others): they are a step of the one call
    /// pipeline.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] when `scope` is not a valid scope name.
    pub fn set_quota(&self, scope: &str, quota: Quota) -> Result<(), ConfigError> {
        if !key::valid_scope(scope) {
            return Err(ConfigError::Invalid(format!(
                "invalid scope {scope:?}: use 1 to 200 characters of A-Z a-z 0-9 _ : . - /"
            )));
        }
        self.inner.overrides.set(scope, Some(quota));
        if !self.inner.overrides.used.load(Ordering::Relaxed) {
            let mut list = NOT_YET_USED.lock().unwrap_or_else(PoisonError::into_inner);
            list.retain(|weak| weak.strong_count() > 0);
            if !list
                .iter()
                .any(|weak| std::ptr::eq(weak.as_ptr(), Arc::as_ptr(&self.inner)))
            {
                list.push(Arc::downgrade(&self.inner));
            }
        }
        Ok(())
    }

    /// Removes the override of `scope`: its limits use the attribute's quota again.
    pub fn clear_quota(&self, scope: &str) {
        self.inner.overrides.set(scope, None);
    }

    /// The quota that overrides `scope`'s, if one was set.
    pub fn quota_override(&self, scope: &str) -> Option<Quota> {
        self.inner.overrides.get(scope)
    }

    /// Whether any scope has an override (one atomic load): the static limits' fast path
    /// is kept when not.
    pub(crate) fn has_overrides(&self) -> bool {
        self.inner.overrides.any.load(Ordering::Relaxed)
    }

    /// Like [`RateLimiter::check`], and when the store admits the call it leaves receipts
    /// under a fresh call id, returned with the verdict, so that [`RateLimiter::refund`] can
    /// give back what the call took (for calls whose outcome decides whether they count).
    /// A verdict given by the failure policy, or by a store without refunds, has no receipts
    /// behind it: its refund gives back nothing.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, store::Check, Policy, RateLimiter};
    ///
    /// let limiter = RateLimiter::builder().build().await?;
    /// let policy = Policy::new(Algorithm::Fixed, 1, Duration::from_secs(60))?;
    /// let checks = [Check::new("login", &policy)];
    /// let (verdict, call_id) = limiter.take(&checks).await?;
    /// assert!(verdict.is_admitted());
    /// limiter.refund(&checks, &call_id).await; // this attempt did not count
    /// assert!(limiter.check(&checks).await?.is_admitted());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`RateLimiter::check`].
    pub async fn take(&self, checks: &[Check<'_>]) -> Result<(Verdict, String), StoreError> {
        let id = crate::store::new_call_id();
        let verdict = self.check_as(checks, Some(&id)).await?;
        Ok((verdict, id))
    }

    /// Gives back what the call taken under `call_id` ([`RateLimiter::take`]) still holds of
    /// its first `checks.len()` limits. Never more than the call took, never twice. Bounded
    /// by the timeout; a refund that fails or comes too late (after the receipts expired, at
    /// most 10 seconds after the take) gives back nothing and the call stays counted: it
    /// fails closed, never admitting more than the quota.
    pub async fn refund(&self, checks: &[Check<'_>], call_id: &str) {
        if checks.is_empty() || self.store_failing() {
            return;
        }
        let timeout = self.inner.settings.timeout;
        let result =
            match tokio::time::timeout(timeout, self.inner.store.refund(checks, call_id)).await {
                Ok(r) => r,
                Err(_) => Err(StoreError::Timeout(timeout)),
            };
        if let Err(error) = result
            && let Some(held_back) = self.inner.warnings.permit()
        {
            let scope = checks.first().map_or("", |c| c.scope);
            tracing::warn!(target: crate::observe::log::LIMITER,
                store = self.inner.store.name(),
                scope,
                %error,
                held_back,
                "rate-limit refund failed; the call stays counted"
            );
        }
    }

    /// Settles the call taken under `call_id` ([`RateLimiter::take`]; `checks` are that take's
    /// checks, their cost the call's estimate) to the units it used, `actual[i]` for limit
    /// `i`: the difference back when it used less, the excess charged when it used more
    /// ([`crate::algorithm::settle`] is the rule). This is what `settle = …` on
    /// `#[rate_limit]` does after the body, for code that checks by hand. Bounded by the
    /// timeout; a settle that fails leaves the call counted at its estimate (logged), so a
    /// store fault never gives back what the call used.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, store::Check, Policy, RateLimiter};
    ///
    /// let limiter = RateLimiter::builder().build().await?;
    /// // 10,000 tokens a minute; this completion may use up to 1,000.
    /// let estimate = Policy::new(Algorithm::Fixed, 10_000, Duration::from_secs(60))?.with_cost(1_000)?;
    /// let checks = [Check::new("tokens:alice", &estimate)];
    /// let (verdict, call_id) = limiter.take(&checks).await?;
    /// assert!(verdict.is_admitted());
    /// limiter.settle(&checks, &call_id, &[3_000]).await; // it used 3,000
    /// assert_eq!(limiter.check(&checks).await?.decisions()[0].remaining, 6_000);
    /// # Ok(()) }
    /// ```
    pub async fn settle(&self, checks: &[Check<'_>], call_id: &str, actual: &[u64]) {
        if checks.is_empty() || self.store_failing() {
            if !checks.is_empty() {
                self.settle_failed(checks, &StoreError::connection("the store is failing"));
            }
            return;
        }
        let timeout = self.inner.settings.timeout;
        let result =
            match tokio::time::timeout(timeout, self.inner.store.settle(checks, call_id, actual))
                .await
            {
                Ok(r) => r,
                Err(_) => Err(StoreError::Timeout(timeout)),
            };
        if let Err(error) = result {
            self.settle_failed(checks, &error);
        }
    }

    /// Logs a settle that failed: the call stays counted at its estimate.
    fn settle_failed(&self, checks: &[Check<'_>], error: &StoreError) {
        if let Some(held_back) = self.inner.warnings.permit() {
            let scope = checks.first().map_or("", |c| c.scope);
            tracing::warn!(target: crate::observe::log::LIMITER,
                store = self.inner.store.name(),
                scope,
                %error,
                held_back,
                "rate-limit settle failed; the call stays counted at its estimate"
            );
        }
    }

    /// Drops the receipts the call taken under `call_id` ([`RateLimiter::take`]; `checks` are
    /// that take's checks) left, giving nothing back: the call stays counted. Call it when a
    /// taken call's outcome counts, so that receipts live only while their call runs. Bounded
    /// by the timeout; a failure only leaves the receipts to expire by themselves.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, store::Check, Policy, RateLimiter};
    ///
    /// let limiter = RateLimiter::builder().build().await?;
    /// let policy = Policy::new(Algorithm::Fixed, 1, Duration::from_secs(60))?;
    /// let checks = [Check::new("login", &policy)];
    /// let (_, call_id) = limiter.take(&checks).await?;
    /// limiter.forget(&checks, &call_id).await; // this attempt counts
    /// limiter.refund(&checks, &call_id).await; // too late: nothing to give back
    /// assert!(!limiter.check(&checks).await?.is_admitted());
    /// # Ok(()) }
    /// ```
    pub async fn forget(&self, checks: &[Check<'_>], call_id: &str) {
        if checks.is_empty() || self.store_failing() {
            return;
        }
        let timeout = self.inner.settings.timeout;
        let forget = self.inner.store.forget(checks, call_id);
        if let Ok(Err(error)) = tokio::time::timeout(timeout, forget).await {
            tracing::debug!(target: crate::observe::log::LIMITER, store = self.inner.store.name(), %error, "rate-limit receipts could not be dropped; they expire by themselves");
        }
    }

    /// [`RateLimiter::forget`] before returning, where the store answers at once (a store in
    /// this process, [`Store::is_local`](crate::store::Store::is_local)): whether it was done.
    /// A remote store's release is a round trip, left to the caller's task.
    pub(crate) fn forget_at_once(&self, checks: &[Check<'_>], call_id: &str) -> bool {
        if checks.is_empty() || !self.inner.store.is_local() {
            return false;
        }
        let mut forget = std::pin::pin!(self.inner.store.forget(checks, call_id));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        forget.as_mut().poll(&mut cx).is_ready()
    }
}

impl super::Builder {
    /// Overrides the quota of `scope` from the start (see [`RateLimiter::set_quota`]); an
    /// invalid scope name makes the build fail.
    ///
    /// ```
    /// use ratelimit_runtime::{Quota, RateLimiter};
    /// let limiter = RateLimiter::builder()
    ///     .override_quota("my_app::login", Quota::per_minute(10)?)
    ///     .build_lazy()?;
    /// assert_eq!(limiter.quota_override("my_app::login"), Some(Quota::per_minute(10)?));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn override_quota(mut self, scope: impl Into<String>, quota: Quota) -> Self {
        self.overrides.push((scope.into(), quota));
        self
    }
}

/// Applies a builder's overrides to the limiter it built.
pub(super) fn install(
    limiter: RateLimiter,
    overrides: Vec<(String, Quota)>,
) -> Result<RateLimiter, ConfigError> {
    for (scope, quota) in overrides {
        limiter.set_quota(&scope, quota)?;
    }
    Ok(limiter)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An override on a limiter nobody installs is reported (the scopes
    /// named), one used through `scope` or dropped is not.
    #[tokio::test]
    async fn overrides_on_a_limiter_nobody_uses_are_reported() {
        let has = |scope: &str| unseen_overrides().iter().any(|s| &**s == scope);
        let orphan = RateLimiter::builder()
            .override_quota("unseen-at-start", Quota::per_minute(3).unwrap())
            .build()
            .await
            .unwrap();
        orphan
            .set_quota("unseen-later", Quota::per_minute(3).unwrap())
            .unwrap();
        assert!(has("unseen-at-start") && has("unseen-later"));

        let scoped = RateLimiter::builder().build().await.unwrap();
        scoped
            .set_quota("seen-in-scope", Quota::per_minute(3).unwrap())
            .unwrap();
        assert!(has("seen-in-scope"));
        scoped.clone().scope(async {}).await;
        assert!(!has("seen-in-scope"));
        // Once used, later overrides are seen too.
        scoped
            .set_quota("seen-after-scope", Quota::per_minute(3).unwrap())
            .unwrap();
        assert!(!has("seen-after-scope"));

        drop(orphan);
        assert!(!has("unseen-at-start") && !has("unseen-later"));
    }
}
