//! The request path as `by = "url"` keys it: one spelling per resource.
//!
//! A client can spell one path many ways: each unreserved character (`A-Z a-z 0-9 - . _ ~`) may
//! be written as itself or percent-encoded (`/search`, `/%73earch`, `/s%65arch`, …), and an
//! escape's hex digits may be upper or lower case. The frameworks route those spellings to the
//! same handler (Actix-web matches on the decoded path; Axum decodes path parameters), so a
//! limit keyed on the raw path would give each spelling a fresh bucket. The key uses the path
//! normalized as RFC 3986 (§6.2.2) says: unreserved characters decoded, the other escapes kept
//! with upper-case hex. Anything else is kept byte for byte (a malformed `%` too).

use std::borrow::Cow;

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// `path` normalized for keys: borrowed as it is when it holds no `%`.
///
/// ```
/// use ratelimit_runtime::http::normalized_path;
/// assert_eq!(normalized_path(b"/search"), &b"/search"[..]);
/// assert_eq!(normalized_path(b"/%73earch"), &b"/search"[..]);
/// assert_eq!(normalized_path(b"/a%2fb"), &b"/a%2Fb"[..]);
/// assert_eq!(normalized_path(b"/100%"), &b"/100%"[..]);
/// ```
pub fn normalized_path(path: &[u8]) -> Cow<'_, [u8]> {
    if !path.contains(&b'%') {
        return Cow::Borrowed(path);
    }
    let mut out = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        let b = path[i];
        if b == b'%'
            && let (Some(&h), Some(&l)) = (path.get(i + 1), path.get(i + 2))
            && let (Some(hv), Some(lv)) = (hex(h), hex(l))
        {
            let decoded = hv * 16 + lv;
            if unreserved(decoded) {
                out.push(decoded);
            } else {
                out.push(b'%');
                out.push(h.to_ascii_uppercase());
                out.push(l.to_ascii_uppercase());
            }
            i += 3;
            continue;
        }
        out.push(b);
        i += 1;
    }
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
        assert_eq!(&*normalized_path(b"/%zz%4"), b"/%zz%4");
    }

    proptest! {
        /// Any bytes: never a panic.
        #[test]
        fn any_bytes_normalize_without_a_panic(path in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = normalized_path(&path);
        }

        /// A path without escapes, with any of its unreserved bytes percent-encoded (in either
        /// case), normalizes back to itself: every such spelling is one key.
        #[test]
        fn encoded_unreserved_bytes_are_one_key_with_the_plain_path(
            plain in proptest::collection::vec(any::<u8>().prop_filter("no escapes", |b| *b != b'%'), 0..48),
            encode in proptest::collection::vec(any::<(bool, bool)>(), 48),
        ) {
            let mut spelled = Vec::new();
            for (i, &b) in plain.iter().enumerate() {
                let (yes, upper) = encode[i];
                if yes && unreserved(b) {
                    let esc = if upper { format!("%{b:02X}") } else { format!("%{b:02x}") };
                    spelled.extend(esc.bytes());
                } else {
                    spelled.push(b);
                }
            }
            prop_assert_eq!(&*normalized_path(&spelled), &plain[..]);
        }
    }
}
