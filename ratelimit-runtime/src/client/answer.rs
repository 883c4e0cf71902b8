//! Reading a partner's answer: `Retry-After`, the IETF `RateLimit` field, the `x-ratelimit-*`
//! families. Pure functions over the header values (no I/O, "now" passed in), each a
//! [`ReadAnswer`] the layer can be given; every value is untrusted input.
//!
//! A value that does not parse, or is negative, is ignored (one log line at most every ten
//! seconds); a value that parses to a pause longer than the layer's maximum is
//! cut to that maximum ([`Advice::bounded`], the one place the bound is applied).

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};

mod values;

pub use self::values::{
    IetfMember, IetfPolicy, epoch_reset, go_duration, ietf_policy, ietf_ratelimit, retry_after,
    unsigned,
};

/// Which of a partner's budgets a reading is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Budget {
    /// Requests (the partner counts one a call).
    Requests,
    /// Tokens (a cost a call estimates and settles).
    Tokens,
}

impl Budget {
    /// The key template of the budget's limit, so the two limits of one scope never share a
    /// key.
    pub(super) const fn key_template(self) -> &'static str {
        match self {
            Budget::Requests => "requests",
            Budget::Tokens => "tokens",
        }
    }
}

/// What the partner says is left of one budget, and when it is whole again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remaining {
    /// The budget.
    pub budget: Budget,
    /// Units left.
    pub left: u64,
    /// Until the partner's window resets (`None`: not said).
    pub reset: Option<Duration>,
}

/// A budget's quota as the partner states it: `limit` units per `window`
/// (`RateLimit-Policy: "default";q=100;w=60`, `x-ratelimit-limit-requests: 100`).
///
/// ```
/// use std::time::Duration;
/// use ratelimit_runtime::client::{Budget, Stated};
///
/// let minute = Some(Duration::from_secs(60));
/// let rpm = Stated { budget: Budget::Requests, limit: 600, window: minute };
/// assert_eq!(rpm.per(Duration::from_secs(1)), Some(10)); // for a budget set per second
/// let unsaid = Stated { window: None, ..rpm };
/// assert_eq!(unsaid.per(Duration::from_secs(1)), Some(600)); // read per the budget's period
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stated {
    /// The budget.
    pub budget: Budget,
    /// Units per window (a reader leaves a zero out; a zero states no rate).
    pub limit: u64,
    /// The partner's window (`None`: not said, as the `x-ratelimit-*` families do not; the
    /// layer then reads `limit` per the budget's configured period).
    pub window: Option<Duration>,
}

impl Stated {
    /// `limit` per `window` as units per `period` (rounded down, at least 1), or `None` when
    /// the limit or the window is zero (no rate).
    pub fn per(&self, period: Duration) -> Option<u64> {
        if self.limit == 0 {
            return None;
        }
        let Some(window) = self.window else {
            return Some(self.limit);
        };
        let window = window.as_nanos();
        if window == 0 {
            return None;
        }
        let units = u128::from(self.limit).saturating_mul(period.as_nanos()) / window;
        Some(u64::try_from(units).unwrap_or(u64::MAX).max(1))
    }
}

/// What one answer tells the fleet: a pause of every budget, what is left of each, and the
/// quota the partner states for each.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Advice {
    /// Every budget is unavailable for this long (a 429 or 503 with `Retry-After`). The
    /// longest of several readings wins.
    pub pause: Option<Duration>,
    /// What is left of each budget (several readings of one budget: the least wins when the
    /// layer applies them).
    pub remaining: Vec<Remaining>,
    /// The partner's quota of each budget (several of one budget: the least rate wins when
    /// the layer applies them).
    pub quotas: Vec<Stated>,
}

impl Advice {
    /// Records a pause, keeping the longest.
    pub fn pause_for(&mut self, pause: Duration) {
        self.pause = Some(self.pause.map_or(pause, |p| p.max(pause)));
    }

    /// The advice with every duration cut to `max` (a pause, a reset), logged when cut.
    #[must_use]
    pub fn bounded(mut self, max: Duration) -> Self {
        let cut = |d: Duration| {
            if d > max {
                ignored(
                    "a pause longer than the maximum (cut to it)",
                    &format!("{d:?}"),
                );
            }
            d.min(max)
        };
        self.pause = self.pause.map(cut);
        for r in &mut self.remaining {
            r.reset = r.reset.map(cut);
        }
        self
    }

    /// The least of the quotas stated for `budget`, as units per `period` (see
    /// [`Stated::per`]).
    pub fn least_quota(&self, budget: Budget, period: Duration) -> Option<u64> {
        self.least_stated(budget, period).map(|(rate, _)| rate)
    }

    /// The least of the quotas stated for `budget` (by its rate per `period`), with that rate.
    pub(super) fn least_stated(&self, budget: Budget, period: Duration) -> Option<(u64, Stated)> {
        self.quotas
            .iter()
            .filter(|q| q.budget == budget)
            .filter_map(|q| Some((q.per(period)?, *q)))
            .min_by_key(|(rate, _)| *rate)
    }

    /// The least left of `budget`, with its reset (the latest among the least).
    pub fn least(&self, budget: Budget) -> Option<Remaining> {
        self.remaining
            .iter()
            .filter(|r| r.budget == budget)
            .copied()
            .reduce(|a, b| match a.left.cmp(&b.left) {
                std::cmp::Ordering::Less => a,
                std::cmp::Ordering::Greater => b,
                std::cmp::Ordering::Equal => Remaining {
                    reset: a.reset.max(b.reset),
                    ..a
                },
            })
    }
}

/// A partner's response as a reader sees it: its status, its headers, and the time it
/// arrived (for an HTTP date or an epoch second).
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: &'a HeaderMap,
    /// The wall-clock time of the answer.
    pub now: SystemTime,
}

/// Reads one family of fields from a partner's answer into [`Advice`]. Implement it for a
/// partner that speaks its own dialect; it must not panic on any value (they are the
/// partner's, untrusted).
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use ratelimit_runtime::client::{Advice, Answer, Budget, ReadAnswer, Remaining};
///
/// /// `x-credits-left: 12`
/// struct Credits;
///
/// impl ReadAnswer for Credits {
///     fn read(&self, answer: &Answer<'_>, advice: &mut Advice) {
///         let left = answer.headers.get("x-credits-left").and_then(|v| v.to_str().ok());
///         if let Some(left) = left.and_then(|v| v.trim().parse().ok()) {
///             advice.remaining.push(Remaining { budget: Budget::Requests, left, reset: None });
///         }
///     }
/// }
///
/// let mut headers = http::HeaderMap::new();
/// headers.insert("x-credits-left", "12".parse()?);
/// let mut advice = Advice::default();
/// Credits.read(&Answer { status: http::StatusCode::OK, headers: &headers, now: SystemTime::now() }, &mut advice);
/// assert_eq!(advice.least(Budget::Requests).map(|r| r.left), Some(12));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait ReadAnswer: Send + Sync + 'static {
    /// Adds what `answer` says to `advice`.
    fn read(&self, answer: &Answer<'_>, advice: &mut Advice);
}

/// `Retry-After` on a 429 or a 503 (delta-seconds or an HTTP date): a pause of every budget.
/// On other statuses the field means something else (a redirect's wait) and is not read.
#[derive(Debug, Clone, Copy, Default)]
pub struct RetryAfter;

impl ReadAnswer for RetryAfter {
    fn read(&self, answer: &Answer<'_>, advice: &mut Advice) {
        let refused = matches!(
            answer.status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        );
        let Some(value) = answer.headers.get(http::header::RETRY_AFTER) else {
            return;
        };
        if !refused {
            return;
        }
        match retry_after(value.as_bytes(), answer.now) {
            Some(pause) => advice.pause_for(pause),
            None => ignored("Retry-After", &show(value.as_bytes())),
        }
    }
}

/// The IETF fields (draft-ietf-httpapi-ratelimit-headers-11): `RateLimit:
/// "default";r=0;t=20`, each member's `r` (left) and `t` (seconds to reset), and
/// `RateLimit-Policy: "default";q=100;w=60`, each policy's quota `q` per `w` seconds; for the
/// requests budget, or the tokens budget for the member named by [`IetfFields::tokens`].
#[derive(Debug, Clone, Default)]
pub struct IetfFields {
    tokens: Option<String>,
}

impl IetfFields {
    /// The members of the `RateLimit` field, all for the requests budget.
    pub fn new() -> Self {
        Self::default()
    }

    /// The member named `policy` is the tokens budget.
    #[must_use]
    pub fn tokens(mut self, policy: impl Into<String>) -> Self {
        self.tokens = Some(policy.into());
        self
    }
}

impl IetfFields {
    /// The budget of the policy named `name`.
    fn budget(&self, name: &str) -> Budget {
        if self.tokens.as_deref() == Some(name) {
            Budget::Tokens
        } else {
            Budget::Requests
        }
    }
}

impl ReadAnswer for IetfFields {
    fn read(&self, answer: &Answer<'_>, advice: &mut Advice) {
        for value in answer.headers.get_all("ratelimit") {
            let Some(members) = ietf_ratelimit(value.as_bytes()) else {
                ignored("RateLimit", &show(value.as_bytes()));
                continue;
            };
            for member in members {
                advice.remaining.push(Remaining {
                    budget: self.budget(&member.name),
                    left: member.remaining,
                    reset: member.reset,
                });
            }
        }
        for value in answer.headers.get_all("ratelimit-policy") {
            let Some(policies) = ietf_policy(value.as_bytes()) else {
                ignored("RateLimit-Policy", &show(value.as_bytes()));
                continue;
            };
            for policy in policies {
                advice.quotas.push(Stated {
                    budget: self.budget(&policy.name),
                    limit: policy.quota,
                    window: policy.window,
                });
            }
        }
    }
}

/// OpenAI's family: `x-ratelimit-remaining-requests` with `x-ratelimit-reset-requests`, and
/// `x-ratelimit-remaining-tokens` with `x-ratelimit-reset-tokens`, resets as Go durations
/// (`6m0s`, `1s`, `20ms`); the quotas `x-ratelimit-limit-requests` and
/// `x-ratelimit-limit-tokens` (per minute at OpenAI: configure the budgets per minute, as the
/// fields do not say their window).
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenAiFields;

impl ReadAnswer for OpenAiFields {
    fn read(&self, answer: &Answer<'_>, advice: &mut Advice) {
        let families = [
            (
                Budget::Requests,
                "x-ratelimit-remaining-requests",
                "x-ratelimit-reset-requests",
            ),
            (
                Budget::Tokens,
                "x-ratelimit-remaining-tokens",
                "x-ratelimit-reset-tokens",
            ),
        ];
        for (budget, remaining, reset) in families {
            read_pair(
                answer.headers,
                budget,
                remaining,
                reset,
                advice,
                go_duration,
            );
        }
        read_limit(
            answer.headers,
            Budget::Requests,
            "x-ratelimit-limit-requests",
            advice,
        );
        read_limit(
            answer.headers,
            Budget::Tokens,
            "x-ratelimit-limit-tokens",
            advice,
        );
    }
}

/// GitHub's family: `x-ratelimit-remaining` with `x-ratelimit-reset` as epoch seconds, and
/// the quota `x-ratelimit-limit` (per hour at GitHub: configure the budget per hour, as the
/// field does not say its window).
#[derive(Debug, Clone, Copy, Default)]
pub struct GitHubFields;

impl ReadAnswer for GitHubFields {
    fn read(&self, answer: &Answer<'_>, advice: &mut Advice) {
        let now = answer.now;
        read_pair(
            answer.headers,
            Budget::Requests,
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
            advice,
            |v| epoch_reset(v, now),
        );
        read_limit(
            answer.headers,
            Budget::Requests,
            "x-ratelimit-limit",
            advice,
        );
    }
}

/// A `limit` field (a quota without a window, as the `x-ratelimit-*` families state it): a
/// [`Stated`] quota when it parses to a positive number.
fn read_limit(headers: &HeaderMap, budget: Budget, limit: &str, advice: &mut Advice) {
    let Some(value) = headers.get(limit) else {
        return;
    };
    match unsigned(value.as_bytes()).filter(|l| *l > 0) {
        Some(limit) => advice.quotas.push(Stated {
            budget,
            limit,
            window: None,
        }),
        None => ignored(limit, &show(value.as_bytes())),
    }
}

/// One `remaining` field and its `reset` field (read by `reset`): a reading when `remaining`
/// parses; a reset that does not parse is ignored, the reading kept without it.
fn read_pair(
    headers: &HeaderMap,
    budget: Budget,
    remaining: &str,
    reset: &str,
    advice: &mut Advice,
    parse_reset: impl Fn(&[u8]) -> Option<Duration>,
) {
    let Some(left) = headers.get(remaining) else {
        return;
    };
    let Some(left) = unsigned(left.as_bytes()) else {
        ignored(remaining, &show(left.as_bytes()));
        return;
    };
    let reset = headers.get(reset).and_then(|v| {
        let parsed = parse_reset(v.as_bytes());
        if parsed.is_none() {
            ignored(reset, &show(v.as_bytes()));
        }
        parsed
    });
    advice.remaining.push(Remaining {
        budget,
        left,
        reset,
    });
}

/// A header value as a log shows it: at most 64 bytes, escaped.
fn show(value: &[u8]) -> String {
    value[..value.len().min(64)].escape_ascii().to_string()
}

/// Logs that a partner's value was ignored (or cut): one line at most every ten seconds for
/// the process, so that a partner sending garbage on every answer cannot flood the log.
pub(crate) fn ignored(field: &str, value: &str) {
    static START: LazyLock<std::time::Instant> = LazyLock::new(std::time::Instant::now);
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let now = START.elapsed().as_secs();
    let next = NEXT.load(Ordering::Relaxed);
    if now < next
        || NEXT
            .compare_exchange(next, now + 10, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    tracing::warn!(target: crate::observe::log::CLIENT, field, value,
        "a partner's rate-limit field was ignored: malformed, negative or out of range (one line per 10 s)");
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use proptest::prelude::*;

    use super::*;

    const NOW: Duration = Duration::from_secs(1_700_000_000);

    fn now() -> SystemTime {
        UNIX_EPOCH + NOW
    }

    fn read(reader: &dyn ReadAnswer, status: u16, fields: &[(&str, &[u8])]) -> Advice {
        let mut headers = HeaderMap::new();
        for (name, value) in fields {
            headers.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                http::HeaderValue::from_bytes(value).unwrap(),
            );
        }
        read_headers(reader, status, &headers)
    }

    fn read_headers(reader: &dyn ReadAnswer, status: u16, headers: &HeaderMap) -> Advice {
        let answer = Answer {
            status: StatusCode::from_u16(status).unwrap(),
            headers,
            now: now(),
        };
        let mut advice = Advice::default();
        reader.read(&answer, &mut advice);
        advice
    }

    #[test]
    fn retry_after_reads_seconds_and_dates_and_ignores_the_rest() {
        assert_eq!(retry_after(b"20", now()), Some(Duration::from_secs(20)));
        assert_eq!(retry_after(b" 0 ", now()), Some(Duration::ZERO));
        let date = httpdate::fmt_http_date(now() + Duration::from_secs(90));
        assert_eq!(
            retry_after(date.as_bytes(), now()),
            Some(Duration::from_secs(90))
        );
        let past = httpdate::fmt_http_date(now() - Duration::from_secs(90));
        assert_eq!(retry_after(past.as_bytes(), now()), Some(Duration::ZERO));
        for bad in [
            &b"-5"[..],
            b"1.5",
            b"",
            b"soon",
            b"99999999999999999999999",
            "２".as_bytes(),
        ] {
            assert_eq!(retry_after(bad, now()), None, "{bad:?}");
        }
        // Only a refusal's Retry-After pauses.
        let refused = read(&RetryAfter, 429, &[("retry-after", b"20")]);
        assert_eq!(refused.pause, Some(Duration::from_secs(20)));
        assert_eq!(
            read(&RetryAfter, 503, &[("retry-after", b"3")]).pause,
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            read(&RetryAfter, 301, &[("retry-after", b"20")]).pause,
            None
        );
    }

    #[test]
    fn ietf_members_read_r_and_t() {
        let members =
            ietf_ratelimit(br#""default";r=0;t=20, "tokens";r=500;t=60;pk=:YWJj:"#).unwrap();
        assert_eq!(members.len(), 2);
        assert_eq!(
            members[0],
            IetfMember {
                name: "default".into(),
                remaining: 0,
                reset: Some(Duration::from_secs(20))
            }
        );
        assert_eq!(members[1].remaining, 500);
        assert_eq!(ietf_ratelimit(b"day;r=3").unwrap()[0].reset, None);
        // A negative or missing r leaves the member out; a broken list is ignored whole.
        assert_eq!(ietf_ratelimit(br#""a";r=-1;t=5"#).unwrap(), vec![]);
        assert_eq!(ietf_ratelimit(br#""a";t=5"#).unwrap(), vec![]);
        assert_eq!(ietf_ratelimit(br#""a;r=1"#), None);
        assert_eq!(ietf_ratelimit(br#""a" "b";r=1"#), None);
        let reader = IetfFields::new().tokens("tokens");
        let advice = read(
            &reader,
            200,
            &[("ratelimit", br#""default";r=4;t=1, "tokens";r=500;t=60"#)],
        );
        assert_eq!(advice.least(Budget::Requests).unwrap().left, 4);
        assert_eq!(
            advice.least(Budget::Tokens).unwrap().reset,
            Some(Duration::from_secs(60))
        );
    }

    #[test]
    fn go_durations_read_as_openai_writes_them() {
        let ms = Duration::from_millis;
        assert_eq!(go_duration(b"6m0s"), Some(Duration::from_secs(360)));
        assert_eq!(go_duration(b"1s"), Some(ms(1000)));
        assert_eq!(go_duration(b"20ms"), Some(ms(20)));
        assert_eq!(go_duration(b"1.5s"), Some(ms(1500)));
        assert_eq!(go_duration(b"1h2m3.25s"), Some(ms(3_723_250)));
        assert_eq!(
            go_duration("7µs".as_bytes()),
            Some(Duration::from_micros(7))
        );
        for bad in [
            &b""[..],
            b"5",
            b"-1s",
            b"1x",
            b"s",
            b".s",
            b"1.2.3s",
            b"99999999999999999999h",
        ] {
            assert_eq!(go_duration(bad), None, "{bad:?}");
        }
        let advice = read(
            &OpenAiFields,
            200,
            &[
                ("x-ratelimit-remaining-requests", b"59"),
                ("x-ratelimit-reset-requests", b"1s"),
                ("x-ratelimit-remaining-tokens", b"149984"),
                ("x-ratelimit-reset-tokens", b"6m0s"),
            ],
        );
        assert_eq!(
            advice.least(Budget::Requests),
            Some(Remaining {
                budget: Budget::Requests,
                left: 59,
                reset: Some(ms(1000))
            })
        );
        assert_eq!(
            advice.least(Budget::Tokens).unwrap().reset,
            Some(Duration::from_secs(360))
        );
    }

    #[test]
    fn github_reads_epoch_resets() {
        let reset = (NOW.as_secs() + 42).to_string();
        let advice = read(
            &GitHubFields,
            200,
            &[
                ("x-ratelimit-remaining", b"0"),
                ("x-ratelimit-reset", reset.as_bytes()),
            ],
        );
        assert_eq!(
            advice.least(Budget::Requests).unwrap().reset,
            Some(Duration::from_secs(42))
        );
        // A malformed reset keeps the reading without it; a malformed remaining drops it.
        let advice = read(
            &GitHubFields,
            200,
            &[
                ("x-ratelimit-remaining", b"3"),
                ("x-ratelimit-reset", b"tomorrow"),
            ],
        );
        assert_eq!(advice.least(Budget::Requests).unwrap().reset, None);
        assert!(
            read(&GitHubFields, 200, &[("x-ratelimit-remaining", b"-3")])
                .remaining
                .is_empty()
        );
        assert_eq!(epoch_reset(b"18446744073709551615", now()), None);
    }

    #[test]
    fn quotas_read_from_ratelimit_policy_and_the_limit_fields() {
        let ietf = IetfFields::new().tokens("tpm");
        let advice = read(
            &ietf,
            200,
            &[(
                "ratelimit-policy",
                br#""rpm";q=600;w=60, "tpm";q=90000;w=60, "no-window";q=7, "zero";q=0;w=1"#,
            )],
        );
        let minute = Duration::from_secs(60);
        assert_eq!(advice.least_quota(Budget::Requests, minute), Some(7));
        assert_eq!(advice.least_quota(Budget::Tokens, minute), Some(90_000));
        // 600 a minute is 10 a second; `q=0` is no quota, and a window of zero none either.
        let second = Duration::from_secs(1);
        let rpm = Stated {
            budget: Budget::Requests,
            limit: 600,
            window: Some(minute),
        };
        assert_eq!(rpm.per(second), Some(10));
        assert_eq!(
            rpm.per(Duration::from_millis(1)),
            Some(1),
            "never below one"
        );
        assert!(advice.quotas.iter().all(|q| q.limit > 0));
        let no_window = Stated {
            window: Some(Duration::ZERO),
            ..rpm
        };
        assert_eq!(no_window.per(second), None);
        // A zero limit (from a reader of your own, whose `Stated` is built by hand) is no
        // rate either, whatever its window.
        for window in [None, Some(minute)] {
            let zero = Stated {
                limit: 0,
                window,
                ..rpm
            };
            assert_eq!(zero.per(second), None);
        }
        // A member whose window is zero or not a number states no rate: left out, never
        // read per the budget's period.
        for bad in [
            &br#""a";q=5;w=0"#[..],
            br#""a";q=5;w=-1"#,
            br#""a";q=5;w=soon"#,
        ] {
            assert_eq!(ietf_policy(bad), Some(vec![]), "{bad:?}");
        }
        assert_eq!(
            ietf_policy(br#""a";q=5"#),
            Some(vec![IetfPolicy {
                name: "a".into(),
                quota: 5,
                window: None
            }])
        );
        assert_eq!(ietf_policy(b"a;q=5 b"), None);
        // The x-ratelimit families state a limit without a window: read per the period.
        let openai = read(
            &OpenAiFields,
            200,
            &[
                ("x-ratelimit-limit-requests", b"500"),
                ("x-ratelimit-limit-tokens", b"30000"),
            ],
        );
        assert_eq!(openai.least_quota(Budget::Requests, minute), Some(500));
        assert_eq!(openai.least_quota(Budget::Tokens, second), Some(30_000));
        let github = read(&GitHubFields, 200, &[("x-ratelimit-limit", b"5000")]);
        assert_eq!(github.least_quota(Budget::Requests, minute), Some(5_000));
        for bad in [&b"0"[..], b"-5", b"lots", "５".as_bytes()] {
            let advice = read(&GitHubFields, 200, &[("x-ratelimit-limit", bad)]);
            assert!(advice.quotas.is_empty(), "{bad:?}");
        }
    }

    #[test]
    fn bounded_cuts_every_duration_to_the_maximum() {
        let mut advice = Advice::default();
        advice.pause_for(Duration::from_secs(10 * 365 * 86_400));
        advice.remaining.push(Remaining {
            budget: Budget::Tokens,
            left: 0,
            reset: Some(Duration::MAX),
        });
        let advice = advice.bounded(Duration::from_secs(60));
        assert_eq!(advice.pause, Some(Duration::from_secs(60)));
        assert_eq!(advice.remaining[0].reset, Some(Duration::from_secs(60)));
    }

    /// Every reader, over any bytes in any of its fields, with any status: no panic, and no
    /// duration past the maximum once bounded.
    fn any_answer(reader: &dyn ReadAnswer, status: u16, values: &[Vec<u8>]) {
        const NAMES: [&str; 12] = [
            "retry-after",
            "ratelimit",
            "ratelimit-policy",
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
            "x-ratelimit-remaining-tokens",
            "x-ratelimit-reset-tokens",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
            "x-ratelimit-limit-requests",
            "x-ratelimit-limit-tokens",
            "x-ratelimit-limit",
        ];
        let mut headers = HeaderMap::new();
        for (name, value) in NAMES.iter().zip(values) {
            if let Ok(value) = http::HeaderValue::from_bytes(value) {
                headers.insert(*name, value);
            }
        }
        let advice = read_headers(reader, status, &headers);
        let max = Duration::from_secs(300);
        let advice = advice.bounded(max);
        assert!(advice.pause.is_none_or(|p| p <= max));
        assert!(
            advice
                .remaining
                .iter()
                .all(|r| r.reset.is_none_or(|d| d <= max))
        );
        // A stated quota is positive, and reads per any period without a panic, never as 0.
        for stated in &advice.quotas {
            assert!(stated.limit > 0, "{stated:?}");
            for period in [Duration::from_millis(1), Duration::from_secs(86_400 * 365)] {
                assert!(
                    stated.per(period).is_some_and(|units| units > 0),
                    "{stated:?}"
                );
            }
        }
    }

    fn field() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..40),
            "[0-9a-zµ.;=\", -]{0,40}".prop_map(String::into_bytes),
            r#""[a-z]{1,5}";r=-?[0-9]{1,25};t=-?[0-9]{1,25}"#.prop_map(String::into_bytes),
            r#""[a-z]{1,5}";q=-?[0-9]{1,25};w=-?[0-9]{1,25}"#.prop_map(String::into_bytes),
            "([0-9]{1,22}(\\.[0-9]{0,25})?(h|m|s|ms|us|ns)){1,4}".prop_map(String::into_bytes),
        ]
    }

    proptest! {
        #[test]
        fn no_value_panics_or_pauses_past_the_maximum(
            status in 100u16..600,
            values in proptest::collection::vec(field(), 12),
        ) {
            let readers: [&dyn ReadAnswer; 4] = [&RetryAfter, &IetfFields::new(), &OpenAiFields, &GitHubFields];
            for reader in readers {
                any_answer(reader, status, &values);
            }
        }

        #[test]
        fn parsers_take_any_bytes(value in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = retry_after(&value, now());
            let _ = epoch_reset(&value, now());
            let _ = go_duration(&value);
            let _ = ietf_ratelimit(&value);
            let _ = ietf_policy(&value);
            let _ = unsigned(&value);
        }
    }
}
