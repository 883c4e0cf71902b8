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
//!   (or the legacy ones, [`crate::http::HeaderStyle`]). A route that also carries `#[rate_limit]`
//!   answers **one** field of each, the route's members first, then the layer's. Every member is
//!   named by one rule, for stacked attributes, stacked layer limits and both together: the
//!   last segment of its limit's scope, with the member's 1-based position in the field
//!   appended when an earlier member has that name (`"api";q=5;w=60, "api-2";q=100;w=3600`).
//!   Legacy `X-RateLimit-*` fields describe the tighter of the two (the lower remaining);
//! * quota spent: the 429 of `#[rate_limit]`, byte for byte (`Retry-After`, the fields, the
//!   JSON body with [`crate::limiter::Builder::message`]);
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
//! trusted proxies and forwarding header ([`crate::limiter::Builder::trusted_proxies`]). The peer
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
//! # Per-route limits
//!
//! One layer can hold a limit per route: [`RateLimitLayerBuilder::path`] (`"/login"` that path,
//! `"/api/*"` a prefix), [`RateLimitLayerBuilder::except_path`] and
//! [`RateLimitLayerBuilder::method`] restrict the current limit to the requests they match.
//! Per request, only the limits that apply are checked (in one round trip, all or nothing) and
//! named in the fields; a request that no limit applies to passes through unlimited, with no
//! rate-limit fields (and no exemption or deny-list check: as a route without the attribute).
//!
//! ```
//! # fn main() -> Result<(), ratelimit_runtime::layer::LayerError> {
//! use std::time::Duration;
//! use ratelimit_runtime::RateLimitLayer;
//!
//! // `/login`: 5 a minute per client; every other path: 100 a minute per client.
//! let layer = RateLimitLayer::builder()
//!     .scope("login").num(5).period(Duration::from_secs(60)).by("ip")
//!     .path("/login")
//!     .and()
//!     .scope("api").num(100).period(Duration::from_secs(60)).by("ip")
//!     .except_path("/login")
//!     .build()?;
//! assert_eq!(layer.limits(), 2);
//! # Ok(()) }
//! ```
//!
//! **What counts as the same route.** The path matched is the one `by = "url"` keys (Axum's
//! `OriginalUri` under `Router::nest`), never its query. A client (or a proxy on the way) can
//! spell one route many ways, and the server behind may read them as one; a limit must not be
//! skipped by a spelling, so each path is matched in three forms — as sent, as `by = "url"`
//! decodes it, and reduced as far as common servers reduce it: every escape decoded (`%69`,
//! double-encoded `%2569`, `%2F`), `\` as `/`, path parameters cut (`/login;x`), empty and
//! dot segments removed (`//login`, `/login/`, `/x/../login`), ASCII case folded (`/LOGIN`).
//! `.path(p)` applies when **any** form is `p` (in any case); `.except_path(p)` leaves a request
//! out only when **every** form is `p` (the first two in `p`'s case). So `/login` is limited by
//! the `/login` limit alone, while `/LOGIN`, `//login`, `/log%69n`, `/login/`, `/login;x` are
//! limited by it *and* by the catch-all: an odd spelling may be limited twice, never not at
//! all. (`/login.json`, `/login/x` and `/logins` are other routes.) `.method(GET)` covers
//! `HEAD`, which routers answer with the `GET` handler. Patterns are checked by `build`
//! ([`LayerError::InvalidPath`]).
//!
//! # Quotas, costs and counts per request
//!
//! As the attribute's `quota = "request"`, `cost = <expression>` and `count = …`, on the
//! current limit:
//!
//! * [`RateLimitLayerBuilder::quota_from_request`]: the [`crate::Quota`] an auth layer put in
//!   the request extensions (a plan per user); none is a 401;
//! * [`RateLimitLayerBuilder::cost_fn`]: a request's units from its method, URI and headers;
//!   beyond the capacity, a 400;
//! * [`RateLimitLayerBuilder::count`] ([`crate::settle::Count`]): the units are taken before the inner
//!   service runs and given back after when the response's status (gRPC: its `grpc-status`)
//!   does not count; `Count::ERRORS` counts only 4xx and 5xx.
//!
//! # Overrides, exemptions and the deny list
//!
//! The layer's requests go through the pipeline every limited call takes, so the limiter's
//! run-time settings apply to them as to the attribute's:
//!
//! * [`RateLimiter::set_quota`] on a layer limit's scope replaces its quota from the next
//!   request on ([`RateLimiter::clear_quota`] restores it);
//! * a client in [`crate::limiter::Builder::exempt_networks`] or for whom
//!   [`crate::limiter::Builder::exempt_when`] answers `true` passes unlimited, with no fields;
//! * a client in [`crate::limiter::Builder::deny_networks`] gets a 403 (gRPC: `PERMISSION_DENIED`,
//!   trailers-only) before any store call.
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
//! # Overhead
//!
//! Per request, the layer allocates what the attribute does — each limit's store key (and the
//! client address's text for `ip`), the rate-limit field values, the check's small vectors —
//! plus one boxed future, since the check is an `async fn` whose future cannot be named. It
//! clones no headers: the sources read the request in place. The service polled ready is the
//! one called (the inner service is cloned and swapped in `call`). Per-route limits add
//! nothing for a path already in its reduced form when every limit (or none) applies; the list
//! of the limits that apply is allocated only when some, not all, do.

mod answer;
mod body;
mod builder;
mod by;
mod error;
mod grpc;
mod route;
mod service;

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use tower_layer::Layer;

pub use self::body::LayerBody;
use self::builder::{CostFn, Draft};
pub use self::builder::{LayerError, RateLimitLayerBuilder};
use self::route::Route;
pub use self::service::{RateLimitService, ResponseFuture};
use crate::call::plan::Dynamic;
use crate::limit::Limit;
use crate::limiter::RateLimiter;

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

struct Shared {
    limits: Box<[Limit]>,
    /// What applies to each limit beside its `Limit` (`rules[i]` for `limits[i]`).
    rules: Box<[Rule]>,
    /// Whether every limit applies to every request.
    routing: Routing,
    /// Each limit's run-time part, when one has any (a quota from the request, a count
    /// filter, a cost per request).
    dynamics: Option<Box<[Dynamic]>>,
    /// Some limit has a cost per request (a cost function, or a cost beside a quota from the
    /// request).
    inputs: bool,
    /// Some limit counts only some outcomes.
    counts: bool,
    limiter: Option<RateLimiter>,
    peer_addr: Option<PeerAddrFn>,
    needs_peer: bool,
}

/// What picks the limits of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Routing {
    /// Nothing: every limit applies to every request.
    All,
    /// Methods only.
    Methods,
    /// Paths (and perhaps methods): the path's forms are read.
    Paths,
}

/// One limit's routing and run-time parts.
#[derive(Debug)]
struct Rule {
    route: Route,
    dynamic: Dynamic,
    cost: Option<CostFn>,
    /// A fixed cost beside a quota from the request (whose policy comes per request).
    fixed_cost: Option<u64>,
}

/// A Tower [`Layer`] that rate-limits every request to the service it wraps; see the
/// [module docs](self). Cheap to clone (one `Arc`).
///
/// ```
/// use std::time::Duration;
/// use ratelimit_runtime::{Algorithm, Policy, RateLimitLayer};
///
/// let per_ip = RateLimitLayer::builder()
///     .policy(Policy::new(Algorithm::Sliding, 100, Duration::from_secs(60))?)
///     .by("ip")
///     .build()?;
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use std::sync::atomic::Ordering;
    use std::task::{Context, Poll};

    use http::header::CONTENT_TYPE;
    use http::{HeaderMap, HeaderValue, Request, Response};
    use tower_service::Service;

    use super::answer::*;
    use super::builder::*;
    use super::by::*;
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::caller::answer::Refusal;
    use crate::limit::By;
    use crate::policy::{Policy, PolicyError};
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
    fn routes_and_counts_are_checked_when_built() {
        use crate::call::plan::Count;
        let ok = || RateLimitLayer::builder().num(3).period(secs(10));
        let err = ok().path("login").build().unwrap_err();
        assert!(
            matches!(&err, LayerError::InvalidPath { limit: 0, path, .. } if path == "login"),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .starts_with("limit #1: invalid path \"login\": "),
            "{err}"
        );
        let err = ok()
            .and()
            .num(1)
            .period(secs(1))
            .except_path("/a/")
            .build()
            .unwrap_err();
        assert!(
            matches!(err, LayerError::InvalidPath { limit: 1, .. }),
            "{err:?}"
        );
        assert!(ok().path("/a%2Fb").build().is_err());
        assert!(
            ok().path("/api/*")
                .except_path("/api/health")
                .method(http::Method::GET)
                .build()
                .is_ok()
        );
        let err = ok()
            .count(Count::ERRORS)
            .and()
            .num(1)
            .period(secs(1))
            .count(Count::Ok)
            .build()
            .unwrap_err();
        assert_eq!(err, LayerError::MixedCounts { limit: 1 });
        assert!(
            err.to_string().contains("must count the same ones"),
            "{err}"
        );
        // The same filter twice, or one filter beside counting everything, is fine.
        assert!(
            ok().count(Count::ERRORS)
                .and()
                .num(1)
                .period(secs(1))
                .count(Count::ERRORS)
                .build()
                .is_ok()
        );
        // A quota from the request needs no numbers; a static cost beside it is per request.
        let layer = RateLimitLayer::builder()
            .quota_from_request()
            .cost(5)
            .build()
            .unwrap();
        assert!(layer.shared.dynamics.is_some() && layer.shared.inputs);
        assert_eq!(layer.shared.rules[0].fixed_cost, Some(5));
        assert!(ok().build().unwrap().shared.dynamics.is_none());
    }

    #[test]
    fn only_the_limits_that_apply_are_selected_and_all_of_them_without_a_list() {
        let layer = RateLimitLayer::builder()
            .scope("login")
            .num(5)
            .period(secs(60))
            .path("/login")
            .and()
            .scope("rest")
            .num(100)
            .period(secs(60))
            .except_path("/login")
            .and()
            .scope("posts")
            .num(10)
            .period(secs(60))
            .method(http::Method::POST)
            .build()
            .unwrap();
        let select = |method: http::Method, path: &str| {
            let request = Request::builder()
                .method(method)
                .uri(path)
                .body(())
                .unwrap();
            match layer.shared.select(&request) {
                service::Selected::All => vec![0, 1, 2],
                service::Selected::None => vec![],
                service::Selected::Some(chosen) => chosen,
            }
        };
        assert_eq!(select(http::Method::GET, "/login"), [0]);
        assert_eq!(select(http::Method::POST, "/login?next=/x"), [0, 2]);
        assert_eq!(select(http::Method::GET, "/LOGIN"), [0, 1]);
        assert_eq!(select(http::Method::GET, "/other"), [1]);
        assert_eq!(select(http::Method::POST, "/other"), [1, 2]);
        let one = RateLimitLayer::builder()
            .num(1)
            .period(secs(1))
            .path("/a/*")
            .build()
            .unwrap();
        let request = |path: &str| Request::builder().uri(path).body(()).unwrap();
        assert!(matches!(
            one.shared.select(&request("/a/b")),
            service::Selected::All
        ));
        assert!(matches!(
            one.shared.select(&request("/b")),
            service::Selected::None
        ));
        let unrouted = RateLimitLayer::builder()
            .num(1)
            .period(secs(1))
            .build()
            .unwrap();
        assert_eq!(unrouted.shared.routing, Routing::All);
        assert!(matches!(
            unrouted.shared.select(&request("/b")),
            service::Selected::All
        ));
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
        let layer = RateLimitLayer::builder()
            .policy(p)
            .by("url")
            .build()
            .unwrap();
        assert_eq!(layer.shared.limits[0].policy, p);
        assert_eq!(layer.shared.limits[0].scope, "layer");
        assert!(!layer.shared.needs_peer);
    }

    #[test]
    fn a_limit_by_ip_with_nowhere_to_read_the_address_from_is_refused_at_build() {
        use super::builder::peer_source;
        // Neither a hook nor a server's records this build reads (`tower` alone): refused.
        let refused = peer_source(1, false, false).unwrap_err();
        assert_eq!(refused, LayerError::NoPeerAddress { limit: 1 });
        let message = refused.to_string();
        assert!(message.starts_with("limit #2: by = \"ip\" needs the client's address"));
        assert!(message.contains("`axum`") && message.contains("`peer_addr` hook"));
        assert!(peer_source(1, true, false).is_ok());
        assert!(peer_source(1, false, true).is_ok());
        // The build's own answer: built with `axum` or `tonic` (the test command's every
        // feature), refused with `tower` alone, unless a hook reads the address.
        let by_ip = || RateLimitLayer::builder().num(1).period(secs(1)).by("ip");
        let reads_records = cfg!(any(feature = "axum", feature = "tonic"));
        assert_eq!(by_ip().build().is_ok(), reads_records);
        let hook: PeerAddrFn = |_| None;
        assert!(by_ip().peer_addr(hook).build().is_ok());
    }

    fn limit(scope: &'static str) -> Limit {
        Limit {
            policy: Policy::from_parts(Algorithm::Fixed, 2, 10_000, 2, 1).unwrap(),
            scope,
            by: By::Global,
            shadow: false,
            failure_policy: None,
            lease: None,
            replica_ack: false,
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

    /// A layer over a route with its own `#[rate_limit]` answers one
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
            crate::caller::answer::push_member_name(&mut names, &stacked, i);
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
            lease: None,
            replica_ack: false,
        }];
        let verdict = crate::decision::Verdict::new(vec![crate::decision::Decision::new(
            false,
            2,
            0,
            secs(10),
            Duration::from_millis(1_500),
        )]);
        let settings = crate::caller::settings::HttpSettings::default();
        let refusal = Refusal::too_many_requests(&limits, &verdict, &settings);
        let web = HeaderValue::from_static("application/grpc-web+proto");
        let mut full = refusal.clone();
        full.message = "100% full\n".to_owned();
        let r = answer::<String>(full, Some(&web));
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
        let r = answer::<String>(refusal, None);
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()[CONTENT_TYPE], "application/json");
        assert_eq!(r.body().size_hint().exact(), Some(len));
        let r = answer::<String>(Refusal::store_unavailable(), Some(&web));
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
            .store(crate::store::MemoryStore::with_clock(clock))
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
