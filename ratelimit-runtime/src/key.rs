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
//! key is never longer than the prefix, scope and suffix plus the sources and 65 bytes a part
//! (a plain value of [`MAX_PLAIN_LEN`] bytes after its `=`).
//!
//! # The suffix
//!
//! The suffix names the policy, so that two different limits (stacked on one function, or one
//! limit changed between two deployments) never share a key: `<num><algorithm><period>`, then
//! `b<burst>` when the burst is not `num`.
//!
//! * `num` and `burst` in decimal, without leading zeros (both are at least 1);
//! * the algorithm as one letter: `f` fixed, `s` sliding, `l` leaky, `t` token, `g` gcra, `c`
//!   sliding counter, `n` concurrency;
//! * the period as a count and a unit, the largest of `d` (day), `h`, `m` (minute), `s` and
//!   `ms` that divides it exactly; the count in decimal, left out when it is 1.
//!
//! | limit | suffix |
//! | --- | --- |
//! | fixed, 100 a day | `100fd` |
//! | sliding, 3 per 10 s | `3s10s` |
//! | token, 10 a minute, burst 20 | `10tmb20` |
//! | leaky, 5 per 1,500 ms | `5l1500ms` |
//!
//! **Why it is injective.** The suffix reads back to exactly one policy: the digits before the
//! first letter are `num` (never empty: `num ≥ 1`); that letter is the algorithm (seven letters,
//! seven algorithms); the digits after it are the count (1 when there are none), and the letters
//! after them, up to a `b` or the end, the unit (`d h m s ms`, none of which is or holds `b`); the
//! digits after a `b` are the burst, and without one the burst is `num`. The period is the count
//! times the unit. Reading back gives the policy it was built from, so two policies that differ
//! in algorithm, `num`, period or burst never write the same suffix. (Each period is written one
//! way only — the largest exact unit, a count of 1 left out — so one policy always writes the
//! same suffix.) The suffix holds no `{ } :`, so it cannot touch the hash tag, and a key has
//! exactly one `:` after its `}`: the stores' own keys derived from a key (`<key>:b` for a
//! block, `<key>:w`, `<key>:r:…` for receipts) have two or more, so no limit's key is ever
//! another's derived key.

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
    fn write_tag(self, out: &mut Vec<u8>) {
        match self {
            Self::Key => out.push(b'k'),
            Self::Ip => out.extend_from_slice(b"ip"),
            Self::Url => out.extend_from_slice(b"url"),
            Self::User => out.extend_from_slice(b"user"),
            Self::AppId => out.extend_from_slice(b"app_id"),
            Self::Header(name)
                if name
                    .bytes()
                    .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-')) =>
            {
                out.extend_from_slice(b"h.");
                out.extend_from_slice(name.as_bytes());
            }
            Self::Header(name) => {
                out.extend_from_slice(b"hx.");
                push_hex(out, name.as_bytes());
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
fn push_part(out: &mut Vec<u8>, part: Part<'_>) {
    part.source.write_tag(out);
    let value = part.value;
    if value.len() <= MAX_PLAIN_LEN && value.iter().all(|&b| is_plain_byte(b)) {
        out.push(b'=');
        out.extend_from_slice(value);
    } else {
        out.push(b'#');
        push_hex(out, &Sha256::digest(value)[..16]);
    }
}

/// Appends `bytes` as lower-case hex digits.
fn push_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for &b in bytes {
        out.push(DIGITS[usize::from(b >> 4)]);
        out.push(DIGITS[usize::from(b & 15)]);
    }
}

/// Appends `n` in decimal, without `core::fmt` and without validating digits as UTF-8 (header
/// values are built per request).
pub(crate) fn push_decimal(out: &mut String, n: u64) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// Builds the key of one limit for one caller.
///
/// `parts` are the caller-supplied parts (the rendered `key` template, then the `by` value);
/// an empty list is one bucket for the whole scope. The suffix names the algorithm and its
/// parameters (see [the module docs](self)), so two different limits stacked on one function
/// never share a key.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_runtime::{Algorithm, Policy};
/// use ratelimit_runtime::key::{build, Part, Source};
///
/// let p = Policy::new(Algorithm::Fixed, 5, Duration::from_secs(60))?;
/// let ip = Part::new(Source::Ip, b"10.0.0.1");
/// assert_eq!(build("ratelimit", "app::login", &[ip], &p), "ratelimit:{app::login:ip=10.0.0.1}:5fm");
/// assert_eq!(build("ratelimit", "app::login", &[], &p), "ratelimit:{app::login}:5fm");
/// let daily = Policy::new(Algorithm::Token, 100, Duration::from_secs(86_400))?.with_burst(20)?;
/// assert_eq!(build("ratelimit", "app::login", &[ip], &daily), "ratelimit:{app::login:ip=10.0.0.1}:100tdb20");
/// // The same value from a header is another bucket.
/// let header = Part::new(Source::Header("x-device"), b"10.0.0.1");
/// assert_ne!(build("ratelimit", "app::login", &[header], &p), build("ratelimit", "app::login", &[ip], &p));
/// let braces = build("ratelimit", "app::login", &[Part::new(Source::Key, b"}{")], &p);
/// assert_eq!(braces.matches('{').count(), 1);
/// # Ok::<(), ratelimit_runtime::PolicyError>(())
/// ```
pub fn build(prefix: &str, scope: &str, parts: &[Part<'_>], policy: &Policy) -> String {
    let suffix = policy.key_suffix();
    let mut key =
        Vec::with_capacity(prefix.len() + scope.len() + 4 + suffix.len() + parts.len() * 40);
    key.extend_from_slice(prefix.as_bytes());
    key.extend_from_slice(b":{");
    key.extend_from_slice(scope.as_bytes());
    for (i, part) in parts.iter().enumerate() {
        key.push(if i == 0 { b':' } else { b'|' });
        push_part(&mut key, *part);
    }
    key.extend_from_slice(b"}:");
    key.extend_from_slice(suffix);
    // Text by construction: the prefix, the scope and a header's name are text, and the rest
    // is ASCII (plain values, hex digits, the suffix). Checked once, for the whole key; were it
    // not text, each byte would be read as its own character (Latin-1), which keeps distinct
    // keys distinct where a lossy reading would merge them.
    String::from_utf8(key).unwrap_or_else(|e| e.into_bytes().into_iter().map(char::from).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::policy::key_suffix::{KeySuffix, PERIOD_UNITS};
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

    /// What a suffix reads back to: algorithm, `num`, period in ms, burst.
    type Read = (Algorithm, u64, u64, u64);

    /// Reads a suffix back by the grammar of the module docs, failing on anything else.
    fn read_suffix(suffix: &str) -> Read {
        let number = |digits: &str| -> u64 {
            assert!(!digits.starts_with('0'), "a leading zero in {suffix}");
            digits.parse().expect("digits")
        };
        let letter = suffix
            .find(|c: char| !c.is_ascii_digit())
            .expect("a letter");
        let num = number(&suffix[..letter]);
        let algorithm = match &suffix[letter..=letter] {
            "f" => Algorithm::Fixed,
            "s" => Algorithm::Sliding,
            "l" => Algorithm::Leaky,
            "t" => Algorithm::Token,
            "g" => Algorithm::Gcra,
            "c" => Algorithm::SlidingCounter,
            "n" => Algorithm::Concurrency,
            other => panic!("no algorithm {other} in {suffix}"),
        };
        let rest = &suffix[letter + 1..];
        let unit_at = rest.find(|c: char| !c.is_ascii_digit()).expect("a unit");
        let count = if unit_at == 0 {
            1
        } else {
            let count = number(&rest[..unit_at]);
            assert_ne!(count, 1, "a count of 1 is left out: {suffix}");
            count
        };
        let (unit, burst) = match rest[unit_at..].split_once('b') {
            Some((unit, burst)) => (unit, Some(number(burst))),
            None => (&rest[unit_at..], None),
        };
        let ms = match unit {
            "d" => 86_400_000,
            "h" => 3_600_000,
            "m" => 60_000,
            "s" => 1_000,
            "ms" => 1,
            other => panic!("no unit {other} in {suffix}"),
        };
        assert!(
            PERIOD_UNITS
                .iter()
                .take_while(|&&(u, _)| u != unit)
                .all(|&(_, larger)| !(count * ms).is_multiple_of(larger)),
            "not the largest exact unit: {suffix}"
        );
        assert_ne!(
            burst,
            Some(num),
            "a burst equal to num is left out: {suffix}"
        );
        (algorithm, num, count * ms, burst.unwrap_or(num))
    }

    /// Reads a key back into its scope, parts and policy, failing on anything ambiguous: the
    /// inverse of `build`, so two inputs that read back differently can never share a key.
    fn read_back(key: &str) -> (String, Vec<Written>, Read) {
        let open = key.find('{').expect("an opening brace");
        let close = key.find('}').expect("a closing brace");
        assert_eq!(key.matches('{').count(), 1, "{key}");
        assert_eq!(key.matches('}').count(), 1, "{key}");
        let suffix = key[close + 1..].strip_prefix(':').expect("}:");
        assert!(!suffix.contains(':'), "one colon after the tag: {key}");
        let policy = read_suffix(suffix);
        let inside = &key[open + 1..close];
        let Some(marker) = inside.find(['=', '#']) else {
            assert!(!inside.contains('|'), "{key}");
            return (inside.to_owned(), Vec::new(), policy);
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
        (scope, parts, policy)
    }

    fn tag(source: Source<'_>) -> String {
        let mut out = Vec::new();
        source.write_tag(&mut out);
        String::from_utf8(out).unwrap()
    }

    fn expected(part: &Part<'_>) -> Written {
        let plain =
            part.value.len() <= MAX_PLAIN_LEN && part.value.iter().all(|&b| is_plain_byte(b));
        if plain {
            Written::Plain(tag(part.source), part.value.to_vec())
        } else {
            let digest = Sha256::digest(part.value);
            let hex = digest[..16].iter().fold(String::new(), |mut hex, b| {
                use std::fmt::Write as _;
                let _ = write!(hex, "{b:02x}");
                hex
            });
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

    /// A number of units: small ones, round ones and the largest the policies take.
    fn units() -> impl Strategy<Value = u64> {
        prop_oneof![
            1..=20u64,
            proptest::sample::select(vec![99, 100, 1000, 3600, 86_400, 1_000_000_000]),
            1..=crate::policy::MAX_UNITS,
        ]
    }

    /// A period in ms: whole units and counts near the unit boundaries, and any period.
    fn period_ms() -> impl Strategy<Value = u64> {
        let unit = proptest::sample::select(vec![1u64, 1_000, 60_000, 3_600_000, 86_400_000]);
        prop_oneof![
            (unit, 1..=120u64).prop_map(|(u, n)| u * n),
            (1..=3u64, 0..=2u64).prop_map(|(n, d)| 86_400_000 * n - d),
            1..=crate::policy::rules::MAX_PERIOD_MS,
        ]
    }

    /// Any policy the rules accept.
    fn any_policy() -> impl Strategy<Value = Policy> {
        (
            proptest::sample::select(Algorithm::ALL.to_vec()),
            units(),
            period_ms(),
            prop_oneof![Just(None), units().prop_map(Some)],
        )
            .prop_filter_map("a policy the rules accept", |(a, num, ms, burst)| {
                Policy::from_parts(a, num, ms, burst.unwrap_or(num), 1).ok()
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Any bytes, any sources, any policy: never a panic, one hash tag, and the key reads
        /// back to exactly the (source, value) pairs and the policy (algorithm, `num`, period,
        /// burst) it was built from, so it is injective.
        #[test]
        fn keys_read_back_to_their_sources_values_and_policy(
            scope in "[a-z:_]{1,8}(::[a-z]{1,6})?",
            parts in proptest::collection::vec((source(), value()), 0..4),
            policy in any_policy(),
        ) {
            let parts: Vec<Part<'_>> = parts.iter().map(|(s, v)| Part::new(*s, v)).collect();
            let key = build("rl", &scope, &parts, &policy);
            let (read_scope, read_parts, read_policy) = read_back(&key);
            prop_assert_eq!(read_scope, scope);
            let want: Vec<Written> = parts.iter().map(expected).collect();
            prop_assert_eq!(read_parts, want);
            prop_assert_eq!(
                read_policy,
                (policy.algorithm(), policy.limit(), policy.period_ms(), policy.burst())
            );
            // num (16 digits), letter, count (13 digits) and unit, burst: at most 49 bytes.
            prop_assert!(key.len() <= 2 + 20 + 2 + 49 + parts.len() * (4 + 26 + 34 + MAX_PLAIN_LEN), "{}", key);
        }

        /// Two policies write the same suffix only when they are the same limit.
        #[test]
        fn different_policies_never_share_a_suffix(a in any_policy(), b in any_policy()) {
            let (ka, kb) = (build("rl", "s", &[], &a), build("rl", "s", &[], &b));
            let same = (a.algorithm(), a.limit(), a.period_ms(), a.burst())
                == (b.algorithm(), b.limit(), b.period_ms(), b.burst());
            prop_assert_eq!(ka == kb, same, "{} {}", ka, kb);
        }
    }

    #[test]
    fn decimals_are_display() {
        let mut out = String::from("x");
        for exponent in 0..=18 {
            let n = 10u64.pow(exponent);
            for m in [n - 1, n, n + 1, n * 9, n * 10 - 1, n * 10 + 7] {
                out.truncate(1);
                push_decimal(&mut out, m);
                assert_eq!(out, format!("x{m}"));
            }
        }
        out.truncate(1);
        push_decimal(&mut out, u64::MAX);
        assert_eq!(out, format!("x{}", u64::MAX));
    }

    #[test]
    fn suffixes_are_short_and_read_as_documented() {
        let p = |a, num, ms, burst| Policy::from_parts(a, num, ms, burst, 1).unwrap();
        let cases = [
            (p(Algorithm::Fixed, 100, 86_400_000, 100), "100fd"),
            (p(Algorithm::Sliding, 3, 10_000, 3), "3s10s"),
            (p(Algorithm::Token, 10, 60_000, 20), "10tmb20"),
            (p(Algorithm::Leaky, 5, 1_500, 5), "5l1500ms"),
            (p(Algorithm::Gcra, 1, 1, 1), "1gms"),
            (p(Algorithm::SlidingCounter, 60, 7_200_000, 60), "60c2h"),
            (
                p(Algorithm::Fixed, 1_000_000_000, 60_000, 1_000_000_000),
                "1000000000fm",
            ),
            (p(Algorithm::Fixed, 7, 90_000, 7), "7f90s"),
        ];
        for (policy, suffix) in cases {
            assert_eq!(
                build("ratelimit", "s", &[], &policy),
                format!("ratelimit:{{s}}:{suffix}")
            );
        }
    }

    /// The suffix is written once, by a `const fn` into a buffer of its own: numbers of every
    /// width, and the longest that `u64`s can make, which no policy's bounds allow, read back
    /// whole, never cut at the buffer's end.
    #[test]
    fn a_suffix_of_any_width_reads_back_whole() {
        let mut widths = vec![1, u64::MAX];
        widths.extend(
            (0..20)
                .map(|e| 10u64.pow(e))
                .flat_map(|n| [n, n - 1 + u64::from(n == 1)]),
        );
        for &n in &widths {
            for (algorithm, period_ms) in [
                (Algorithm::Fixed, n),
                (Algorithm::Token, n.saturating_mul(1000)),
                (Algorithm::Gcra, 86_400_000),
            ] {
                let burst = if n == 1 { 2 } else { n - 1 };
                let suffix = KeySuffix::of(algorithm, n, period_ms, burst);
                assert_eq!(
                    read_suffix(std::str::from_utf8(suffix.as_bytes()).unwrap()),
                    (algorithm, n, period_ms, burst),
                    "{:?}",
                    suffix.as_bytes()
                );
            }
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
