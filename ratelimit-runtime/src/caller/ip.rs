//! The client address of a request (`by = "ip"`): the peer, or — only when the peer
//! is a trusted proxy — the right-most untrusted hop of the one forwarding header the
//! application configured ([`ForwardedHeader`]); then the bucket it belongs to (IPv6 grouped by
//! a prefix).

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, Ordering};

use super::settings::{ForwardedHeader, HttpSettings};
use crate::net::{IpNet, canonical};

/// Where the forwarding headers of one request are read from.
pub(crate) trait ForwardingHeaders {
    /// Every value of the header `name` (lower-case), in the order received.
    fn values(&self, name: &str) -> Vec<&[u8]>;

    /// Whether the request carries the forwarding header `header` (asked per request from a
    /// private peer until the unconfigured-proxy warning is written: no name to parse).
    fn has(&self, header: ForwardedHeader) -> bool {
        !self.values(header.name()).is_empty()
    }
}

#[cfg(any(
    feature = "axum",
    feature = "actix",
    feature = "tower",
    feature = "tonic"
))]
impl ForwardingHeaders for http::HeaderMap {
    fn values(&self, name: &str) -> Vec<&[u8]> {
        self.get_all(name)
            .iter()
            .map(http::HeaderValue::as_bytes)
            .collect()
    }

    fn has(&self, header: ForwardedHeader) -> bool {
        let [xff, forwarded, real_ip] = forwarding_names();
        self.contains_key(match header {
            ForwardedHeader::XForwardedFor => xff,
            ForwardedHeader::Forwarded => forwarded,
            ForwardedHeader::XRealIp => real_ip,
        })
    }
}

#[cfg(any(
    feature = "axum",
    feature = "actix",
    feature = "tower",
    feature = "tonic"
))]
/// The names of the three forwarding headers, as `http` header names: `X-Forwarded-For`,
/// `Forwarded`, `X-Real-IP`.
pub(crate) fn forwarding_names() -> [&'static http::HeaderName; 3] {
    static X_FORWARDED_FOR: http::HeaderName = http::HeaderName::from_static("x-forwarded-for");
    static X_REAL_IP: http::HeaderName = http::HeaderName::from_static("x-real-ip");
    [&X_FORWARDED_FOR, &http::header::FORWARDED, &X_REAL_IP]
}

#[cfg(test)]
impl ForwardingHeaders for [(&str, &[u8])] {
    fn values(&self, name: &str) -> Vec<&[u8]> {
        self.iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
            .collect()
    }
}

/// Who the client of a request is, as [`client_ip`](crate::http::client_ip) reads it.
///
/// [`Known`](ClientAddr::Known) is an address: the peer of the connection, or the hop a trusted
/// proxy's forwarding header names. [`Unknown`](ClientAddr::Unknown) is a request that came
/// through the trusted proxy `proxy` whose header names, where the client should be, a hop that
/// cannot be read (`unknown`, an obfuscated `Forwarded` identifier, garbage). Such a request is
/// not the proxy's: `by = "ip"` keys it apart from every address (`unknown@<proxy>`, a text no
/// address renders to; one bucket per proxy for all such requests), it is never exempt, and the
/// deny list is checked against every address its header does name.
///
/// ```
/// use ratelimit_runtime::http::ClientAddr;
///
/// let proxy = "10.0.0.1".parse().unwrap();
/// assert_eq!(ClientAddr::Unknown { proxy }.known(), None);
/// assert_eq!(ClientAddr::Unknown { proxy }.to_string(), "unknown@10.0.0.1");
/// let client = "203.0.113.7".parse().unwrap();
/// assert_eq!(ClientAddr::Known(client).known(), Some(client));
/// assert_eq!(ClientAddr::Known(client).to_string(), "203.0.113.7");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientAddr {
    /// The client's address (IPv4-mapped IPv6 addresses as IPv4).
    Known(IpAddr),
    /// The client is behind the trusted proxy `proxy`, whose forwarding header does not say
    /// who it is in a form that can be read.
    Unknown {
        /// The last trusted address of the chain: the peer, or the right-most trusted hop.
        proxy: IpAddr,
    },
}

impl ClientAddr {
    /// The client's address, when it is known.
    pub fn known(self) -> Option<IpAddr> {
        match self {
            Self::Known(ip) => Some(ip),
            Self::Unknown { .. } => None,
        }
    }
}

impl std::fmt::Display for ClientAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Known(ip) => write!(f, "{ip}"),
            Self::Unknown { proxy } => write!(f, "{UNKNOWN_PREFIX}{proxy}"),
        }
    }
}

/// What the bucket text of an [`ClientAddr::Unknown`] client starts with: letters no address
/// text holds (`u`, `n`, `k`, `o`, `w`, `@`), so it can never equal a real address's bucket.
const UNKNOWN_PREFIX: &str = "unknown@";

/// The client of a request ([`client_ip`]) and, when it is unknown, every address the
/// forwarding header does name to the left of the unreadable hop: the deny list is checked
/// against each (it can only make the sender's own request stricter).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Resolved {
    pub(crate) client: ClientAddr,
    /// Empty unless `client` is unknown.
    pub(crate) named: Vec<IpAddr>,
}

/// The client of a request.
///
/// `peer` is the address of the connection. Unless it is one of `settings.trusted_proxies`,
/// it is the answer and no header is read: with no trusted proxies configured, spoofed headers
/// change nothing. From a trusted peer, only the header `settings.forwarded_header` is read —
/// the hops of `X-Forwarded-For`, the `for=` nodes of RFC 7239 `Forwarded`, or the `X-Real-IP`
/// lines — and walked right to left: the first hop that is not itself a trusted proxy is the
/// client. The other two headers are ignored, whatever they hold (proxies pass them through
/// from the client). When every hop is trusted, the left-most one is the client; with no
/// header, the peer. IPv4-mapped IPv6 addresses count as IPv4.
///
/// A hop that cannot be read (`unknown`, an obfuscated identifier, garbage) where the walk
/// looks for the client makes the client [`ClientAddr::Unknown`] behind the last trusted
/// address (logged once per process, naming the header, never its value). `Forwarded` is split
/// into elements from the right, so a client's unterminated quote spoils only its own
/// elements, never the ones a proxy appended after it.
///
/// A peer in a loopback or private range that sends a forwarding header while no trusted proxy
/// is configured is warned about once per process ([`hint_unconfigured_proxy`]).
pub(crate) fn client_ip<H: ForwardingHeaders + ?Sized>(
    peer: IpAddr,
    headers: &H,
    settings: &HttpSettings,
) -> ClientAddr {
    walk(peer, headers, settings, false).client
}

/// [`client_ip`], with the addresses named beside an unknown client (see [`Resolved`]).
pub(crate) fn resolve<H: ForwardingHeaders + ?Sized>(
    peer: IpAddr,
    headers: &H,
    settings: &HttpSettings,
) -> Resolved {
    walk(peer, headers, settings, true)
}

fn walk<H: ForwardingHeaders + ?Sized>(
    peer: IpAddr,
    headers: &H,
    settings: &HttpSettings,
    named: bool,
) -> Resolved {
    let peer = canonical(peer);
    let known = |ip| Resolved {
        client: ClientAddr::Known(ip),
        named: Vec::new(),
    };
    if !settings.is_trusted_proxy(peer) {
        if settings.trusted_proxies.is_empty() {
            hint_unconfigured_proxy(&PROXY_HINT_LOGGED, peer, headers);
        }
        return known(peer);
    }
    let header = settings.forwarded_header;
    // Right-most hop first: the lines from the last, each line's hops from its end.
    let mut hops: Vec<Option<IpAddr>> = Vec::new();
    for value in headers.values(header.name()).into_iter().rev() {
        match header {
            ForwardedHeader::XForwardedFor => {
                hops.extend(value.rsplit(|&b| b == b',').map(parse_node));
            }
            ForwardedHeader::Forwarded => {
                hops.extend(elements_from_right(value).map(forwarded_for));
            }
            ForwardedHeader::XRealIp => hops.push(parse_node(value)),
        }
    }
    let mut client = peer;
    for (i, hop) in hops.iter().enumerate() {
        let Some(ip) = hop else {
            hint_unreadable_hop(&UNREADABLE_HOP_LOGGED, header);
            return Resolved {
                client: ClientAddr::Unknown { proxy: client },
                named: if named {
                    hops[i + 1..]
                        .iter()
                        .flatten()
                        .map(|ip| canonical(*ip))
                        .collect()
                } else {
                    Vec::new()
                },
            };
        };
        client = canonical(*ip);
        if !settings.is_trusted_proxy(client) {
            return known(client);
        }
    }
    known(client)
}

/// Set once the unreadable-hop warning was written: it is written once per process.
static UNREADABLE_HOP_LOGGED: AtomicBool = AtomicBool::new(false);

const UNREADABLE_HOP: &str = "a trusted proxy's forwarding header names a client that cannot be read \
     (`unknown`, an obfuscated identifier, or a value that is not an address): such requests are keyed \
     apart from every address, one bucket per proxy (`unknown@<proxy>`), are never exempt, and the deny \
     list is checked against every address the header names. Have the proxy write the client's address \
     (logged once per process)";

/// Writes one warning, the first time a client is [`ClientAddr::Unknown`]; names the header,
/// never its value. Returns whether it wrote it.
fn hint_unreadable_hop(logged: &AtomicBool, header: ForwardedHeader) -> bool {
    if logged.load(Ordering::Relaxed) || logged.swap(true, Ordering::Relaxed) {
        return false;
    }
    tracing::warn!(target: crate::observe::log::CALLER, header = header.name(), "{UNREADABLE_HOP}");
    true
}

/// Set once the unconfigured-proxy warning was written: it is written once per process.
static PROXY_HINT_LOGGED: AtomicBool = AtomicBool::new(false);

/// Every forwarding header, whichever one the application configured.
const FORWARDING_HEADERS: [ForwardedHeader; 3] = [
    ForwardedHeader::XForwardedFor,
    ForwardedHeader::Forwarded,
    ForwardedHeader::XRealIp,
];

const UNCONFIGURED_PROXY: &str = "a request from a loopback or private-network address carries a forwarding header, \
     but no trusted proxy is configured: this application looks like it runs behind a reverse proxy, \
     so `by = \"ip\"` sees the proxy's address and every client shares one bucket. \
     Configure the proxy's addresses with `RateLimiter::builder().trusted_proxies([\"10.0.0.0/8\"])` \
     and, unless it sets X-Forwarded-For, the header it sets with `.forwarded_header(ForwardedHeader::Forwarded)` \
     or `ForwardedHeader::XRealIp` (logged once per process)";

/// Writes one warning, the first time `peer` is a loopback or private-network address
/// ([`is_internal`]) and the request carries `Forwarded`, `X-Forwarded-For` or `X-Real-IP`;
/// the caller calls it only when no trusted proxy is configured. Returns whether it wrote the
/// warning. Once `logged` is set this is one relaxed load. The event names the header, never
/// its value nor the address.
fn hint_unconfigured_proxy<H: ForwardingHeaders + ?Sized>(
    logged: &AtomicBool,
    peer: IpAddr,
    headers: &H,
) -> bool {
    if logged.load(Ordering::Relaxed) || !is_internal(peer) {
        return false;
    }
    let Some(header) = FORWARDING_HEADERS.iter().find(|&&h| headers.has(h)) else {
        return false;
    };
    if logged.swap(true, Ordering::Relaxed) {
        return false;
    }
    tracing::warn!(target: crate::observe::log::CALLER, header = header.name(), "{UNCONFIGURED_PROXY}");
    true
}

/// Whether `ip` is where a reverse proxy in front of the application would connect from: IPv4
/// loopback, private (RFC 1918), link-local or shared (CGNAT, `100.64.0.0/10`); IPv6 loopback,
/// unique-local (`fc00::/7`) or link-local (`fe80::/10`). IPv4-mapped addresses count as IPv4.
fn is_internal(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || (a == 100 && (b & 0xc0) == 64)
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            v6.is_loopback() || (first & 0xfe00) == 0xfc00 || (first & 0xffc0) == 0xfe80
        }
    }
}

/// The bucket of a client address, as written into keys: an IPv4 address as itself, an IPv6
/// address as its network of `settings.ipv6_prefix` bits (`2001:db8:1:2::/64`).
pub(crate) fn bucket(ip: IpAddr, settings: &HttpSettings) -> String {
    bucket_text(ClientAddr::Known(ip), settings)
        .as_str()
        .to_owned()
}

/// The bucket of a client, as `by = "ip"` keys it, without an allocation: a known address as
/// [`bucket`] writes it; an unknown client as `unknown@` and its proxy's bucket.
pub(crate) fn bucket_text(client: ClientAddr, settings: &HttpSettings) -> IpText {
    let mut text = IpText::default();
    let ip = match client {
        ClientAddr::Known(ip) => ip,
        ClientAddr::Unknown { proxy } => {
            text.push(UNKNOWN_PREFIX.as_bytes());
            proxy
        }
    };
    match canonical(ip) {
        IpAddr::V4(v4) => text.push_v4(v4),
        IpAddr::V6(v6) if settings.ipv6_prefix >= 128 => {
            let _ = write!(text, "{v6}");
        }
        IpAddr::V6(v6) => {
            let _ = match IpNet::new(IpAddr::V6(v6), settings.ipv6_prefix) {
                Some(net) => write!(text, "{net}"),
                None => write!(text, "{v6}"),
            };
        }
    }
    text
}

/// The text of an address or network, inline: at most 57 bytes (`unknown@` and
/// `ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255/128`, the longest).
#[derive(Clone, Copy)]
pub(crate) struct IpText {
    buf: [u8; 64],
    len: u8,
}

impl Default for IpText {
    fn default() -> Self {
        Self {
            buf: [0; 64],
            len: 0,
        }
    }
}

impl IpText {
    fn push(&mut self, bytes: &[u8]) {
        let start = usize::from(self.len);
        // Never longer than the buffer (see the type's docs); cut rather than panic.
        let end = (start + bytes.len()).min(self.buf.len());
        self.buf[start..end].copy_from_slice(&bytes[..end - start]);
        #[allow(clippy::cast_possible_truncation)] // at most 64
        {
            self.len = end as u8;
        }
    }

    /// Appends `v4` in dotted decimal (as `Ipv4Addr`'s `Display` writes it), one byte at a
    /// time: this runs on every request keyed by IP.
    fn push_v4(&mut self, v4: std::net::Ipv4Addr) {
        let mut at = usize::from(self.len);
        // At most 15 bytes after at most `unknown@`: within the buffer.
        for (i, octet) in v4.octets().into_iter().enumerate() {
            if i > 0 {
                self.buf[at] = b'.';
                at += 1;
            }
            if octet >= 100 {
                self.buf[at] = b'0' + octet / 100;
                at += 1;
            }
            if octet >= 10 {
                self.buf[at] = b'0' + octet / 10 % 10;
                at += 1;
            }
            self.buf[at] = b'0' + octet % 10;
            at += 1;
        }
        #[allow(clippy::cast_possible_truncation)] // at most 8 + 15
        {
            self.len = at as u8;
        }
    }

    /// The bytes written.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }

    /// The text written (ASCII).
    pub(crate) fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }
}

impl std::fmt::Write for IpText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.push(s.as_bytes());
        Ok(())
    }
}

impl std::fmt::Debug for IpText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Splits `s` at `sep`, except inside double-quoted strings (with `\` escapes).
fn split_quoted(s: &[u8], sep: u8) -> impl Iterator<Item = &[u8]> {
    let mut start = 0;
    let mut pos = 0;
    let mut quoted = false;
    let mut done = false;
    std::iter::from_fn(move || {
        if done {
            return None;
        }
        while pos < s.len() {
            let b = s[pos];
            pos += 1;
            match b {
                b'\\' if quoted => pos += 1,
                b'"' => quoted = !quoted,
                _ if b == sep && !quoted => {
                    let part = &s[start..pos - 1];
                    start = pos;
                    return Some(part);
                }
                _ => {}
            }
        }
        done = true;
        Some(&s[start.min(s.len())..])
    })
}

/// The elements of one `Forwarded` line, right-most first: split at the commas outside
/// quoted strings, scanning from the end. A `"` opens or closes a quoted string unless an odd
/// number of backslashes precede it (an escaped quote inside one). On a well-formed line this is
/// [`split_quoted`] reversed; on any line, an unterminated quote spoils only the element it is
/// in and the ones to its left — what a client wrote, never what a proxy appended after it.
fn elements_from_right(s: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut end = s.len();
    let mut pos = s.len();
    let mut quoted = false;
    let mut done = false;
    std::iter::from_fn(move || {
        if done {
            return None;
        }
        while pos > 0 {
            pos -= 1;
            match s[pos] {
                b'"' if !escaped(s, pos) => quoted = !quoted,
                b',' if !quoted => {
                    let part = &s[pos + 1..end];
                    end = pos;
                    return Some(part);
                }
                _ => {}
            }
        }
        done = true;
        Some(&s[..end])
    })
}

/// Whether the byte at `pos` follows an odd number of backslashes. Each run of backslashes is
/// counted once, for the quote right after it: linear in the line.
fn escaped(s: &[u8], pos: usize) -> bool {
    s[..pos].iter().rev().take_while(|&&b| b == b'\\').count() % 2 == 1
}

/// The `for=` node of one `Forwarded` element (`for=192.0.2.60;proto=http`).
fn forwarded_for(element: &[u8]) -> Option<IpAddr> {
    split_quoted(element, b';').find_map(|pair| {
        let eq = pair.iter().position(|&b| b == b'=')?;
        let (name, value) = (trim(&pair[..eq]), &pair[eq + 1..]);
        name.eq_ignore_ascii_case(b"for")
            .then(|| parse_node(value))?
    })
}

fn trim(s: &[u8]) -> &[u8] {
    s.trim_ascii()
}

/// One hop: `192.0.2.60`, `192.0.2.60:8080`, `2001:db8::1`, `[2001:db8::1]:4711`, each maybe
/// double-quoted.
fn parse_node(node: &[u8]) -> Option<IpAddr> {
    let mut node = trim(node);
    if let [b'"', inner @ .., b'"'] = node {
        node = trim(inner);
    }
    let text = std::str::from_utf8(node).ok()?;
    if let Some(rest) = text.strip_prefix('[') {
        let (v6, port) = rest.split_once(']')?;
        if !(port.is_empty() || port.strip_prefix(':').is_some_and(is_port)) {
            return None;
        }
        return v6.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip);
    }
    let (v4, port) = text.split_once(':')?;
    if !is_port(port) {
        return None;
    }
    v4.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

fn is_port(s: &str) -> bool {
    !s.is_empty() && s.len() <= 5 && s.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(all(
    test,
    any(
        feature = "axum",
        feature = "actix",
        feature = "tower",
        feature = "tonic"
    )
))]
mod tests {
    use super::*;

    /// Every octet value in every position, known and behind a proxy: the text is the
    /// address's `Display`.
    #[test]
    fn ipv4_text_is_display_for_every_octet() {
        let settings = HttpSettings::default();
        for b in 0..=255u8 {
            for v4 in [
                [b, 0, 0, 0],
                [1, b, 2, 3],
                [255, 99, b, 100],
                [9, 10, 255, b],
                [b, b, b, b],
            ] {
                let ip = IpAddr::from(v4);
                let known = bucket_text(ClientAddr::Known(ip), &settings);
                assert_eq!(known.as_str(), ip.to_string());
                let unknown = bucket_text(ClientAddr::Unknown { proxy: ip }, &settings);
                assert_eq!(unknown.as_str(), format!("{UNKNOWN_PREFIX}{ip}"));
            }
        }
    }

    #[test]
    fn ip_text_is_display_and_forwarding_headers_are_found_by_name() {
        let settings = HttpSettings::default();
        for ip in [
            "0.0.0.0",
            "10.1.2.3",
            "192.168.100.9",
            "255.255.255.255",
            "1.22.133.4",
            "::ffff:10.1.2.3",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(bucket(ip, &settings), canonical(ip).to_string());
        }
        // The longest texts fit.
        for ip in ["ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "2001:db8::1"] {
            let ip: IpAddr = ip.parse().unwrap();
            for prefix in [0, 64, 127, 128] {
                let s = HttpSettings {
                    ipv6_prefix: prefix,
                    ..HttpSettings::default()
                };
                let want = if prefix >= 128 {
                    ip.to_string()
                } else {
                    IpNet::new(ip, prefix).unwrap().to_string()
                };
                assert_eq!(bucket(ip, &s), want);
            }
        }
        for header in FORWARDING_HEADERS {
            let mut map = http::HeaderMap::new();
            assert!(!map.has(header));
            map.insert("x-other", "1".parse().unwrap());
            assert!(!map.has(header));
            map.insert(
                http::HeaderName::from_static(header.name()),
                "1".parse().unwrap(),
            );
            assert!(map.has(header));
            let list: &[(&str, &[u8])] = &[
                ("X-Real-IP", b"1"),
                ("Forwarded", b"1"),
                ("X-Forwarded-For", b"1"),
            ];
            assert!(list.has(header));
        }
    }
    fn settings_for(proxies: &[&str], header: ForwardedHeader) -> HttpSettings {
        HttpSettings {
            trusted_proxies: proxies.iter().map(|p| p.parse().unwrap()).collect(),
            forwarded_header: header,
            ..HttpSettings::default()
        }
    }

    fn settings(proxies: &[&str], v6: u8) -> HttpSettings {
        HttpSettings {
            trusted_proxies: proxies.iter().map(|p| p.parse().unwrap()).collect(),
            ipv6_prefix: v6,
            ..HttpSettings::default()
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn who(peer: &str, headers: &[(&str, &[u8])], s: &HttpSettings) -> ClientAddr {
        client_ip(ip(peer), headers, s)
    }

    fn known(s: &str) -> ClientAddr {
        ClientAddr::Known(ip(s))
    }

    fn unknown(proxy: &str) -> ClientAddr {
        ClientAddr::Unknown { proxy: ip(proxy) }
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_the_headers_say() {
        let spoof: &[(&str, &[u8])] = &[
            ("x-forwarded-for", b"1.2.3.4"),
            ("forwarded", b"for=5.6.7.8"),
            ("x-real-ip", b"9.9.9.9"),
        ];
        for header in FORWARDING_HEADERS {
            let s = settings_for(&[], header);
            assert_eq!(who("10.0.0.1", spoof, &s), known("10.0.0.1"));
            let s = settings_for(&["10.0.0.0/8"], header);
            assert_eq!(who("192.0.2.1", spoof, &s), known("192.0.2.1"));
        }
    }

    #[test]
    fn x_forwarded_for_is_the_default_header() {
        assert_eq!(
            HttpSettings::default().forwarded_header,
            ForwardedHeader::XForwardedFor
        );
        let s = settings(&["10.0.0.0/8"], 64);
        assert_eq!(s.forwarded_header, ForwardedHeader::XForwardedFor);
    }

    #[test]
    fn from_a_trusted_peer_the_right_most_untrusted_hop_is_the_client() {
        let s = settings(&["10.0.0.0/8", "fd00::/8"], 64);
        let xff: &[(&str, &[u8])] = &[("X-Forwarded-For", b"6.6.6.6, 1.2.3.4, 10.1.1.1")];
        assert_eq!(who("10.0.0.1", xff, &s), known("1.2.3.4"));
        // Several header lines are one list, in order.
        let lines: &[(&str, &[u8])] = &[
            ("x-forwarded-for", b"6.6.6.6"),
            ("x-forwarded-for", b"1.2.3.4, 10.9.9.9"),
        ];
        assert_eq!(who("10.0.0.1", lines, &s), known("1.2.3.4"));
        // Every hop trusted: the left-most is the client.
        let all: &[(&str, &[u8])] = &[("x-forwarded-for", b"10.3.3.3, 10.2.2.2")];
        assert_eq!(who("10.0.0.1", all, &s), known("10.3.3.3"));
        // Garbage where the client should be: unknown, behind the last trusted address.
        let bad: &[(&str, &[u8])] = &[("x-forwarded-for", b"1.2.3.4, nonsense, 10.2.2.2")];
        assert_eq!(who("10.0.0.1", bad, &s), unknown("10.2.2.2"));
        // No header at all: the peer.
        assert_eq!(who("10.0.0.1", &[], &s), known("10.0.0.1"));
        // IPv6 peers and hops, with ports.
        let v6: &[(&str, &[u8])] = &[("x-forwarded-for", b"[2001:db8::7]:443, fd00::2")];
        assert_eq!(who("fd00::1", v6, &s), known("2001:db8::7"));
    }

    /// What `main` got wrong: `Forwarded` won over `X-Forwarded-For`, so behind an XFF proxy a
    /// client's own `Forwarded: for=<random>` named a fresh client per request.
    #[test]
    fn a_spoofed_forwarded_header_behind_an_xff_proxy_changes_nothing() {
        let s = settings(&["10.0.0.0/8"], 64);
        let proxied: &[(&str, &[u8])] = &[("x-forwarded-for", b"203.0.113.7")];
        let spoofed: &[(&str, &[u8])] = &[
            ("forwarded", b"for=198.51.100.1"),
            ("x-forwarded-for", b"203.0.113.7"),
            ("x-real-ip", b"198.51.100.2"),
        ];
        assert_eq!(who("10.0.0.1", proxied, &s), known("203.0.113.7"));
        assert_eq!(who("10.0.0.1", spoofed, &s), known("203.0.113.7"));
        // Without the configured header, the others are not a fallback: the peer.
        let only_others: &[(&str, &[u8])] = &[
            ("forwarded", b"for=198.51.100.1"),
            ("x-real-ip", b"198.51.100.2"),
        ];
        assert_eq!(who("10.0.0.1", only_others, &s), known("10.0.0.1"));
    }

    #[test]
    fn forwarded_is_read_per_rfc_7239_only_when_configured() {
        let s = settings_for(&["10.0.0.0/8"], ForwardedHeader::Forwarded);
        let h: &[(&str, &[u8])] = &[
            (
                "forwarded",
                b"for=6.6.6.6, For=\"[2001:db8:cafe::17]:4711\";proto=https, for=10.0.0.9",
            ),
            ("x-forwarded-for", b"7.7.7.7"),
            ("x-real-ip", b"8.8.8.8"),
        ];
        assert_eq!(who("10.0.0.1", h, &s), known("2001:db8:cafe::17"));
        let port: &[(&str, &[u8])] = &[("forwarded", b"proto=http;for=\"192.0.2.60:8080\"")];
        assert_eq!(who("10.0.0.1", port, &s), known("192.0.2.60"));
        // A quoted comma does not split an element.
        let q: &[(&str, &[u8])] = &[("forwarded", b"for=\"a,b\", for=198.51.100.3")];
        assert_eq!(who("10.0.0.1", q, &s), known("198.51.100.3"));
        // `unknown` and obfuscated identifiers: the client is unknown behind the peer.
        let hop: &[(&str, &[u8])] = &[("forwarded", b"for=1.2.3.4, for=unknown")];
        assert_eq!(who("10.0.0.1", hop, &s), unknown("10.0.0.1"));
        let hidden: &[(&str, &[u8])] = &[("forwarded", b"for=_hidden;by=10.0.0.1")];
        assert_eq!(who("10.0.0.1", hidden, &s), unknown("10.0.0.1"));
        // A client's own X-Forwarded-For / X-Real-IP behind a Forwarded proxy: ignored.
        let spoof: &[(&str, &[u8])] = &[("x-forwarded-for", b"7.7.7.7"), ("x-real-ip", b"8.8.8.8")];
        assert_eq!(who("10.0.0.1", spoof, &s), known("10.0.0.1"));
    }

    /// Behind an RFC 7239 proxy, a client's `Forwarded: for="x` must not make one unreadable
    /// element of the whole line, the proxy's appended `for=` included, so that the client
    /// becomes the proxy (a deny-listed address let through; with the proxies exempt, no
    /// limit at all). Parsed from the right, the quote spoils only the client's element.
    #[test]
    fn an_unterminated_quote_spoils_only_the_client_s_own_elements() {
        let s = settings_for(&["10.0.0.0/8"], ForwardedHeader::Forwarded);
        for line in [
            &b"for=\"x, for=198.51.100.9"[..],
            b"for=\"x\\\", for=198.51.100.9",
            b"\"\"\", for=\"198.51.100.9:4711\"",
            b"for=1.2.3.4\", for=198.51.100.9;proto=https",
            b"for=\"[::1, for=198.51.100.9, for=10.0.0.7",
        ] {
            let h: &[(&str, &[u8])] = &[("forwarded", line)];
            assert_eq!(
                who("10.0.0.1", h, &s),
                known("198.51.100.9"),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
        // On its own line too (a proxy that adds a line instead of appending).
        let lines: &[(&str, &[u8])] = &[
            ("forwarded", b"for=\"x"),
            ("forwarded", b"for=198.51.100.9"),
        ];
        assert_eq!(who("10.0.0.1", lines, &s), known("198.51.100.9"));
        // The client's element itself is what cannot be read: unknown, never the proxy.
        let alone: &[(&str, &[u8])] = &[("forwarded", b"for=\"x")];
        assert_eq!(who("10.0.0.1", alone, &s), unknown("10.0.0.1"));
        let zone: &[(&str, &[u8])] = &[("forwarded", b"for=\"[fe80::1%eth0]\", for=10.0.0.7")];
        assert_eq!(who("10.0.0.1", zone, &s), unknown("10.0.0.7"));
    }

    /// An unknown client: its own bucket per proxy, in a text no address renders to; the
    /// addresses its header does name are kept for the deny list (those left of the unreadable
    /// hop only); one warning per process, naming the header.
    #[test]
    fn an_unknown_client_is_keyed_apart_and_keeps_the_addresses_named() {
        let s = settings(&["10.0.0.0/8", "fd00::/8"], 64);
        let h: &[(&str, &[u8])] = &[(
            "x-forwarded-for",
            b"198.51.100.7, 2001:db8::1, unknown, 10.2.2.2",
        )];
        let r = resolve(ip("10.0.0.1"), h, &s);
        assert_eq!(r.client, unknown("10.2.2.2"));
        assert_eq!(r.named, [ip("2001:db8::1"), ip("198.51.100.7")]);
        // client_ip does not collect them; a known client names none.
        assert!(
            resolve(
                ip("10.0.0.1"),
                &[("x-forwarded-for", &b"198.51.100.7"[..])][..],
                &s
            )
            .named
            .is_empty()
        );
        assert_eq!(bucket_text(r.client, &s).as_str(), "unknown@10.2.2.2");
        let v6 = ClientAddr::Unknown {
            proxy: ip("fd00:0:0:1::9"),
        };
        assert_eq!(bucket_text(v6, &s).as_str(), "unknown@fd00:0:0:1::/64");
        let longest = ClientAddr::Unknown {
            proxy: ip("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
        };
        let s128 = settings(&[], 128);
        assert_eq!(
            bucket_text(longest, &s128).as_str(),
            "unknown@ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
        );
        let logged = AtomicBool::new(false);
        assert!(hint_unreadable_hop(&logged, ForwardedHeader::Forwarded));
        assert!(!hint_unreadable_hop(&logged, ForwardedHeader::Forwarded));
    }

    #[test]
    fn x_real_ip_is_read_only_when_configured() {
        let s = settings_for(&["10.0.0.0/8"], ForwardedHeader::XRealIp);
        let real: &[(&str, &[u8])] = &[
            ("x-real-ip", b" 203.0.113.9 "),
            ("forwarded", b"for=198.51.100.1"),
            ("x-forwarded-for", b"198.51.100.2"),
        ];
        assert_eq!(who("10.0.0.1", real, &s), known("203.0.113.9"));
        // Several lines (a proxy that adds instead of setting): right to left, as the lists.
        let lines: &[(&str, &[u8])] = &[
            ("x-real-ip", b"198.51.100.9"),
            ("x-real-ip", b"203.0.113.9"),
            ("x-real-ip", b"10.7.7.7"),
        ];
        assert_eq!(who("10.0.0.1", lines, &s), known("203.0.113.9"));
        // A list is not one address: unknown behind the peer.
        let list: &[(&str, &[u8])] = &[("x-real-ip", b"198.51.100.9, 203.0.113.9")];
        assert_eq!(who("10.0.0.1", list, &s), unknown("10.0.0.1"));
        let spoof: &[(&str, &[u8])] = &[
            ("forwarded", b"for=198.51.100.1"),
            ("x-forwarded-for", b"198.51.100.2"),
        ];
        assert_eq!(who("10.0.0.1", spoof, &s), known("10.0.0.1"));
    }

    #[test]
    fn ipv4_mapped_addresses_count_as_ipv4() {
        let s = settings(&["10.0.0.0/8"], 64);
        let h: &[(&str, &[u8])] = &[("x-forwarded-for", b"::ffff:1.2.3.4")];
        assert_eq!(who("::ffff:10.0.0.1", h, &s), known("1.2.3.4"));
        assert_eq!(bucket(ip("::ffff:1.2.3.4"), &s), "1.2.3.4");
    }

    #[test]
    fn ipv6_addresses_are_grouped_by_the_configured_prefix() {
        let s = settings(&[], 64);
        let a = bucket(ip("2001:db8:1:2::1"), &s);
        let b = bucket(ip("2001:db8:1:2:ffff:ffff:ffff:ffff"), &s);
        let c = bucket(ip("2001:db8:1:3::1"), &s);
        assert_eq!(a, "2001:db8:1:2::/64");
        assert_eq!(a, b);
        assert_ne!(a, c);
        let s48 = settings(&[], 48);
        assert_eq!(
            bucket(ip("2001:db8:1:2::1"), &s48),
            bucket(ip("2001:db8:1:3::1"), &s48)
        );
        let s128 = settings(&[], 128);
        assert_ne!(
            bucket(ip("2001:db8:1:2::1"), &s128),
            bucket(ip("2001:db8:1:2::2"), &s128)
        );
        assert_eq!(bucket(ip("192.0.2.1"), &s), "192.0.2.1");
    }

    #[test]
    fn nodes_parse_leniently_and_reject_garbage() {
        assert_eq!(parse_node(b"1.2.3.4:80"), Some(ip("1.2.3.4")));
        assert_eq!(parse_node(b"\"[::1]\""), Some(ip("::1")));
        assert_eq!(parse_node(b"[::1]:x"), None);
        assert_eq!(parse_node(b"1.2.3.4:"), None);
        assert_eq!(parse_node(b"\xff\xfe"), None);
        assert_eq!(parse_node(b""), None);
        assert_eq!(parse_node(b"\""), None);
        let parts: Vec<&[u8]> = split_quoted(b"a,\"b,\\\"c\",", b',').collect();
        assert_eq!(parts, [&b"a"[..], b"\"b,\\\"c\"", b""]);
        // A trailing escape inside quotes runs past the end: no panic.
        let parts: Vec<&[u8]> = split_quoted(b"\"a\\", b',').collect();
        assert_eq!(parts, [&b"\"a\\"[..]]);
    }

    #[test]
    fn internal_ranges_are_the_ones_a_proxy_connects_from() {
        for internal in [
            "127.0.0.1",
            "127.255.0.9",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.0.7",
            "100.64.0.1",
            "100.127.255.255",
            "::1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "febf::1",
            "::ffff:10.0.0.1",
            "::ffff:127.0.0.1",
        ] {
            assert!(is_internal(ip(internal)), "{internal}");
        }
        for public in [
            "8.8.8.8",
            "172.32.0.1",
            "172.15.255.255",
            "192.169.0.1",
            "100.63.255.255",
            "100.128.0.0",
            "203.0.113.7",
            "2001:db8::1",
            "fec0::1",
            "fbff::1",
            "::ffff:8.8.8.8",
            "::",
        ] {
            assert!(!is_internal(ip(public)), "{public}");
        }
    }

    /// An application behind a proxy it did not configure: every client has the proxy's
    /// address. One warning, the first time; never for public peers, never without a header.
    #[test]
    fn a_private_peer_with_forwarding_headers_and_no_trusted_proxy_is_warned_about_once() {
        let logged = AtomicBool::new(false);
        let xff: &[(&str, &[u8])] = &[("X-Forwarded-For", b"203.0.113.7")];
        let none: &[(&str, &[u8])] = &[("x-api-key", b"k")];
        assert!(!hint_unconfigured_proxy(&logged, ip("203.0.113.1"), xff));
        assert!(!hint_unconfigured_proxy(&logged, ip("10.0.0.1"), none));
        assert!(!logged.load(Ordering::Relaxed));
        assert!(hint_unconfigured_proxy(&logged, ip("10.0.0.1"), xff));
        assert!(logged.load(Ordering::Relaxed));
        assert!(!hint_unconfigured_proxy(&logged, ip("10.0.0.1"), xff));
        assert!(!hint_unconfigured_proxy(&logged, ip("::1"), xff));
        // Each of the three headers, IPv6 and mapped peers.
        for (peer, header) in [
            ("127.0.0.1", "forwarded"),
            ("::1", "x-real-ip"),
            ("::ffff:192.168.0.2", "x-forwarded-for"),
            ("fd00::7", "Forwarded"),
        ] {
            let logged = AtomicBool::new(false);
            let h: &[(&str, &[u8])] = &[(header, b"for=203.0.113.7")];
            assert!(
                hint_unconfigured_proxy(&logged, ip(peer), h),
                "{peer} {header}"
            );
        }
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        const HEADERS: [&str; 3] = ["x-forwarded-for", "forwarded", "x-real-ip"];

        fn header_kind() -> impl Strategy<Value = ForwardedHeader> {
            prop_oneof![
                Just(ForwardedHeader::XForwardedFor),
                Just(ForwardedHeader::Forwarded),
                Just(ForwardedHeader::XRealIp),
            ]
        }

        /// Addresses inside and outside the trusted networks below, IPv4, IPv6 and mapped.
        fn address() -> impl Strategy<Value = String> {
            prop_oneof![
                (0u8..4, any::<u8>()).prop_map(|(a, b)| format!("10.0.{a}.{b}")),
                (0u8..4, any::<u8>()).prop_map(|(a, b)| format!("203.0.{a}.{b}")),
                any::<u8>().prop_map(|b| format!("::ffff:10.0.0.{b}")),
                any::<u16>().prop_map(|b| format!("fd00::{b:x}")),
                any::<u16>().prop_map(|b| format!("2001:db8::{b:x}")),
            ]
        }

        /// One hop as proxies (and attackers) write it: bare, with a port, bracketed, quoted,
        /// as a `for=` pair, or garbage.
        fn hop() -> impl Strategy<Value = String> {
            prop_oneof![
                address(),
                (address(), any::<u16>()).prop_map(|(a, p)| if a.contains(':') {
                    format!("[{a}]:{p}")
                } else {
                    format!("{a}:{p}")
                }),
                address().prop_map(|a| format!("\"{a}\"")),
                address().prop_map(|a| format!("for={a}")),
                address().prop_map(|a| format!("for=\"[{a}]\";proto=https")),
                Just("unknown".to_owned()),
                Just("for=_hidden".to_owned()),
                "[ -~]{0,12}",
            ]
        }

        /// A header line: any bytes, or a list of realistic hops with any separators.
        fn line() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..48),
                (
                    proptest::collection::vec(hop(), 0..5),
                    prop_oneof![Just(", "), Just(","), Just(";"), Just(" ")]
                )
                    .prop_map(|(hops, sep)| hops.join(sep).into_bytes()),
            ]
        }

        fn lines() -> impl Strategy<Value = Vec<Vec<u8>>> {
            proptest::collection::vec(line(), 0..3)
        }

        fn peer() -> impl Strategy<Value = IpAddr> {
            prop_oneof![
                any::<u8>().prop_map(|b| IpAddr::from([10, 0, 0, b])),
                any::<u8>().prop_map(|b| IpAddr::from([198, 51, 100, b])),
                any::<u16>().prop_map(|b| IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, b))),
                any::<u8>().prop_map(|b| IpAddr::V6(Ipv4Addr::new(10, 0, 0, b).to_ipv6_mapped())),
                any::<[u8; 16]>().prop_map(|b| IpAddr::V6(Ipv6Addr::from(b))),
            ]
        }

        use std::net::Ipv4Addr;

        /// Every address that some contiguous run of `line`'s bytes spells, canonical.
        fn spelled(line: &[u8]) -> Vec<IpAddr> {
            let mut found = Vec::new();
            for start in 0..line.len() {
                for end in start + 1..=line.len().min(start + 45) {
                    if let Ok(text) = std::str::from_utf8(&line[start..end])
                        && let Ok(ip) = text.parse::<IpAddr>()
                    {
                        found.push(canonical(ip));
                    }
                }
            }
            found
        }

        fn headers<'a>(
            by_name: &'a [(&'static str, Vec<Vec<u8>>)],
            only: Option<&str>,
        ) -> Vec<(&'static str, &'a [u8])> {
            by_name
                .iter()
                .filter(|(name, _)| only.is_none_or(|o| o == *name))
                .flat_map(|(name, lines)| lines.iter().map(move |l| (*name, l.as_slice())))
                .collect()
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// Any bytes in any of the headers, any peer, any configured header, with or
            /// without trusted proxies: no panic; an untrusted peer is the client; from a
            /// trusted peer the client is the peer or an address the configured header spells,
            /// and the other two headers change nothing.
            #[test]
            fn forwarding_headers_never_panic_and_only_the_configured_one_counts(
                peer in peer(),
                kind in header_kind(),
                trusting in any::<bool>(),
                xff in lines(),
                fwd in lines(),
                real in lines(),
            ) {
                let proxies: &[&str] = if trusting { &["10.0.0.0/8", "fd00::/8"] } else { &[] };
                let s = settings_for(proxies, kind);
                let by_name = [(HEADERS[0], xff), (HEADERS[1], fwd), (HEADERS[2], real)];
                let all = headers(&by_name, None);
                let resolved = resolve(peer, all.as_slice(), &s);
                let client = resolved.client;
                prop_assert_eq!(client, client_ip(peer, all.as_slice(), &s));
                let peer = canonical(peer);
                if s.is_trusted_proxy(peer) {
                    let configured = headers(&by_name, Some(kind.name()));
                    prop_assert_eq!(client, client_ip(peer, configured.as_slice(), &s));
                    let spelled: Vec<IpAddr> =
                        configured.iter().flat_map(|(_, l)| spelled(l)).collect();
                    // Known or unknown, the address is the peer's or one the header spells;
                    // an unknown client is behind a trusted address.
                    let (ClientAddr::Known(addr) | ClientAddr::Unknown { proxy: addr }) = client;
                    prop_assert!(
                        addr == peer || spelled.contains(&addr),
                        "{client} is neither the peer nor in {:?}",
                        configured
                    );
                    if let ClientAddr::Unknown { proxy } = client {
                        prop_assert!(s.is_trusted_proxy(proxy));
                    }
                    for named in &resolved.named {
                        prop_assert!(spelled.contains(named), "{named} named, not spelled");
                    }
                } else {
                    prop_assert_eq!(client, ClientAddr::Known(peer));
                    prop_assert!(resolved.named.is_empty());
                }
                // The lenient helpers hold on their own too.
                for (_, l) in &all {
                    let _ = parse_node(l);
                    let _ = forwarded_for(l);
                    prop_assert!(split_quoted(l, b',').count() <= l.len() + 1);
                }
            }

            /// Hops that are all trusted but one: that one is the client, wherever it stands,
            /// as long as only trusted hops are to its right.
            #[test]
            fn the_right_most_untrusted_hop_is_the_client(
                kind in header_kind(),
                left in proptest::collection::vec(address(), 0..3),
                client in (0u8..4, any::<u8>()).prop_map(|(a, b)| IpAddr::from([203, 0, a, b])),
                right in proptest::collection::vec(any::<u8>().prop_map(|b| format!("10.9.0.{b}")), 0..3),
            ) {
                let s = settings_for(&["10.0.0.0/8"], kind);
                let hops: Vec<String> = left
                    .iter()
                    .cloned()
                    .chain(std::iter::once(client.to_string()))
                    .chain(right.iter().cloned())
                    .collect();
                let lines: Vec<Vec<u8>> = match kind {
                    ForwardedHeader::XForwardedFor => vec![hops.join(", ").into_bytes()],
                    ForwardedHeader::Forwarded => vec![
                        hops.iter()
                            .map(|h| if h.contains(':') { format!("for=\"[{h}]\"") } else { format!("for={h}") })
                            .collect::<Vec<_>>()
                            .join(", ")
                            .into_bytes(),
                    ],
                    ForwardedHeader::XRealIp => hops.iter().map(|h| h.clone().into_bytes()).collect(),
                };
                let h: Vec<(&str, &[u8])> = lines.iter().map(|l| (kind.name(), l.as_slice())).collect();
                prop_assert_eq!(
                    client_ip(IpAddr::from([10, 0, 0, 1]), h.as_slice(), &s),
                    ClientAddr::Known(client)
                );
            }

            /// Well-formed `Forwarded` lines (tokens, quoted strings with escaped quotes,
            /// backslashes, commas and semicolons inside): split from the right, the elements
            /// are those of the left-to-right split, in reverse.
            #[test]
            fn well_formed_forwarded_lines_split_the_same_both_ways(line in well_formed_line()) {
                let mut left: Vec<&[u8]> = split_quoted(line.as_bytes(), b',').collect();
                left.reverse();
                let right: Vec<&[u8]> = elements_from_right(line.as_bytes()).collect();
                prop_assert_eq!(left, right);
            }

            /// Anything a client wrote before a trusted proxy's readable, appended hop (any bytes,
            /// unterminated quotes, backslashes, several lines of its own) never changes the
            /// answer: the appended address, or the hop before the trusted ones after it.
            #[test]
            fn a_client_prefix_never_changes_a_readable_appended_hop(
                kind in header_kind(),
                prefix in proptest::collection::vec(
                    prop_oneof![
                        proptest::collection::vec(any::<u8>(), 0..32),
                        "[\"\\\\,;= a-z0-9.:\\[\\]]{0,24}".prop_map(String::into_bytes),
                    ],
                    0..3,
                ),
                client in prop_oneof![
                    (0u8..4, any::<u8>()).prop_map(|(a, b)| IpAddr::from([203, 0, a, b])),
                    any::<u16>().prop_map(|b| IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, b))),
                ],
                port in proptest::option::of(any::<u16>()),
                quoted in any::<bool>(),
                proxies in proptest::collection::vec(any::<u8>().prop_map(|b| format!("10.9.0.{b}")), 0..3),
                same_line in any::<bool>(),
            ) {
                let s = settings_for(&["10.0.0.0/8"], kind);
                let node = match (client, port) {
                    (IpAddr::V6(v6), Some(p)) => format!("[{v6}]:{p}"),
                    (IpAddr::V6(v6), None) if kind == ForwardedHeader::Forwarded => format!("[{v6}]"),
                    (ip, Some(p)) => format!("{ip}:{p}"),
                    (ip, None) => ip.to_string(),
                };
                let appended: Vec<String> = std::iter::once(node).chain(proxies).collect();
                let mut lines: Vec<Vec<u8>> = prefix;
                if kind == ForwardedHeader::XRealIp {
                    // One address a line: the proxy's own line(s) after the client's.
                    lines.extend(appended.iter().map(|a| a.clone().into_bytes()));
                } else {
                        let hops: Vec<String> = appended
                            .iter()
                            .map(|a| match kind {
                                ForwardedHeader::Forwarded if quoted || a.contains(':') => {
                                    format!("for=\"{a}\"")
                                }
                                ForwardedHeader::Forwarded => format!("for={a}"),
                                _ => a.clone(),
                            })
                            .collect();
                        let tail = hops.join(", ");
                        match lines.last_mut() {
                            Some(last) if same_line => {
                                last.extend_from_slice(b", ");
                                last.extend_from_slice(tail.as_bytes());
                            }
                            _ => lines.push(tail.into_bytes()),
                        }
                }
                let h: Vec<(&str, &[u8])> = lines.iter().map(|l| (kind.name(), l.as_slice())).collect();
                prop_assert_eq!(
                    client_ip(IpAddr::from([10, 0, 0, 1]), h.as_slice(), &s),
                    ClientAddr::Known(client)
                );
            }
        }

        /// A `Forwarded` line as RFC 7239 writes it: elements of `name=value` pairs, values
        /// tokens or quoted strings (escaped quotes and backslashes, commas inside).
        fn well_formed_line() -> impl Strategy<Value = String> {
            let token = "[a-zA-Z0-9._:\\[\\]-]{1,12}";
            let quoted = proptest::collection::vec(
                prop_oneof![
                    "[a-zA-Z0-9 ,;=.:\\[\\]-]{1,4}",
                    Just("\\\"".to_owned()),
                    Just("\\\\".to_owned()),
                ],
                0..5,
            )
            .prop_map(|parts| format!("\"{}\"", parts.concat()));
            let pair =
                ("[a-z]{1,5}", prop_oneof![token, quoted]).prop_map(|(n, v)| format!("{n}={v}"));
            let element = proptest::collection::vec(pair, 1..4).prop_map(|p| p.join(";"));
            (
                proptest::collection::vec(element, 1..5),
                prop_oneof![Just(","), Just(", ")],
            )
                .prop_map(|(elements, sep)| elements.join(sep))
        }
    }
}
