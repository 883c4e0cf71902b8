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

    /// Issue 21, point 5: reserved characters reach the handler decoded, so their escapes are
    /// one key with them (before, `@`, `!` and `+` each doubled the buckets of a path).
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
