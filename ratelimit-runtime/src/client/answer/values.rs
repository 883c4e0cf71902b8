//! The values of a partner's fields, parsed: pure functions over the bytes of one header
//! value, each answering `None` for what it cannot read (every value is untrusted input).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `Retry-After`: delta-seconds, or an HTTP date (a date before `now` is no pause).
pub fn retry_after(value: &[u8], now: SystemTime) -> Option<Duration> {
    if let Some(seconds) = unsigned(value) {
        return Some(Duration::from_secs(seconds));
    }
    let text = std::str::from_utf8(value).ok()?.trim();
    let at = httpdate::parse_http_date(text).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// GitHub's `x-ratelimit-reset`: epoch seconds; one before `now` is no wait.
pub fn epoch_reset(value: &[u8], now: SystemTime) -> Option<Duration> {
    let at = UNIX_EPOCH.checked_add(Duration::from_secs(unsigned(value)?))?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// An unsigned decimal integer with optional surrounding whitespace (no sign, no fraction),
/// `None` past `u64::MAX`.
pub fn unsigned(value: &[u8]) -> Option<u64> {
    let digits = value.trim_ascii();
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    digits.iter().try_fold(0u64, |n, d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// A Go duration as OpenAI writes resets: one or more `<number>[.<fraction>]<unit>` with units
/// `h`, `m`, `s`, `ms`, `us`, `µs`, `ns` (`6m0s`, `1.5s`, `20ms`); `None` for anything else
/// or past `u64::MAX` nanoseconds.
pub fn go_duration(value: &[u8]) -> Option<Duration> {
    let mut rest = value.trim_ascii();
    if rest.is_empty() {
        return None;
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let (whole, after) = split_digits(rest);
        let (fraction, after) = match after.strip_prefix(b".") {
            Some(after) => split_digits(after),
            None => (&after[..0], after),
        };
        if whole.is_empty() && fraction.is_empty() {
            return None;
        }
        let (unit, after) = go_unit(after)?;
        total = total.checked_add(scaled(whole, fraction, unit)?)?;
        rest = after;
    }
    u64::try_from(total).ok().map(Duration::from_nanos)
}

/// The leading ASCII digits of `s`, and the rest.
fn split_digits(s: &[u8]) -> (&[u8], &[u8]) {
    let n = s.iter().take_while(|b| b.is_ascii_digit()).count();
    s.split_at(n)
}

/// A Go duration unit at the start of `s`, in nanoseconds, and the rest.
fn go_unit(s: &[u8]) -> Option<(u128, &[u8])> {
    const UNITS: [(&[u8], u128); 7] = [
        (b"ns", 1),
        (b"us", 1_000),
        ("µs".as_bytes(), 1_000),
        (b"ms", 1_000_000),
        (b"s", 1_000_000_000),
        (b"m", 60_000_000_000),
        (b"h", 3_600_000_000_000),
    ];
    UNITS
        .iter()
        .find_map(|(name, nanos)| s.strip_prefix(*name).map(|rest| (*nanos, rest)))
}

/// `whole.fraction` units of `unit` nanoseconds, truncated to a nanosecond; `None` on
/// overflow (digits beyond the 18th of a fraction are below a nanosecond and dropped).
fn scaled(whole: &[u8], fraction: &[u8], unit: u128) -> Option<u128> {
    let number = |digits: &[u8]| {
        digits.iter().try_fold(0u128, |n, d| {
            n.checked_mul(10)?.checked_add(u128::from(d - b'0'))
        })
    };
    let mut nanos = number(whole)?.checked_mul(unit)?;
    let fraction = &fraction[..fraction.len().min(18)];
    let denominator = 10u128.pow(u32::try_from(fraction.len()).ok()?);
    nanos = nanos.checked_add(number(fraction)?.checked_mul(unit)? / denominator)?;
    Some(nanos)
}

/// One member of the IETF `RateLimit` field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IetfMember {
    /// The policy's name.
    pub name: String,
    /// `r`: units left.
    pub remaining: u64,
    /// `t`: seconds until the quota is whole again.
    pub reset: Option<Duration>,
}

/// The IETF `RateLimit` field's members (`"default";r=0;t=20, "daily";r=5;t=3600`); members
/// without `r`, or with a negative or malformed one, are left out; `None` when the field is
/// not a list of such members at all.
pub fn ietf_ratelimit(value: &[u8]) -> Option<Vec<IetfMember>> {
    sf_members(value, |name, params| {
        let remaining = sf_unsigned(params, "r")?;
        let reset = sf_unsigned(params, "t").map(Duration::from_secs);
        Some(IetfMember {
            name,
            remaining,
            reset,
        })
    })
}

/// One member of the IETF `RateLimit-Policy` field: a policy's name, quota and window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IetfPolicy {
    /// The policy's name.
    pub name: String,
    /// `q`: the quota (never zero).
    pub quota: u64,
    /// `w`: the window, in seconds (`None`: not said).
    pub window: Option<Duration>,
}

/// The IETF `RateLimit-Policy` field's members (`"default";q=100;w=60`); members without a
/// positive `q`, or with a `w` that is not a positive number of seconds, are left out (a
/// window of zero states no rate); `None` when the field is not a list of members at all.
pub fn ietf_policy(value: &[u8]) -> Option<Vec<IetfPolicy>> {
    sf_members(value, |name, params| {
        let quota = sf_unsigned(params, "q").filter(|q| *q > 0)?;
        let window = match params.iter().find(|(k, _)| *k == "w") {
            Some(_) => Some(sf_unsigned(params, "w").filter(|w| *w > 0)?),
            None => None,
        };
        Some(IetfPolicy {
            name,
            quota,
            window: window.map(Duration::from_secs),
        })
    })
}

/// A structured field list of items with parameters (`"a";r=0;t=20, b;q=5`), each turned
/// into `T` by `member` (`None` leaves the member out); `None` when the value is not such a
/// list.
fn sf_members<T>(
    value: &[u8],
    member: impl Fn(String, &[(&str, &str)]) -> Option<T>,
) -> Option<Vec<T>> {
    let text = std::str::from_utf8(value).ok()?;
    let mut members = Vec::new();
    let mut unread = text.trim_start_matches([' ', '\t']);
    while !unread.is_empty() {
        let (name, after) = sf_item_name(unread)?;
        let (params, after) = sf_params(after)?;
        members.extend(member(name, &params));
        unread = after.trim_start_matches([' ', '\t']);
        match unread.strip_prefix(',') {
            Some(after) => unread = after.trim_start_matches([' ', '\t']),
            None if unread.is_empty() => {}
            None => return None,
        }
    }
    Some(members)
}

/// The parameter `key`'s value as an unsigned integer.
fn sf_unsigned(params: &[(&str, &str)], key: &str) -> Option<u64> {
    let (_, value) = params.iter().find(|(k, _)| *k == key)?;
    unsigned(value.as_bytes())
}

/// A structured field item's name: a string (`"default"`, with `\"` and `\\` escapes) or a
/// token; and the rest.
fn sf_item_name(s: &str) -> Option<(String, &str)> {
    if let Some(body) = s.strip_prefix('"') {
        let mut name = String::new();
        let mut chars = body.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => return Some((name, &body[i + 1..])),
                '\\' => name.push(chars.next().filter(|(_, c)| matches!(c, '"' | '\\'))?.1),
                c if c.is_ascii() && !c.is_ascii_control() => name.push(c),
                _ => return None,
            }
        }
        return None;
    }
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~:/".contains(c)))
        .unwrap_or(s.len());
    (end > 0).then(|| (s[..end].to_owned(), &s[end..]))
}

/// A structured field item's parameters (`;r=0;t=20`; a key alone is `?1`), each value as
/// its text; and the rest.
fn sf_params(mut s: &str) -> Option<(Vec<(&str, &str)>, &str)> {
    let mut params = Vec::new();
    while let Some(after) = s.strip_prefix(';') {
        let after = after.trim_start_matches(' ');
        let key_end = after
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || "_-.*".contains(c)))
            .unwrap_or(after.len());
        if key_end == 0 {
            return None;
        }
        let (key, after) = after.split_at(key_end);
        let Some(value) = after.strip_prefix('=') else {
            params.push((key, "?1"));
            s = after;
            continue;
        };
        let end = value.find([';', ',', ' ', '\t']).unwrap_or(value.len());
        params.push((key, &value[..end]));
        s = &value[end..];
    }
    Some((params, s))
}
