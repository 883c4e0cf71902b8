//! The Axum and Actix-web integrations (features `axum` and `actix`): what `#[rate_limit]`
//! handlers read from a request and what they answer.
//!
//! A handler whose limit is `by` an HTTP source gets a hidden extractor in front of its own
//! parameters, so `State`, `Path`, `Json`, `web::Data` and body extractors keep working:
//!
//! ```
//! # #[cfg(feature = "axum")] mod demo {
//! use axum::{extract::State, response::IntoResponse};
//! use ratelimit_runtime::rate_limit;
//!
//! #[derive(Clone)]
//! pub struct AppState;
//!
//! #[rate_limit(algo = "sliding", num = 3, time = 10, by = "ip")]
//! pub async fn login(State(_s): State<AppState>, user: String) -> impl IntoResponse {
//!     format!("welcome {user}")
//! }
//! # }
//! ```
//!
//! # Sources (`by`)
//!
//! * `ip` — the peer address of the connection. Axum needs the router served with
//!   `into_make_service_with_connect_info::<SocketAddr>()`; without it every limited request
//!   gets a 500 that says so (logged once). A forwarding header is read **only when the peer is
//!   one of the configured trusted proxies** ([`crate::limiter::Builder::trusted_proxies`]), and only the
//!   one header they set ([`crate::limiter::Builder::forwarded_header`]: `X-Forwarded-For` by default,
//!   `Forwarded` or `X-Real-IP` by choice), walking right to left to the first untrusted hop;
//!   with no trusted proxies, spoofed headers change nothing. A hop that cannot be read where
//!   the client should be (`unknown`, an obfuscated identifier, garbage) makes the client
//!   unknown ([`ClientAddr::Unknown`]): its own bucket per proxy, never the proxy's, never
//!   exempt, logged once. A loopback or private-network
//!   peer sending forwarding headers while no proxy is trusted is warned about once per
//!   process. IPv6 clients are grouped by their /64 ([`crate::limiter::Builder::ipv6_prefix`]).
//! * `url` — the path the client sent (under Axum's `Router::nest` too, whose handlers see it
//!   stripped), without the query, normalized so that every spelling of one path is one bucket
//!   ([`normalized_path`]: every escape decoded as the routers decode it, `@` and `%40` alike,
//!   except `%2F` and `%25`, kept upper-cased) — the frameworks hand `/users/alice%40x` and
//!   `/users/alice@x` to one handler with one parameter.
//! * `user` — the [`crate::UserId`] that the application's auth layer put in the request extensions;
//!   missing: 401.
//! * `app_id` — the header `appId` (any case); missing or blank: 400 "appId must not be empty".
//! * `header:<name>` — any header; missing or blank: 400 naming the header.
//! * `global` — one bucket for the scope.
//!
//! Header values of any length and content (non-UTF-8 bytes, braces, colons) go into keys
//! safely: long or unusual values are hashed ([`crate::key`]).
//!
//! # Responses
//!
//! * admitted: the handler's response plus `RateLimit-Policy` and `RateLimit`
//!   (draft-ietf-httpapi-ratelimit-headers), e.g. `"login";q=3;w=10` and `"login";r=2;t=10`;
//! * rejected: 429 with `Retry-After` (whole seconds, rounded up), the same fields and
//!   `{"error":"too_many_requests","message":…,"retry_after":…}`;
//! * store failed under [`crate::FailurePolicy::Deny`]: 503 with a JSON message.
//!
//! [`crate::http::HeaderStyle`] adds the legacy `X-RateLimit-Limit/Remaining/Reset`.
//!
//! # Which limiter
//!
//! A [`crate::RateLimiter`] in the request extensions (Axum: `.layer(Extension(limiter))`) or
//! the app data (Actix: `.app_data(limiter)` or `.app_data(web::Data::new(limiter))`), else
//! [`crate::RateLimiter::current`].

pub use crate::caller::ip::ClientAddr;
pub use crate::caller::path::normalized_path;
pub use crate::caller::settings::{ForwardedHeader, HeaderStyle, HttpSettings, IetfDraft};

// The handlers' plumbing (`HttpCaller`, `Limited`, `check_http…`): `__private` re-exports it.
#[cfg(any(feature = "axum", feature = "actix"))]
pub(crate) mod adapter;

#[cfg(feature = "actix")]
pub(crate) mod actix;
#[cfg(feature = "axum")]
pub(crate) mod axum;

#[cfg(not(any(feature = "axum", feature = "actix")))]
pub(crate) mod disabled;
// The macro's compile-time checks of the features an attribute needs: `__private` re-exports them.
pub(crate) mod require;

/// The client of a request, as `by = "ip"` computes it before grouping: `peer` itself unless
/// it is a trusted proxy, else the right-most hop that is not a trusted proxy in the one header
/// [`HttpSettings::forwarded_header`] names (`X-Forwarded-For` by default; `Forwarded`'s RFC
/// 7239 `for=` nodes, or `X-Real-IP`). The other forwarding headers are never read.
/// IPv4-mapped IPv6 addresses are returned as IPv4. A hop that cannot be read where the client
/// should be gives [`ClientAddr::Unknown`] (behind the last trusted address), never the proxy's
/// address as if it were the client's.
///
/// ```
/// # #[cfg(any(feature = "axum", feature = "actix", feature = "tower"))] {
/// use ratelimit_runtime::{http::ForwardedHeader, RateLimiter, http::{ClientAddr, client_ip}};
///
/// let limiter = RateLimiter::builder().trusted_proxies(["10.0.0.0/8"]).build_lazy().unwrap();
/// let mut headers = http::HeaderMap::new();
/// headers.insert("x-forwarded-for", "6.6.6.6, 203.0.113.7, 10.0.0.2".parse().unwrap());
/// let peer = "10.0.0.1".parse().unwrap();
/// assert_eq!(client_ip(peer, &headers, &limiter.settings().http).to_string(), "203.0.113.7");
/// // An untrusted peer is the client, whatever it sends.
/// let untrusted = "198.51.100.1".parse().unwrap();
/// assert_eq!(client_ip(untrusted, &headers, &limiter.settings().http).to_string(), "198.51.100.1");
/// // A client's own `Forwarded`, passed through by an X-Forwarded-For proxy, changes nothing.
/// headers.insert("forwarded", "for=192.0.2.99".parse().unwrap());
/// assert_eq!(client_ip(peer, &headers, &limiter.settings().http).to_string(), "203.0.113.7");
/// // A proxy that writes `unknown`: the client is unknown, not the proxy.
/// headers.insert("x-forwarded-for", "unknown".parse().unwrap());
/// assert_eq!(client_ip(peer, &headers, &limiter.settings().http), ClientAddr::Unknown { proxy: peer });
/// // `Forwarded` behind an RFC 7239 proxy: a client's unterminated quote spoils only its own
/// // element, not the one the proxy appended.
/// let limiter = RateLimiter::builder()
///     .trusted_proxies(["10.0.0.0/8"])
///     .forwarded_header(ForwardedHeader::Forwarded)
///     .build_lazy()
///     .unwrap();
/// headers.insert("forwarded", "for=\"x, for=198.51.100.9".parse().unwrap());
/// assert_eq!(client_ip(peer, &headers, &limiter.settings().http).to_string(), "198.51.100.9");
/// # }
/// ```
#[cfg(any(feature = "axum", feature = "actix", feature = "tower"))]
pub fn client_ip(
    peer: std::net::IpAddr,
    headers: &http::HeaderMap,
    settings: &HttpSettings,
) -> ClientAddr {
    crate::caller::ip::client_ip(peer, headers, settings)
}
