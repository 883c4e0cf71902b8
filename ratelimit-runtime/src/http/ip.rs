//! The client address of a request (SPEC §5, `by = "ip"`): the peer, or — only when the peer
//! is a trusted proxy — the right-most untrusted hop of `Forwarded`, `X-Forwarded-For` or
//! `X-Real-IP`; then the bucket it belongs to (IPv6 grouped by a prefix).

use std::net::{IpAddr, Ipv6Addr};

use crate::limiter::Settings;
use crate::net::{IpNet, canonical};

/// Where the forwarding headers of one request are read from.
pub(crate) trait ForwardingHeaders {
    /// Every value of the header `name` (lower-case), in the order received.
    fn values(&self, name: &str) -> Vec<&[u8]>;
}

impl ForwardingHeaders for http::HeaderMap {
    fn values(&self, name: &str) -> Vec<&[u8]> {
        self.get_all(name)
            .iter()
            .map(http::HeaderValue::as_bytes)
            .collect()
    }
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

/// The address that identifies the client of a request.
///
/// `peer` is the address of the connection. Unless it is one of `settings.trusted_proxies`,
/// it is the answer and no header is read: with no trusted proxies configured, spoofed headers
/// change nothing. From a trusted peer, the hops listed by `Forwarded` (RFC 7239 `for=`), else
/// `X-Forwarded-For`, else `X-Real-IP` are walked right to left, and the first hop that is not
/// itself a trusted proxy is the client. A hop that cannot be read (`unknown`, an obfuscated
/// identifier, garbage) stops the walk at the last trusted address; when every hop is trusted,
/// the left-most one is the client. IPv4-mapped IPv6 addresses count as IPv4.
pub(crate) fn client_ip<H: ForwardingHeaders + ?Sized>(
    peer: IpAddr,
    headers: &H,
    settings: &Settings,
) -> IpAddr {
    let peer = canonical(peer);
    if !settings.is_trusted_proxy(peer) {
        return peer;
    }
    let mut hops: Vec<Option<IpAddr>> = Vec::new();
    for value in headers.values("forwarded") {
        for element in split_quoted(value, b',') {
            hops.push(forwarded_for(element));
        }
    }
    if hops.is_empty() {
        for value in headers.values("x-forwarded-for") {
            hops.extend(value.split(|&b| b == b',').map(parse_node));
        }
    }
    if hops.is_empty()
        && let Some(value) = headers.values("x-real-ip").first().copied()
    {
        hops.push(parse_node(value));
    }
    let mut client = peer;
    for hop in hops.iter().rev() {
        let Some(ip) = hop else {
            return client;
        };
        client = canonical(*ip);
        if !settings.is_trusted_proxy(client) {
            return client;
        }
    }
    client
}

/// The bucket of a client address, as written into keys: an IPv4 address as itself, an IPv6
/// address as its network of `settings.ipv6_prefix` bits (`2001:db8:1:2::/64`).
pub(crate) fn bucket(ip: IpAddr, settings: &Settings) -> String {
    match canonical(ip) {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) if settings.ipv6_prefix >= 128 => v6.to_string(),
        IpAddr::V6(v6) => IpNet::new(IpAddr::V6(v6), settings.ipv6_prefix)
            .map_or_else(|| v6.to_string(), |net| net.to_string()),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RateLimiter;

    fn settings(proxies: &[&str], v6: u8) -> Settings {
        RateLimiter::builder()
            .trusted_proxies(proxies.iter().copied())
            .ipv6_prefix(v6)
            .build_lazy()
            .unwrap()
            .settings()
            .clone()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn resolve(peer: &str, headers: &[(&str, &[u8])], s: &Settings) -> IpAddr {
        client_ip(ip(peer), headers, s)
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_the_headers_say() {
        let s = settings(&[], 64);
        let spoof: &[(&str, &[u8])] = &[
            ("x-forwarded-for", b"1.2.3.4"),
            ("forwarded", b"for=5.6.7.8"),
            ("x-real-ip", b"9.9.9.9"),
        ];
        assert_eq!(resolve("10.0.0.1", spoof, &s), ip("10.0.0.1"));
        let s = settings(&["10.0.0.0/8"], 64);
        assert_eq!(resolve("192.0.2.1", spoof, &s), ip("192.0.2.1"));
    }

    #[test]
    fn from_a_trusted_peer_the_right_most_untrusted_hop_is_the_client() {
        let s = settings(&["10.0.0.0/8", "fd00::/8"], 64);
        let xff: &[(&str, &[u8])] = &[("X-Forwarded-For", b"6.6.6.6, 1.2.3.4, 10.1.1.1")];
        assert_eq!(resolve("10.0.0.1", xff, &s), ip("1.2.3.4"));
        // Several header lines are one list, in order.
        let lines: &[(&str, &[u8])] = &[
            ("x-forwarded-for", b"6.6.6.6"),
            ("x-forwarded-for", b"1.2.3.4, 10.9.9.9"),
        ];
        assert_eq!(resolve("10.0.0.1", lines, &s), ip("1.2.3.4"));
        // Every hop trusted: the left-most is the client.
        let all: &[(&str, &[u8])] = &[("x-forwarded-for", b"10.3.3.3, 10.2.2.2")];
        assert_eq!(resolve("10.0.0.1", all, &s), ip("10.3.3.3"));
        // Garbage written by a trusted hop stops the walk at the last trusted address.
        let bad: &[(&str, &[u8])] = &[("x-forwarded-for", b"1.2.3.4, nonsense, 10.2.2.2")];
        assert_eq!(resolve("10.0.0.1", bad, &s), ip("10.2.2.2"));
        // No header at all: the peer.
        assert_eq!(resolve("10.0.0.1", &[], &s), ip("10.0.0.1"));
        // X-Real-IP as the last resort.
        let real: &[(&str, &[u8])] = &[("x-real-ip", b" 203.0.113.9 ")];
        assert_eq!(resolve("10.0.0.1", real, &s), ip("203.0.113.9"));
        // IPv6 peers and hops, with ports.
        let v6: &[(&str, &[u8])] = &[("x-forwarded-for", b"[2001:db8::7]:443, fd00::2")];
        assert_eq!(resolve("fd00::1", v6, &s), ip("2001:db8::7"));
    }

    #[test]
    fn forwarded_is_read_per_rfc_7239_and_wins_over_x_forwarded_for() {
        let s = settings(&["10.0.0.0/8"], 64);
        let h: &[(&str, &[u8])] = &[
            (
                "forwarded",
                b"for=6.6.6.6, For=\"[2001:db8:cafe::17]:4711\";proto=https, for=10.0.0.9",
            ),
            ("x-forwarded-for", b"7.7.7.7"),
        ];
        assert_eq!(resolve("10.0.0.1", h, &s), ip("2001:db8:cafe::17"));
        let port: &[(&str, &[u8])] = &[("forwarded", b"proto=http;for=\"192.0.2.60:8080\"")];
        assert_eq!(resolve("10.0.0.1", port, &s), ip("192.0.2.60"));
        // A quoted comma does not split an element.
        let q: &[(&str, &[u8])] = &[("forwarded", b"for=\"a,b\", for=198.51.100.3")];
        assert_eq!(resolve("10.0.0.1", q, &s), ip("198.51.100.3"));
        // `unknown` and obfuscated identifiers stop the walk.
        let unknown: &[(&str, &[u8])] = &[("forwarded", b"for=1.2.3.4, for=unknown")];
        assert_eq!(resolve("10.0.0.1", unknown, &s), ip("10.0.0.1"));
        let hidden: &[(&str, &[u8])] = &[("forwarded", b"for=_hidden;by=10.0.0.1")];
        assert_eq!(resolve("10.0.0.1", hidden, &s), ip("10.0.0.1"));
    }

    #[test]
    fn ipv4_mapped_addresses_count_as_ipv4() {
        let s = settings(&["10.0.0.0/8"], 64);
        let h: &[(&str, &[u8])] = &[("x-forwarded-for", b"::ffff:1.2.3.4")];
        assert_eq!(resolve("::ffff:10.0.0.1", h, &s), ip("1.2.3.4"));
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
    }
}
