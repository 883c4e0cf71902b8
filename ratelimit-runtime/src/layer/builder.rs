//! Building a [`RateLimitLayer`]: its limits, checked when built ([`LayerError`]).

use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::algorithm::Algorithm;
use crate::key;
use crate::limit::FailurePolicy;
use crate::limit::{By, Limit};
use crate::limiter::RateLimiter;
use crate::policy::{Policy, PolicyError};

use super::{PeerAddrFn, RateLimitLayer, Shared};

/// Why a [`RateLimitLayer`] could not be built. `limit` is the 0-based index of the limit
/// (the first, then one per [`RateLimitLayerBuilder::and`]).
///
/// ```
/// use std::time::Duration;
/// use ratelimit_runtime::layer::{LayerError, RateLimitLayer};
///
/// let err = RateLimitLayer::builder().period(Duration::from_secs(1)).build().unwrap_err();
/// assert_eq!(err, LayerError::MissingNum { limit: 0 });
/// let err = RateLimitLayer::builder().num(1).period(Duration::from_secs(1)).by("cookie").build().unwrap_err();
/// assert!(err.to_string().contains("unknown by \"cookie\""));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LayerError {
    /// The limit has no `num`.
    MissingNum {
        /// Which limit.
        limit: usize,
    },
    /// The limit has no `period`.
    MissingPeriod {
        /// Which limit.
        limit: usize,
    },
    /// The limit breaks a rule of [`Policy`] (the attribute's rules: the same bounds).
    Policy {
        /// Which limit.
        limit: usize,
        /// The rule.
        error: PolicyError,
    },
    /// A scope that cannot name a bucket ([`key::valid_scope`]).
    InvalidScope {
        /// The scope given.
        scope: String,
    },
    /// A `by` that is not one of the sources.
    InvalidBy {
        /// The value given.
        by: String,
    },
}

pub(super) const BYS: &str =
    "\"global\" (the default), \"ip\", \"url\", \"user\", \"app_id\" or \"header:<name>\"";

impl fmt::Display for LayerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MissingNum { limit } => write!(f, "limit #{}: `num` is required", limit + 1),
            Self::MissingPeriod { limit } => {
                write!(f, "limit #{}: `period` is required", limit + 1)
            }
            Self::Policy { limit, error } => write!(f, "limit #{}: {error}", limit + 1),
            Self::InvalidScope { scope } => write!(
                f,
                "invalid scope {scope:?}: use 1 to 200 of A-Z a-z 0-9 _ : . - /"
            ),
            Self::InvalidBy { by } => {
                if let Some(name) = by.strip_prefix("header:") {
                    write!(
                        f,
                        "invalid header name {:?} in by = {by:?}: use letters, digits and !#$%&'*+-.^_`|~, as in \"header:x-api-key\"",
                        name.trim()
                    )
                } else {
                    write!(f, "unknown by {by:?}: expected {BYS}")
                }
            }
        }
    }
}

impl std::error::Error for LayerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Policy { error, .. } => Some(error),
            _ => None,
        }
    }
}

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
        }
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
    /// [`crate::Settings::failure_policy`]). A request is answered by the strictest policy
    /// among the layer's limits ([`FailurePolicy::stricter`]).
    ///
    /// ```
    /// # fn main() -> Result<(), ratelimit_runtime::LayerError> {
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

    /// The layer, or what is wrong with it.
    pub fn build(self) -> Result<RateLimitLayer, LayerError> {
        let mut limits = Vec::with_capacity(self.done.len() + 1);
        let mut scope = RateLimitLayer::DEFAULT_SCOPE;
        for (i, draft) in self.done.iter().chain([&self.current]).enumerate() {
            if let Some(s) = &draft.scope {
                if !key::valid_scope(s) {
                    return Err(LayerError::InvalidScope { scope: s.clone() });
                }
                scope = intern(s);
            }
            let policy = draft.policy(i)?;
            let by = parse_by(&draft.by).ok_or_else(|| LayerError::InvalidBy {
                by: draft.by.clone().into_owned(),
            })?;
            limits.push(Limit {
                policy,
                scope,
                by,
                shadow: false,
                failure_policy: draft.failure_policy,
            });
        }
        let needs_peer = limits.iter().any(|l| l.by == By::Ip);
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                limits: limits.into_boxed_slice(),
                limiter: self.limiter,
                peer_addr: self.peer_addr,
                needs_peer,
            }),
        })
    }
}

/// Whether `b` may be in a header name (an RFC 9110 token).
pub(super) fn is_header_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A `by` value, as the attribute spells it.
pub(super) fn parse_by(text: &str) -> Option<By> {
    Some(match text {
        "global" => By::Global,
        "ip" => By::Ip,
        "url" => By::Url,
        "user" => By::User,
        "app_id" => By::AppId,
        other => {
            let name = other.strip_prefix("header:")?.trim();
            if name.is_empty() || !name.bytes().all(is_header_name_byte) {
                return None;
            }
            By::Header(intern(&name.to_ascii_lowercase()))
        }
    })
}

/// `s` for as long as the process lives, once per distinct value: the limits' scopes and
/// header names are `&'static str` (the attribute's are literals). Only validated names of
/// configured layers come here, so the memory this keeps is bounded by the configuration.
pub(super) fn intern(s: &str) -> &'static str {
    static NAMES: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(name) = names.iter().find(|n| **n == s) {
        return name;
    }
    let name: &'static str = Box::leak(s.into());
    names.push(name);
    name
}
