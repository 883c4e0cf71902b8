//! The request path as `by = "url"` keys it: one spelling per resource.
//!
//! A client can spell one path many ways: any character may be percent-encoded (`/search`,
//! `/%73earch`; `/users/alice@example.com`, `/users/alice%40example.com`), and an escape's hex
//! digits may be upper or lower case. The frameworks hand a handler the same thing for those
//! spellings — Axum's and Actix-web's `Path` extractors decode every escape of a parameter, and
//! Actix-web routes on the decoded path — so a limit keyed on the raw path would give each
//! spelling a fresh bucket (k encodable characters, 2^k buckets). The key decodes every escape
//! the routers decode, including reserved characters (`%40` is `@`, `%21` is `!`, `%2B` is `+`:
//! a path's `+` is a plus, never a space), with two exceptions kept as upper-case escapes:
//!
//! * `%2F`: a `/` that is not a segment boundary. `/users/a%2Fb` reaches `/users/{id}` with
//!   `a/b`, while `/users/a/b` is another route; both routers keep it apart. (A catch-all
//!   parameter — Axum's `{*rest}`, Actix-web's `{tail}*` — yields `a/b` for both spellings,
//!   which stay two buckets: the one case where the key is finer than the parameter.)
//! * `%25`: a literal `%`, kept encoded so that the key never shows an escape that was not one
//!   (`%2541` is the parameter `%41`, not `A`). A `%` that does not start an escape is a
//!   literal `%` to both routers, so it is written `%25` too: `/100%` and `/100%25` are one key.
//!
//! Decoded bytes that are not UTF-8 are replaced as Actix-web replaces them (U+FFFD for each
//! invalid sequence); Axum refuses such parameters (400) before the handler runs. (Actix-web
//! decodes a parameter twice — once to route, once in `Path` — so a literal `%` followed by an
//! escape of a hex digit, `%%34%31`, yields one more decoded character there than in Axum: the
//! key follows Axum's single decoding.)

use std::borrow::Cow;

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// `path` normalized for keys: borrowed as it is when it holds no `%`.
///
/// ```
/// use ratelimit_runtime::http::normalized_path;
/// assert_eq!(normalized_path(b"/search"), &b"/search"[..]);
/// assert_eq!(normalized_path(b"/%73earch"), &b"/search"[..]);
/// assert_eq!(normalized_path(b"/users/alice%40example.com"), &b"/users/alice@example.com"[..]);
/// assert_eq!(normalized_path(b"/a%2Bb%21"), &b"/a+b!"[..]);
/// assert_eq!(normalized_path(b"/a%2fb"), &b"/a%2Fb"[..]);
/// assert_eq!(normalized_path(b"/100%"), &b"/100%25"[..]);
/// assert_eq!(normalized_path(b"/100%25"), &b"/100%25"[..]);
/// ```
pub fn normalized_path(path: &[u8]) -> Cow<'_, [u8]> {
    if !path.contains(&b'%') {
        return Cow::Borrowed(path);
    }
    let mut out = Vec::with_capacity(path.len() + 2);
    let mut i = 0;
    while i < path.len() {
        let b = path[i];
        if b != b'%' {
            out.push(b);
            i += 1;
            continue;
        }
        let escape = match (path.get(i + 1), path.get(i + 2)) {
            (Some(&h), Some(&l)) => hex(h).zip(hex(l)).map(|(h, l)| h * 16 + l),
            _ => None,
        };
        match escape {
            Some(b'/') => out.extend_from_slice(b"%2F"),
            Some(b'%') | None => out.extend_from_slice(b"%25"),
            Some(decoded) => out.push(decoded),
        }
        i += if escape.is_some() { 3 } else { 1 };
    }
    match String::from_utf8_lossy(&out) {
        Cow::Borrowed(_) => Cow::Owned(out),
        Cow::Owned(replaced) => Cow::Owned(replaced.into_bytes()),
    }
}

/// The forms of one request path that a route ([`crate::RateLimitLayer`]'s `.path(…)`) is
/// matched against: every spelling that some server, proxy or router on the way may take for
/// the same resource. A limit's `.path(…)` applies when **any** form matches (an odd spelling
/// is limited, perhaps twice, never skipped); its `.except_path(…)` leaves a request out only
/// when **every** form matches, so that an exception is never wider than the path it names.
#[derive(Debug)]
pub(crate) struct RouteForms<'p> {
    /// The path as the client sent it (no query).
    pub(crate) raw: &'p str,
    /// The path as `by = "url"` keys it ([`normalized_path`]).
    pub(crate) decoded: Cow<'p, str>,
    /// The path reduced as far as any common stack reduces it ([`route_path`]).
    pub(crate) canonical: Cow<'p, str>,
}

impl<'p> RouteForms<'p> {
    /// The forms of `raw`, the path without its query (nothing allocated for a path that is
    /// already canonical: lower-case, no escape, no empty or dot segment, no trailing `/`).
    pub(crate) fn of(raw: &'p str) -> Self {
        let decoded = match normalized_path(raw.as_bytes()) {
            Cow::Borrowed(_) => Cow::Borrowed(raw),
            Cow::Owned(bytes) => Cow::Owned(
                String::from_utf8(bytes)
                    .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
            ),
        };
        let canonical = match &decoded {
            Cow::Borrowed(text) => route_path(text),
            Cow::Owned(text) => Cow::Owned(route_path(text).into_owned()),
        };
        Self {
            raw,
            decoded,
            canonical,
        }
    }

    /// The three forms.
    pub(crate) fn all(&self) -> [&str; 3] {
        [self.raw, &self.decoded, &self.canonical]
    }
}

/// Whether `path` is already as [`route_path`] writes it.
fn is_canonical_route(path: &str) -> bool {
    let bytes = path.as_bytes();
    if bytes.first() != Some(&b'/') {
        return false;
    }
    if bytes
        .iter()
        .any(|b| matches!(b, b'%' | b'\\' | b';') || b.is_ascii_uppercase())
    {
        return false;
    }
    if path.len() > 1 && path.ends_with('/') {
        return false;
    }
    path.len() == 1
        || path[1..]
            .split('/')
            .all(|segment| !matches!(segment, "" | "." | ".."))
}

/// Decodes every valid escape of `bytes` once (`%2F` and `%25` too); `None` when it has none.
fn decode_once(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut decoded = false;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let (Some(&h), Some(&l)) = (bytes.get(i + 1), bytes.get(i + 2))
            && let (Some(h), Some(l)) = (hex(h), hex(l))
        {
            out.push(h * 16 + l);
            decoded = true;
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    decoded.then_some(out)
}

/// `path` (as [`normalized_path`] wrote it) reduced to one spelling per route, for matching
/// the layer's `.path(…)` patterns, never for keys. Every step is one that some server,
/// proxy or framework takes, so that no spelling of a limited route escapes its limit:
///
/// 1. every escape decoded, `%2F` and `%25` included, and again while escapes remain (a
///    double-encoded `%2569` is `i`), up to eight rounds (no stack decodes more);
/// 2. `\` read as `/` (as IIS does);
/// 3. each segment cut at its first `;` (path parameters, `/login;jsessionid=…`; `..;` is
///    `..`, as Tomcat reads it);
/// 4. empty and `.` segments dropped (`//login`, `/./login`, `/login/`), `..` removing the
///    segment before it (RFC 3986 dot-segment removal; never above the root);
/// 5. ASCII letters lower-cased (`/LOGIN`).
///
/// Borrowed when `path` is already in that form (the common case: no allocation).
///
/// ```text
/// /LOGIN, //login, /login/, /log%69n, /log%2569n, /login;x, /x/../login, /%2E/login → /login
/// ```
pub(crate) fn route_path(path: &str) -> Cow<'_, str> {
    if is_canonical_route(path) {
        return Cow::Borrowed(path);
    }
    let mut bytes = path.as_bytes().to_vec();
    for _ in 0..8 {
        match decode_once(&bytes) {
            Some(next) => bytes = next,
            None => break,
        }
    }
    let text = String::from_utf8_lossy(&bytes);
    let mut segments: Vec<&str> = Vec::new();
    for segment in text.split(['/', '\\']) {
        let segment = segment.split(';').next().unwrap_or_default();
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(text.len() + 1);
    for segment in segments {
        out.push('/');
        out.push_str(segment);
    }
    if out.is_empty() {
        out.push('/');
    }
    out.make_ascii_lowercase();
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_spelling_of_one_path_is_one_key() {
        let plain = normalized_path(b"/files/report").into_owned();
        for spelling in [
            &b"/files/%72eport"[..],
            b"/files/r%65port",
            b"/%66iles/%72%65port",
            b"/fil%65s/repor%74",
            b"/files/%72%45port".as_slice(),
        ] {
            let n = normalized_path(spelling);
            if spelling == b"/files/%72%45port" {
                // %45 is `E`: another path (paths are case-sensitive).
                assert_eq!(&*n, b"/files/rEport");
            } else {
                assert_eq!(&*n, &plain[..], "{}", String::from_utf8_lossy(spelling));
            }
        }
        assert_eq!(&*normalized_path(b"/a%2fb"), b"/a%2Fb");
        assert_eq!(&*normalized_path(b"/a%2Fb"), b"/a%2Fb");
        assert_eq!(&*normalized_path(b"/%zz%4"), b"/%25zz%254");
    }

    /// Reserved characters reach the handler decoded, so their escapes are one key with them
    /// (`@`, `!` and `+` escaped or not never double the buckets of a path).
    #[test]
    fn reserved_characters_are_one_key_with_their_escapes() {
        for (plain, spellings) in [
            (
                &b"/users/alice@example.com"[..],
                &[
                    &b"/users/alice%40example.com"[..],
                    b"/users/alice%40example%2ecom",
                ][..],
            ),
            (b"/users/hi!", &[b"/users/hi%21"]),
            (b"/users/a+b", &[b"/users/a%2Bb", b"/users/a%2bb"]),
            (b"/users/a b", &[b"/users/a%20b"]),
            (
                b"/users/caf\xc3\xa9",
                &[b"/users/caf%C3%A9", b"/users/caf%c3%a9"],
            ),
            (b"/users/100%25", &[b"/users/100%", b"/users/100%25"]),
        ] {
            for spelling in spellings {
                let key = normalized_path(spelling);
                assert_eq!(
                    &*key,
                    &*normalized_path(plain),
                    "{}",
                    String::from_utf8_lossy(spelling)
                );
            }
        }
        // Kept apart: a `/` inside a segment, and an escaped `%` from the escape it spells.
        assert_ne!(normalized_path(b"/a%2Fb"), normalized_path(b"/a/b"));
        assert_ne!(normalized_path(b"/%2541"), normalized_path(b"/%41"));
        // Invalid UTF-8 as Actix-web reads it: one replacement character.
        assert_eq!(&*normalized_path(b"/%FF"), "/\u{fffd}".as_bytes());
    }

    #[test]
    fn route_paths_reduce_every_spelling_of_one_route() {
        for spelling in [
            "/login",
            "/LOGIN",
            "/Login",
            "//login",
            "/login/",
            "/login//",
            "/log%69n",
            "/log%2569n",
            "/%6c%6F%67%69%6E",
            "/login;x",
            "/login;jsessionid=1/",
            "/x/../login",
            "/x/..;/login",
            "/%2E/login",
            "/./login",
            "/a/b/%2e%2e/%2E%2E/login",
            "/../login",
            "\\login",
            "/x%2F..%2Flogin",
            "/x%252F..%252Flogin",
        ] {
            let decoded = normalized_path(spelling.as_bytes());
            let decoded = std::str::from_utf8(&decoded).unwrap();
            assert_eq!(route_path(decoded), "/login", "{spelling}");
        }
        assert!(matches!(route_path("/login"), Cow::Borrowed(_)));
        assert!(matches!(route_path("/"), Cow::Borrowed(_)));
        assert!(matches!(route_path("/api/v1/users"), Cow::Borrowed(_)));
        assert_eq!(route_path(""), "/");
        assert_eq!(route_path("*"), "/*");
        assert_eq!(route_path("/.."), "/");
        assert_eq!(route_path("/login.json"), "/login.json");
        assert_eq!(route_path("/caf\u{e9}"), "/caf\u{e9}");
        let forms = RouteForms::of("/log%69n/");
        assert_eq!(forms.all(), ["/log%69n/", "/login/", "/login"]);
        let forms = RouteForms::of("/login");
        assert!(matches!(forms.decoded, Cow::Borrowed(_)));
        assert!(matches!(forms.canonical, Cow::Borrowed(_)));
    }

    proptest! {
        /// Any bytes: never a panic; the key is UTF-8 and holds no `%` that is not `%2F` or
        /// `%25`; normalizing twice changes nothing.
        #[test]
        fn any_bytes_normalize_without_a_panic(path in proptest::collection::vec(any::<u8>(), 0..64)) {
            let key = normalized_path(&path);
            if path.contains(&b'%') {
                let text = std::str::from_utf8(&key);
                prop_assert!(text.is_ok());
                let text = text.unwrap_or_default();
                for (i, _) in text.match_indices('%') {
                    prop_assert!(matches!(&text[i..], t if t.starts_with("%2F") || t.starts_with("%25")), "{text}");
                }
                prop_assert_eq!(&*normalized_path(&key), &*key);
            }
        }

        /// Any path: never a panic; the route form starts with `/` and has no empty or dot
        /// segment; reducing it again changes nothing (unless escapes nested past eight
        /// rounds remain).
        #[test]
        fn any_path_reduces_to_a_stable_route(path in "[/a-zA-Z.;%2-5F\\\\]{0,24}") {
            let forms = RouteForms::of(&path);
            let route = &*forms.canonical;
            prop_assert!(route.starts_with('/'));
            prop_assert!(route.len() == 1 || route[1..].split('/').all(|s| !matches!(s, "" | "." | "..")));
            if !route.contains('%') {
                prop_assert_eq!(&*route_path(route), route);
            }
        }

        /// A path without escapes, with any of its bytes but `/` percent-encoded (in either
        /// case), normalizes back to itself: every such spelling is one key.
        #[test]
        fn encoded_bytes_are_one_key_with_the_plain_path(
            plain in "[a-zA-Z0-9._~!$&'()*+,;=:@ /é-]{0,32}",
            encode in proptest::collection::vec(any::<(bool, bool)>(), 64),
        ) {
            let mut spelled = Vec::new();
            for (i, &b) in plain.as_bytes().iter().enumerate() {
                let (yes, upper) = encode[i];
                if yes && b != b'/' {
                    let esc = if upper { format!("%{b:02X}") } else { format!("%{b:02x}") };
                    spelled.extend(esc.bytes());
                } else {
                    spelled.push(b);
                }
            }
            prop_assert_eq!(&*normalized_path(&spelled), plain.as_bytes());
        }
    }
}
