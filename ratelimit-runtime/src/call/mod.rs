//! The one call pipeline: every limited call, on every transport, goes through these steps,
//! written once.
//!
//! 1. **Exemptions and the deny list** ([`exempt`]): read from the [`Caller`] (a plain
//!    function has none and is always limited).
//! 2. **The limits as they apply to this call** ([`plan`]): the scope's run-time override, the
//!    caller's quota (`quota = …`), the call's cost (`cost = <expression>`); an unlimited quota
//!    drops its limit. Functions whose limits are all static, on a limiter without overrides,
//!    skip this step (one atomic load tells).
//! 3. **The keys**: each limit's `by` value read from the caller, its `key` template.
//! 4. **The decision** ([`crate::RateLimiter`]): shadow mode, the blocked-caller cache, the
//!    breaker, the timeout, the store (one round trip for every limit of the call), the
//!    failure policy; or, when some limit counts only some outcomes (`count = …`), a *take*
//!    with receipts.
//! 5. **The answer**: an [`Admitted`] call (its rate-limit fields; after the body,
//!    [`Admitted::settle`] gives back what an uncounted outcome took) or a [`Refused`] one, a
//!    neutral reason that each transport renders: a `RateLimitError` for plain functions, a
//!    429/403/400/401/500/503 for HTTP, a `tonic::Status` for gRPC (one table of codes:
//!    [`Refusal::grpc_code`]), a trailers-only answer for gRPC through the layer.
//!
//! Around steps 1–4, a call may **wait** for a slot instead of failing ([`wait`]): a limited
//! call sleeps until its `retry_after` and runs them again, within a budget (`wait = "5s"`).
//!
//! Steps 1–3 read the request and end its borrow ([`prepare`]); step 4 is the only await
//! ([`Prepared::run`]), so a transport whose request is neither `Send` nor `Sync` (a tonic
//! `Streaming`) holds nothing of it across the store call. A decision that waits for nothing
//! (the memory store's) is taken without one ([`Prepared::run_now`]); the transports await
//! [`Prepared::run_soon`], which boxes `run` only for a decision that waits, so the future a
//! framework boxes and moves on every request holds none of its state. A transport is an adapter: it
//! builds a [`Caller`] and a [`Call`], and renders the answer.

// Each transport uses its part of the pipeline; the full build (every integration) is the
// one that proves nothing here is dead.
#![cfg_attr(
    not(all(
        feature = "axum",
        feature = "actix",
        feature = "tower",
        feature = "tonic"
    )),
    allow(dead_code)
)]

use std::future::Future;
use std::time::Duration;

use crate::caller::answer::{FieldSet, PolicyField, Refusal, rate_fields, static_rate_fields};
use crate::caller::settings::{HeaderStyle, HttpSettings};
use crate::caller::{ByValue, Caller, Missing};
use crate::decision::{Decision, Verdict};
use crate::error::{RateLimitError, StoreError};
use crate::limit::{Limit, key_of, keys_for};
use crate::limiter::RateLimiter;

mod exempt;
pub(crate) mod plan;
pub(crate) mod settle;
pub(crate) mod wait;

use self::plan::{Dynamic, Input, Outcome, Taken};

/// What one call is checked against, as the transport has it: the function's (or the layer's)
/// limits, their run-time parts (for functions with `quota`, `cost = <expression>` or `count`),
/// what the call gives each (`inputs[i]` for limit `i`) and each limit's rendered `key`
/// template.
/// The limits live as long as `'l` (a function's `static`, a layer's list): an admitted call
/// keeps them for its fields; the rest is read while the call is prepared.
#[derive(Clone, Copy)]
pub(crate) struct Call<'l, 'c> {
    pub(crate) limits: &'l [Limit],
    pub(crate) dynamics: Option<&'c [Dynamic]>,
    pub(crate) inputs: &'c [Input],
    pub(crate) templates: &'c [Option<&'c str>],
}

impl<'l, 'c> Call<'l, 'c> {
    /// Static limits (no run-time part) with their templates.
    pub(crate) const fn fixed(limits: &'l [Limit], templates: &'c [Option<&'c str>]) -> Self {
        Self {
            limits,
            dynamics: None,
            inputs: &[],
            templates,
        }
    }
}

/// Why a call was refused, before any transport renders it.
#[derive(Debug)]
pub(crate) enum Refused {
    /// The quota is spent: the limits as they applied and the verdict.
    Limited {
        limits: Vec<Limit>,
        verdict: Verdict,
    },
    /// The store failed and the failure policy refused.
    Unavailable(StoreError),
    /// The request lacks what a limit is `by`.
    Missing(Missing),
    /// The client's network is on the deny list.
    Denied,
    /// A run-time rule could not apply: no quota for the caller, a cost beyond the capacity,
    /// a negative cost, an invalid quota.
    Rule(RateLimitError),
}

impl Refused {
    /// The HTTP answer (the body, status and fields of a refused handler, the layer's too).
    pub(crate) fn refusal(&self, settings: &HttpSettings) -> Refusal {
        match self {
            Self::Limited { limits, verdict } => {
                Refusal::too_many_requests(limits, verdict, settings)
            }
            Self::Unavailable(_) => Refusal::store_unavailable(),
            Self::Missing(missing) => missing.refusal(),
            Self::Denied => Refusal::forbidden(),
            Self::Rule(error) => rule_refusal(error),
        }
    }

    /// The plain-mode error (a plain function's caller has no request, so nothing is missing
    /// nor denied there; a transport that has them renders [`Refused::refusal`]).
    pub(crate) fn into_error(self) -> RateLimitError {
        match self {
            Self::Limited { verdict, .. } => limited(&verdict),
            Self::Unavailable(e) => RateLimitError::StoreUnavailable(e),
            Self::Rule(e) => e,
            Self::Missing(m) => {
                RateLimitError::StoreUnavailable(StoreError::connection(m.message().into_owned()))
            }
            Self::Denied => RateLimitError::StoreUnavailable(StoreError::connection(
                "requests from this network are not accepted",
            )),
        }
    }
}

/// The answer to a call a run-time rule refused before checking it.
fn rule_refusal(error: &RateLimitError) -> Refusal {
    match error {
        RateLimitError::MissingQuota => Refusal::new(
            401,
            "unauthorized",
            "quota info empty: the request carries no quota for its caller (Quota)",
        ),
        RateLimitError::CostExceedsCapacity { .. } => {
            Refusal::new(400, "cost_exceeds_capacity", &error.to_string())
        }
        RateLimitError::NegativeCost { .. } => {
            Refusal::new(400, "negative_cost", &error.to_string())
        }
        RateLimitError::StoreUnavailable(_) => Refusal::store_unavailable(),
        _ => {
            tracing::error!(target: crate::observe::log::LIMITER, %error, "a rate limit could not be applied");
            Refusal::new(500, "internal_error", &error.to_string())
        }
    }
}

/// A rejection as the plain-mode error.
pub(crate) fn limited(verdict: &Verdict) -> RateLimitError {
    let binding: Decision = verdict
        .binding()
        .copied()
        .unwrap_or_else(|| Decision::new(false, 0, 0, Duration::ZERO, Duration::ZERO));
    RateLimitError::Limited {
        retry_after: binding.retry_after.unwrap_or_default(),
        limit: binding.limit,
        remaining: binding.remaining,
        reset_after: binding.reset_after,
    }
}

/// The keys of one call's static limits (one limit, the usual case, without a list).
pub(crate) enum Keys {
    One([String; 1]),
    Many(Vec<String>),
}

impl std::ops::Deref for Keys {
    type Target = [String];

    fn deref(&self) -> &[String] {
        match self {
            Self::One(key) => key,
            Self::Many(keys) => keys,
        }
    }
}

/// A call whose request has been read (steps 1–3), ready for the store.
pub(crate) enum Prepared<'c> {
    /// Exempt: runs unlimited, nothing to check.
    Exempt,
    /// Static limits under their keys.
    Fixed { limits: &'c [Limit], keys: Keys },
    /// Limits worked out for this call.
    Planned {
        limits: &'c [Limit],
        plan: plan::Plan,
    },
}

impl std::fmt::Debug for Prepared<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Keys may hold a caller's header (an API key): not printed.
        f.write_str(match self {
            Self::Exempt => "Prepared::Exempt",
            Self::Fixed { .. } => "Prepared::Fixed",
            Self::Planned { .. } => "Prepared::Planned",
        })
    }
}

/// The outcome of static limits' decision: admitted, refused with the verdict, or refused for
/// a store that could not answer.
fn fixed_outcome<'c>(
    limiter: &RateLimiter,
    limits: &'c [Limit],
    decided: Result<Verdict, StoreError>,
) -> Result<Admitted<'c>, Refused> {
    let verdict = decided.map_err(Refused::Unavailable)?;
    if !verdict.is_admitted() {
        return Err(Refused::Limited {
            limits: limits.to_vec(),
            verdict,
        });
    }
    Ok(Admitted {
        shadow: limiter.any_shadow(limits),
        verdict,
        applied: Applied::Fixed(limits),
    })
}

/// Steps 1–3: the exemptions, the limits as they apply, the keys. The request's borrow ends
/// here.
pub(crate) fn prepare<'l>(
    limiter: &RateLimiter,
    call: Call<'l, '_>,
    caller: &Caller<'_>,
) -> Result<Prepared<'l>, Refused> {
    let settings = limiter.settings();
    if exempt::exempted(caller, settings, call.limits)? {
        return Ok(Prepared::Exempt);
    }
    let by_value = |by| {
        if caller.transport == crate::caller::Transport::Plain {
            // A plain function's limits are keyed by their template alone (the macro refuses
            // request sources there).
            return Ok(None);
        }
        caller.by_value(by, &settings.http)
    };
    // A concurrency limit is released when the call ends: planned, so that it is settled.
    if call.dynamics.is_none()
        && !limiter.has_overrides()
        && !call.limits.iter().any(Limit::holds_slot)
    {
        let keys = if let [limit] = call.limits {
            let by = by_value(limit.by).map_err(Refused::Missing)?;
            let template = call.templates.first().copied().flatten();
            let by = by.as_ref().map(AsRef::as_ref);
            Keys::One([key_of(&settings.prefix, limit, template, by)])
        } else {
            Keys::Many(
                keys_for(&settings.prefix, call.limits, call.templates, by_value)
                    .map_err(Refused::Missing)?,
            )
        };
        return Ok(Prepared::Fixed {
            limits: call.limits,
            keys,
        });
    }
    let plan = plan::plan(
        limiter,
        call.limits,
        call.dynamics,
        call.inputs,
        caller.quota,
        call.templates,
        |by| {
            by_value(by)
                .map(|v| v.map(ByValue::into_cow))
                .map_err(Refused::Missing)
        },
        Refused::Rule,
    )?;
    Ok(Prepared::Planned {
        limits: call.limits,
        plan,
    })
}

impl<'c> Prepared<'c> {
    /// Step 4 when it waits for nothing ([`RateLimiter::decide_now`]: static limits, a local
    /// store that answers at once, no shadow mode; an exempt call): the decision, as
    /// [`Prepared::run`] would take it. An admitted call of it has nothing to settle (no
    /// planned limit). `Err` gives the call back untouched, for `run`.
    pub(crate) fn run_now(
        self,
        limiter: &RateLimiter,
    ) -> Result<Result<Admitted<'c>, Refused>, Self> {
        match self {
            Self::Exempt => Ok(Ok(Admitted::exempt())),
            Self::Fixed { limits, keys } => match limiter.decide_now(limits, &keys) {
                Some(decided) => Ok(fixed_outcome(limiter, limits, decided)),
                None => Err(Self::Fixed { limits, keys }),
            },
            Self::Planned { .. } => Err(self),
        }
    }

    /// Step 4, as the transports take it: at once when it waits for nothing
    /// ([`Prepared::run_now`]), else [`Prepared::run`] in a box, the one a call that waits
    /// allocates. The future a transport awaits holds the call, not the size of every future
    /// the decision may wait for (a remote store's call, a planned call's run, a lease's
    /// refill, shadow mode's second check), so a call the memory store answers allocates and
    /// copies none of it.
    pub(crate) async fn run_soon(self, limiter: &RateLimiter) -> Result<Admitted<'c>, Refused> {
        match self.run_now(limiter) {
            Ok(decided) => decided,
            Err(prepared) => Box::pin(prepared.run(limiter)).await,
        }
    }

    /// Step 4: the decision. An admitted call, or why not.
    pub(crate) async fn run(self, limiter: &RateLimiter) -> Result<Admitted<'c>, Refused> {
        match self {
            Self::Exempt => Ok(Admitted::exempt()),
            Self::Fixed { limits, keys } => {
                fixed_outcome(limiter, limits, limiter.decide(limits, &keys).await)
            }
            Self::Planned { limits, plan } => {
                let (verdict, taken) = plan.run(limiter).await.map_err(Refused::Unavailable)?;
                if !verdict.is_admitted() {
                    return Err(Refused::Limited {
                        limits: taken.limits().to_vec(),
                        verdict,
                    });
                }
                Ok(Admitted {
                    // A function with a limit in shadow mode answers no fields, nor one whose
                    // limits were all unlimited for this caller.
                    shadow: limiter.any_shadow(limits) || taken.limits().is_empty(),
                    verdict,
                    applied: Applied::Planned(taken),
                })
            }
        }
    }
}

/// The limits an admitted call was checked against.
enum Applied<'c> {
    /// None (an exempt caller).
    Nothing,
    Fixed(&'c [Limit]),
    /// Worked out for the call, with what to settle after it.
    Planned(Taken),
}

/// An admitted call: its rate-limit fields, and what to settle after its body.
pub(crate) struct Admitted<'c> {
    verdict: Verdict,
    applied: Applied<'c>,
    /// No fields: a limit in shadow mode, an exempt caller, nothing applied.
    shadow: bool,
}

impl std::fmt::Debug for Admitted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admitted")
            .field("verdict", &self.verdict)
            .finish_non_exhaustive()
    }
}

impl Admitted<'_> {
    /// An exempt call: nothing applied, no fields.
    fn exempt() -> Self {
        Self {
            verdict: Verdict::new(Vec::new()),
            applied: Applied::Nothing,
            shadow: true,
        }
    }

    /// The decision that admitted the call, one per limit as they applied.
    #[cfg(feature = "client")]
    pub(crate) fn verdict(&self) -> &Verdict {
        &self.verdict
    }

    /// The limits as they applied (empty for an exempt caller).
    pub(crate) fn limits(&self) -> &[Limit] {
        match &self.applied {
            Applied::Nothing => &[],
            Applied::Fixed(limits) => limits,
            Applied::Planned(taken) => taken.limits(),
        }
    }

    /// The rate-limit fields of the admitted response ([`FieldSet::Empty`] in shadow mode and
    /// for an exempt caller). `policy` is the function's `RateLimit-Policy` value, formatted
    /// once, for static limits.
    pub(crate) fn fields(
        &self,
        style: HeaderStyle,
        policy: Option<&'static PolicyField>,
    ) -> FieldSet {
        if self.shadow {
            return FieldSet::Empty;
        }
        match (&self.applied, policy) {
            (Applied::Fixed(limits), Some(policy)) => {
                static_rate_fields(limits, policy, &self.verdict, style)
            }
            _ => FieldSet::List(rate_fields(self.limits(), &self.verdict, style)),
        }
    }

    /// After the body: gives back what the limits whose `count` excludes `outcome` took, and
    /// drops the call's receipts whatever the outcome. Dropped instead (the call was
    /// cancelled or panicked), the call counts.
    pub(crate) async fn settle(self, outcome: Outcome) {
        self.settle_to(outcome, None).await;
    }

    /// [`Admitted::settle`], and the limits with `settle = …` settled to the units the call
    /// used (`actual`; `None`: they stay counted at their estimate).
    pub(crate) async fn settle_to(self, outcome: Outcome, actual: Option<crate::cost::Units>) {
        if let Applied::Planned(taken) = self.applied {
            taken.settle(outcome, settle::used(actual)).await;
        }
    }
}

/// Plain functions: a call with no request; with `wait`, limited calls wait for a slot
/// within that budget.
pub(crate) async fn plain<'l>(
    call: Call<'l, '_>,
    wait: Option<Duration>,
) -> Result<Admitted<'l>, RateLimitError> {
    let limiter = RateLimiter::current_for_call();
    let answer = match wait {
        None => match prepare(&limiter, call, &Caller::PLAIN) {
            Ok(prepared) => prepared.run_soon(&limiter).await,
            Err(refused) => Err(refused),
        },
        Some(budget) => {
            wait::admit(&limiter, budget, || prepare(&limiter, call, &Caller::PLAIN)).await
        }
    };
    answer.map_err(Refused::into_error)
}

/// Plain mode: checks every limit for one call against the process's limiter.
pub async fn check(limits: &'static [Limit], keys: &[Option<&str>]) -> Result<(), RateLimitError> {
    plain(Call::fixed(limits, keys), None).await.map(drop)
}

/// Plain mode with `wait`: [`check`], where a limited call waits up to `wait` for a slot
/// (the pipeline's `wait` step).
pub async fn check_wait(
    limits: &'static [Limit],
    keys: &[Option<&str>],
    wait: Duration,
) -> Result<(), RateLimitError> {
    plain(Call::fixed(limits, keys), Some(wait)).await.map(drop)
}

/// Plain mode with a dynamic limit (`quota`, `cost = <expression>`, `count`): checks the
/// call; the [`Hold`] settles it after the body. With `wait`, a limited call waits up to that
/// long for a slot.
pub async fn check_dyn(
    limits: &'static [Limit],
    dynamics: Option<&'static [Dynamic]>,
    keys: &[Option<&str>],
    inputs: &[Input],
    wait: Option<Duration>,
) -> Result<Hold, RateLimitError> {
    let call = Call {
        limits,
        dynamics,
        inputs,
        templates: keys,
    };
    let admitted = plain(call, wait).await?;
    Ok(Hold {
        admitted: admitted.detach(),
    })
}

impl Admitted<'_> {
    /// The call with its limits owned (the fields are not needed after this).
    pub(crate) fn detach(self) -> Admitted<'static> {
        Admitted {
            verdict: self.verdict,
            shadow: self.shadow,
            applied: match self.applied {
                Applied::Planned(taken) => Applied::Planned(taken),
                Applied::Nothing | Applied::Fixed(_) => Applied::Nothing,
            },
        }
    }
}

/// An admitted plain call, to settle after its body ([`Hold::settle`]).
#[derive(Debug)]
pub struct Hold {
    admitted: Admitted<'static>,
}

impl Hold {
    /// Gives back what the call took from the limits whose `count` excludes `outcome`.
    pub async fn settle(self, outcome: Outcome) {
        self.admitted.settle(outcome).await;
    }

    /// [`Hold::settle`], and the limits with `settle = |output| …` settled to what the
    /// closure read from the output ([`settle::measure`]).
    pub async fn settle_to(self, outcome: Outcome, actual: Option<crate::cost::Units>) {
        self.admitted.settle_to(outcome, actual).await;
    }

    /// `settle = "later"`: runs the body with the call's [`settle::Reservation`] available to
    /// it; when the body did not take it, the call settles by its result as
    /// [`Hold::settle`] does (its estimate stays counted).
    pub async fn run_later<T, E>(self, body: impl Future<Output = Result<T, E>>) -> Result<T, E> {
        let (result, left) = settle::with_reservation(self.admitted, body).await;
        if let Some(admitted) = left {
            admitted.settle(Outcome::of(&result)).await;
        }
        result
    }
}
