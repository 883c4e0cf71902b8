//! Shadow mode: a limit (or the whole limiter) whose rejections are recorded, never enforced.
//!
//! A call is checked and counted as usual, in one store call with every limit of the function.
//! When the only limits that reject it are in shadow mode, the call goes through: a rejection
//! is logged (`INFO`, target `ratelimit_runtime::limiter`, "rate limit would reject (shadow
//! mode)", with the scope and the wait, never the caller) and counted
//! (`ratelimit_calls_total{outcome="shadow_rejected"}`, feature `metrics`). Since a rejected
//! call takes nothing from any limit, the store is left exactly as an enforced rejection
//! leaves it: the counts in shadow mode are the rejections enforcing would make. When a
//! function stacks enforced and shadow limits, the enforced ones are then checked again on
//! their own (a second store call, only for the would-be rejected calls), so that they count
//! the call that goes through. Shadow limits never refuse a call: when the store fails and
//! the failure policy would refuse ([`crate::FailurePolicy::Deny`]), a call whose limits are
//! all in shadow mode runs all the same.

use std::time::Duration;

use crate::decision::{Decision, Verdict};
use crate::error::StoreError;
use crate::limit::Limit;
use crate::observe;
use crate::store::Check;

use super::RateLimiter;

impl RateLimiter {
    /// Whether limit `limit` is in shadow mode here (its own `shadow`, or the limiter's).
    pub(crate) fn is_shadow(&self, limit: &Limit) -> bool {
        self.inner.settings.shadow || limit.shadow
    }

    /// Whether any of `limits` is in shadow mode here (their responses then carry no
    /// rate-limit headers).
    #[cfg_attr(not(any(feature = "axum", feature = "actix")), allow(dead_code))]
    pub(crate) fn any_shadow(&self, limits: &[Limit]) -> bool {
        self.inner.settings.shadow || limits.iter().any(|l| l.shadow)
    }

    /// The store check of `limit` under `key`.
    fn check_of<'a>(&self, limit: &'a Limit, key: &'a str) -> Check<'a> {
        let mut check = Check::new(key, &limit.policy).with_scope(limit.scope);
        check.replica_ack = limit.replica_ack;
        // A shadow limit never refuses a call: its own failure policy waits until it is
        // enforced.
        match limit.failure_policy.filter(|_| !self.is_shadow(limit)) {
            Some(policy) => check.with_failure_policy(policy),
            None => check,
        }
    }

    /// Checks `limits` under `keys` for one call, shadow mode applied, and counts the
    /// outcome: the verdict is admitted when the call may run.
    pub(crate) async fn decide(
        &self,
        limits: &[Limit],
        keys: &[String],
    ) -> Result<Verdict, StoreError> {
        self.decide_as(limits, keys, None).await
    }

    /// [`RateLimiter::decide`], taking with receipts under `call_id` when it is given (the
    /// outcome-filtered calls of `count = …`). The second check of a stacked call's enforced
    /// limits (see the module docs) takes without receipts: that call stays counted whatever
    /// its outcome (it fails closed).
    pub(crate) async fn decide_as(
        &self,
        limits: &[Limit],
        keys: &[String],
        call_id: Option<&str>,
    ) -> Result<Verdict, StoreError> {
        let checks = self.checks_of(limits, keys);
        let asked = match self.leased(limits, call_id) {
            Some(
                limit @ Limit {
                    lease: Some(lease), ..
                },
            ) => self.check_leased(limit, checks[0], *lease).await,
            _ => self.check_as(&checks, call_id).await,
        };
        match self.counted(limits, asked) {
            Counted::Final(result) => result,
            Counted::Rejected(verdict) => self.shadowed(limits, &checks, &verdict).await,
        }
    }

    /// [`RateLimiter::decide`] when the decision waits for nothing: the store is local and
    /// answers at once (the memory store), its breaker is closed, and no limit is in shadow
    /// mode. `None` otherwise, before anything was asked: the call is then decided by
    /// [`RateLimiter::decide`].
    ///
    /// A call whose future is polled once to its end costs its framework less (the future a
    /// framework boxes and moves holds nothing of the decision).
    pub(crate) fn decide_now(
        &self,
        limits: &[Limit],
        keys: &[String],
    ) -> Option<Result<Verdict, StoreError>> {
        // A store that is not local is asked by `decide` alone: its blocked-caller cache and
        // breaker are not asked twice (leases, too, serve only such stores). An open breaker
        // may hand this call its probe: `decide` takes it, so that a local store that does
        // not answer at once (a wrapper) never drops one here.
        if !self.inner.store.is_local() || self.inner.breaker.is_open() || self.any_shadow(limits) {
            return None;
        }
        let checks = self.checks_of(limits, keys);
        let asked = self.ask_now(&checks, None).ok()?.into_result();
        Some(match self.counted(limits, asked) {
            Counted::Final(result) => result,
            // No limit is in shadow mode: a rejection stands as the store answered it
            // (`shadowed` would give it back unchanged).
            Counted::Rejected(verdict) => Ok(verdict),
        })
    }

    /// The store checks of one call's limits under their keys.
    fn checks_of<'a>(&self, limits: &'a [Limit], keys: &'a [String]) -> Checks<'a> {
        if let ([limit], [key, ..]) = (limits, keys) {
            Checks::One([self.check_of(limit, key)])
        } else {
            Checks::Many(
                limits
                    .iter()
                    .zip(keys)
                    .map(|(l, k)| self.check_of(l, k))
                    .collect(),
            )
        }
    }

    /// A call's verdict once its store (or failure policy) answered, counted: final, or a
    /// rejection for shadow mode to look at ([`RateLimiter::shadowed`]).
    fn counted(&self, limits: &[Limit], asked: Result<Verdict, StoreError>) -> Counted {
        let labels = || limits.iter().map(|l| (l.scope, l.policy.algorithm()));
        let verdict = match asked {
            Ok(v) => v,
            // The store failed and the failure policy refused: a call whose limits are all in
            // shadow mode runs all the same (shadow never refuses; the failure was logged and
            // counted by the policy's answer).
            Err(_) if limits.iter().all(|l| self.is_shadow(l)) => {
                let whole = |l: &Limit| {
                    let cap = l.policy.capacity();
                    Decision::new(true, cap, cap, Duration::ZERO, Duration::ZERO)
                };
                return Counted::Final(Ok(Verdict::new(limits.iter().map(whole).collect())));
            }
            Err(e) => return Counted::Final(Err(e)),
        };
        let shadow = |i: usize| limits.get(i).is_some_and(|l| self.is_shadow(l));
        observe::count_verdict(labels(), &verdict, shadow);
        if verdict.is_admitted() {
            return Counted::Final(Ok(verdict));
        }
        Counted::Rejected(verdict)
    }

    /// A verdict that rejects, seen through shadow mode: each shadow limit's would-be
    /// rejection logged; the call refused when an enforced limit rejects (the shadow limits
    /// shown as admitting); otherwise admitted, its enforced limits checked again on their
    /// own so that the call counts against them (the first check took nothing: it rejected).
    async fn shadowed(
        &self,
        limits: &[Limit],
        checks: &[Check<'_>],
        verdict: &Verdict,
    ) -> Result<Verdict, StoreError> {
        let shadow = |i: usize| limits.get(i).is_some_and(|l| self.is_shadow(l));
        let rejecting = || {
            verdict
                .decisions()
                .iter()
                .enumerate()
                .filter(|(_, d)| !d.admitted)
                .map(|(i, _)| i)
        };
        // One event per would-be rejection, as the counter counts them: also for the shadow
        // limits of a call that an enforced limit rejects.
        for i in rejecting().filter(|&i| shadow(i)) {
            log_shadow_rejection(&limits[i], &verdict.decisions()[i]);
        }
        if !rejecting().all(shadow) {
            // An enforced limit rejects: the call is refused, with the enforced limits' wait
            // (a shadow limit's longer one would give it away and mislead).
            let decisions = (0..limits.len())
                .map(|i| {
                    let d = &verdict.decisions()[i];
                    if shadow(i) { as_admitted(d) } else { *d }
                })
                .collect();
            return Ok(Verdict::new(decisions));
        }
        let enforced: Vec<usize> = (0..limits.len()).filter(|&i| !shadow(i)).collect();
        let mut decisions: Vec<Decision> = verdict.decisions().iter().map(as_admitted).collect();
        if enforced.is_empty() {
            return Ok(Verdict::new(decisions));
        }
        let sub: Vec<Check<'_>> = enforced.iter().map(|&i| checks[i]).collect();
        let again = self.check(&sub).await?;
        observe::count_verdict(
            enforced
                .iter()
                .map(|&i| (limits[i].scope, limits[i].policy.algorithm())),
            &again,
            |_| false,
        );
        for (&i, d) in enforced.iter().zip(again.decisions()) {
            decisions[i] = *d;
        }
        Ok(Verdict::new(decisions))
    }
}

/// A decision as an admitting one: its numbers kept, no wait.
fn as_admitted(d: &Decision) -> Decision {
    Decision::new(true, d.limit, d.remaining, d.reset_after, Duration::ZERO)
}

/// The event of a shadow limit that would have rejected a call.
fn log_shadow_rejection(limit: &Limit, d: &Decision) {
    let retry_after_ms = d.retry_after.unwrap_or_default().as_millis();
    tracing::info!(target: crate::observe::log::LIMITER,
        scope = limit.scope,
        algorithm = limit.policy.algorithm().as_str(),
        limit = d.limit,
        retry_after_ms,
        "rate limit would reject (shadow mode)"
    );
}

/// The store checks of one call: one limit's on the stack (the usual call: no allocation).
enum Checks<'a> {
    One([Check<'a>; 1]),
    Many(Vec<Check<'a>>),
}

impl<'a> std::ops::Deref for Checks<'a> {
    type Target = [Check<'a>];

    fn deref(&self) -> &[Check<'a>] {
        match self {
            Self::One(check) => check,
            Self::Many(checks) => checks,
        }
    }
}

/// A call's verdict once counted ([`RateLimiter::counted`]).
enum Counted {
    /// The call's answer.
    Final(Result<Verdict, StoreError>),
    /// A rejection, which shadow mode may turn into an admission.
    Rejected(Verdict),
}
