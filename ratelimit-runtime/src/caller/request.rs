//! The seam between a transport and the limiter: [`Caller`], what one request offers (its
//! peer address, path, headers, user and quota), borrowed, and the one place where a `by`
//! source is read from it. The handlers' hidden extractor, gRPC methods, the Tower layer and
//! plain functions (which offer nothing) each build one; nothing downstream knows which.

use std::borrow::Cow;
use std::net::IpAddr;

use super::UserId;
use super::answer::Refusal;
use super::ip;
use super::settings::HttpSettings;
use crate::limit::By;
use crate::quota::Quota;

/// The headers of a request: the first line of a header, and every line of a forwarding one.
pub(crate) trait Headers: ip::ForwardingHeaders {
    /// The first value of header `name` (lower-case), if any.
    fn first(&self, name: &str) -> Option<&[u8]>;
}

#[cfg(any(
    feature = "axum",
    feature = "actix",
    feature = "tower",
    feature = "tonic"
))]
impl Headers for http::HeaderMap {
    fn first(&self, name: &str) -> Option<&[u8]> {
        self.get(name).map(http::HeaderValue::as_bytes)
    }
}

/// No headers at all (a plain function's call).
impl ip::ForwardingHeaders for () {
    fn values(&self, _: &str) -> Vec<&[u8]> {
        Vec::new()
    }
}

impl Headers for () {
    fn first(&self, _: &str) -> Option<&[u8]> {
        None
    }
}

/// Which transport a request came through: what a missing peer address is blamed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    /// A plain function (no request).
    Plain,
    /// An Axum handler.
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    Axum,
    /// An Actix-web handler.
    #[cfg_attr(not(feature = "actix"), allow(dead_code))]
    Actix,
    /// A gRPC method (tonic).
    Grpc,
    /// The Tower layer; `grpc`: the request is a gRPC call (its named values are metadata).
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    Layer { grpc: bool },
}

impl Transport {
    /// What this transport calls a request's named values, in messages: gRPC carries
    /// `metadata`, the others `header`s.
    pub(crate) fn header_word(self) -> &'static str {
        match self {
            Self::Grpc | Self::Layer { grpc: true } => "metadata",
            Self::Plain | Self::Axum | Self::Actix | Self::Layer { grpc: false } => "header",
        }
    }

    /// What to do when `by = "ip"` finds no peer address on this transport.
    pub(crate) fn missing_peer_message(self) -> &'static str {
        match self {
            Self::Plain => {
                "rate limiting by IP needs a request, and a plain function has none: use a `key` template"
            }
            Self::Axum => {
                "rate limiting by IP needs the client address, which this request does not carry: \
                 serve the router with `into_make_service_with_connect_info::<SocketAddr>()`, e.g. \
                 `axum::serve(listener, app.into_make_service_with_connect_info::<std::net::SocketAddr>())`"
            }
            Self::Actix => {
                "rate limiting by IP needs the peer address of the connection, which this request does not carry \
                 (a test request? set it with `TestRequest::peer_addr`)"
            }
            Self::Grpc => {
                "rate limiting by IP needs the peer address of the connection, which this request does not carry: \
                 serve the service with tonic's transport server (`tonic::transport::Server`), which records it \
                 (`Request::remote_addr`), or use another `by`"
            }
            Self::Layer { .. } => {
                "rate limiting by IP needs the client address, which this request does not carry: \
                 serve an Axum router with `into_make_service_with_connect_info::<SocketAddr>()`, a tonic server with \
                 `Server::serve` or `serve_with_incoming` (ratelimit-runtime's `tonic` feature), or give the layer a `peer_addr` hook"
            }
        }
    }
}

/// What one request offers the limiter, borrowed from it: every transport builds one, and
/// every step that reads a request (the `by` sources, the deny list, the exemptions, a
/// quota from the request) reads it here.
pub(crate) struct Caller<'r> {
    /// The peer address of the connection, when the server recorded it.
    pub(crate) peer: Option<IpAddr>,
    /// The path the client sent, without the query (`None`: the transport has none, as a gRPC
    /// method's call, whose path is the method's).
    pub(crate) path: Option<&'r str>,
    pub(crate) headers: &'r dyn Headers,
    /// The [`UserId`] the application's auth layer put in the request.
    pub(crate) user: Option<&'r UserId>,
    /// The [`Quota`] the application's auth layer put in the request (`quota = "request"`).
    pub(crate) quota: Option<Quota>,
    pub(crate) transport: Transport,
}

impl Caller<'static> {
    /// A plain function's call: no request.
    pub(crate) const PLAIN: Self = Self {
        peer: None,
        path: None,
        headers: &(),
        user: None,
        quota: None,
        transport: Transport::Plain,
    };
}

/// A caller's value for a `by` source: borrowed from the request, made from it, or an address
/// written inline (no allocation for `by = "ip"`).
#[derive(Debug)]
pub(crate) enum ByValue<'r> {
    Borrowed(&'r [u8]),
    Owned(Vec<u8>),
    Ip(ip::IpText),
}

impl AsRef<[u8]> for ByValue<'_> {
    fn as_ref(&self) -> &[u8] {
        match self {
            Self::Borrowed(b) => b,
            Self::Owned(v) => v,
            Self::Ip(text) => text.as_bytes(),
        }
    }
}

impl<'r> ByValue<'r> {
    /// The value as a `Cow` (an address copied out).
    pub(crate) fn into_cow(self) -> Cow<'r, [u8]> {
        match self {
            Self::Borrowed(b) => Cow::Borrowed(b),
            Self::Owned(v) => Cow::Owned(v),
            Self::Ip(text) => Cow::Owned(text.as_bytes().to_vec()),
        }
    }
}

impl<'r> From<Cow<'r, [u8]>> for ByValue<'r> {
    fn from(value: Cow<'r, [u8]>) -> Self {
        match value {
            Cow::Borrowed(b) => Self::Borrowed(b),
            Cow::Owned(v) => Self::Owned(v),
        }
    }
}

/// Why a request cannot be keyed by a `by` source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Missing {
    /// `ip`: the request carries no peer address (a server set up without it).
    Peer(Transport),
    /// `url`: the transport has no path (a gRPC method).
    Path,
    /// `user`: no (or an empty) [`UserId`].
    User,
    /// `app_id`: no or a blank `appId` header.
    AppId,
    /// `header:<name>`: no or a blank header (a metadata entry on gRPC: the transport says
    /// which).
    Header(&'static str, Transport),
}

/// A missing peer address is the server's setup, not the client's: logged once per process.
static MISSING_PEER_LOGGED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

impl Missing {
    /// The message the refusal carries.
    pub(crate) fn message(self) -> Cow<'static, str> {
        match self {
            Self::Peer(transport) => Cow::Borrowed(transport.missing_peer_message()),
            Self::Path => Cow::Borrowed(
                "by = \"url\" is not available on a gRPC method: a tonic request carries no path",
            ),
            Self::User => Cow::Borrowed(Refusal::NO_USER),
            Self::AppId => Cow::Borrowed("appId must not be empty"),
            Self::Header(name, transport) => Cow::Owned(format!(
                "{} {name} must not be empty",
                transport.header_word()
            )),
        }
    }

    /// The refusal: 400 (a blank or missing header), 401 (no user), 500 (the server records
    /// no peer address or path: its setup, logged once).
    pub(crate) fn refusal(self) -> Refusal {
        match self {
            Self::Peer(_) | Self::Path => {
                let message = self.message();
                if !MISSING_PEER_LOGGED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::error!(target: crate::observe::log::CALLER, "{message}");
                }
                Refusal::new(500, "internal_error", &message)
            }
            Self::User => Refusal::no_user(),
            Self::AppId | Self::Header(..) => Refusal::new(400, "bad_request", &self.message()),
        }
    }
}

impl<'r> Caller<'r> {
    /// The first value of header `name`, unless it is blank.
    pub(crate) fn header(&self, name: &str) -> Option<&'r [u8]> {
        let value = self.headers.first(name)?;
        (!value.trim_ascii().is_empty()).then_some(value)
    }

    /// The path an exemption predicate sees: empty when the request carries none (a gRPC
    /// method whose server records no path), so that a predicate written for an HTTP route
    /// (`/`, say) never matches it.
    pub(crate) fn path_or_empty(&self) -> &'r str {
        self.path.unwrap_or("")
    }

    /// The value `by` identifies this caller with (`None` for `global`), or what is missing.
    pub(crate) fn by_value(
        &self,
        by: By,
        settings: &HttpSettings,
    ) -> Result<Option<ByValue<'r>>, Missing> {
        Ok(Some(match by {
            By::Global => return Ok(None),
            By::Ip => {
                let Some(peer) = self.peer else {
                    return Err(Missing::Peer(self.transport));
                };
                let client = ip::client_ip(peer, self.headers, settings);
                ByValue::Ip(ip::bucket_text(client, settings))
            }
            By::Url => {
                let path = self.path.ok_or(Missing::Path)?;
                super::path::normalized_path(path.as_bytes()).into()
            }
            By::User => match self.user {
                Some(user) if !user.as_str().is_empty() => {
                    ByValue::Borrowed(user.as_str().as_bytes())
                }
                _ => return Err(Missing::User),
            },
            By::AppId => ByValue::Borrowed(self.header("appid").ok_or(Missing::AppId)?),
            By::Header(name) => {
                let missing = Missing::Header(name, self.transport);
                ByValue::Borrowed(self.header(name).ok_or(missing)?)
            }
        }))
    }
}
