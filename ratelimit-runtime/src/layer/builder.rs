//! Building a [`RateLimitLayer`]: its limits, checked when built ([`LayerError`]).

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::Method;

use crate::algorithm::Algorithm;
use crate::call::plan::{Count, Dynamic, QuotaFrom};
use crate::key;
use crate::lease::Lease;
use crate::limit::FailurePolicy;
use crate::limit::{By, Limit};
use crate::limiter::RateLimiter;
use crate::policy::{Policy, PolicyError};

use super::by::{intern, parse_by};
pub use super::error::LayerError;
use super::route::{Pattern, Route};
use super::{PeerAddrFn, RateLimitLayer, Routing, Rule, Shared};

/// One limit being built.
#[derive(Debug, Clone)]
pub(super) struct Draft {
    algorithm: Algorithm,
    num: Option<u64>,
    period: Option<Duration>,
    burst: Option<u64>,
    cost: u64,
    by: Cow<'static, str>,
    scope: Option<String>,
    failure_policy: Option<FailurePolicy>,
    paths: Vec<String>,
    except_paths: Vec<String>,
    methods: Vec<Method>,
    quota_from_request: bool,
    count: Count,
    cost_fn: Option<CostFn>,
    lease: Option<Lease>,
}

/// A request's cost ([`RateLimitLayerBuilder::cost_fn`]).
#[derive(Clone)]
pub(super) struct CostFn(pub(super) Arc<dyn Fn(&http::request::Parts) -> u64 + Send + Sync>);

impl fmt::Debug for CostFn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CostFn")
    }
}

impl Draft {
    pub(super) fn new() -> Self {
        Self {
            algorithm: Algorithm::Fixed,
            num: None,
            period: None,
            burst: None,
            cost: 1,
            by: Cow::Borrowed("global"),
            scope: None,
            failure_policy: None,
            paths: Vec::new(),
            except_paths: Vec::new(),
            methods: Vec::new(),
            quota_from_request: false,
            count: Count::All,
            cost_fn: None,
            lease: None,
        }
    }

    /// Which requests the limit applies to.
    fn route(&self, limit: usize) -> Result<Route, LayerError> {
        let parse = |paths: &[String]| {
            paths
                .iter()
                .map(|path| {
                    Pattern::parse(path).map_err(|reason| LayerError::InvalidPath {
                        limit,
                        path: path.clone(),
                        reason,
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Route {
            paths: parse(&self.paths)?,
            except: parse(&self.except_paths)?,
            methods: self.methods.clone(),
        })
    }

    fn policy(&self, limit: usize) -> Result<Policy, LayerError> {
        let num = self.num.ok_or(LayerError::MissingNum { limit })?;
        let period = self.period.ok_or(LayerError::MissingPeriod { limit })?;
        let error = |error| LayerError::Policy { limit, error };
        let ms =
            u64::try_from(period.as_millis()).map_err(|_| error(PolicyError::PeriodTooLong))?;
        Policy::from_parts(
            self.algorithm,
            num,
            ms,
            self.burst.unwrap_or(num),
            self.cost,
        )
        .map_err(error)
    }
}

/// Builds a [`RateLimitLayer`]: one limit, or several stacked with
/// [`and`](RateLimitLayerBuilder::and). Nothing is checked before
/// [`build`](RateLimitLayerBuilder::build), which answers a typed [`LayerError`].
///
/// ```
/// use std::time::Duration;
/// use ratelimit_runtime::{Algorithm, RateLimitLayer};
///
/// // 10 per second with bursts of 20, and 10,000 a day, per API key.
/// let layer = RateLimitLayer::builder()
///     .scope("api")
///     .algorithm(Algorithm::Token).num(10).period(Duration::from_secs(1)).burst(20)
///     .by("header:x-api-key")
///     .and()
///     .num(10_000).period(Duration::from_secs(86_400))
///     .by("header:x-api-key")
///     .build()?;
/// assert_eq!(layer.limits(), 2);
/// # Ok::<(), ratelimit_runtime::layer::LayerError>(())
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct RateLimitLayerBuilder {
    pub(super) done: Vec<Draft>,
    pub(super) current: Draft,
    pub(super) limiter: Option<RateLimiter>,
    pub(super) peer_addr: Option<PeerAddrFn>,
}

impl RateLimitLayerBuilder {
    /// The algorithm of the current limit (default [`Algorithm::Fixed`]).
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.current.algorithm = algorithm;
        self
    }

    /// Calls allowed per period (required; for buckets, the refill/drain rate).
    pub fn num(mut self, num: u64) -> Self {
        self.current.num = Some(num);
        self
    }

    /// The period (required; whole milliseconds).
    pub fn period(mut self, period: Duration) -> Self {
        self.current.period = Some(period);
        self
    }

    /// The bucket capacity of `token` and `leaky` (default `num`).
    pub fn burst(mut self, burst: u64) -> Self {
        self.current.burst = Some(burst);
        self
    }

    /// Units one request takes (default 1).
    pub fn cost(mut self, cost: u64) -> Self {
        self.current.cost = cost;
        self
    }

    /// Sets algorithm, `num`, period, burst and cost from a policy.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.current.algorithm = policy.algorithm();
        self.current.num = Some(policy.limit());
        self.current.period = Some(policy.period());
        self.current.burst = Some(policy.burst());
        self.current.cost = policy.cost();
        self
    }

    /// Who a caller is: `"global"` (the default), `"ip"`, `"url"`, `"user"`, `"app_id"` or
    /// `"header:<name>"` (any case).
    pub fn by(mut self, by: impl Into<Cow<'static, str>>) -> Self {
        self.current.by = by.into();
        self
    }

    /// The bucket name of the current limit; a limit started by
    /// [`and`](RateLimitLayerBuilder::and) keeps the scope of the one before unless given its
    /// own. Default [`RateLimitLayer::DEFAULT_SCOPE`].
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.current.scope = Some(scope.into());
        self
    }

    /// What a request gets from the current limit when the store fails or does not answer
    /// in time (the attribute's `on_store_error`; default: the limiter's
    /// [`crate::limiter::Settings::failure_policy`]). A request is answered by the strictest policy
    /// among the layer's limits ([`FailurePolicy::stricter`]).
    ///
    /// ```
    /// # fn main() -> Result<(), ratelimit_runtime::layer::LayerError> {
    /// use std::time::Duration;
    /// use ratelimit_runtime::{FailurePolicy, RateLimitLayer};
    /// // 503 while the store is down, whatever the limiter's policy.
    /// let logins = RateLimitLayer::builder()
    ///     .num(3)
    ///     .period(Duration::from_secs(60))
    ///     .by("ip")
    ///     .failure_policy(FailurePolicy::Deny)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.current.failure_policy = Some(policy);
        self
    }

    /// Limits only the requests to `pattern` (call it again for more paths: any of them):
    /// `"/login"` is that path, `"/api/*"` is `/api` and every path below it, `"/*"` every
    /// path. Without `path`, the limit applies to every path (but its
    /// [`except_path`](Self::except_path)s). A request that no limit of the layer applies to
    /// passes through unlimited, without rate-limit fields.
    ///
    /// The pattern is matched against every spelling a server, proxy or router may take for
    /// the same path — case folded (`/LOGIN`), escapes decoded (`/log%69n`, `%2F`), empty
    /// and dot segments removed (`//login`, `/login/`, `/x/../login`), path parameters cut
    /// (`/login;x`); the query is never part of the path — so an odd spelling of a limited
    /// path is limited (perhaps by two limits), never skipped. Patterns are checked by
    /// [`build`](Self::build) ([`LayerError::InvalidPath`]): a path starting with `/`, written
    /// decoded, without empty or dot segments, a trailing `/` (but the root), `?`, `#`, `;` or
    /// `%`, and `*` only as a final `/*`. See the [module docs](crate::layer#per-route-limits).
    ///
    /// ```
    /// # fn main() -> Result<(), ratelimit_runtime::layer::LayerError> {
    /// use std::time::Duration;
    /// use ratelimit_runtime::RateLimitLayer;
    /// // `/login`: 5 a minute per client; every other path: 100 a minute.
    /// let layer = RateLimitLayer::builder()
    ///     .scope("login").num(5).period(Duration::from_secs(60)).by("ip")
    ///     .path("/login")
    ///     .and()
    ///     .scope("api").num(100).period(Duration::from_secs(60)).by("ip")
    ///     .except_path("/login")
    ///     .build()?;
    /// assert!(RateLimitLayer::builder().num(1).period(Duration::from_secs(1)).path("login").build().is_err());
    /// # Ok(()) }
    /// ```
    pub fn path(mut self, pattern: impl Into<String>) -> Self {
        self.current.paths.push(pattern.into());
        self
    }

    /// Leaves the requests to `pattern` (a [`path`](Self::path) pattern) out of the current
    /// limit; call it again for more. A request is left out only when every spelling of its
    /// path is that pattern: `/login` leaves out `/login`, but `/LOGIN` or `/login/` stay
    /// limited (and a `.path("/login")` limit limits them too).
    pub fn except_path(mut self, pattern: impl Into<String>) -> Self {
        self.current.except_paths.push(pattern.into());
        self
    }

    /// Limits only the requests of `method` (call it again for more: any of them). Matched in
    /// any case; [`http::Method::GET`] covers `HEAD` too (routers answer `HEAD` with the
    /// `GET` handler).
    ///
    /// ```
    /// # fn main() -> Result<(), ratelimit_runtime::layer::LayerError> {
    /// use std::time::Duration;
    /// use ratelimit_runtime::RateLimitLayer;
    /// // Sign-ups (POST /users): 10 an hour per client; reading users is not limited here.
    /// let layer = RateLimitLayer::builder()
    ///     .num(10).period(Duration::from_secs(3600)).by("ip")
    ///     .path("/users").method(http::Method::POST)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn method(mut self, method: Method) -> Self {
        self.current.methods.push(method);
        self
    }

    /// The current limit's quota is the [`crate::Quota`] an earlier layer (authentication)
    /// put in the request extensions, as `#[rate_limit(quota = "request")]` reads it: a plan
    /// per user or tenant. The limit's `num`, `period` and `burst` are then not needed (and
    /// not used; its algorithm, cost, `by` and scope are); a request without a `Quota` is refused with 401
    /// (`{"error":"unauthorized",…}`; gRPC: `UNAUTHENTICATED`); [`crate::Quota::unlimited`]
    /// lets it through that limit without a store call. Each quota counts in its own bucket.
    ///
    /// ```
    /// # fn main() -> Result<(), ratelimit_runtime::layer::LayerError> {
    /// use std::time::Duration;
    /// use ratelimit_runtime::RateLimitLayer;
    /// let per_plan = RateLimitLayer::builder()
    ///     .scope("plans")
    ///     .by("user")
    ///     .quota_from_request()
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn quota_from_request(mut self) -> Self {
        self.current.quota_from_request = true;
        self
    }

    /// What one request costs against the current limit, read from its method, URI, headers
    /// and extensions (the body is not read): the attribute's `cost = <expression>`. 0 counts
    /// as 1; a cost beyond the limit's capacity is refused with 400
    /// (`{"error":"cost_exceeds_capacity",…}`; gRPC: `INVALID_ARGUMENT`) without taking
    /// anything. Replaces [`cost`](Self::cost) for the limit.
    ///
    /// ```
    /// # fn main() -> Result<(), ratelimit_runtime::layer::LayerError> {
    /// use std::time::Duration;
    /// use ratelimit_runtime::RateLimitLayer;
    /// // 1,000 units a minute; a request costs its `x-batch-size` (default 1).
    /// let layer = RateLimitLayer::builder()
    ///     .num(1_000).period(Duration::from_secs(60)).by("header:x-api-key")
    ///     .cost_fn(|request| {
    ///         request.headers.get("x-batch-size")
    ///             .and_then(|v| v.to_str().ok()?.parse().ok())
    ///             .unwrap_or(1)
    ///     })
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn cost_fn(
        mut self,
        cost: impl Fn(&http::request::Parts) -> u64 + Send + Sync + 'static,
    ) -> Self {
        self.current.cost_fn = Some(CostFn(Arc::new(cost)));
        self
    }

    /// Which outcomes count against the current limit (the attribute's `count = …`; default
    /// [`Count::All`]): a request takes its units before the inner service runs, and gets
    /// them back when its response's outcome does not count — for HTTP, by the response's
    /// status ([`Count::ERRORS`]: only 4xx and 5xx count); for gRPC, by its `grpc-status`
    /// (`0` is `Ok`, others `Err`, which [`Count::ERRORS`] counts), read from the headers or,
    /// after the body, the trailers. Requests in flight hold their units, so concurrent
    /// requests never get more than the quota of counted outcomes. The limits of one layer
    /// that count only some outcomes must count the same ones ([`LayerError::MixedCounts`]).
    ///
    /// ```
    /// # fn main() -> Result<(), ratelimit_runtime::layer::LayerError> {
    /// use std::time::Duration;
    /// use ratelimit_runtime::{settle::Count, RateLimitLayer};
    /// // 5 failed logins a minute per client; successful ones are not counted.
    /// let layer = RateLimitLayer::builder()
    ///     .num(5).period(Duration::from_secs(60)).by("ip")
    ///     .path("/login")
    ///     .count(Count::ERRORS)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn count(mut self, count: Count) -> Self {
        self.current.count = count;
        self
    }

    /// Ends the current limit and starts another, checked with it (all or nothing). In the
    /// rate-limit fields, a limit whose scope an earlier one has is named with its position:
    /// `.scope("api")…and()…` answers `"api";…, "api-2";…` (see the [module docs](crate::layer)).
    pub fn and(mut self) -> Self {
        let next = Draft::new();
        self.done.push(std::mem::replace(&mut self.current, next));
        self
    }

    /// The limiter to check against (default: one in the request extensions, else
    /// [`RateLimiter::current`] at call time).
    pub fn limiter(mut self, limiter: RateLimiter) -> Self {
        self.limiter = Some(limiter);
        self
    }

    /// A hook that finds the peer address in the request extensions, tried before the
    /// built-in ones (see the [module docs](crate::layer)).
    pub fn peer_addr(mut self, hook: PeerAddrFn) -> Self {
        self.peer_addr = Some(hook);
        self
    }

    /// Takes this limit's units a lease at a time on a hot key ([`crate::lease`]): for a
    /// global limit on a whole router, the one-round-trip check per request becomes one take
    /// per lease. The limit must be the layer's only one and count every outcome, and its
    /// algorithm one that leases (not the sliding log): [`build`](Self::build) says otherwise.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use ratelimit_runtime::{lease::Lease, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::builder()
    ///     .num(100_000)
    ///     .period(Duration::from_secs(60))
    ///     .lease(Lease::new(Duration::from_millis(100))?)
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    pub fn lease(mut self, lease: Lease) -> Self {
        self.current.lease = Some(lease);
        self
    }

    /// The layer, or what is wrong with it.
    pub fn build(self) -> Result<RateLimitLayer, LayerError> {
        let drafts: Vec<&Draft> = self.done.iter().chain([&self.current]).collect();
        let mut limits = Vec::with_capacity(drafts.len());
        let mut rules = Vec::with_capacity(drafts.len());
        let mut scope = RateLimitLayer::DEFAULT_SCOPE;
        let mut filter: Option<Count> = None;
        for (i, draft) in drafts.iter().enumerate() {
            if let Some(s) = &draft.scope {
                if !key::valid_scope(s) {
                    return Err(LayerError::InvalidScope { scope: s.clone() });
                }
                scope = intern(s);
            }
            let limit = draft.limit(i, scope)?;
            if draft.count != Count::All {
                if filter.is_some_and(|f| f != draft.count) {
                    return Err(LayerError::MixedCounts { limit: i });
                }
                filter = Some(draft.count);
            }
            if let Some(lease) = &draft.lease {
                if drafts.len() > 1 || draft.count != Count::All {
                    return Err(LayerError::LeaseAlone { limit: i });
                }
                crate::lease::check(&limit.policy, lease)
                    .map_err(|error| LayerError::Policy { limit: i, error })?;
            }
            limits.push(limit);
            rules.push(draft.rule(i)?);
        }
        if let Some(limit) = limits.iter().position(|l| l.by == By::Ip) {
            peer_source(limit, self.peer_addr.is_some(), PEER_FROM_SERVER)?;
        }
        Ok(RateLimitLayer {
            shared: Arc::new(Shared::new(
                limits,
                rules,
                filter.is_some(),
                self.limiter,
                self.peer_addr,
            )),
        })
    }
}

impl Draft {
    /// The limit this draft describes, in `scope`, or what is wrong with it (limit `i`).
    fn limit(&self, i: usize, scope: &'static str) -> Result<Limit, LayerError> {
        // A quota from the request gives num, period and burst per request; the policy here
        // is a placeholder (as the attribute's), its cost given per request.
        let policy = if self.quota_from_request {
            Policy::from_parts(self.algorithm, 1, 1000, 1, 1)
                .map_err(|error| LayerError::Policy { limit: i, error })?
        } else {
            self.policy(i)?
        };
        let by = parse_by(&self.by).ok_or_else(|| LayerError::InvalidBy {
            by: self.by.clone().into_owned(),
        })?;
        Ok(Limit {
            policy,
            scope,
            by,
            shadow: false,
            failure_policy: self.failure_policy,
            lease: self.lease,
            replica_ack: false,
        })
    }

    /// Which requests the draft's limit applies to and what it reads of each (limit `i`).
    fn rule(&self, i: usize) -> Result<Rule, LayerError> {
        Ok(Rule {
            route: self.route(i)?,
            dynamic: Dynamic {
                quota: if self.quota_from_request {
                    QuotaFrom::Request
                } else {
                    QuotaFrom::Attribute
                },
                count: self.count,
                settle: false,
            },
            cost: self.cost_fn.clone(),
            fixed_cost: (self.quota_from_request && self.cost != 1).then_some(self.cost),
        })
    }
}

impl Shared {
    /// What the layer's services share: the limits and rules, and what they make the service
    /// read of each request (the path or the method, the costs, the outcome).
    fn new(
        limits: Vec<Limit>,
        rules: Vec<Rule>,
        counts: bool,
        limiter: Option<RateLimiter>,
        peer_addr: Option<PeerAddrFn>,
    ) -> Self {
        let dynamic = rules.iter().any(|r| {
            r.dynamic.quota != QuotaFrom::Attribute
                || r.dynamic.count != Count::All
                || r.cost.is_some()
                || r.fixed_cost.is_some()
        });
        Self {
            routing: if rules.iter().any(|r| r.route.reads_path()) {
                Routing::Paths
            } else if rules.iter().any(|r| !r.route.is_any()) {
                Routing::Methods
            } else {
                Routing::All
            },
            dynamics: dynamic.then(|| rules.iter().map(|r| r.dynamic).collect()),
            inputs: rules
                .iter()
                .any(|r| r.cost.is_some() || r.fixed_cost.is_some()),
            counts,
            needs_peer: limits.iter().any(|l| l.by == By::Ip),
            limits: limits.into_boxed_slice(),
            rules: rules.into_boxed_slice(),
            limiter,
            peer_addr,
        }
    }
}

/// Whether this build reads the client's address from what a server records: Axum's
/// `ConnectInfo` or tonic's `TcpConnectInfo` (the layer's `peer`).
const PEER_FROM_SERVER: bool = cfg!(any(feature = "axum", feature = "tonic"));

/// A limit by IP (the first, `limit`) needs somewhere to read the client's address from: the
/// hook, or a server whose records this build reads. Refused at build, not answered 500 at
/// every request.
pub(super) fn peer_source(limit: usize, hook: bool, from_server: bool) -> Result<(), LayerError> {
    if hook || from_server {
        Ok(())
    } else {
        Err(LayerError::NoPeerAddress { limit })
    }
}
