//! What the HTTP integrations read from the limiter's settings: who the client is behind
//! proxies, how IPv6 callers are grouped, and what the responses say. Plain data: the limiter
//! holds it ([`crate::limiter::Settings::http`]) and never reads it itself.

use std::net::IpAddr;

use crate::net::IpNet;

/// Which rate-limit header fields responses carry (HTTP fields, gRPC metadata).
///
/// The IETF fields are named by the draft they follow, so that an upgrade of this crate never
/// changes the format clients parse: a later draft is one more [`IetfDraft`], chosen here.
///
/// ```
/// use ratelimit_runtime::{http::HeaderStyle, http::IetfDraft, RateLimiter};
///
/// assert_eq!(HeaderStyle::default(), HeaderStyle::Ietf(IetfDraft::Draft11));
/// let limiter = RateLimiter::builder()
///     .header_style(HeaderStyle::Both(IetfDraft::Draft11))
///     .build_lazy()?;
/// assert_eq!(limiter.settings().http.header_style.ietf(), Some(IetfDraft::Draft11));
/// assert!(limiter.settings().http.header_style.legacy());
/// # Ok::<(), ratelimit_runtime::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// The IETF `RateLimit-Policy` and `RateLimit` fields, as the draft writes them. The
    /// default, with [`IetfDraft::Draft11`].
    Ietf(IetfDraft),
    /// The legacy `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` only.
    Legacy,
    /// The IETF fields of the draft and the legacy ones.
    Both(IetfDraft),
}

impl Default for HeaderStyle {
    fn default() -> Self {
        Self::Ietf(IetfDraft::Draft11)
    }
}

impl HeaderStyle {
    /// The IETF draft whose fields this style writes, if any.
    pub const fn ietf(self) -> Option<IetfDraft> {
        match self {
            Self::Ietf(draft) | Self::Both(draft) => Some(draft),
            Self::Legacy => None,
        }
    }

    /// Whether this style writes the legacy `X-RateLimit-*` fields.
    pub const fn legacy(self) -> bool {
        matches!(self, Self::Legacy | Self::Both(_))
    }
}

/// A version of the IETF rate-limit fields (`draft-ietf-httpapi-ratelimit-headers`): how
/// [`HeaderStyle::Ietf`] spells `RateLimit-Policy` and `RateLimit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum IetfDraft {
    /// draft-ietf-httpapi-ratelimit-headers-11 (2026): `RateLimit-Policy: "name";q=5;w=60` and
    /// `RateLimit: "name";r=4;t=60`, one list member per limit. The default.
    #[default]
    Draft11,
}

impl IetfDraft {
    /// The draft's name.
    ///
    /// ```
    /// use ratelimit_runtime::http::IetfDraft;
    /// assert_eq!(IetfDraft::Draft11.name(), "draft-ietf-httpapi-ratelimit-headers-11");
    /// ```
    pub const fn name(self) -> &'static str {
        match self {
            Self::Draft11 => "draft-ietf-httpapi-ratelimit-headers-11",
        }
    }
}

/// The one forwarding header that the application's trusted proxies set, and the only one `by =
/// "ip"` reads. Reverse proxies append to (or overwrite) their own header and pass every other
/// header through from the client untouched, so believing a second header would let a client
/// name itself: behind an `X-Forwarded-For` proxy, a client sending `Forwarded: for=<random>`
/// would get a fresh bucket per request.
///
/// Set it with [`crate::limiter::Builder::forwarded_header`]. From a peer that is not a trusted proxy,
/// no header is read at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: <client>, <proxy1>, …` (several lines are one list), walked right to
    /// left. The default: nginx (`$proxy_add_x_forwarded_for`), `HAProxy` (`option forwardfor`),
    /// Envoy, Traefik, Caddy and the cloud load balancers (AWS ALB, Google Cloud, Azure) write
    /// it.
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=<client>;proto=https, for=…`, walked right to left; only its
    /// `for=` parameters are read. For proxies configured to write it (`HAProxy`
    /// `option forwarded`, nginx with `proxy_set_header Forwarded …`).
    Forwarded,
    /// `X-Real-IP: <client>`, one address per header line, set by the proxy (nginx
    /// `proxy_set_header X-Real-IP $remote_addr`). With several lines, the last that is not a
    /// trusted proxy wins, as for the lists.
    XRealIp,
}

impl ForwardedHeader {
    /// The header's name, lower-case (`x-forwarded-for`, `forwarded`, `x-real-ip`).
    ///
    /// ```
    /// use ratelimit_runtime::http::ForwardedHeader;
    /// assert_eq!(ForwardedHeader::default().name(), "x-forwarded-for");
    /// assert_eq!(ForwardedHeader::XRealIp.name(), "x-real-ip");
    /// ```
    pub const fn name(self) -> &'static str {
        match self {
            Self::XForwardedFor => "x-forwarded-for",
            Self::Forwarded => "forwarded",
            Self::XRealIp => "x-real-ip",
        }
    }
}

/// The settings of the HTTP integrations, set through the [`crate::limiter::Builder`]
/// ([`trusted_proxies`](crate::limiter::Builder::trusted_proxies),
/// [`forwarded_header`](crate::limiter::Builder::forwarded_header),
/// [`ipv6_prefix`](crate::limiter::Builder::ipv6_prefix),
/// [`header_style`](crate::limiter::Builder::header_style), [`message`](crate::limiter::Builder::message)) and
/// read back from [`crate::limiter::Settings::http`].
///
/// ```
/// use ratelimit_runtime::{http::ForwardedHeader, RateLimiter};
///
/// let limiter = RateLimiter::builder().trusted_proxies(["10.0.0.0/8"]).build_lazy()?;
/// let http = &limiter.settings().http;
/// assert!(http.is_trusted_proxy("10.1.2.3".parse().unwrap()));
/// assert_eq!(http.forwarded_header, ForwardedHeader::XForwardedFor);
/// assert_eq!(http.ipv6_prefix, 64);
/// # Ok::<(), ratelimit_runtime::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HttpSettings {
    /// Peers whose forwarding header ([`HttpSettings::forwarded_header`]) is believed. Empty by
    /// default: the peer of the connection is the client and no header is read.
    pub trusted_proxies: Vec<IpNet>,
    /// The one header the trusted proxies set (default [`ForwardedHeader::XForwardedFor`]).
    /// The other forwarding headers are never read, whoever sends them.
    pub forwarded_header: ForwardedHeader,
    /// IPv6 callers are grouped by this prefix length (default 64).
    pub ipv6_prefix: u8,
    /// Which headers HTTP responses carry.
    pub header_style: HeaderStyle,
    /// The message of a 429 body (default [`HttpSettings::DEFAULT_MESSAGE`]).
    pub message: String,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            trusted_proxies: Vec::new(),
            forwarded_header: ForwardedHeader::XForwardedFor,
            ipv6_prefix: 64,
            header_style: HeaderStyle::Ietf(IetfDraft::Draft11),
            message: Self::DEFAULT_MESSAGE.to_owned(),
        }
    }
}

impl HttpSettings {
    /// The default message of a 429 body.
    pub const DEFAULT_MESSAGE: &str = "Too many requests, please try again later.";

    /// Whether `ip` is a trusted proxy.
    pub fn is_trusted_proxy(&self, ip: IpAddr) -> bool {
        self.trusted_proxies.iter().any(|net| net.contains(ip))
    }
}
