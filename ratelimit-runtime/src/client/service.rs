//! The client layer: [`PartnerLayer`] over a `tower::Service<http::Request<B>>` that sends
//! requests to a partner (hyper's client, an SDK built on it).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use http::{Request, Response};
use tower_layer::Layer;
use tower_service::Service;

use super::answer::{Budget, IetfFields, ReadAnswer, RetryAfter};
use super::learn::{Estimate, Known, Partner, Price, Usage};
use crate::call::plan::{Count, Dynamic, Input, Outcome, QuotaFrom, cost_of};
use crate::call::{Admitted, Call, prepare, wait};
use crate::caller::Caller;
use crate::cost::Units;
use crate::error::RateLimitError;
use crate::layer::LayerError;
use crate::limit::{By, Limit};
use crate::limiter::RateLimiter;
use crate::policy::Policy;

/// A Tower layer for outgoing requests to one partner: each request checked (with waiting)
/// against the fleet's budget for the partner, each response read and its lesson told to the
/// store. See the [module docs](crate::client).
#[derive(Clone)]
pub struct PartnerLayer {
    pub(super) partner: Arc<Partner>,
}

impl fmt::Debug for PartnerLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PartnerLayer")
            .field("limits", &self.partner.limits)
            .finish_non_exhaustive()
    }
}

impl PartnerLayer {
    /// A builder for the partner whose budget is named `scope` (every process that names the
    /// same scope, with the same policies, on the same store shares the budget).
    pub fn builder(scope: &'static str) -> PartnerLayerBuilder {
        PartnerLayerBuilder {
            scope,
            requests: None,
            tokens: None,
            usage: None,
            readers: Vec::new(),
            wait: Duration::from_secs(30),
            max_pause: Duration::from_secs(60),
            limiter: None,
            learn: true,
        }
    }
}

impl<S> Layer<S> for PartnerLayer {
    type Service = PartnerService<S>;

    fn layer(&self, inner: S) -> PartnerService<S> {
        PartnerService {
            inner,
            partner: Arc::clone(&self.partner),
        }
    }
}

/// Builds a [`PartnerLayer`]: its budgets (requests, tokens or both), the readers of the
/// partner's answer, how long a request may wait, the longest pause an answer may ask.
pub struct PartnerLayerBuilder {
    scope: &'static str,
    requests: Option<Policy>,
    tokens: Option<(Policy, Estimate)>,
    usage: Option<Usage>,
    readers: Vec<Box<dyn ReadAnswer>>,
    wait: Duration,
    max_pause: Duration,
    limiter: Option<RateLimiter>,
    learn: bool,
}

impl fmt::Debug for PartnerLayerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PartnerLayerBuilder")
            .field("scope", &self.scope)
            .field("requests", &self.requests)
            .finish_non_exhaustive()
    }
}

impl PartnerLayerBuilder {
    /// The requests budget: each request takes the policy's cost (one unit unless
    /// [`Policy::with_cost`] says more). A quota the partner states counts requests.
    #[must_use]
    pub fn requests(mut self, policy: Policy) -> Self {
        self.requests = Some(policy);
        self
    }

    /// The tokens budget: each request takes `estimate(request)` units before it is sent,
    /// settled after the response to what [`PartnerLayerBuilder::settle_tokens`] reads (the
    /// estimate stays counted without it).
    #[must_use]
    pub fn tokens(
        mut self,
        policy: Policy,
        estimate: impl Fn(&http::request::Parts) -> u64 + Send + Sync + 'static,
    ) -> Self {
        self.tokens = Some((policy, Arc::new(estimate)));
        self
    }

    /// Reads the tokens a request used from its response's head (a usage header): the
    /// tokens budget is settled to them (the difference back, or the excess charged); `None`
    /// keeps the estimate.
    #[must_use]
    pub fn settle_tokens(
        mut self,
        used: impl Fn(&http::response::Parts) -> Option<u64> + Send + Sync + 'static,
    ) -> Self {
        self.usage = Some(Arc::new(used));
        self
    }

    /// Adds a reader of the partner's answer. None given: [`RetryAfter`] and
    /// [`IetfFields`].
    #[must_use]
    pub fn read(mut self, reader: impl ReadAnswer) -> Self {
        self.readers.push(Box::new(reader));
        self
    }

    /// How long a request may wait for its slot before it fails with
    /// [`RateLimitError::Limited`] (default 30 s; zero: never waits).
    #[must_use]
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The longest pause one answer may impose on the fleet (default 60 s): a longer
    /// `Retry-After` or reset is cut to it. A quota the partner states is believed for this
    /// long after the last answer that states it, or for the budget's period if longer.
    #[must_use]
    pub fn max_pause(mut self, max: Duration) -> Self {
        self.max_pause = max;
        self
    }

    /// The limiter whose store keeps the budget (default: the installed one, as
    /// [`RateLimiter::current`] finds it per request).
    #[must_use]
    pub fn limiter(mut self, limiter: RateLimiter) -> Self {
        self.limiter = Some(limiter);
        self
    }

    /// Whether the partner's answers are told to the store (default `true`; `false` paces
    /// by the configured budget alone).
    #[must_use]
    pub fn learn(mut self, learn: bool) -> Self {
        self.learn = learn;
        self
    }

    /// The layer, or what is wrong with it: a scope that cannot name a bucket, or no budget.
    pub fn build(self) -> Result<PartnerLayer, LayerError> {
        if !crate::key::valid_scope(self.scope) {
            return Err(LayerError::InvalidScope {
                scope: self.scope.to_owned(),
            });
        }
        let mut budgets = Vec::new();
        let mut limits = Vec::new();
        if let Some(policy) = self.requests {
            budgets.push(Budget::Requests);
            limits.push(Limit::new(policy, self.scope, By::Global));
        }
        let estimate = self.tokens.map(|(policy, estimate)| {
            budgets.push(Budget::Tokens);
            limits.push(Limit::new(policy, self.scope, By::Global));
            estimate
        });
        if limits.is_empty() {
            return Err(LayerError::MissingNum { limit: 0 });
        }
        // Every budget's cost is the call's: priced by the partner's stated quota, and the
        // tokens budget settled.
        let priced = |b: &Budget| Dynamic {
            quota: QuotaFrom::Attribute,
            count: Count::All,
            settle: *b == Budget::Tokens,
        };
        let dynamics = budgets.iter().map(priced).collect();
        let mut readers = self.readers;
        if readers.is_empty() {
            readers = vec![Box::new(RetryAfter), Box::new(IetfFields::new())];
        }
        let templates = budgets.iter().map(|b| Some(b.key_template())).collect();
        let limits_len = limits.len();
        Ok(PartnerLayer {
            partner: Arc::new(Partner {
                limiter: self.limiter,
                limits: limits.into(),
                budgets: budgets.into(),
                dynamics,
                templates,
                estimate,
                usage: self.usage,
                readers,
                wait: self.wait,
                max_pause: self.max_pause,
                learn: self.learn,
                lowered: (0..limits_len).map(|_| AtomicU64::new(0)).collect(),
                stated: (0..limits_len).map(|_| Mutex::new(None)).collect(),
            }),
        })
    }
}

/// A request admitted and sent: what to settle (its tokens estimate), and what each budget
/// had left once it was admitted.
pub(super) struct Sent<'l> {
    call: Admitted<'l>,
    /// The tokens budget's position and what the request took from it.
    taken: Option<(usize, u64)>,
    known: Vec<Known>,
}

/// Why a [`PartnerService`] call failed: the budget (or the store) refused it before it was
/// sent, or the wrapped service failed.
#[derive(Debug)]
pub enum PartnerError<E> {
    /// Refused before sending: [`RateLimitError::Limited`] with the time the budget is
    /// whole again (the partner's, after a pause), or the store failed and the failure
    /// policy refused.
    RateLimited(RateLimitError),
    /// The wrapped service's error.
    Service(E),
}

impl<E: fmt::Display> fmt::Display for PartnerError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::RateLimited(e) => write!(f, "not sent to the partner: {e}"),
            Self::Service(e) => e.fmt(f),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for PartnerError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::RateLimited(e) => Some(e),
            Self::Service(e) => Some(e),
        }
    }
}

/// The service of a [`PartnerLayer`].
#[derive(Clone)]
pub struct PartnerService<S> {
    inner: S,
    partner: Arc<Partner>,
}

impl<S: fmt::Debug> fmt::Debug for PartnerService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PartnerService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// The future of a [`PartnerService`] call.
pub type PartnerFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<B>, PartnerError<E>>> + Send + 'static>>;

impl<S, ReqB, ResB> Service<Request<ReqB>> for PartnerService<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    ReqB: Send + 'static,
    ResB: Send + 'static,
{
    type Response = Response<ResB>;
    type Error = PartnerError<S::Error>;
    type Future = PartnerFuture<ResB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(PartnerError::Service)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        // The service that was polled ready is the one to call.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(Arc::clone(&self.partner).send(inner, request))
    }
}

impl Partner {
    /// One request: admitted (waiting for its slot), sent, its answer learnt, its tokens
    /// settled.
    async fn send<S, ReqB, ResB>(
        self: Arc<Self>,
        mut inner: S,
        request: Request<ReqB>,
    ) -> Result<Response<ResB>, PartnerError<S::Error>>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>>,
    {
        let limiter = self.limiter.clone().unwrap_or_else(RateLimiter::current);
        let (head, body) = request.into_parts();
        let admitted = self
            .admit(&limiter, &head)
            .await
            .map_err(PartnerError::RateLimited)?;
        let response = inner.call(Request::from_parts(head, body)).await;
        let response = match response {
            Ok(response) => response,
            Err(error) => {
                admitted.call.settle_to(Outcome::Err, None).await;
                return Err(PartnerError::Service(error));
            }
        };
        let (head, body) = response.into_parts();
        self.answered(&limiter, admitted, &head).await;
        Ok(Response::from_parts(head, body))
    }

    /// Before a request: its budget checked, waiting for a slot within the layer's wait.
    pub(super) async fn admit(
        &self,
        limiter: &RateLimiter,
        head: &http::request::Parts,
    ) -> Result<Sent<'_>, RateLimitError> {
        let prices: Vec<Price> = (0..self.limits.len())
            .map(|i| self.price(limiter, i))
            .collect();
        let costs = self.costs(head, &prices);
        let inputs: Vec<Input> = costs
            .iter()
            .map(|cost| Input {
                quota: None,
                cost: Some(cost_of(*cost)),
            })
            .collect();
        let call = Call {
            limits: &self.limits,
            dynamics: Some(&self.dynamics),
            inputs: &inputs,
            templates: &self.templates,
        };
        let admitted = wait::admit(limiter, self.wait, || {
            prepare(limiter, call, &Caller::PLAIN)
        })
        .await
        .map_err(crate::call::Refused::into_error)?;
        // What each budget had left once this request was admitted.
        let at = Instant::now();
        let known = (0..self.limits.len())
            .map(|i| Known {
                left: admitted
                    .verdict()
                    .decisions()
                    .get(i)
                    .map_or(0, |d| d.remaining),
                at,
                price: prices[i],
                lowered: self.lowered[i].load(Ordering::Relaxed),
                settled: 0,
            })
            .collect();
        Ok(Sent {
            call: admitted,
            taken: self.tokens_index().map(|i| (i, costs[i])),
            known,
        })
    }

    /// After the response: its tokens settled, its answer learnt.
    pub(super) async fn answered(
        &self,
        limiter: &RateLimiter,
        sent: Sent<'_>,
        head: &http::response::Parts,
    ) {
        let mut known = sent.known;
        // The tokens used, at the price the call was admitted at (a quota stated since
        // prices the calls after it).
        let used = self.usage.as_ref().and_then(|u| u(head));
        let used = used
            .zip(sent.taken)
            .map(|(used, (i, taken))| (i, taken, known[i].price.of(used)));
        sent.call
            .settle_to(
                Outcome::Status(head.status.as_u16()),
                used.map(|(_, _, used)| Units::of(used)),
            )
            .await;
        if let Some((i, taken, used)) = used {
            known[i].settled = i128::from(taken) - i128::from(used);
        }
        if self.learn {
            self.learn(limiter, head, &known).await;
        }
    }

    /// What each budget takes from this request at its price ([`Price::of`]): the requests
    /// budget its policy's cost, the tokens budget the request's estimate.
    fn costs(&self, head: &http::request::Parts, prices: &[Price]) -> Vec<u64> {
        let estimate = self.estimate.as_ref().map_or(0, |estimate| estimate(head));
        (0..self.budgets.len())
            .map(|i| {
                let units = match self.budgets[i] {
                    Budget::Requests => prices[i].policy.cost(),
                    Budget::Tokens => estimate,
                };
                prices[i].of(units)
            })
            .collect()
    }

    /// The position of the tokens budget.
    fn tokens_index(&self) -> Option<usize> {
        self.budgets.iter().position(|b| *b == Budget::Tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::super::answer::{Advice, Answer, Stated};
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::limiter::admin::Target;
    use crate::store::{MemoryStore, TokioClock};

    /// A layer at 20 a second on a memory store whose clock is tokio's (paused in the tests).
    async fn layer() -> (RateLimiter, PartnerLayer) {
        let policy = Policy::new(Algorithm::Gcra, 20, Duration::from_secs(1)).unwrap();
        layer_with(|b| b.requests(policy)).await
    }

    /// A layer whose budgets `budgets` gives (and any setting it changes), waiting for
    /// nothing, pausing at most 5 s.
    async fn layer_with(
        budgets: impl FnOnce(PartnerLayerBuilder) -> PartnerLayerBuilder,
    ) -> (RateLimiter, PartnerLayer) {
        let store = MemoryStore::with_clock(TokioClock::default());
        let limiter = RateLimiter::builder().store(store).build().await.unwrap();
        let builder = PartnerLayer::builder("partner")
            .wait(Duration::ZERO)
            .max_pause(Duration::from_secs(5))
            .limiter(limiter.clone());
        let layer = budgets(builder).build().unwrap();
        (limiter, layer)
    }

    fn request() -> http::request::Parts {
        http::Request::new(()).into_parts().0
    }

    /// One call admitted and answered `answer`.
    async fn one_call(limiter: &RateLimiter, partner: &Partner, answer: &http::response::Parts) {
        let sent = partner.admit(limiter, &request()).await.unwrap();
        partner.answered(limiter, sent, answer).await;
    }

    /// A 200 whose `RateLimit` field says `left` with a reset of `reset` seconds.
    fn says(left: u64, reset: u64) -> http::response::Parts {
        let field = format!("\"default\";r={left};t={reset}");
        let response = http::Response::builder().header("ratelimit", field);
        response.body(()).unwrap().into_parts().0
    }

    async fn budget(limiter: &RateLimiter, layer: &PartnerLayer) -> crate::decision::Verdict {
        let target = Target::global().key("requests");
        limiter.peek(&layer.partner.limits, &target).await.unwrap()
    }

    /// The budget refuses until `reset` (still 100 ms before it), and admits after it.
    async fn deferred_until(limiter: &RateLimiter, layer: &PartnerLayer, reset: Duration) {
        tokio::time::sleep(reset.saturating_sub(Duration::from_millis(100))).await;
        let now = budget(limiter, layer).await;
        assert!(!now.is_admitted(), "{now:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(budget(limiter, layer).await.is_admitted());
    }

    #[tokio::test(start_paused = true)]
    async fn the_calls_in_flight_take_from_what_the_partner_says_is_left() {
        let (limiter, layer) = layer().await;
        let partner = &layer.partner;
        let mut sent = Vec::new();
        for _ in 0..3 {
            sent.push(partner.admit(&limiter, &request()).await.unwrap());
        }
        // The first call's answer: 6 left; two calls in flight and the unit refilling take 3.
        partner
            .answered(&limiter, sent.remove(0), &says(6, 1))
            .await;
        assert_eq!(budget(&limiter, &layer).await.decisions()[0].remaining, 3);
        // The second's: 3 left; the budget lost 15 since, 14 of them to the first lesson: one
        // call in flight and the unit refilling leave 1.
        partner
            .answered(&limiter, sent.remove(0), &says(3, 1))
            .await;
        assert_eq!(budget(&limiter, &layer).await.decisions()[0].remaining, 1);
        // The third's: 1 left, nothing in flight but the unit refilling: none for the partner,
        // so the budget waits for its reset instead of refilling past it.
        partner
            .answered(&limiter, sent.remove(0), &says(1, 1))
            .await;
        deferred_until(&limiter, &layer, Duration::from_secs(1)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn the_partners_last_unit_is_not_refilled_past() {
        let (limiter, layer) = layer().await;
        let partner = &layer.partner;
        let sent = partner.admit(&limiter, &request()).await.unwrap();
        // One left and nothing in flight: the unit the budget may be refilling is counted, so
        // the budget waits for the partner's reset.
        partner.answered(&limiter, sent, &says(1, 1)).await;
        assert!(!budget(&limiter, &layer).await.is_admitted());
    }

    #[tokio::test(start_paused = true)]
    async fn a_spent_budget_that_reads_empty_still_waits_for_the_partners_reset() {
        let (limiter, layer) = layer().await;
        let partner = &layer.partner;
        let mut last = None;
        for _ in 0..20 {
            last = Some(partner.admit(&limiter, &request()).await.unwrap());
        }
        // The budget had nothing left either: still, the partner's 0 holds until its reset,
        // past the budget's own refill (one unit every 50 ms).
        partner.answered(&limiter, last.unwrap(), &says(0, 2)).await;
        deferred_until(&limiter, &layer, Duration::from_secs(2)).await;
    }

    /// A 200 whose `RateLimit-Policy` field states `quota` (and plenty left).
    fn states(quota: &str) -> http::response::Parts {
        states_with(200, quota)
    }

    /// An answer of `status` whose `RateLimit-Policy` field states `quota` (and plenty left).
    fn states_with(status: u16, quota: &str) -> http::response::Parts {
        states_left(status, quota, 1_000)
    }

    /// An answer of `status` whose `RateLimit-Policy` field states `quota`, and whose
    /// `RateLimit` field says `left` (reset in a second).
    fn states_left(status: u16, quota: &str, left: u64) -> http::response::Parts {
        let response = http::Response::builder()
            .status(status)
            .header("ratelimit-policy", format!("\"default\";{quota}"))
            .header("ratelimit", format!("\"default\";r={left};t=1"));
        response.body(()).unwrap().into_parts().0
    }

    /// How many calls the layer admits at once, from where the budget is.
    async fn admitted_now(limiter: &RateLimiter, partner: &Partner) -> usize {
        let mut n = 0;
        while partner.admit(limiter, &request()).await.is_ok() {
            n += 1;
        }
        n
    }

    #[tokio::test(start_paused = true)]
    async fn a_partner_stating_a_lower_quota_paces_the_budget_at_it_under_the_same_key() {
        let (limiter, layer) = layer().await;
        let partner = &layer.partner;
        let sent = partner.admit(&limiter, &request()).await.unwrap();
        // The partner admits 10 a second; the budget was told 20.
        partner.answered(&limiter, sent, &states("q=10;w=1")).await;
        // Each request now takes two of the budget's units: with 19 left, 9 more go now…
        assert_eq!(admitted_now(&limiter, partner).await, 9);
        // …and 10 a second after, the partner's rate, in the budget's own bucket.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(admitted_now(&limiter, partner).await, 10);
        assert_eq!(budget(&limiter, &layer).await.decisions()[0].limit, 20);
        // A partner stating more than configured never makes a request cheaper than one.
        let sent = {
            tokio::time::sleep(Duration::from_secs(1)).await;
            partner.admit(&limiter, &request()).await.unwrap()
        };
        partner.answered(&limiter, sent, &states("q=40;w=1")).await;
        // (The call that learnt it was priced at two.)
        assert_eq!(admitted_now(&limiter, partner).await, 18);
    }

    #[tokio::test(start_paused = true)]
    async fn a_partner_stating_a_tiny_quota_slows_the_budget_to_one_call_a_period_never_none() {
        let (limiter, layer) = layer().await;
        let partner = &layer.partner;
        let sent = partner.admit(&limiter, &request()).await.unwrap();
        // One a day: read per the budget's second, less than one, priced at the capacity.
        partner
            .answered(&limiter, sent, &states("q=1;w=86400"))
            .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(admitted_now(&limiter, partner).await, 1);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(admitted_now(&limiter, partner).await, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_partner_with_more_left_than_the_budget_neither_raises_nor_pauses_it() {
        let (limiter, layer) = layer().await;
        let partner = &layer.partner;
        one_call(&limiter, partner, &says(1_000, 3600)).await;
        assert_eq!(budget(&limiter, &layer).await.decisions()[0].remaining, 19);
        // A ten-year reset with nothing left pauses no longer than `max_pause` (5 s).
        one_call(&limiter, partner, &says(0, 315_360_000)).await;
        tokio::time::sleep(Duration::from_millis(5_100)).await;
        assert!(budget(&limiter, &layer).await.is_admitted());
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_call_counts_no_refill_past_the_capacity_as_calls_in_flight() {
        let (limiter, layer) = layer().await;
        let partner = &layer.partner;
        let sent = partner.admit(&limiter, &request()).await.unwrap();
        // The call takes ten periods; the budget refilled to its capacity (20), no further,
        // and nothing else was admitted: only the unit refilling is in flight, so the
        // partner's 5 leave 4, and the budget is lowered to them, not deferred.
        tokio::time::sleep(Duration::from_secs(10)).await;
        partner.answered(&limiter, sent, &says(5, 1)).await;
        let now = budget(&limiter, &layer).await;
        assert!(now.is_admitted(), "{now:?}");
        assert_eq!(now.decisions()[0].remaining, 4);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stated_quota_is_believed_while_fresh_and_only_from_a_success_or_a_429() {
        let (limiter, layer) = layer().await;
        let partner = &layer.partner;
        let sent = partner.admit(&limiter, &request()).await.unwrap();
        partner.answered(&limiter, sent, &states("q=10;w=1")).await;
        assert_eq!(admitted_now(&limiter, partner).await, 9);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(admitted_now(&limiter, partner).await, 10);
        // No answer states it again for `max_pause` (5 s, longer than the period): a call
        // costs one unit again.
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(admitted_now(&limiter, partner).await, 20);
        // A 503 (a proxy's error page, say) states nothing the fleet believes; a 429 does.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let sent = partner.admit(&limiter, &request()).await.unwrap();
        partner
            .answered(&limiter, sent, &states_with(503, "q=1;w=1"))
            .await;
        assert_eq!(admitted_now(&limiter, partner).await, 19);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let sent = partner.admit(&limiter, &request()).await.unwrap();
        partner
            .answered(&limiter, sent, &states_with(429, "q=5;w=1"))
            .await;
        assert_eq!(admitted_now(&limiter, partner).await, 4);
    }

    #[tokio::test(start_paused = true)]
    async fn a_scope_override_prices_calls_against_the_quota_in_force() {
        let (limiter, layer) = layer().await;
        let partner = &layer.partner;
        // The operator lowers the partner's budget to 5 a second; the partner states 1.
        let five = crate::quota::Quota::per_second(5).unwrap();
        limiter.set_quota("partner", five).unwrap();
        let sent = partner.admit(&limiter, &request()).await.unwrap();
        partner.answered(&limiter, sent, &states("q=1;w=1")).await;
        // A call is priced at the override's capacity (5), not the configured one (20, a
        // cost the overridden budget could never admit): one call a second.
        for _ in 0..2 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert_eq!(admitted_now(&limiter, partner).await, 1);
        }
    }

    /// A 200 stating a tokens quota of `quota` with `used` tokens used.
    fn used(quota: &str, used: u64) -> http::response::Parts {
        let response = http::Response::builder()
            .header("ratelimit-policy", format!("\"tpm\";{quota}"))
            .header("x-used", used.to_string());
        response.body(()).unwrap().into_parts().0
    }

    /// A tokens budget of 1,000 a second, each call estimated at 10 and settled to its
    /// `x-used` field, the IETF policy `tpm` read as its quota.
    async fn tokens_layer() -> (RateLimiter, PartnerLayer) {
        let policy = Policy::new(Algorithm::Token, 1_000, Duration::from_secs(1)).unwrap();
        layer_with(|b| {
            b.tokens(policy, |_| 10)
                .settle_tokens(|head| head.headers.get("x-used")?.to_str().ok()?.parse().ok())
                .read(IetfFields::new().tokens("tpm"))
        })
        .await
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_settle_at_the_price_the_call_was_admitted_at() {
        let (limiter, layer) = tokens_layer().await;
        let partner = &layer.partner;
        // The first call, unpriced, learns a quota of one token a second: a thousandfold.
        let sent = partner.admit(&limiter, &request()).await.unwrap();
        partner.answered(&limiter, sent, &used("q=1;w=1", 10)).await;
        // A call is then priced at the capacity, and its 10 tokens used settle to the same
        // (the price it was admitted at, capped alike), not to 10,000.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let sent = partner.admit(&limiter, &request()).await.unwrap();
        partner.answered(&limiter, sent, &used("q=1;w=1", 10)).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(admitted_now(&limiter, partner).await, 1);
        // A quota stated while a call is in flight prices the calls after it, not its settle.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let slow = partner.admit(&limiter, &request()).await.unwrap();
        let fast = partner.admit(&limiter, &request()).await.unwrap();
        partner
            .answered(&limiter, fast, &used("q=500;w=1", 10))
            .await;
        partner
            .answered(&limiter, slow, &used("q=500;w=1", 10))
            .await;
        let target = Target::global().key("tokens");
        let now = limiter.peek(&partner.limits, &target).await.unwrap();
        assert_eq!(now.decisions()[0].remaining, 1_000 - 20);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_call_charged_by_its_settle_counts_the_charge_after_the_refill() {
        let (limiter, layer) = tokens_layer().await;
        let partner = &layer.partner;
        let sent = partner.admit(&limiter, &request()).await.unwrap();
        // Ten periods later the budget is full (1,000), the call's 60 tokens charge 50 more
        // than its estimate (950 left), and nothing else was admitted: the partner's 500
        // leave 499 once the unit refilling is counted.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let answer = |left: u64, used: &str| {
            let response = http::Response::builder()
                .header("ratelimit", format!("\"tpm\";r={left};t=1"))
                .header("x-used", used);
            response.body(()).unwrap().into_parts().0
        };
        partner.answered(&limiter, sent, &answer(500, "60")).await;
        let target = Target::global().key("tokens");
        let left = || async { limiter.peek(&partner.limits, &target).await.unwrap() };
        assert_eq!(left().await.decisions()[0].remaining, 499);
        // A call that used less than its estimate gives back 9 to a full budget, which stays
        // at its capacity: nothing was lost to other calls, and the partner's 400 leave 399.
        let sent = partner.admit(&limiter, &request()).await.unwrap();
        tokio::time::sleep(Duration::from_secs(10)).await;
        partner.answered(&limiter, sent, &answer(400, "1")).await;
        assert_eq!(left().await.decisions()[0].remaining, 399);
    }

    #[tokio::test(start_paused = true)]
    async fn a_max_pause_past_what_the_clock_can_name_never_panics() {
        let policy = Policy::new(Algorithm::Gcra, 20, Duration::from_secs(1)).unwrap();
        let (limiter, layer) = layer_with(|b| b.requests(policy).max_pause(Duration::MAX)).await;
        let partner = &layer.partner;
        let sent = partner.admit(&limiter, &request()).await.unwrap();
        partner.answered(&limiter, sent, &states("q=10;w=1")).await;
        assert_eq!(admitted_now(&limiter, partner).await, 9);
    }

    #[tokio::test(start_paused = true)]
    async fn the_requests_budget_takes_its_policy_s_cost() {
        let policy = Policy::new(Algorithm::Gcra, 20, Duration::from_secs(1)).unwrap();
        let policy = policy.with_cost(2).unwrap();
        let (limiter, layer) = layer_with(|b| b.requests(policy)).await;
        let partner = &layer.partner;
        assert_eq!(admitted_now(&limiter, partner).await, 10);
        // The partner counts requests: stating the 10 a second the budget admits prices
        // nothing (its 20 units are 10 requests)…
        tokio::time::sleep(Duration::from_secs(1)).await;
        let sent = partner.admit(&limiter, &request()).await.unwrap();
        partner.answered(&limiter, sent, &states("q=10;w=1")).await;
        assert_eq!(admitted_now(&limiter, partner).await, 9);
        // …and stating 5 makes a request take twice its cost: 5 a second.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let sent = partner.admit(&limiter, &request()).await.unwrap();
        partner.answered(&limiter, sent, &states("q=5;w=1")).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(admitted_now(&limiter, partner).await, 5);
    }

    #[tokio::test(start_paused = true)]
    async fn what_is_left_of_a_requests_budget_counts_requests_at_their_cost() {
        let policy = Policy::new(Algorithm::Gcra, 20, Duration::from_secs(1)).unwrap();
        let policy = policy.with_cost(2).unwrap();
        let (limiter, layer) = layer_with(|b| b.requests(policy)).await;
        let partner = &layer.partner;
        // 4 requests left are 8 units, less the unit refilling: 3 requests of 2 units.
        one_call(&limiter, partner, &says(4, 1)).await;
        assert_eq!(budget(&limiter, &layer).await.decisions()[0].remaining, 7);
        assert_eq!(admitted_now(&limiter, partner).await, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn the_partner_s_largest_numbers_never_overflow_the_conversion() {
        let policy = Policy::new(Algorithm::Fixed, 1 << 40, Duration::from_secs(1)).unwrap();
        let policy = policy.with_cost(1 << 30).unwrap();
        let (limiter, layer) = layer_with(|b| b.requests(policy)).await;
        let partner = &layer.partner;
        // Priced at the whole window (2^40 units a request), told 2^64 - 1 requests left.
        one_call(&limiter, partner, &states("q=1;w=1")).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let answer = states_left(200, "q=1;w=1", u64::MAX);
        one_call(&limiter, partner, &answer).await;
        assert!(!budget(&limiter, &layer).await.is_admitted());
    }

    #[tokio::test(start_paused = true)]
    async fn what_is_left_is_counted_at_the_cheaper_of_the_call_s_price_and_the_next() {
        let (limiter, layer) = layer().await;
        let partner = &layer.partner;
        // Priced at two units a call (the partner states 10 a second, the budget 20)…
        let sent = partner.admit(&limiter, &request()).await.unwrap();
        partner.answered(&limiter, sent, &states("q=10;w=1")).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        // …a call admitted at two learns the partner's 20 a second and 8 left: the next
        // calls cost one unit, so the 8 are 8 units (not 16), less the unit refilling.
        let sent = partner.admit(&limiter, &request()).await.unwrap();
        partner
            .answered(&limiter, sent, &states_left(200, "q=20;w=1", 8))
            .await;
        assert_eq!(admitted_now(&limiter, partner).await, 7);
    }

    /// A reader of your own that states a quota of zero (`Stated`'s fields are public).
    struct StatesZero;

    impl ReadAnswer for StatesZero {
        fn read(&self, _: &Answer<'_>, advice: &mut Advice) {
            for window in [None, Some(Duration::from_secs(1))] {
                advice.quotas.push(Stated {
                    budget: Budget::Requests,
                    limit: 0,
                    window,
                });
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stated_quota_of_zero_prices_nothing_and_never_panics() {
        let policy = Policy::new(Algorithm::Gcra, 20, Duration::from_secs(1)).unwrap();
        let (limiter, layer) = layer_with(|b| b.requests(policy).read(StatesZero)).await;
        let partner = &layer.partner;
        one_call(&limiter, partner, &says(1_000, 1)).await;
        assert_eq!(admitted_now(&limiter, partner).await, 19);
    }
}
