//! What a request's `by` value is, read from borrowed request parts: shared by the handlers'
//! hidden extractor ([`super::HttpCaller`]) and the Tower layer, so both identify a caller the
//! same way and answer the same refusals.

use std::borrow::Cow;
use std::net::IpAddr;

use super::UserId;
use super::ip;
use super::response::Refusal;
use super::settings::HttpSettings;
use crate::limit::By;

/// The headers of a request: the first line of a header, and every line of a forwarding one.
pub(crate) trait Headers: ip::ForwardingHeaders {
    /// The first value of header `name` (lower-case), if any.
    fn first(&self, name: &str) -> Option<&[u8]>;
}

impl Headers for http::HeaderMap {
    fn first(&self, name: &str) -> Option<&[u8]> {
        self.get(name).map(http::HeaderValue::as_bytes)
    }
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

/// The parts of one request that the `by` sources read, borrowed.
pub(crate) struct RequestParts<'r, H: ?Sized> {
    /// The peer address of the connection, when the server recorded it.
    pub(crate) peer: Option<IpAddr>,
    /// The path, without the query.
    pub(crate) path: &'r str,
    pub(crate) headers: &'r H,
    pub(crate) user: Option<&'r UserId>,
}

/// Why a request cannot be keyed by a `by` source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Missing {
    /// `ip`: the request carries no peer address (a server set up without it).
    Peer,
    /// `user`: no (or an empty) [`UserId`].
    User,
    /// `app_id`: no or a blank `appId` header.
    AppId,
    /// `header:<name>`: no or a blank header.
    Header(&'static str),
}

impl Missing {
    /// The message the refusal carries (`None` for [`Missing::Peer`], whose message depends on
    /// the server).
    pub(crate) fn message(self) -> Option<Cow<'static, str>> {
        Some(match self {
            Self::Peer => return None,
            Self::User => Cow::Borrowed(Refusal::NO_USER),
            Self::AppId => Cow::Borrowed("appId must not be empty"),
            Self::Header(name) => Cow::Owned(format!("header {name} must not be empty")),
        })
    }

    /// The refusal (400 or 401); `peer` answers for [`Missing::Peer`].
    pub(crate) fn refusal(self, peer: impl FnOnce() -> Refusal) -> Refusal {
        match self {
            Self::Peer => peer(),
            Self::User => Refusal::no_user(),
            Self::AppId | Self::Header(_) => {
                let message = self.message().unwrap_or_default();
                Refusal::new(400, "bad_request", &message)
            }
        }
    }
}

impl<'r, H: Headers + ?Sized> RequestParts<'r, H> {
    /// The first value of header `name`, unless it is blank.
    fn header(&self, name: &str) -> Option<&'r [u8]> {
        let value = self.headers.first(name)?;
        (!value.trim_ascii().is_empty()).then_some(value)
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
                    return Err(Missing::Peer);
                };
                let client = ip::client_ip(peer, self.headers, settings);
                ByValue::Ip(ip::bucket_text(client, settings))
            }
            By::Url => super::path::normalized_path(self.path.as_bytes()).into(),
            By::User => match self.user {
                Some(user) if !user.as_str().is_empty() => {
                    ByValue::Borrowed(user.as_str().as_bytes())
                }
                _ => return Err(Missing::User),
            },
            By::AppId => ByValue::Borrowed(self.header("appid").ok_or(Missing::AppId)?),
            By::Header(name) => ByValue::Borrowed(self.header(name).ok_or(Missing::Header(name))?),
        }))
    }
}
