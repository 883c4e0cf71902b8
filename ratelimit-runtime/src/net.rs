//! IP networks: trusted proxies and IPv6 grouping.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// An IP network in CIDR notation (`10.0.0.0/8`, `2001:db8::/32`), or one address.
///
/// ```
/// use ratelimit_runtime::net::IpNet;
/// let net: IpNet = "10.0.0.0/8".parse().unwrap();
/// assert!(net.contains("10.1.2.3".parse().unwrap()));
/// assert!(!net.contains("11.0.0.1".parse().unwrap()));
/// assert!("10.0.0.0/33".parse::<IpNet>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

/// The text is not an IP address or CIDR block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpNetParseError(String);

impl fmt::Display for IpNetParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not an IP address or CIDR block such as 10.0.0.0/8",
            self.0
        )
    }
}

impl std::error::Error for IpNetParseError {}

/// What the builder's network lists take ([`crate::limiter::Builder::trusted_proxies`],
/// [`crate::limiter::Builder::exempt_networks`], [`crate::limiter::Builder::deny_networks`]): the text of an
/// address or CIDR block (`"10.0.0.0/8"`, `String`s), an [`IpNet`] or an [`IpAddr`]. One
/// spelling for the three lists; a text that is not a network fails the build with a
/// [`crate::ConfigError`] naming it.
pub trait IntoNetwork {
    /// The network, or the text that is not one.
    fn into_network(self) -> Result<IpNet, String>;
}

impl IntoNetwork for IpNet {
    fn into_network(self) -> Result<IpNet, String> {
        Ok(self)
    }
}

impl IntoNetwork for IpAddr {
    fn into_network(self) -> Result<IpNet, String> {
        let bits = if self.is_ipv4() { 32 } else { 128 };
        IpNet::new(self, bits).ok_or_else(|| self.to_string())
    }
}

impl IntoNetwork for &str {
    fn into_network(self) -> Result<IpNet, String> {
        self.parse().map_err(|_| self.to_owned())
    }
}

impl IntoNetwork for String {
    fn into_network(self) -> Result<IpNet, String> {
        self.as_str().into_network()
    }
}

impl IntoNetwork for &String {
    fn into_network(self) -> Result<IpNet, String> {
        self.as_str().into_network()
    }
}

impl IpNet {
    /// The network of `addr` with the first `prefix` bits kept; `None` when `prefix` is longer
    /// than the address.
    pub fn new(addr: IpAddr, prefix: u8) -> Option<Self> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (prefix <= max).then(|| Self {
            addr: mask(addr, prefix),
            prefix,
        })
    }

    /// Whether `ip` is inside this network. IPv4-mapped IPv6 addresses count as IPv4.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        ip.is_ipv4() == self.addr.is_ipv4() && mask(ip, self.prefix) == self.addr
    }

    /// The network address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl FromStr for IpNet {
    type Err = IpNetParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || IpNetParseError(s.to_owned());
        let (addr, prefix) = match s.trim().split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s.trim(), None),
        };
        let addr = canonical(addr.parse::<IpAddr>().map_err(|_| err())?);
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
                p.parse::<u8>().map_err(|_| err())?
            }
            Some(_) => return Err(err()),
            None => max,
        };
        Self::new(addr, prefix).ok_or_else(err)
    }
}

/// IPv4-mapped IPv6 addresses (`::ffff:1.2.3.4`) as IPv4.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// Keeps the first `prefix` bits of `ip`.
pub(crate) fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let m = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(prefix.min(32)))
            };
            IpAddr::V4(Ipv4Addr::from(bits & m))
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let m = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(prefix.min(128)))
            };
            IpAddr::V6(Ipv6Addr::from(bits & m))
        }
    }
}
