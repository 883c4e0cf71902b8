//! Limits that follow the caller: the run-time half of `quota = …`, `cost = <expression>`,
//! `count = …` and of the limiter's scope overrides.
//!
//! A function whose limits are all static never comes here unless its limiter has an
//! override (one atomic load per call tells). Here, per call:
//!
//! 1. each limit's policy is worked out: the caller's [`Quota`] (`quota = …`) or the scope's
//!    override, then the call's cost; an unlimited quota drops the limit (no store call);
//! 2. the keys are built as for static limits ([`keys_for`]): the policy's numbers are part of
//!    the key, so a caller under another quota counts in another bucket;
//! 3. the call is checked, or — when some limit counts only some outcomes — *taken* with
//!    receipts, and after the body the limits whose `count` excludes the outcome get their
//!    units back ([`Taken::settle`]). Calls in flight hold their units, so concurrent calls
//!    never get more than the quota of counted outcomes.
//!
//! The macro reaches the data items (`Dynamic`, `Input`, `Count`, …) through
//! `crate::__private`.

use std::borrow::Cow;

use crate::cost::{IntoUnits, Units};
use crate::decision::Verdict;
use crate::error::RateLimitError;
use crate::limit::{By, Limit, keys_for};
use crate::limiter::RateLimiter;
use crate::policy::Policy;
use crate::quota::{AsQuota, Quota};
use crate::store::Check;

/// Where a limit's quota comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaFrom {
    /// The attribute's `num`/`time`/`burst` (or the scope's override).
    Attribute,
    /// `quota = "request"`: the [`Quota`] the auth layer put in the request extensions.
    Request,
    /// `quota = "{arg}"`: an argument of the call ([`Input::quota`]).
    Argument,
}

/// Which outcomes of a call count against a limit: the attribute's `count = …`, and
/// [`crate::layer::RateLimitLayerBuilder::count`] for a layer's limit. A call takes its units before
/// it runs; when its outcome does not count, it gets them back after.
///
/// ```
/// use ratelimit_runtime::settle::Count;
///
/// // Only failed requests (status 4xx and 5xx) count: a brute-force limit on a login.
/// let errors = Count::ERRORS;
/// assert_eq!(errors, Count::Status((1 << 4) | (1 << 5)));
/// // Only server errors: bit `n` of the mask for status class `nxx`.
/// let five_xx = Count::Status(1 << 5);
/// assert_ne!(five_xx, errors);
/// assert_ne!(Count::All, Count::Err);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// Every admitted call (the default).
    All,
    /// Plain functions: calls that return `Err` (handlers: status 400 and above).
    Err,
    /// Plain functions: calls that return `Ok` (handlers: status below 400).
    Ok,
    /// Handlers: responses whose status class is in the mask (bit `n` for `nxx`).
    Status(u8),
}

/// What a call ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A plain function returned `Ok`.
    Ok,
    /// A plain function returned `Err`.
    Err,
    /// A handler answered with this status.
    Status(u16),
}

impl Outcome {
    /// The outcome of a plain function's result.
    pub fn of<T, E>(result: &Result<T, E>) -> Self {
        if result.is_ok() { Self::Ok } else { Self::Err }
    }
}

impl Count {
    /// `4xx` and `5xx`: what `count = "errors"` means for handlers.
    pub const ERRORS: Self = Self::Status((1 << 4) | (1 << 5));

    /// Whether `outcome` counts.
    pub fn counts(self, outcome: Outcome) -> bool {
        let failed = match outcome {
            Outcome::Ok => false,
            Outcome::Err => true,
            Outcome::Status(s) => s >= 400,
        };
        match self {
            Self::All => true,
            Self::Err => failed,
            Self::Ok => !failed,
            Self::Status(mask) => match outcome {
                Outcome::Status(s) => u8::try_from(s / 100)
                    .ok()
                    .filter(|class| *class < 8)
                    .is_some_and(|class| mask & (1 << class) != 0),
                // A handler's outcome is a status; a result counts as its class would.
                Outcome::Err => mask & (1 << 5) != 0,
                Outcome::Ok => mask & (1 << 2) != 0,
            },
        }
    }
}

/// The run-time parts of one limit, as the macro wrote them (a `static` beside the
/// [`Limit`]s, for functions with a dynamic limit).
#[derive(Debug, Clone, Copy)]
pub struct Dynamic {
    /// Where the quota comes from.
    pub quota: QuotaFrom,
    /// Which outcomes count.
    pub count: Count,
    /// `settle = …`: the call's cost is an estimate, settled after the body to what it used.
    pub settle: bool,
}

impl Dynamic {
    /// A limit with nothing dynamic (in a stack where another limit is).
    pub const STATIC: Self = Self {
        quota: QuotaFrom::Attribute,
        count: Count::All,
        settle: false,
    };
}

/// What one call gives a limit at run time.
#[derive(Debug, Clone, Copy, Default)]
pub struct Input {
    /// `quota = "{arg}"`: the argument's quota (`None` when the argument had none).
    pub quota: Option<Quota>,
    /// `cost = <expression>` (or a `const`): the call's cost, as [`cost_of`] computed it.
    pub cost: Option<Units>,
}

impl Input {
    /// No run-time input.
    pub const NONE: Self = Self {
        quota: None,
        cost: None,
    };
}

/// A `quota = "{arg}"` argument's quota.
pub fn quota_of<Q: AsQuota + ?Sized>(quota: &Q) -> Option<Quota> {
    quota.as_quota()
}

/// A `cost = <expression>` value (the macro hands the expression's arithmetic to
/// the runtime's `cost` module, so it cannot wrap): a negative value is refused
/// ([`RateLimitError::NegativeCost`]), one beyond the capacity too
/// ([`RateLimitError::CostExceedsCapacity`]); 0 counts as 1 (a call always takes at least one
/// unit).
pub fn cost_of<T: IntoUnits>(cost: T) -> Units {
    Units::of(cost)
}

/// The limits of one call as they apply to this caller: effective policies, in the order the
/// store sees them (the limits with an outcome filter first), with their keys.
pub(crate) struct Plan {
    pub(crate) limits: Vec<Limit>,
    pub(crate) keys: Vec<String>,
    /// How many of the first limits count only some outcomes.
    filtered: usize,
    /// Their filter (one for the whole call: the macro checks they agree).
    count: Count,
    /// Which limits settle their cost after the call (`settle = …`), by position, each with
    /// the least it settles to (a fixed cost merged into it).
    settled: Vec<Option<u64>>,
}

/// Works out the limits of one call: policies from quotas, overrides and costs; unlimited
/// ones dropped; keys built; filtered limits first.
#[allow(clippy::too_many_arguments)] // the call's parts, as both modes hold them
pub(crate) fn plan<'c, E>(
    limiter: &RateLimiter,
    limits: &[Limit],
    dynamics: Option<&[Dynamic]>,
    inputs: &[Input],
    request_quota: Option<Quota>,
    templates: &[Option<&str>],
    by_value: impl FnMut(By) -> Result<Option<Cow<'c, [u8]>>, E>,
    error: impl Fn(RateLimitError) -> E,
) -> Result<Plan, E> {
    let mut effective: Vec<Effective<'_>> = Vec::with_capacity(limits.len());
    for (i, limit) in limits.iter().enumerate() {
        let dynamic = dynamics.and_then(|d| d.get(i)).copied();
        let dynamic = dynamic.unwrap_or(Dynamic::STATIC);
        let input = inputs.get(i).copied().unwrap_or(Input::NONE);
        let template = templates.get(i).copied().flatten();
        let quota =
            quota_of_limit(limiter, limit, dynamic, input, request_quota).map_err(&error)?;
        if let Some(e) = effective_limit(limit, dynamic, input, quota, template).map_err(&error)? {
            effective.push(e);
        }
    }
    let (limits, templates): (Vec<Limit>, Vec<Option<&str>>) =
        effective.iter().map(|e| (e.limit, e.template)).unzip();
    let keys = keys_for(&limiter.settings().prefix, &limits, &templates, by_value)?;
    let mut merged = merge(effective, keys);
    // Filtered limits first: a refund gives back a prefix of the take (the receipts are
    // numbered by position).
    merged.sort_by_key(|m| m.dynamic.count == Count::All);
    let filtered = merged
        .iter()
        .filter(|m| m.dynamic.count != Count::All)
        .count();
    let count = merged.first().map_or(Count::All, |m| m.dynamic.count);
    let settled = merged
        .iter()
        .map(|m| m.dynamic.settle.then_some(m.floor))
        .collect();
    let (limits, keys) = merged.into_iter().map(|m| (m.limit, m.key)).unzip();
    Ok(Plan {
        limits,
        keys,
        filtered,
        count,
        settled,
    })
}

/// One limit as it applies to this call, before its key.
struct Effective<'t> {
    limit: Limit,
    template: Option<&'t str>,
    dynamic: Dynamic,
    /// Whether a run-time quota chose its policy.
    chosen_at_run_time: bool,
}

/// One limit of the plan, with its key and the least a settle leaves of its cost.
struct Merged {
    limit: Limit,
    key: String,
    dynamic: Dynamic,
    chosen_at_run_time: bool,
    floor: u64,
}

/// The run-time quota of `limit` for this call: the scope's override, the request's or the
/// argument's; `None` for the attribute's own numbers.
fn quota_of_limit(
    limiter: &RateLimiter,
    limit: &Limit,
    dynamic: Dynamic,
    input: Input,
    request_quota: Option<Quota>,
) -> Result<Option<Quota>, RateLimitError> {
    Ok(match dynamic.quota {
        QuotaFrom::Attribute => limiter.quota_override(limit.scope),
        QuotaFrom::Request => Some(request_quota.ok_or(RateLimitError::MissingQuota)?),
        QuotaFrom::Argument => Some(input.quota.ok_or(RateLimitError::MissingQuota)?),
    })
}

/// `limit` with its policy worked out from `quota` and the call's cost; `None` when the
/// quota is unlimited (the limit is dropped: no store call).
fn effective_limit<'t>(
    limit: &Limit,
    dynamic: Dynamic,
    input: Input,
    quota: Option<Quota>,
    template: Option<&'t str>,
) -> Result<Option<Effective<'t>>, RateLimitError> {
    let base = limit.policy;
    let cost = match input.cost.map(Units::to_cost) {
        None => base.cost(),
        Some(Ok(cost)) => cost,
        Some(Err(cost)) => return Err(RateLimitError::NegativeCost { cost }),
    };
    let policy = match quota {
        Some(q) => match q.apply(base.algorithm(), 1) {
            Ok(Some(p)) => p,
            Ok(None) => return Ok(None),
            Err(e) => return Err(RateLimitError::InvalidQuota(e)),
        },
        None => base,
    };
    let policy = with_cost(policy, cost)?;
    // A concurrency limit is released whatever the outcome: never outcome-filtered.
    let count = if limit.holds_slot() {
        Count::All
    } else {
        dynamic.count
    };
    Ok(Some(Effective {
        limit: Limit { policy, ..*limit },
        template,
        dynamic: Dynamic { count, ..dynamic },
        chosen_at_run_time: quota.is_some(),
    }))
}

/// The limits with their keys, two that a run-time quota made one bucket (an override or a
/// caller's quota equal to a stacked limit) merged into one: counted once, never twice per
/// call. The stricter parts win: the larger cost, enforced over shadow, every outcome
/// counted over some; it settles if a part settles, never below a fixed part's cost.
fn merge(effective: Vec<Effective<'_>>, keys: Vec<String>) -> Vec<Merged> {
    let mut merged: Vec<Merged> = Vec::with_capacity(keys.len());
    for (e, key) in effective.into_iter().zip(keys) {
        let floor = if e.dynamic.settle {
            0
        } else {
            e.limit.policy.cost()
        };
        let run_time = e.chosen_at_run_time;
        if let Some(m) = merged
            .iter_mut()
            .find(|m| m.key == key && (m.chosen_at_run_time || run_time))
        {
            if e.limit.policy.cost() > m.limit.policy.cost() {
                m.limit.policy = e.limit.policy;
            }
            m.dynamic.settle |= e.dynamic.settle;
            m.floor = m.floor.max(floor);
            m.limit.shadow &= e.limit.shadow;
            if e.dynamic.count == Count::All {
                m.dynamic.count = Count::All;
            }
            m.chosen_at_run_time = true;
            continue;
        }
        merged.push(Merged {
            limit: e.limit,
            key,
            dynamic: e.dynamic,
            chosen_at_run_time: run_time,
            floor,
        });
    }
    merged
}

/// `policy` with `cost`, or the typed error of a cost that never fits.
fn with_cost(policy: Policy, cost: u64) -> Result<Policy, RateLimitError> {
    if cost == policy.cost() {
        return Ok(policy);
    }
    policy
        .with_cost(cost)
        .map_err(|_| RateLimitError::CostExceedsCapacity {
            cost,
            capacity: policy.capacity(),
        })
}

impl Plan {
    fn checks(&self) -> Vec<Check<'_>> {
        self.limits
            .iter()
            .zip(&self.keys)
            .map(|(l, k)| Check::new(k, &l.policy).with_scope(l.scope))
            .collect()
    }

    /// Checks the call (taking with receipts when some limit counts only some outcomes). An
    /// empty plan (every limit unlimited) is admitted without a store call.
    pub(crate) async fn run(
        self,
        limiter: &RateLimiter,
    ) -> Result<(Verdict, Taken), crate::error::StoreError> {
        if self.limits.is_empty() {
            return Ok((
                Verdict::new(Vec::new()),
                Taken {
                    plan: self,
                    pending: None,
                },
            ));
        }
        // Shadow mode and the metrics apply as to static limits. A call that gives back or
        // settles after its body is taken with receipts; a concurrency limit's lease is named
        // by the call id, which its release removes.
        let holds = self.limits.iter().any(Limit::holds_slot);
        let receipts = self.filtered > 0 || holds || self.settled.iter().any(Option::is_some);
        let call_id = receipts.then(crate::store::new_call_id);
        if call_id.is_none() || limiter.store_is_local() {
            // Nothing to release, or a store that decides within one poll.
            return self.take(limiter, call_id).await;
        }
        // A remote take with receipts runs on a task of its own: a caller dropped while the
        // take is in flight (a client that hung up) leaves the task to finish it, and the
        // `Taken` nobody claims releases what it got (a concurrency slot held for the whole
        // lease otherwise). The release follows the take's answer, so it never runs before
        // the take, and it runs once: the caller never got that `Taken`.
        let owner = limiter.clone();
        limiter
            .run_detached(async move { self.take(&owner, call_id).await })
            .await
            .unwrap_or_else(|| {
                Err(crate::error::StoreError::connection(
                    "the runtime shut down while the check was in flight",
                ))
            })
    }

    /// Takes (with receipts under `call_id`, when given) and keeps what an admitted take must
    /// release.
    async fn take(
        self,
        limiter: &RateLimiter,
        call_id: Option<String>,
    ) -> Result<(Verdict, Taken), crate::error::StoreError> {
        let verdict = limiter
            .decide_as(&self.limits, &self.keys, call_id.as_deref())
            .await?;
        // Only an admitted take left receipts.
        let pending = call_id
            .filter(|_| verdict.is_admitted())
            .map(|call_id| Pending {
                limiter: limiter.clone(),
                call_id,
            });
        Ok((
            verdict,
            Taken {
                plan: self,
                pending,
            },
        ))
    }
}

/// The receipts of an admitted take, until its outcome settles them.
struct Pending {
    limiter: RateLimiter,
    call_id: String,
}

/// A checked call: what [`Taken::settle`] gives back after the body, if its outcome does not
/// count. Dropped unsettled (the call was cancelled or panicked), it counts: its receipts are
/// dropped in the background, so they never outlive the call.
pub(crate) struct Taken {
    plan: Plan,
    pending: Option<Pending>,
}

impl std::fmt::Debug for Taken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Taken")
            .field("limits", &self.plan.limits.len())
            .field("filtered", &self.plan.filtered)
            .finish_non_exhaustive()
    }
}

impl Taken {
    /// The limits as they applied to this call (for the rate-limit fields).
    pub(crate) fn limits(&self) -> &[Limit] {
        &self.plan.limits
    }

    /// Whether some limit settles its cost after the call (`settle = …`).
    pub(crate) fn settles(&self) -> bool {
        self.plan.settled.iter().any(Option::is_some)
    }

    /// After the body: gives back the filtered limits' units when `outcome` does not count,
    /// settles the limits with `settle = …` to `actual` units (when given), and drops the
    /// call's receipts whatever the outcome.
    pub(crate) async fn settle(mut self, outcome: Outcome, actual: Option<u64>) {
        let Some(Pending { limiter, call_id }) = self.pending.take() else {
            return;
        };
        let checks = self.plan.checks();
        let filtered = self.plan.filtered;
        if let Some(actual) = actual.filter(|_| self.settles()) {
            // One settle for the whole call: a limit whose outcome does not count gives back
            // everything (settled to 0), one with `settle` is settled to what the call used,
            // the others stay counted.
            let counts = self.plan.count.counts(outcome);
            let units: Vec<u64> = checks
                .iter()
                .enumerate()
                .map(|(i, check)| {
                    if i < filtered && !counts {
                        0
                    } else if let Some(floor) = self.plan.settled[i] {
                        actual.max(floor)
                    } else {
                        check.policy.cost()
                    }
                })
                .collect();
            limiter.settle(&checks, &call_id, &units).await;
            if self.plan.limits.iter().any(Limit::holds_slot) {
                limiter.forget(&checks, &call_id).await; // releases the call's slots
            }
            return;
        }
        if !self.plan.count.counts(outcome) {
            limiter.refund(&checks[..filtered], &call_id).await;
            if filtered == checks.len() {
                return; // the refund read and deleted every receipt
            }
        }
        limiter.forget(&checks, &call_id).await;
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        let Some(Pending { limiter, call_id }) = self.pending.take() else {
            return;
        };
        // A store in this process releases before the drop returns: a call retried at once
        // after a cancelled or panicking one finds its slot free.
        if limiter.forget_at_once(&self.plan.checks(), &call_id) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // no runtime to send it on: the receipts expire by themselves
        };
        let limits = std::mem::take(&mut self.plan.limits);
        let keys = std::mem::take(&mut self.plan.keys);
        let tracked = limiter.track(); // shutdown waits for the release
        runtime.spawn(async move {
            let _tracked = tracked;
            let checks: Vec<Check<'_>> = limits
                .iter()
                .zip(&keys)
                .map(|(l, k)| Check::new(k, &l.policy).with_scope(l.scope))
                .collect();
            limiter.forget(&checks, &call_id).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_the_outcome() {
        assert!(Count::All.counts(Outcome::Ok));
        assert!(Count::Err.counts(Outcome::Err));
        assert!(!Count::Err.counts(Outcome::Ok));
        assert!(Count::Err.counts(Outcome::Status(401)));
        assert!(!Count::Err.counts(Outcome::Status(302)));
        assert!(Count::Ok.counts(Outcome::Status(200)));
        assert!(Count::ERRORS.counts(Outcome::Status(500)));
        assert!(Count::ERRORS.counts(Outcome::Status(404)));
        assert!(!Count::ERRORS.counts(Outcome::Status(204)));
        let five = Count::Status(1 << 5);
        assert!(!five.counts(Outcome::Status(429)));
        assert!(five.counts(Outcome::Status(503)));
        // Out-of-range statuses never index past the mask.
        assert!(!five.counts(Outcome::Status(u16::MAX)));
    }

    #[test]
    fn costs_are_at_least_one_and_never_wrap() {
        assert_eq!(cost_of(3_usize).to_cost(), Ok(3));
        assert_eq!(cost_of(0_u32).to_cost(), Ok(1));
        assert_eq!(cost_of(-1_i64).to_cost(), Err(-1));
        assert_eq!(cost_of(u128::MAX).to_cost(), Ok(u64::MAX));
    }
}
