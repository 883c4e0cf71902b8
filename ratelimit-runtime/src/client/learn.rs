//! Learning from a partner's answer: what its fields teach each budget (a pause, what is left
//! once the calls in flight are counted, the quota it states), told to the store.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use http::StatusCode;

use tokio::time::Instant;

use super::answer::{Advice, Answer, Budget, ReadAnswer, Remaining, Stated};
use crate::call::plan::Dynamic;
use crate::limit::Limit;
use crate::limiter::RateLimiter;
use crate::limiter::admin::Target;
use crate::policy::Policy;

/// Reads a request's estimated tokens.
pub(super) type Estimate = Arc<dyn Fn(&http::request::Parts) -> u64 + Send + Sync>;
/// Reads the tokens a response says were used.
pub(super) type Usage = Arc<dyn Fn(&http::response::Parts) -> Option<u64> + Send + Sync>;

/// What a [`PartnerLayer`](super::PartnerLayer) holds: a partner's budgets, and what they
/// learn from its answers.
pub(super) struct Partner {
    pub(super) limiter: Option<RateLimiter>,
    pub(super) limits: Box<[Limit]>,
    /// Each limit's budget, by position.
    pub(super) budgets: Box<[Budget]>,
    /// Each budget's run-time part: its cost, and the tokens budget settles.
    pub(super) dynamics: Box<[Dynamic]>,
    pub(super) templates: Box<[Option<&'static str>]>,
    pub(super) estimate: Option<Estimate>,
    pub(super) usage: Option<Usage>,
    pub(super) readers: Vec<Box<dyn ReadAnswer>>,
    pub(super) wait: Duration,
    pub(super) max_pause: Duration,
    pub(super) learn: bool,
    /// The units this process's lessons took from each budget, by position.
    pub(super) lowered: Box<[AtomicU64]>,
    /// The quota the partner last stated for each budget, while it is believed: see
    /// [`Price`].
    pub(super) stated: Box<[Mutex<Option<Told>>]>,
}

/// The unit a budget may be refilling when it is read: counted in flight (see
/// [`Partner::lesson`]).
const REFILLING: u64 = 1;

/// What a budget had left once a call was admitted, when, at what price, and how many units
/// this process's lessons had taken from it by then; after the response, what the call's own
/// settle gave back to it (negative: charged).
#[derive(Debug, Clone, Copy)]
pub(super) struct Known {
    pub(super) left: u64,
    pub(super) at: Instant,
    pub(super) price: Price,
    pub(super) lowered: u64,
    pub(super) settled: i128,
}

impl Known {
    /// What the budget lost since the call was admitted, to the calls admitted after it (and
    /// to lowerings by other processes): `left`, refilled at the policy's rate since (never
    /// past its capacity, as the store refills) with what the call's settle gave back, less
    /// what it has `now`.
    fn lost(&self, now: u64) -> u64 {
        let policy = &self.price.policy;
        let elapsed = self.at.elapsed().as_nanos();
        let period = u128::from(policy.period_ms())
            .saturating_mul(1_000_000)
            .max(1);
        let refilled = (u128::from(policy.limit()) * elapsed).div_ceil(period);
        let capacity = i128::from(policy.capacity());
        let refilled = i128::from(self.left)
            .saturating_add(i128::try_from(refilled).unwrap_or(i128::MAX))
            .min(capacity);
        let before = refilled.saturating_add(self.settled).min(capacity);
        u64::try_from(before.saturating_sub(i128::from(now)).max(0)).unwrap_or(u64::MAX)
    }
}

/// A quota the partner stated for one budget, and until when it is believed: the budget's
/// period or the layer's `max_pause` after the answer that stated it, the longer (a partner
/// that stops stating it, or an answer that was a one-off, does not slow the fleet for good).
#[derive(Debug, Clone, Copy)]
pub(super) struct Told {
    quota: Stated,
    /// `None`: past what the clock can name (a `max_pause` of centuries), believed until an
    /// answer states another.
    until: Option<Instant>,
}

/// How one budget prices a call: its policy as it applies now (a scope's quota override
/// included), the budget's units one of the partner's is worth unpriced (a request: the
/// policy's cost; a token: one), and the partner's stated quota in those units per that
/// policy's period, if believed.
#[derive(Debug, Clone, Copy)]
pub(super) struct Price {
    pub(super) policy: Policy,
    scale: u64,
    stated: Option<u64>,
}

impl Price {
    /// What `units` of the partner's take from the budget: as many when the partner stated
    /// no quota below the budget's; otherwise in proportion, the budget's quota over the
    /// partner's, rounded up, and never past the budget's capacity (a call it could never
    /// admit; `units` alone past it are refused as too costly, as any call is). The budget
    /// then admits at the partner's rate and burst under its own key (no new bucket,
    /// whatever the partner states), and never faster than configured.
    pub(super) fn of(&self, units: u64) -> u64 {
        let Some(stated) = self.below() else {
            return units;
        };
        let configured = self.policy.limit();
        let priced = (u128::from(units) * u128::from(configured)).div_ceil(u128::from(stated));
        let priced = u64::try_from(priced).unwrap_or(u64::MAX);
        priced.min(self.policy.capacity().max(units))
    }

    /// What the partner says is left (in its own units: requests or tokens), in the budget's
    /// units: the reverse of [`Price::of`], rounded down, and never more than `left` calls of
    /// one partner unit each cost (a price cut to the capacity makes a call cheaper than in
    /// proportion). Saturating: `left` is the partner's number.
    fn in_budget_units(&self, left: u64) -> u64 {
        let units = u128::from(left).saturating_mul(u128::from(self.scale));
        let units = match self.below() {
            Some(stated) => {
                let proportional =
                    units.saturating_mul(u128::from(self.policy.limit())) / u128::from(stated);
                let per_unit = u128::from(self.of(self.scale));
                proportional.min(u128::from(left).saturating_mul(per_unit))
            }
            None => units,
        };
        u64::try_from(units).unwrap_or(u64::MAX)
    }

    /// The stated quota in the budget's units, when it is below the budget's (never zero).
    fn below(&self) -> Option<u64> {
        let configured = self.policy.limit();
        self.stated.filter(|s| (1..configured).contains(s))
    }
}

impl Partner {
    /// How budget `i` prices a call now ([`Price`]).
    pub(super) fn price(&self, limiter: &RateLimiter, i: usize) -> Price {
        let policy = limiter.in_force(&self.limits[i..=i])[0].policy;
        let scale = match self.budgets[i] {
            Budget::Requests => policy.cost(),
            Budget::Tokens => 1,
        };
        let told = *self.stated[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let stated = told
            .filter(|t| t.until.is_none_or(|until| until > Instant::now()))
            .and_then(|t| t.quota.per(policy.period()))
            .map(|rate| rate.saturating_mul(scale));
        Price {
            policy,
            scale,
            stated,
        }
    }

    /// Remembers the least quota the answer states for budget `i` (by its rate per the
    /// budget's period), until it is stale ([`Told`]).
    fn told(&self, i: usize, policy: &Policy, advice: &Advice) {
        let period = policy.period();
        if let Some((_, quota)) = advice.least_stated(self.budgets[i], period) {
            let until = Instant::now().checked_add(period.max(self.max_pause));
            *self.stated[i]
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(Told { quota, until });
        }
    }

    /// Reads the partner's answer and tells the store: a pause defers every budget; a budget
    /// with units left is brought down to what the partner will still admit
    /// ([`Partner::lesson`]).
    pub(super) async fn learn(
        &self,
        limiter: &RateLimiter,
        head: &http::response::Parts,
        known: &[Known],
    ) {
        let answer = Answer {
            status: head.status,
            headers: &head.headers,
            now: SystemTime::now(),
        };
        let mut advice = Advice::default();
        for reader in &self.readers {
            reader.read(&answer, &mut advice);
        }
        let advice = advice.bounded(self.max_pause);
        // A quota is the partner's word on a success or a 429, not on an error page (a
        // proxy's, a maintenance page's) that may carry any fields.
        let states_quota = head.status.is_success() || head.status == StatusCode::TOO_MANY_REQUESTS;
        for (i, budget) in self.budgets.iter().enumerate() {
            let limit = &self.limits[i..=i];
            if states_quota {
                self.told(i, &known[i].price.policy, &advice);
            }
            // What is left, in the budget's units at the cheaper of two prices: the one this
            // call was admitted at (the calls in flight paid it) and the one the next calls
            // pay (the answer may have just changed it).
            let next = self.price(limiter, i);
            let in_units =
                |left| (known[i].price.in_budget_units(left)).min(next.in_budget_units(left));
            let target = Target::global().key(budget.key_template());
            let least = advice.least(*budget).map(|r| Remaining {
                left: in_units(r.left),
                ..r
            });
            let lesson = self
                .lesson(limiter, i, &target, advice.pause, least, known[i])
                .await;
            if let Err(error) = lesson {
                tracing::warn!(target: crate::observe::log::CLIENT, %error,
                    scope = limit[0].scope, "a partner's answer could not be recorded in the store");
            }
        }
    }

    /// One budget's lesson. The partner's `left` counts what it had received; the calls the
    /// fleet admitted since this one are on their way and take from it too, and so does the
    /// unit the budget is refilling (read as whole units, it may be a moment from admitting
    /// one more before the next answer is learnt). The calls in flight are what the budget
    /// lost since this call was admitted ([`Known::lost`]: a tokens budget counts them at
    /// their estimates, which they hold until settled), less what this process's lessons
    /// took from it meanwhile: a lowering by another process in between counts as calls too,
    /// so the count errs towards fewer calls. What the partner will still admit
    /// is `left` less those: none, and the budget is deferred until the partner's reset (or
    /// the pause, the longer); some, and the budget is lowered to them.
    async fn lesson(
        &self,
        limiter: &RateLimiter,
        i: usize,
        target: &Target,
        pause: Option<Duration>,
        least: Option<Remaining>,
        known: Known,
    ) -> Result<(), crate::error::StoreError> {
        let limit = &self.limits[i..=i];
        // A partner with more left than the budget had, counting the unit refilling, has
        // nothing to teach (and costs no round trip).
        let news = |r: &Remaining| r.left <= known.left.saturating_add(REFILLING);
        let Some(partner) = least.filter(news) else {
            return match pause {
                Some(pause) => limiter.defer(limit, target, pause).await,
                None => Ok(()),
            };
        };
        let now = limiter.peek(limit, target).await?;
        let has = now.decisions().first().map_or(0, |d| d.remaining);
        let lowered = self.lowered[i]
            .load(Ordering::Relaxed)
            .saturating_sub(known.lowered);
        let lost = known.lost(has);
        let in_flight = lost.saturating_sub(lowered).saturating_add(REFILLING);
        let left = partner.left.saturating_sub(in_flight);
        let spent = partner.reset.filter(|_| left == 0);
        if let Some(pause) = pause.max(spent).filter(|p| !p.is_zero()) {
            return limiter.defer(limit, target, pause).await;
        }
        let took = limiter.lower_taking(limit, target, left).await?;
        self.lowered[i].fetch_add(took, Ordering::Relaxed);
        Ok(())
    }
}
