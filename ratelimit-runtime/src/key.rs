//! Store keys (SPEC §5): `<prefix>:{<scope>:<identity>}:<suffix>`.
//!
//! The braces are a Redis Cluster hash tag, so every key of one caller in one scope lands in one
//! slot. The identity is made of caller-supplied parts (an IP, a header value, a user id, a
//! rendered `key` template). Each part is written either as itself, when it is short and made
//! of safe characters, or as the hash of itself, with a marker telling which:
//!
//! * `=value` — the value as is: at most [`MAX_PLAIN_LEN`] bytes of `A-Z a-z 0-9 . _ - @ / + :`;
//! * `#<32 hex digits>` — the first 128 bits of the SHA-256 of the value, for anything else.
//!
//! Parts are joined by `|`. None of `= # | { }` can appear inside a written part, and a scope
//! (checked by [`valid_scope`]) holds none of them either, so a key reads back in one way only:
//! no input can make one caller's key equal another's, braces cannot break the hash tag, and a
//! key is never longer than the prefix, scope and suffix plus 34 bytes a part.

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

/// Appends one caller-supplied part, as itself or as its hash (see the module docs).
pub fn push_part(out: &mut String, value: &[u8]) {
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
/// use ratelimit_runtime::{Algorithm, Policy, key::build};
///
/// let p = Policy::new(Algorithm::Fixed, 5, Duration::from_secs(60))?;
/// assert_eq!(build("ratelimit", "app::login", &[b"10.0.0.1"], &p), "ratelimit:{app::login:=10.0.0.1}:fixed:5:60000");
/// assert_eq!(build("ratelimit", "app::login", &[], &p), "ratelimit:{app::login}:fixed:5:60000");
/// let braces = build("ratelimit", "app::login", &[b"}{"], &p);
/// assert_eq!(braces.matches('{').count(), 1);
/// # Ok::<(), ratelimit_runtime::PolicyError>(())
/// ```
pub fn build(prefix: &str, scope: &str, parts: &[&[u8]], policy: &Policy) -> String {
    let mut key = String::with_capacity(prefix.len() + scope.len() + 40 + parts.len() * 34);
    key.push_str(prefix);
    key.push_str(":{");
    key.push_str(scope);
    for (i, part) in parts.iter().enumerate() {
        key.push(if i == 0 { ':' } else { '|' });
        push_part(&mut key, part);
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
    use std::collections::HashSet;
    use std::time::Duration;

    fn policy() -> Policy {
        Policy::new(Algorithm::Sliding, 3, Duration::from_secs(10)).unwrap()
    }

    #[test]
    fn long_and_unusual_values_are_hashed_and_bounded() {
        let p = policy();
        let long = vec![b'a'; 10 * 1024];
        let k = build("rl", "s", &[&long], &p);
        assert!(k.len() < 80, "{k}");
        assert!(k.contains("{s:#"));
        for v in [
            &b"a{b"[..],
            b"a}b",
            b"a|b",
            b"=x",
            b"#x",
            b"\xff\xfe",
            b"a b",
            b"",
        ] {
            let k = build("rl", "s", &[v], &p);
            assert_eq!(k.matches('{').count(), 1, "{k}");
            assert_eq!(k.matches('}').count(), 1, "{k}");
        }
    }

    #[test]
    fn distinct_inputs_never_share_a_key() {
        let p = policy();
        let values: Vec<Vec<u8>> = vec![
            b"a".to_vec(),
            b"a|=b".to_vec(),
            b"=a".to_vec(),
            b"#a".to_vec(),
            vec![b'a'; 64],
            vec![b'a'; 65],
            b"a:b".to_vec(),
            b"".to_vec(),
            b"\xff".to_vec(),
        ];
        let mut seen = HashSet::new();
        for a in &values {
            assert!(seen.insert(build("rl", "s", &[a], &p)));
            for b in &values {
                assert!(seen.insert(build("rl", "s", &[a, b], &p)));
            }
        }
        assert!(seen.insert(build("rl", "s", &[], &p)));
    }
}
