//! Exemptions and the deny list of the HTTP integrations: callers that bypass every limit,
//! and networks answered 403 before any store call.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use crate::caller::UserId;
use crate::net::IpNet;

/// What an exemption predicate ([`crate::limiter::Builder::exempt_when`]) sees of a request: the
/// client's address as `by = "ip"` computes it (trusted proxies honoured, before IPv6
/// grouping), the authenticated user, the path, the headers, and the scope of the function's
/// first limit.
///
/// ```
/// use ratelimit_runtime::{exempt::CallerView, RateLimiter};
///
/// let limiter = RateLimiter::builder()
///     // Health checks and the internal service account are never limited.
///     .exempt_when(|caller: &CallerView<'_>| {
///         caller.path() == "/healthz" || caller.user().is_some_and(|u| u.as_str() == "svc-internal")
///     })
///     .build_lazy()?;
/// assert!(limiter.settings().exemptions.has_predicate());
/// # Ok::<(), ratelimit_runtime::ConfigError>(())
/// ```
pub struct CallerView<'a> {
    pub(crate) ip: Option<IpAddr>,
    pub(crate) user: Option<&'a UserId>,
    pub(crate) path: &'a str,
    pub(crate) header: &'a (dyn Fn(&str) -> Option<&'a [u8]> + 'a),
    pub(crate) scope: &'a str,
}

impl fmt::Debug for CallerView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Headers may hold credentials: not printed.
        f.debug_struct("CallerView")
            .field("ip", &self.ip)
            .field("user", &self.user)
            .field("path", &self.path)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl<'a> CallerView<'a> {
    /// The client's address, as `by = "ip"` computes it: the peer of the connection, or, from
    /// a trusted proxy only, the address its forwarding header names. `None` when the request
    /// carries no peer address (Axum served without `ConnectInfo`), and when the trusted
    /// proxy's header names a client that cannot be read ([`crate::http::ClientAddr::Unknown`]):
    /// the proxy's own address is never shown as the client's, so a predicate that exempts
    /// the proxies' network does not exempt every client whose hop is unreadable.
    pub fn ip(&self) -> Option<IpAddr> {
        self.ip
    }

    /// The [`UserId`] the application's auth layer put in the request, if any.
    pub fn user(&self) -> Option<&'a UserId> {
        self.user
    }

    /// The request path, without the query. On a gRPC method, the method's path
    /// (`/package.Service/Method`), as an HTTP request to it has it: the Tower layer reads it
    /// from the request; a `#[rate_limit]` method from tonic's `GrpcMethod` extension or the
    /// URI tonic's router keeps (Axum's `OriginalUri`, with the `axum` feature), and sees an
    /// empty path when the request carries neither (never `/`).
    pub fn path(&self) -> &'a str {
        self.path
    }

    /// The first value of header `name` (lower-case), if any. A client can send any header:
    /// never exempt on a header alone unless something the client cannot forge (a proxy that
    /// strips it, a secret compared in constant time) stands behind it.
    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        (self.header)(name)
    }

    /// The scope of the function's first limit.
    pub fn scope(&self) -> &'a str {
        self.scope
    }
}

/// A predicate over a caller ([`crate::limiter::Builder::exempt_when`]).
pub(crate) type Predicate = Arc<dyn Fn(&CallerView<'_>) -> bool + Send + Sync>;

/// Who bypasses the limits and who is refused before them (set with
/// [`crate::limiter::Builder::exempt_networks`], [`crate::limiter::Builder::exempt_when`] and
/// [`crate::limiter::Builder::deny_networks`]; read back from [`crate::limiter::Settings::exemptions`]).
///
/// They apply on every transport that has a request — Axum and Actix-web handlers, gRPC
/// methods, the Tower layer: they are the first step of the one call pipeline. Plain functions
/// and methods have no caller to exempt and are always limited. In order, per request:
/// 1. the client's address (the one `by = "ip"` uses, trusted proxies honoured) in a **deny**
///    network: 403 `{"error":"forbidden",…}` (gRPC: `PERMISSION_DENIED`), no store call, the
///    handler does not run;
/// 2. in an **exempt** network, or the **predicate** answers `true`: the handler runs, no store
///    call, no rate-limit headers;
/// 3. otherwise the limits are checked as usual.
///
/// A network on both lists is denied. A client cannot reach an exempt network by sending a
/// forwarding header: headers are believed from trusted proxies only. A client whose hop in
/// the trusted proxy's header cannot be read ([`crate::http::ClientAddr::Unknown`]) is never
/// exempt by network, and is denied when any address that header names is denied.
///
/// ```
/// use ratelimit_runtime::RateLimiter;
/// let limiter = RateLimiter::builder()
///     .exempt_networks(["10.0.0.0/8"])
///     .deny_networks(["198.51.100.0/24"])
///     .build_lazy()?;
/// let e = &limiter.settings().exemptions;
/// assert!(e.is_exempt_ip("10.1.2.3".parse()?));
/// assert!(e.is_denied_ip("198.51.100.9".parse()?));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Default)]
pub struct Exemptions {
    pub(crate) exempt: Vec<IpNet>,
    pub(crate) deny: Vec<IpNet>,
    pub(crate) predicate: Option<Predicate>,
}

impl fmt::Debug for Exemptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Exemptions")
            .field("exempt", &self.exempt)
            .field("deny", &self.deny)
            .field("predicate", &self.predicate.is_some())
            .finish()
    }
}

impl Exemptions {
    /// Whether nothing is configured (the check path then skips them at no cost).
    pub fn is_empty(&self) -> bool {
        self.exempt.is_empty() && self.deny.is_empty() && self.predicate.is_none()
    }

    /// Whether `ip` is in an exempt network.
    pub fn is_exempt_ip(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.exempt.iter().any(|n| n.contains(ip))
    }

    /// Whether `ip` is in a denied network.
    pub fn is_denied_ip(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.deny.iter().any(|n| n.contains(ip))
    }

    /// Whether a predicate was set.
    pub fn has_predicate(&self) -> bool {
        self.predicate.is_some()
    }

    /// The exempt networks.
    pub fn exempt_networks(&self) -> &[IpNet] {
        &self.exempt
    }

    /// The denied networks.
    pub fn deny_networks(&self) -> &[IpNet] {
        &self.deny
    }
}

/// IPv4-mapped IPv6 addresses as IPv4, as `by = "ip"` reads them.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}
