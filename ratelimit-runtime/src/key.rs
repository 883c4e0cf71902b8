//! Store keys: `<prefix>:{<scope>:<identity>}:<suffix>`.
//!
//! The braces are a Redis Cluster hash tag, so every key of one caller in one scope lands in one
//! slot. The identity is made of caller-supplied [`Part`]s (an IP, a header value, a user id, a
//! rendered `key` template), each written as its [`Source`] followed by its value, either as
//! itself, when it is short and made of safe characters, or as the hash of itself:
//!
//! * `<source>=value` — the value as is: at most [`MAX_PLAIN_LEN`] bytes of
//!   `A-Z a-z 0-9 . _ - @ / + :`;
//! * `<source>#<32 hex digits>` — the first 128 bits of the SHA-256 of the value, for anything
//!   else.
//!
//! The source is `k` (the `key` template), `ip`, `url`, `user`, `app_id`, or `h.<name>` for a
//! header (`hx.<hex of the name>` when the name holds characters other than `a-z 0-9 _ -`). Parts
//! are joined by `|`. No source holds `= # | { }`, no written value holds any of them either,
//! and a scope (checked by [`valid_scope`]) holds none of them, so a key reads back in one way
//! only: no input can make one caller's key equal another's — in particular a header value
//! equal to an IP never lands in the per-IP bucket — braces cannot break the hash tag, and a
//! key is never longer than the prefix, scope and suffix plus the sources and 33 bytes a part.

use std::fmt::Write as _;

use sha2::{Digest, Sha256};

use crate::policy::Policy;

/// The longest caller value written as itself; longer ones are hashed.
pub const MAX_PLAIN_LEN: usize = 64;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "ratelimit";

fn is_plain_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'@' | b'/' | b'+' | b':')
}

/// Whether `scope` may name a bucket: non-empty, at most 200 bytes of
/// `A-Z a-z 0-9 _ : . - /`.
///
/// ```
/// use ratelimit_runtime::key::valid_scope;
/// assert!(valid_scope("my_app::handlers::login"));
/// assert!(!valid_scope("bad{scope}"));
/// ```
pub fn valid_scope(scope: &str) -> bool {
    !scope.is_empty()
        && scope.len() <= 200
        && scope
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b':' | b'.' | b'-' | b'/'))
}

/// Whether `prefix` may start keys: like a scope.
pub fn valid_prefix(prefix: &str) -> bool {
    valid_scope(prefix)
}

/// Where a caller-supplied part of a key comes from. Written into the key before the part's
/// value, so that equal values from different sources make different keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Source<'a> {
    /// The rendered `key` template (or fixed key) of the attribute.
    Key,
    /// The client address (`by = "ip"`), as bucketed (IPv6 by prefix).
    Ip,
    /// The request path (`by = "url"`).
    Url,
    /// The authenticated user (`by = "user"`).
    User,
    /// The `appId` header (`by = "app_id"`).
    AppId,
    /// A header (`by = "header:<name>"`); the name is lower-case.
    Header(&'a str),
}

impl Source<'_> {
    fn write_tag(self, out: &mut String) {
        match self {
            Self::Key => out.push('k'),
            Self::Ip => out.push_str("ip"),
            Self::Url => out.push_str("url"),
            Self::User => out.push_str("user"),
            Self::AppId => out.push_str("app_id"),
            Self::Header(name)
                if name
                    .bytes()
                    .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-')) =>
            {
                out.push_str("h.");
                out.push_str(name);
            }
            Self::Header(name) => {
                out.push_str("hx.");
                for b in name.bytes() {
                    let _ = write!(out, "{b:02x}");
                }
            }
        }
    }
}

/// One caller-supplied part of a key: its source and its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part<'a> {
    /// Where the value comes from.
    pub source: Source<'a>,
    /// The value, any bytes.
    pub value: &'a [u8],
}

impl<'a> Part<'a> {
    /// A part of `value` from `source`.
    pub fn new(source: Source<'a>, value: &'a [u8]) -> Self {
        Self { source, value }
    }
}

/// Appends one caller-supplied part: its source, then its value as itself or as its hash (see
/// the module docs).
fn push_part(out: &mut String, part: Part<'_>) {
    part.source.write_tag(out);
    let value = part.value;
    if value.len() <= MAX_PLAIN_LEN && value.iter().all(|&b| is_plain_byte(b)) {
        out.push('=');
        // All plain bytes are ASCII.
        out.extend(value.iter().map(|&b| char::from(b)));
    } else {
        out.push('#');
        let digest = Sha256::digest(value);
        for b in &digest[..16] {
            let _ = write!(out, "{b:02x}");
        }
    }
}

/// Builds the key of one limit for one caller.
///
/// `parts` are the caller-supplied parts (the rendered `key` template, then the `by` value);
/// an empty list is one bucket for the whole scope. The suffix names the algorithm and its
/// parameters, so two different limits stacked on one function never share a key.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_runtime::{Algorithm, Policy};
/// use ratelimit_runtime::key::{build, Part, Source};
///
/// let p = Policy::new(Algorithm::Fixed, 5, Duration::from_secs(60))?;
/// let ip = Part::new(Source::Ip, b"10.0.0.1");
/// assert_eq!(build("ratelimit", "app::login", &[ip], &p), "ratelimit:{app::login:ip=10.0.0.1}:fixed:5:60000");
/// assert_eq!(build("ratelimit", "app::login", &[], &p), "ratelimit:{app::login}:fixed:5:60000");
/// // The same value from a header is another bucket.
/// let header = Part::new(Source::Header("x-device"), b"10.0.0.1");
/// assert_ne!(build("ratelimit", "app::login", &[header], &p), build("ratelimit", "app::login", &[ip], &p));
/// let braces = build("ratelimit", "app::login", &[Part::new(Source::Key, b"}{")], &p);
/// assert_eq!(braces.matches('{').count(), 1);
/// # Ok::<(), ratelimit_runtime::PolicyError>(())
/// ```
pub fn build(prefix: &str, scope: &str, parts: &[Part<'_>], policy: &Policy) -> String {
    let mut key = String::with_capacity(prefix.len() + scope.len() + 40 + parts.len() * 40);
    key.push_str(prefix);
    key.push_str(":{");
    key.push_str(scope);
    for (i, part) in parts.iter().enumerate() {
        key.push(if i == 0 { ':' } else { '|' });
        push_part(&mut key, *part);
    }
    key.push_str("}:");
    key.push_str(policy.algorithm().as_str());
    let _ = write!(key, ":{}:{}", policy.limit(), policy.period_ms());
    if policy.burst() != policy.limit() {
        let _ = write!(key, ":b{}", policy.burst());
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Algorithm;
    use proptest::prelude::*;
    use std::time::Duration;

    fn policy() -> Policy {
        Policy::new(Algorithm::Sliding, 3, Duration::from_secs(10)).unwrap()
    }

    /// How a part reads back from a key: its source tag and its value, or the hash of it.
    #[derive(Debug, PartialEq, Eq)]
    enum Written {
        Plain(String, Vec<u8>),
        Hashed(String, String),
    }

    /// Reads a key back into its scope and parts, failing on anything ambiguous: the inverse of
    /// `build`, so two inputs that read back differently can never share a key.
    fn read_back(key: &str) -> (String, Vec<Written>) {
        let open = key.find('{').expect("an opening brace");
        let close = key.find('}').expect("a closing brace");
        assert_eq!(key.matches('{').count(), 1, "{key}");
        assert_eq!(key.matches('}').count(), 1, "{key}");
        let inside = &key[open + 1..close];
        let Some(marker) = inside.find(['=', '#']) else {
            assert!(!inside.contains('|'), "{key}");
            return (inside.to_owned(), Vec::new());
        };
        let colon = inside[..marker].rfind(':').expect("scope:part");
        let scope = inside[..colon].to_owned();
        let parts = inside[colon + 1..]
            .split('|')
            .map(|part| {
                let at = part.find(['=', '#']).expect("a marker in every part");
                let (tag, rest) = (part[..at].to_owned(), &part[at + 1..]);
                assert!(!tag.contains(':'), "{key}");
                if part.as_bytes()[at] == b'=' {
                    Written::Plain(tag, rest.as_bytes().to_vec())
                } else {
                    assert_eq!(rest.len(), 32, "{key}");
                    Written::Hashed(tag, rest.to_owned())
                }
            })
            .collect();
        (scope, parts)
    }

    fn tag(source: Source<'_>) -> String {
        let mut out = String::new();
        source.write_tag(&mut out);
        out
    }

    fn expected(part: &Part<'_>) -> Written {
        let plain =
            part.value.len() <= MAX_PLAIN_LEN && part.value.iter().all(|&b| is_plain_byte(b));
        if plain {
            Written::Plain(tag(part.source), part.value.to_vec())
        } else {
            let digest = Sha256::digest(part.value);
            let mut hex = String::new();
            for b in &digest[..16] {
                let _ = write!(hex, "{b:02x}");
            }
            Written::Hashed(tag(part.source), hex)
        }
    }

    const HEADER_NAME_BYTES: &str = "abcxyz0189-_!#$%&'*+.^`|~";

    fn source() -> impl Strategy<Value = Source<'static>> {
        let header = proptest::collection::vec(
            proptest::sample::select(HEADER_NAME_BYTES.as_bytes().to_vec()),
            1..12,
        )
        .prop_map(|name| {
            Source::Header(Box::leak(String::from_utf8(name).unwrap().into_boxed_str()))
        });
        prop_oneof![
            Just(Source::Key),
            Just(Source::Ip),
            Just(Source::Url),
            Just(Source::User),
            Just(Source::AppId),
            header,
        ]
    }

    fn value() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            // Values that look like keys, IPs, other sources' tags and markers.
            proptest::collection::vec(
                proptest::sample::select(b"ab1.:=#|{}h-x_@/+".to_vec()),
                0..80
            ),
            proptest::collection::vec(any::<u8>(), 0..200),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Any bytes, any sources: never a panic, one hash tag, and the key reads back to
        /// exactly the (source, value) pairs it was built from, so it is injective.
        #[test]
        fn keys_read_back_to_their_sources_and_values(
            scope in "[a-z:_]{1,8}(::[a-z]{1,6})?",
            parts in proptest::collection::vec((source(), value()), 0..4),
        ) {
            let parts: Vec<Part<'_>> = parts.iter().map(|(s, v)| Part::new(*s, v)).collect();
            let key = build("rl", &scope, &parts, &policy());
            let (read_scope, read_parts) = read_back(&key);
            prop_assert_eq!(read_scope, scope);
            let want: Vec<Written> = parts.iter().map(expected).collect();
            prop_assert_eq!(read_parts, want);
            prop_assert!(key.len() <= 2 + 20 + 40 + parts.len() * (4 + 26 + 34 + MAX_PLAIN_LEN), "{}", key);
        }
    }

    #[test]
    fn one_value_from_different_sources_makes_different_keys() {
        let p = policy();
        let sources = [
            Source::Key,
            Source::Ip,
            Source::Url,
            Source::User,
            Source::AppId,
            Source::Header("x-device"),
            Source::Header("x-devic"),
            Source::Header("x|device"),
            Source::Header("ip"),
        ];
        let mut seen = std::collections::HashSet::new();
        for source in sources {
            for value in [&b"203.0.113.7"[..], &[b'a'; 200]] {
                assert!(seen.insert(build("rl", "s", &[Part::new(source, value)], &p)));
            }
        }
    }

    #[test]
    fn long_and_unusual_values_are_hashed_and_bounded() {
        let p = policy();
        let long = vec![b'a'; 10 * 1024];
        let k = build("rl", "s", &[Part::new(Source::Header("x-k"), &long)], &p);
        assert!(k.len() < 80, "{k}");
        assert!(k.contains("{s:h.x-k#"), "{k}");
    }
}
