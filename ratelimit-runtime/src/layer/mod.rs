//! [`RateLimitLayer`]: a Tower layer that limits a whole router or service (feature `tower`)
//! — an Axum `Router`, a tonic `Server`, any [`tower_service::Service`] over
//! [`http::Request`] — with the policies, sources, stores, responses and fields of
//! `#[rate_limit]`, configured in code.
//!
//! ```no_run
//! # #[cfg(feature = "axum")] mod demo {
//! use std::net::SocketAddr;
//! use std::time::Duration;
//!
//! use axum::{Router, routing::get};
//! use ratelimit_runtime::{Algorithm, RateLimitLayer};
//!
//! pub async fn serve() -> Result<(), Box<dyn std::error::Error>> {
//!     // Every route: 100 requests per minute per client address.
//!     let limit = RateLimitLayer::builder()
//!         .scope("api")
//!         .algorithm(Algorithm::Sliding)
//!         .num(100)
//!         .period(Duration::from_secs(60))
//!         .by("ip")
//!         .build()?;
//!     let app = Router::new().route("/", get(|| async { "hello" })).layer(limit);
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//!     axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//!     Ok(())
//! }
//! # }
//! # fn main() {}
//! ```
//!
//! # What it does
//!
//! Each request is checked against every limit of the layer in one store round trip (all or
//! nothing: a request that one limit refuses takes nothing from the others), before the inner
//! service sees it:
//!
//! * admitted: the inner service's response, with the `RateLimit-Policy` and `RateLimit` fields
//!   (or the legacy ones, [`crate::HeaderStyle`]). A route that also carries `#[rate_limit]`
//!   answers **one** field of each, the route's members first, then the layer's. Every member is
//!   named by one rule, for stacked attributes, stacked layer limits and both together: the
//!   last segment of its limit's scope, with the member's 1-based position in the field
//!   appended when an earlier member has that name (`"api";q=5;w=60, "api-2";q=100;w=3600`).
//!   Legacy `X-RateLimit-*` fields describe the tighter of the two (the lower remaining);
//! * quota spent: the 429 of `#[rate_limit]`, byte for byte (`Retry-After`, the fields, the
//!   JSON body with [`crate::Builder::message`]);
//! * store down under [`crate::FailurePolicy::Deny`]: 503; a request lacking what a limit is
//!   `by`: 400 (`app_id`, `header:<name>`, naming the header), 401 (`user`) or 500 (`ip`
//!   without a peer address: the server was not set up to record it).
//!
//! A **gRPC** request (`POST` with content type `application/grpc…`) gets a gRPC answer
//! instead: HTTP 200, trailers-only, `grpc-status: 8` (`RESOURCE_EXHAUSTED`) for a spent quota,
//! `14` (`UNAVAILABLE`) for a store down, `3`/`16`/`13` for the others, `grpc-message`, and the
//! same `Retry-After` and rate-limit fields as headers (tonic clients read them as the
//! status's metadata). Admitted gRPC responses carry the fields as initial metadata.
//!
//! A route that carries `#[rate_limit]` as well gets both limits: the layer checks first, the
//! attribute then; the tighter binds, and a request the layer admitted counts against the
//! layer's quota even when the attribute then refuses it.
//!
//! # Sources (`by`)
//!
//! The attribute's: `"global"` (the default), `"ip"`, `"url"`, `"user"`, `"app_id"`,
//! `"header:<name>"` — read as the attribute reads them ([`crate::http`]), with the same
//! trusted proxies and forwarding header ([`crate::Builder::trusted_proxies`]). The peer
//! address for `"ip"` is looked up in the request extensions:
//!
//! * the [`RateLimitLayerBuilder::peer_addr`] hook, when set and it answers;
//! * Axum's `ConnectInfo<SocketAddr>` (feature `axum`; serve the router with
//!   `into_make_service_with_connect_info::<SocketAddr>()`);
//! * tonic's `TcpConnectInfo` (feature `tonic`; tonic's `Server::serve` and
//!   `serve_with_incoming` record it).
//!
//! `"url"` keys the path the client sent: a layer on a router nested with Axum's
//! `Router::nest` sees the prefix stripped from `uri()`, and reads Axum's `OriginalUri` instead
//! (feature `axum`).
//!
//! The limiter's exemptions and deny list ([`crate::Exemptions`]) are not applied by the layer
//! yet: every request is checked against its limits. Building a layer from a limiter that has
//! them (or calling one that finds such a limiter) logs one warning per process saying so.
//!
//! # Scope, keys and limiter
//!
//! A limit's bucket is named by its scope ([`RateLimitLayerBuilder::scope`], default
//! [`RateLimitLayer::DEFAULT_SCOPE`], `"layer"`) and its `by` value, as for the attribute: a
//! layer and a `#[rate_limit(scope = "api", …)]` with the same policy and `by` share one
//! bucket. The `RateLimit-Policy` member is named after the scope's last segment.
//!
//! The limiter is, in order: the one given to [`RateLimitLayerBuilder::limiter`], a
//! [`RateLimiter`] in the request extensions, [`RateLimiter::current`] at call time.
//!
//! # Where it goes
//!
//! * Axum: `Router::layer` limits every route (and the fallback); `Router::route_layer` only
//!   matched routes; `MethodRouter::layer` (`get(h).layer(…)`) one route.
//! * tonic: `Server::builder().layer(…)`, around every service of the server. (A single
//!   service wrapped with it no longer answers tonic's own body type, which `add_service`
//!   requires; the server's layer does not have that constraint.)
//! * Any other `Service<http::Request<B>, Response = http::Response<R>>` that is `Clone`; the
//!   response body becomes [`LayerBody<R>`].
//!
//! # Cost
//!
//! Per request, the layer allocates what the attribute does — each limit's store key (and the
//! client address's text for `ip`), the rate-limit field values, the check's small vectors —
//! plus one boxed future, since the check is an `async fn` whose future cannot be named. It
//! clones no headers: the sources read the request in place. The service polled ready is the
//! one called (the inner service is cloned and swapped in `call`).

mod body;
mod grpc;

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use tower_layer::Layer;
use tower_service::Service;

pub use self::body::LayerBody;
use crate::http::UserId;
use crate::http::response::{Fields, Refusal, join_members, rate_fields};
use crate::http::source::{Missing, RequestParts};
use crate::key;
use crate::limit::{By, Limit, keys_for};
use crate::limiter::{FailurePolicy, RateLimiter, Settings};
use crate::policy::{Algorithm, Policy, PolicyError};

/// A hook that finds the peer address of a request in its extensions, for servers whose
/// connection info the layer does not know (TLS, Unix sockets, PROXY protocol…).
///
/// ```
/// use std::net::IpAddr;
/// use ratelimit_runtime::layer::PeerAddrFn;
///
/// #[derive(Clone)]
/// struct MyConnInfo(IpAddr);
///
/// let hook: PeerAddrFn = |ext| ext.get::<MyConnInfo>().map(|c| c.0);
/// let mut ext = http::Extensions::new();
/// ext.insert(MyConnInfo("192.0.2.1".parse().unwrap()));
/// assert_eq!(hook(&ext), Some("192.0.2.1".parse().unwrap()));
/// ```
pub type PeerAddrFn = fn(&http::Extensions) -> Option<IpAddr>;

/// The future of a [`RateLimitService`] call.
pub type ResponseFuture<B, E> =
    Pin<Box<dyn Future<Output = Result<Response<LayerBody<B>>, E>> + Send + 'static>>;

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

const BYS: &str =
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
struct Draft {
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
    fn new() -> Self {
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
    done: Vec<Draft>,
    current: Draft,
    limiter: Option<RateLimiter>,
    peer_addr: Option<PeerAddrFn>,
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
    /// `.scope("api")…and()…` answers `"api";…, "api-2";…` (see the [module docs](self)).
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
    /// built-in ones (see the [module docs](self)).
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
        if let Some(limiter) = &self.limiter {
            warn_ignored_exemptions(&IGNORED_EXEMPTIONS_LOGGED, &limiter.settings().exemptions);
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
fn is_header_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A `by` value, as the attribute spells it.
fn parse_by(text: &str) -> Option<By> {
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
fn intern(s: &str) -> &'static str {
    static NAMES: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut names = NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(name) = names.iter().find(|n| **n == s) {
        return name;
    }
    let name: &'static str = Box::leak(s.into());
    names.push(name);
    name
}

struct Shared {
    limits: Box<[Limit]>,
    limiter: Option<RateLimiter>,
    peer_addr: Option<PeerAddrFn>,
    needs_peer: bool,
}

/// A Tower [`Layer`] that rate-limits every request to the service it wraps; see the
/// [module docs](self). Cheap to clone (one `Arc`).
///
/// ```
/// use std::time::Duration;
/// use ratelimit_runtime::{Algorithm, Policy, RateLimitLayer};
///
/// let per_ip = RateLimitLayer::new(Policy::new(Algorithm::Sliding, 100, Duration::from_secs(60))?, "ip")?;
/// assert_eq!(per_ip.limits(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct RateLimitLayer {
    shared: Arc<Shared>,
}

impl fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limits", &self.shared.limits)
            .field("limiter", &self.shared.limiter)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer {
    /// The scope of a limit that names none.
    pub const DEFAULT_SCOPE: &str = "layer";

    /// A builder; see [`RateLimitLayerBuilder`].
    pub fn builder() -> RateLimitLayerBuilder {
        RateLimitLayerBuilder {
            done: Vec::new(),
            current: Draft::new(),
            limiter: None,
            peer_addr: None,
        }
    }

    /// One limit, `policy` per caller identified by `by`, in scope
    /// [`RateLimitLayer::DEFAULT_SCOPE`].
    pub fn new(policy: Policy, by: &str) -> Result<Self, LayerError> {
        Self::builder().policy(policy).by(by.to_owned()).build()
    }

    /// How many limits the layer checks per request.
    pub fn limits(&self) -> usize {
        self.shared.limits.len()
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimitService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The service of a [`RateLimitLayer`]: checks each request, then calls the inner service or
/// answers in its place.
///
/// ```
/// use std::convert::Infallible;
/// use std::task::{Context, Poll};
/// use std::time::Duration;
/// use ratelimit_runtime::{RateLimitLayer, RateLimiter};
/// use tower_layer::Layer as _;
/// use tower_service::Service;
///
/// #[derive(Clone)]
/// struct Hello;
///
/// impl Service<http::Request<String>> for Hello {
///     type Response = http::Response<String>;
///     type Error = Infallible;
///     type Future = std::future::Ready<Result<Self::Response, Infallible>>;
///
///     fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
///         Poll::Ready(Ok(()))
///     }
///
///     fn call(&mut self, _: http::Request<String>) -> Self::Future {
///         std::future::ready(Ok(http::Response::new("hi".to_owned())))
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = RateLimitLayer::builder()
///     .num(1)
///     .period(Duration::from_secs(60))
///     .limiter(RateLimiter::builder().build().await?)
///     .build()?;
/// let mut service = layer.layer(Hello);
/// let ok = service.call(http::Request::new(String::new())).await?;
/// assert_eq!(ok.status(), 200);
/// assert!(ok.headers()["ratelimit"].to_str()?.starts_with("\"layer\";r=0;t="));
/// let limited = service.call(http::Request::new(String::new())).await?;
/// assert_eq!(limited.status(), 429);
/// assert!(limited.headers().contains_key("retry-after"));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RateLimitService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: fmt::Debug> fmt::Debug for RateLimitService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitService")
            .field("inner", &self.inner)
            .field("limits", &self.shared.limits)
            .finish_non_exhaustive()
    }
}

impl<S> RateLimitService<S> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for RateLimitService<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: 'static,
    ReqB: Send + 'static,
    ResB: Send + 'static,
{
    type Response = Response<LayerBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<ResB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        // The service that was polled ready is the one to call; the clone waits for the next
        // `poll_ready`.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(Arc::clone(&self.shared).run(inner, request))
    }
}

static MISSING_PEER_LOGGED: AtomicBool = AtomicBool::new(false);

const MISSING_PEER: &str = "rate limiting by IP needs the client address, which this request does not carry: \
     serve an Axum router with `into_make_service_with_connect_info::<SocketAddr>()`, a tonic server with \
     `Server::serve` or `serve_with_incoming` (ratelimit-runtime's `tonic` feature), or give the layer a `peer_addr` hook";

const STORE_DOWN: &str = "The rate-limit store is unavailable; please try again later.";

impl Shared {
    async fn run<S, ReqB, ResB>(
        self: Arc<Self>,
        mut inner: S,
        request: Request<ReqB>,
    ) -> Result<Response<LayerBody<ResB>>, S::Error>
    where
        S: Service<Request<ReqB>, Response = Response<ResB>>,
    {
        // For gRPC, the request's content type (reference-counted), answered back: a
        // gRPC-Web client expects its own.
        let grpc = grpc::is_grpc(request.method(), request.headers())
            .then(|| request.headers().get(CONTENT_TYPE).cloned())
            .flatten();
        let limiter = match &self.limiter {
            Some(l) => l.clone(),
            None => match request.extensions().get::<RateLimiter>() {
                Some(l) => l.clone(),
                None => RateLimiter::current(),
            },
        };
        let settings = limiter.settings();
        // A limiter found at call time (extensions, `current`) is warned about as one given.
        if self.limiter.is_none() {
            warn_ignored_exemptions(&IGNORED_EXEMPTIONS_LOGGED, &settings.exemptions);
        }
        let keys = match self.keys(&request, settings) {
            Ok(keys) => keys,
            Err(missing) => return Ok(Self::missing(missing, grpc.as_ref())),
        };
        // Shadow mode and the metrics apply as for handlers (`RateLimiter::decide`); with a
        // limit in shadow mode, responses carry no rate-limit headers.
        let verdict = limiter.decide(&self.limits, &keys).await;
        match verdict {
            Ok(v) if v.is_admitted() && limiter.any_shadow(&self.limits) => {
                let response = inner.call(request).await?;
                Ok(response.map(LayerBody::new))
            }
            Ok(v) if v.is_admitted() => {
                let fields = rate_fields(&self.limits, &v, settings.http.header_style);
                let mut response = inner.call(request).await?;
                add_admitted_fields(response.headers_mut(), fields, &self.limits);
                Ok(response.map(LayerBody::new))
            }
            Ok(v) => Ok(answer(
                Refusal::too_many_requests(&self.limits, &v, &settings.http),
                grpc.as_ref(),
                &settings.http.message,
            )),
            Err(_) => Ok(answer(
                Refusal::store_unavailable(),
                grpc.as_ref(),
                STORE_DOWN,
            )),
        }
    }

    /// The store keys of the limits for `request`.
    fn keys<B>(&self, request: &Request<B>, settings: &Settings) -> Result<Vec<String>, Missing> {
        let extensions = request.extensions();
        let parts = RequestParts {
            peer: if self.needs_peer {
                self.peer(extensions)
            } else {
                None
            },
            path: path_of(request),
            headers: request.headers(),
            user: extensions.get::<UserId>(),
        };
        keys_for(&settings.prefix, &self.limits, &[], |by| {
            parts.by_value(by, &settings.http)
        })
    }

    /// The peer address the server recorded in the request extensions.
    fn peer(&self, extensions: &http::Extensions) -> Option<IpAddr> {
        if let Some(ip) = self.peer_addr.and_then(|hook| hook(extensions)) {
            return Some(ip);
        }
        #[cfg(feature = "axum")]
        if let Some(axum::extract::ConnectInfo(addr)) =
            extensions.get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        {
            return Some(addr.ip());
        }
        #[cfg(feature = "tonic")]
        if let Some(addr) = extensions
            .get::<tonic::transport::server::TcpConnectInfo>()
            .and_then(tonic::transport::server::TcpConnectInfo::remote_addr)
        {
            return Some(addr.ip());
        }
        None
    }

    /// The answer to a request that lacks what a limit is `by`.
    fn missing<B>(missing: Missing, grpc: Option<&HeaderValue>) -> Response<LayerBody<B>> {
        let refusal = missing.refusal(|| {
            if !MISSING_PEER_LOGGED.swap(true, Ordering::Relaxed) {
                tracing::error!(target: crate::observe::log::CALLER, "{MISSING_PEER}");
            }
            Refusal::new(500, "internal_error", MISSING_PEER)
        });
        let message = missing.message().unwrap_or(Cow::Borrowed(MISSING_PEER));
        answer(refusal, grpc, &message)
    }
}

/// The path the client sent, as `by = "url"` keys it: with the `axum` feature, the one Axum's
/// router recorded (`OriginalUri`) before `Router::nest` stripped its prefix (a layer on a
/// nested router sees the stripped one in `uri()`), else the request's.
fn path_of<B>(request: &Request<B>) -> &str {
    #[cfg(feature = "axum")]
    if let Some(axum::extract::OriginalUri(uri)) = request.extensions().get() {
        return uri.path();
    }
    request.uri().path()
}

/// Set once the layer warned that it ignores its limiter's exemptions and deny list.
static IGNORED_EXEMPTIONS_LOGGED: AtomicBool = AtomicBool::new(false);

const IGNORED_EXEMPTIONS: &str = "this RateLimitLayer's limiter has a deny list or exemptions, which the layer does not apply yet: \
     every request through the layer is checked against its limits, denied networks included \
     (#[rate_limit] handlers apply them) (logged once per process)";

/// Writes one warning, the first time a layer is built from (or calls) a limiter with a deny
/// list or exemptions, which the layer does not apply. Returns whether it wrote it.
fn warn_ignored_exemptions(logged: &AtomicBool, exemptions: &crate::Exemptions) -> bool {
    if exemptions.is_empty()
        || logged.load(Ordering::Relaxed)
        || logged.swap(true, Ordering::Relaxed)
    {
        return false;
    }
    tracing::warn!(target: crate::observe::log::CALLER,
        deny_networks = exemptions.deny_networks().len(),
        exempt_networks = exemptions.exempt_networks().len(),
        predicate = exemptions.has_predicate(),
        "{IGNORED_EXEMPTIONS}"
    );
    true
}

/// The response that replaces the inner service's: the attribute's (status, JSON body,
/// fields), or for a gRPC request (`grpc`: its content type) a trailers-only answer with the
/// same fields and `message`.
fn answer<B>(
    refusal: Refusal,
    grpc: Option<&HeaderValue>,
    message: &str,
) -> Response<LayerBody<B>> {
    let mut response;
    if let Some(content_type) = grpc {
        response = Response::new(LayerBody::empty());
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, content_type.clone());
        headers.insert(
            HeaderName::from_static("grpc-status"),
            HeaderValue::from(u16::from(grpc::code(refusal.status))),
        );
        if let Ok(value) = HeaderValue::try_from(grpc::message(message)) {
            headers.insert(HeaderName::from_static("grpc-message"), value);
        }
    } else {
        response = Response::new(LayerBody::full(Bytes::from(refusal.body)));
        *response.status_mut() =
            StatusCode::from_u16(refusal.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    let headers = response.headers_mut();
    for (name, value) in refusal.fields {
        if let Ok(value) = HeaderValue::try_from(value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    }
    response
}

const LEGACY_REMAINING: &str = "x-ratelimit-remaining";

/// Adds the layer's fields to an admitted response: the IETF lists join the response's own
/// (a route's `#[rate_limit]`) into one field each, its members first, named by the one rule
/// of [`join_members`]; the legacy single values are the layer's unless the response already
/// describes a limit with no more remaining.
fn add_admitted_fields(headers: &mut HeaderMap, fields: Fields, limits: &[Limit]) {
    let ours = fields
        .iter()
        .find(|(name, _)| *name == LEGACY_REMAINING)
        .and_then(|(_, v)| v.parse::<u64>().ok());
    let theirs = headers
        .get(LEGACY_REMAINING)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let keep_theirs = matches!((ours, theirs), (Some(o), Some(t)) if t <= o);
    for (name, value) in fields {
        let Ok(value) = HeaderValue::try_from(value) else {
            continue;
        };
        let name = HeaderName::from_static(name);
        if name.as_str().starts_with("x-ratelimit-") {
            if !keep_theirs {
                headers.insert(name, value);
            }
            continue;
        }
        let theirs: Vec<&str> = headers
            .get_all(&name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        if theirs.is_empty() {
            headers.insert(name, value);
            continue;
        }
        let joined = join_members(&theirs.join(", "), value.to_str().unwrap_or(""), limits);
        if let Ok(joined) = HeaderValue::try_from(joined) {
            headers.insert(name, joined);
        } else {
            headers.append(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn by_values_are_the_attribute_s() {
        assert_eq!(parse_by("global"), Some(By::Global));
        assert_eq!(parse_by("ip"), Some(By::Ip));
        assert_eq!(parse_by("url"), Some(By::Url));
        assert_eq!(parse_by("user"), Some(By::User));
        assert_eq!(parse_by("app_id"), Some(By::AppId));
        assert_eq!(parse_by("header:X-Api-Key"), Some(By::Header("x-api-key")));
        assert_eq!(parse_by("header: x-k "), Some(By::Header("x-k")));
        for bad in [
            "",
            "IP",
            "header:",
            "header: ",
            "header:a b",
            "header:a{",
            "cookie",
        ] {
            assert_eq!(parse_by(bad), None, "{bad:?}");
        }
        // One leaked name per distinct value.
        let a = intern("x-same");
        assert!(std::ptr::eq(a, intern("x-same")));
    }

    #[test]
    fn builder_errors_are_typed_and_name_the_limit() {
        let ok = || RateLimitLayer::builder().num(3).period(secs(10));
        assert!(ok().build().is_ok());
        assert_eq!(
            RateLimitLayer::builder().num(3).build().unwrap_err(),
            LayerError::MissingPeriod { limit: 0 }
        );
        assert_eq!(
            ok().num(0).build().unwrap_err(),
            LayerError::Policy {
                limit: 0,
                error: PolicyError::ZeroLimit
            }
        );
        assert_eq!(
            ok().period(Duration::from_micros(10)).build().unwrap_err(),
            LayerError::Policy {
                limit: 0,
                error: PolicyError::ZeroPeriod
            }
        );
        assert_eq!(
            ok().period(Duration::MAX).build().unwrap_err(),
            LayerError::Policy {
                limit: 0,
                error: PolicyError::PeriodTooLong
            }
        );
        assert_eq!(
            ok().cost(4).build().unwrap_err(),
            LayerError::Policy {
                limit: 0,
                error: PolicyError::CostExceedsCapacity
            }
        );
        assert_eq!(
            ok().and().num(1).build().unwrap_err(),
            LayerError::MissingPeriod { limit: 1 }
        );
        let err = ok().scope("bad{scope}").build().unwrap_err();
        assert!(matches!(err, LayerError::InvalidScope { .. }));
        assert!(err.to_string().contains("bad{scope}"));
        let err = ok().by("header:a b").build().unwrap_err();
        assert!(
            err.to_string().contains("invalid header name \"a b\""),
            "{err}"
        );
        let err = ok()
            .algorithm(Algorithm::Sliding)
            .num(1_000_000)
            .build()
            .unwrap_err();
        assert!(err.to_string().starts_with("limit #1: "), "{err}");
    }

    #[test]
    fn stacked_limits_inherit_the_scope() {
        let layer = RateLimitLayer::builder()
            .scope("api")
            .num(3)
            .period(secs(1))
            .by("ip")
            .and()
            .num(100)
            .period(secs(60))
            .and()
            .scope("other")
            .num(1)
            .period(secs(1))
            .build()
            .unwrap();
        let limits = &layer.shared.limits;
        assert_eq!(
            limits.iter().map(|l| (l.scope, l.by)).collect::<Vec<_>>(),
            [("api", By::Ip), ("api", By::Global), ("other", By::Global)]
        );
        assert!(layer.shared.needs_peer);
        let p = Policy::new(Algorithm::Token, 5, secs(1))
            .unwrap()
            .with_burst(9)
            .unwrap();
        let layer = RateLimitLayer::new(p, "url").unwrap();
        assert_eq!(layer.shared.limits[0].policy, p);
        assert_eq!(layer.shared.limits[0].scope, "layer");
        assert!(!layer.shared.needs_peer);
    }

    fn limit(scope: &'static str) -> Limit {
        Limit {
            policy: Policy::from_parts(Algorithm::Fixed, 2, 10_000, 2, 1).unwrap(),
            scope,
            by: By::Global,
            shadow: false,
        }
    }

    #[test]
    fn admitted_fields_join_lists_and_keep_the_tighter_legacy_values() {
        let mut headers = HeaderMap::new();
        headers.insert("ratelimit", HeaderValue::from_static("\"login\";r=1;t=5"));
        headers.insert(LEGACY_REMAINING, HeaderValue::from_static("1"));
        headers.insert("x-ratelimit-limit", HeaderValue::from_static("2"));
        add_admitted_fields(
            &mut headers,
            vec![
                ("ratelimit", "\"layer\";r=7;t=1".to_owned()),
                ("x-ratelimit-limit", "10".to_owned()),
                (LEGACY_REMAINING, "7".to_owned()),
            ],
            &[limit("layer")],
        );
        let all: Vec<_> = headers.get_all("ratelimit").iter().collect();
        assert_eq!(all, ["\"login\";r=1;t=5, \"layer\";r=7;t=1"]);
        assert_eq!(headers[LEGACY_REMAINING], "1");
        assert_eq!(headers["x-ratelimit-limit"], "2");
        add_admitted_fields(
            &mut headers,
            vec![
                ("x-ratelimit-limit", "3".to_owned()),
                (LEGACY_REMAINING, "0".to_owned()),
            ],
            &[limit("layer")],
        );
        assert_eq!(headers[LEGACY_REMAINING], "0");
        assert_eq!(headers["x-ratelimit-limit"], "3");
    }

    /// Issue 28, point 15: a layer over a route with its own `#[rate_limit]` answers one
    /// `RateLimit-Policy` and one `RateLimit` field, named by the rule stacked attributes
    /// follow: a name an earlier member has gets the member's position in the field.
    #[test]
    fn a_layer_over_an_attribute_answers_one_field_per_list_named_by_one_rule() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "ratelimit-policy",
            HeaderValue::from_static("\"api\";q=2;w=10"),
        );
        headers.insert("ratelimit", HeaderValue::from_static("\"api\";r=1;t=10"));
        let ours = [limit("api"), limit("api"), limit("other::daily")];
        add_admitted_fields(
            &mut headers,
            vec![
                (
                    "ratelimit-policy",
                    "\"api\";q=2;w=10, \"api-2\";q=2;w=10, \"daily\";q=2;w=10".to_owned(),
                ),
                (
                    "ratelimit",
                    "\"api\";r=1;t=9, \"api-2\";r=0;t=9, \"daily\";r=1;t=9".to_owned(),
                ),
            ],
            &ours,
        );
        let policy: Vec<_> = headers.get_all("ratelimit-policy").iter().collect();
        assert_eq!(
            policy,
            ["\"api\";q=2;w=10, \"api-2\";q=2;w=10, \"api-3\";q=2;w=10, \"daily\";q=2;w=10"]
        );
        let state: Vec<_> = headers.get_all("ratelimit").iter().collect();
        assert_eq!(
            state,
            ["\"api\";r=1;t=10, \"api-2\";r=1;t=9, \"api-3\";r=0;t=9, \"daily\";r=1;t=9"]
        );
        // The same limits stacked in one attribute are named the same way.
        let stacked = [
            limit("api"),
            limit("api"),
            limit("api"),
            limit("other::daily"),
        ];
        let mut names = String::new();
        for i in 0..stacked.len() {
            if i > 0 {
                names.push_str(", ");
            }
            crate::http::response::push_member_name(&mut names, &stacked, i);
        }
        assert_eq!(names, "\"api\", \"api-2\", \"api-3\", \"daily\"");
    }

    #[test]
    fn grpc_answers_are_trailers_only_in_the_request_s_content_type() {
        use http_body::Body as _;
        let limits = [Limit {
            policy: Policy::from_parts(Algorithm::Fixed, 2, 10_000, 2, 1).unwrap(),
            scope: "api",
            by: By::Ip,
            shadow: false,
            failure_policy: None,
        }];
        let verdict = crate::Verdict::new(vec![crate::Decision::new(
            false,
            2,
            0,
            secs(10),
            Duration::from_millis(1_500),
        )]);
        let settings = crate::http::HttpSettings::default();
        let refusal = Refusal::too_many_requests(&limits, &verdict, &settings);
        let web = HeaderValue::from_static("application/grpc-web+proto");
        let r = answer::<String>(refusal.clone(), Some(&web), "100% full\n");
        assert_eq!(r.status(), 200);
        assert!(r.body().is_end_stream());
        let h = r.headers();
        assert_eq!(h[CONTENT_TYPE], "application/grpc-web+proto");
        assert_eq!(h["grpc-status"], "8");
        assert_eq!(h["grpc-message"], "100%25 full%0A");
        assert_eq!(h["retry-after"], "2");
        assert_eq!(h["ratelimit-policy"], "\"api\";q=2;w=10");
        assert_eq!(h["ratelimit"], "\"api\";r=0;t=10");
        let len = refusal.body.len() as u64;
        let r = answer::<String>(refusal, None, "unused");
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()[CONTENT_TYPE], "application/json");
        assert_eq!(r.body().size_hint().exact(), Some(len));
        let r = answer::<String>(Refusal::store_unavailable(), Some(&web), STORE_DOWN);
        assert_eq!(r.headers()["grpc-status"], "14");
    }

    /// A service that fails the test when called without `poll_ready` on that very instance;
    /// its clones start unready.
    #[derive(Debug)]
    struct MustBeReady {
        ready: bool,
        calls: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Clone for MustBeReady {
        fn clone(&self) -> Self {
            Self {
                ready: false,
                calls: Arc::clone(&self.calls),
            }
        }
    }

    impl Service<Request<String>> for MustBeReady {
        type Response = Response<String>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Response<String>, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            self.ready = true;
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<String>) -> Self::Future {
            assert!(self.ready, "called without poll_ready");
            self.ready = false;
            self.calls.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok(Response::new("ok".to_owned())))
        }
    }

    #[tokio::test]
    async fn the_service_polled_ready_is_the_one_called_and_refusals_never_call_it() {
        let clock = crate::store::ManualClock::new();
        let limiter = RateLimiter::builder()
            .store(crate::MemoryStore::with_clock(clock))
            .build()
            .await
            .unwrap();
        let layer = RateLimitLayer::builder()
            .num(2)
            .period(secs(60))
            .limiter(limiter)
            .build()
            .unwrap();
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut service = layer.layer(MustBeReady {
            ready: false,
            calls: Arc::clone(&calls),
        });
        let mut statuses = Vec::new();
        for grpc in [false, false, false, true] {
            std::future::poll_fn(|cx| service.poll_ready(cx))
                .await
                .unwrap();
            let mut request = Request::new(String::new());
            if grpc {
                *request.method_mut() = http::Method::POST;
                request
                    .headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
            }
            let response = service.call(request).await.unwrap();
            let grpc_status = response.headers().get("grpc-status").cloned();
            statuses.push((response.status().as_u16(), grpc_status));
        }
        assert_eq!(
            statuses,
            [
                (200, None),
                (200, None),
                (429, None),
                (200, Some(HeaderValue::from_static("8")))
            ]
        );
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    /// The layer does not apply a deny list or exemptions yet: building one from a limiter that
    /// has them says so, once per process, with what is ignored (never the networks).
    #[test]
    fn a_layer_built_from_a_limiter_with_a_deny_list_warns_once() {
        let capture = crate::limiter::tests::Capture::start();
        let logged = AtomicBool::new(false);
        let plain = RateLimiter::builder().build_lazy().unwrap();
        assert!(!warn_ignored_exemptions(
            &logged,
            &plain.settings().exemptions
        ));
        let deny = RateLimiter::builder()
            .deny_networks(["198.51.100.0/24"])
            .build_lazy()
            .unwrap();
        let exempt = RateLimiter::builder()
            .exempt_when(|_| true)
            .build_lazy()
            .unwrap();
        assert!(warn_ignored_exemptions(
            &logged,
            &exempt.settings().exemptions
        ));
        assert!(!warn_ignored_exemptions(
            &logged,
            &deny.settings().exemptions
        ));
        // Through the builder (the process's own flag): one warning for two layers.
        for _ in 0..2 {
            RateLimitLayer::builder()
                .num(1)
                .period(secs(1))
                .limiter(deny.clone())
                .build()
                .unwrap();
        }
        let lines = capture.lines();
        let warnings: Vec<&String> = lines
            .iter()
            .filter(|l| l.starts_with("WARN") && l.contains("does not apply yet"))
            .collect();
        assert_eq!(warnings.len(), 2, "{lines:#?}");
        assert!(warnings[1].contains("deny_networks=1"), "{}", warnings[1]);
        assert!(!warnings[1].contains("198.51.100"), "{}", warnings[1]);
    }

    proptest! {
        #[test]
        fn any_by_parses_or_is_refused_without_panic(s in any::<String>()) {
            if let Some(By::Header(name)) = parse_by(&s) {
                prop_assert!(!name.is_empty());
                prop_assert!(name.bytes().all(|b| is_header_name_byte(b) && !b.is_ascii_uppercase()));
                prop_assert!(http::HeaderName::from_bytes(name.as_bytes()).is_ok());
            }
        }
    }
}
