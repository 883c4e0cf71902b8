//! What a limited handler answers, independent of the framework: the rate-limit
//! header fields of a verdict and the bodies of the refusals.

use std::fmt::Write as _;
use std::sync::OnceLock;
use std::time::Duration;

use super::settings::{HeaderStyle, HttpSettings, IetfDraft};
use crate::decision::{Decision, Verdict};
use crate::key::push_decimal;
use crate::limit::Limit;

/// Header fields to add to a response: lower-case static names, ASCII values.
pub(crate) type Fields = Vec<(&'static str, String)>;

/// The rate-limit fields of a handler's admitted response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FieldSet {
    /// No field (an exempted request, a function with a limit in shadow mode).
    Empty,
    /// `RateLimit-Policy` (formatted once for the function: [`PolicyField`]) and `RateLimit`,
    /// in that order: the usual set, built without a list.
    Ietf { policy: &'static str, state: String },
    /// Any other set, in order.
    List(Fields),
}

impl FieldSet {
    /// The fields, in the order they are added to a response.
    pub(crate) fn into_fields(self) -> Fields {
        match self {
            Self::Empty => Vec::new(),
            Self::Ietf { policy, state } => vec![
                ("ratelimit-policy", policy.to_owned()),
                ("ratelimit", state),
            ],
            Self::List(fields) => fields,
        }
    }

    /// The fields, in the order they are added to the response.
    #[cfg(test)]
    pub(crate) fn to_list(&self) -> Fields {
        match self {
            Self::Empty => Vec::new(),
            Self::Ietf { policy, state } => vec![
                ("ratelimit-policy", (*policy).to_owned()),
                ("ratelimit", state.clone()),
            ],
            Self::List(fields) => fields.clone(),
        }
    }
}

/// A function's `RateLimit-Policy` value, formatted on first use and kept for the process:
/// `#[rate_limit]` writes one `static` of it beside the function's limits and hands it to
/// `check_http` (the macro's HTTP call), so that a response gets the value without formatting,
/// copying or validating it again (and the `RateLimit` value its members' names).
#[derive(Debug)]
#[cfg_attr(not(any(feature = "axum", feature = "actix")), allow(unreachable_pub))]
pub struct PolicyField(OnceLock<Option<Formatted>>);

/// What [`PolicyField`] keeps.
#[derive(Debug)]
struct Formatted {
    /// The `RateLimit-Policy` value.
    policy: Box<str>,
    /// Each limit's list-member name, quoted (`"login"`, `"login-2"`).
    names: Box<[Box<str>]>,
}

#[cfg_attr(not(any(feature = "axum", feature = "actix")), allow(unreachable_pub))]
impl PolicyField {
    /// Not formatted yet.
    #[allow(clippy::new_without_default)] // only ever a `static`
    pub const fn new() -> Self {
        Self(OnceLock::new())
    }

    /// The value and names for `limits` (always the same limits for one `static`), or `None`
    /// if the value were not a valid field value (it always is: scopes are made of safe
    /// characters).
    fn get(&'static self, limits: &[Limit]) -> Option<&'static Formatted> {
        self.0
            .get_or_init(|| {
                let mut policy = String::with_capacity(24 * limits.len());
                for (i, limit) in limits.iter().enumerate() {
                    push_policy(&mut policy, limits, i, limit.policy.capacity());
                }
                let names = (0..limits.len())
                    .map(|i| {
                        let mut name = String::new();
                        push_name(&mut name, limits, i);
                        name.into_boxed_str()
                    })
                    .collect();
                // What `HeaderValue::from_static` accepts.
                policy
                    .bytes()
                    .all(|b| (0x20..0x7f).contains(&b))
                    .then(|| Formatted {
                        policy: policy.into_boxed_str(),
                        names,
                    })
            })
            .as_ref()
    }
}

/// The answer that replaces a refused call's: an HTTP status, fields and a JSON body, the
/// message the body carries (a gRPC status's message), and for a spent quota the exact wait.
/// Every transport renders this one value: HTTP as it is, gRPC by [`Refusal::grpc_code`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) status: u16,
    pub(crate) fields: Fields,
    pub(crate) body: String,
    pub(crate) message: String,
    /// The exact wait of a spent quota (a gRPC `RetryInfo`); `None` for other refusals.
    pub(crate) retry_after: Option<Duration>,
}

impl Refusal {
    /// A refusal with `{"error":<error>,"message":<message>}`.
    pub(crate) fn new(status: u16, error: &str, message: &str) -> Self {
        let mut body = String::with_capacity(32 + message.len());
        body.push_str("{\"error\":");
        push_json_string(&mut body, error);
        body.push_str(",\"message\":");
        push_json_string(&mut body, message);
        body.push('}');
        Self {
            status,
            fields: Vec::new(),
            body,
            message: message.to_owned(),
            retry_after: None,
        }
    }

    /// The gRPC status code of this refusal: the one table every gRPC answer uses (methods
    /// and the layer). `RESOURCE_EXHAUSTED` (8) for a spent quota, `UNAVAILABLE` (14) for a
    /// store down, `PERMISSION_DENIED` (7) for a denied network, `INVALID_ARGUMENT` (3) for a
    /// blank header or a cost refused, `UNAUTHENTICATED` (16) for no user or quota,
    /// `INTERNAL` (13) for a server set up without what a limit reads.
    pub(crate) fn grpc_code(&self) -> i32 {
        match self.status {
            429 => 8,
            503 => 14,
            403 => 7,
            400 => 3,
            401 => 16,
            500 => 13,
            _ => 2, // UNKNOWN
        }
    }

    /// 403: the client's network is on the deny list ([`crate::limiter::Builder::deny_networks`]).
    pub(crate) fn forbidden() -> Self {
        Self::new(
            403,
            "forbidden",
            "requests from this network are not accepted",
        )
    }

    /// 429: the quota is spent.
    pub(crate) fn too_many_requests(
        limits: &[Limit],
        verdict: &Verdict,
        settings: &HttpSettings,
    ) -> Self {
        // Shadow limits never show: a client cannot tell that a limit is coming, from a 429
        // either. The fields and the wait are the enforced limits'.
        let enforced;
        let (limits, verdict) = if limits.iter().any(|l| l.shadow) {
            let (kept, decisions): (Vec<Limit>, Vec<_>) = limits
                .iter()
                .zip(verdict.decisions())
                .filter(|(l, _)| !l.shadow)
                .map(|(l, d)| (*l, *d))
                .unzip();
            enforced = (kept, Verdict::new(decisions));
            (&enforced.0[..], &enforced.1)
        } else {
            (limits, verdict)
        };
        let retry_after = verdict.retry_after().unwrap_or_default();
        let reset_after = verdict.binding().map_or(retry_after, |d| d.reset_after);
        let wait = retry_seconds(retry_after, reset_after);
        let mut body = String::with_capacity(80 + settings.message.len());
        body.push_str("{\"error\":\"too_many_requests\",\"message\":");
        push_json_string(&mut body, &settings.message);
        body.push_str(",\"retry_after\":");
        push_decimal(&mut body, wait);
        body.push('}');
        let mut fields = rate_fields(limits, verdict, settings.header_style);
        fields.push(("retry-after", decimal_string(wait)));
        Self {
            status: 429,
            fields,
            body,
            message: settings.message.clone(),
            retry_after: Some(retry_after),
        }
    }

    /// The message of [`Refusal::no_user`].
    pub(crate) const NO_USER: &str =
        "user info empty: the request carries no authenticated user (UserId)";

    /// 401: `by = "user"` and no [`super::UserId`] in the request.
    pub(crate) fn no_user() -> Self {
        Self::new(401, "unauthorized", Self::NO_USER)
    }

    /// 503: the store failed and the failure policy is `deny`.
    pub(crate) fn store_unavailable() -> Self {
        Self::new(
            503,
            "rate_limit_unavailable",
            "The rate-limit store is unavailable; please try again later.",
        )
    }
}

/// A refusal's wait in whole seconds (`Retry-After`, the body's `retry_after`, gRPC's
/// `retry-after`): `retry_after` rounded up, so that a client is never early, but never past
/// the `t` of the same refusal (its `reset_after` as [`reset_seconds`] rounds it), and at
/// least 1. A slot the stores put a little past the window (calls close together get distinct
/// microseconds on the sliding log; Redis rounds to the millisecond: a sliding 3 per 10 s
/// answering 10.000002 s) is answered as the window's 10, not 11. The exact wait (gRPC's
/// `RetryInfo`, `RateLimitError::Limited`) is not rounded.
pub(crate) fn retry_seconds(retry_after: Duration, reset_after: Duration) -> u64 {
    let wait = whole_seconds(retry_after);
    let bound = if reset_after >= retry_after {
        reset_seconds(reset_after)
    } else {
        wait
    };
    wait.min(bound).max(1)
}

/// Rounds up to whole seconds: `Retry-After`, which is never early.
pub(crate) fn whole_seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// A `reset_after` in whole seconds, as `t` (and `X-RateLimit-Reset`) report it: rounded up,
/// less the millisecond the stores round a window's end up by. Redis and the memory store
/// count expiries in whole milliseconds, so a fresh window of `w` seconds ends up to 1 ms
/// after `w`; without this a fresh 60 s window read `t=61`. `t` is then early by at most that
/// millisecond; `Retry-After`, the wait a client obeys, stays rounded up, up to `t`
/// ([`retry_seconds`]).
pub(crate) fn reset_seconds(d: Duration) -> u64 {
    whole_seconds(d.saturating_sub(Duration::from_millis(1)))
}

/// The `RateLimit-Policy` / `RateLimit` fields (draft-ietf-httpapi-ratelimit-headers) and/or
/// the legacy `X-RateLimit-*` ones for a verdict over `limits`.
///
/// Each limit is one list member, named after the last segment of its scope (a function name
/// by default, never the module path): `"login";q=3;w=10` and `"login";r=2;t=10`. `q` is the
/// limit's capacity, `w` the time it takes to grant that capacity (omitted when it is not a
/// whole number of seconds), `r` the units left and `t` the seconds, rounded up, until the quota
/// is whole again. A concurrency limit's member says `qu="concurrent-requests"` (the draft's
/// quota unit for calls in flight) and has no `w`: `q` is its slots, `r` the free ones. The
/// legacy fields describe the binding limit.
pub(crate) fn rate_fields(limits: &[Limit], verdict: &Verdict, style: HeaderStyle) -> Fields {
    fields_with(limits, verdict, style, None)
}

/// [`rate_fields`] for a function's static limits: the `RateLimit-Policy` value depends only
/// on them (and on the decisions' capacities, which are the limits' own), so it is formatted
/// once per function (`policy`) and only `RateLimit` is formatted per response.
pub(crate) fn static_rate_fields(
    limits: &[Limit],
    policy: &'static PolicyField,
    verdict: &Verdict,
    style: HeaderStyle,
) -> FieldSet {
    if style.ietf().is_none() {
        return FieldSet::List(fields_with(limits, verdict, style, None));
    }
    let decisions = verdict.decisions();
    let usual = decisions.len() == limits.len()
        && decisions
            .iter()
            .zip(limits)
            .all(|(d, l)| d.limit == l.policy.capacity());
    let Some(formatted) = policy.get(limits).filter(|_| usual) else {
        return FieldSet::List(fields_with(limits, verdict, style, None));
    };
    if style.legacy() {
        FieldSet::List(fields_with(limits, verdict, style, Some(&formatted.policy)))
    } else {
        FieldSet::Ietf {
            policy: &formatted.policy,
            state: state_value(Names::Formatted(&formatted.names), decisions),
        }
    }
}

/// A number as a `String` of exactly its digits (the frameworks take a string whose length is
/// its capacity without copying it).
fn decimal_string(n: u64) -> String {
    itoa::Buffer::new().format(n).to_owned()
}

/// The list-member names of a verdict's limits.
#[derive(Clone, Copy)]
enum Names<'a> {
    /// Formatted once for a function ([`PolicyField`]).
    Formatted(&'a [Box<str>]),
    /// Worked out from the limits.
    Of(&'a [Limit]),
}

impl Names<'_> {
    fn count(self) -> usize {
        match self {
            Self::Formatted(names) => names.len(),
            Self::Of(limits) => limits.len(),
        }
    }

    fn len(self, i: usize) -> usize {
        match self {
            Self::Formatted(names) => names[i].len(),
            Self::Of(limits) => name_len(limits, i),
        }
    }

    fn push(self, out: &mut String, i: usize) {
        match self {
            Self::Formatted(names) => out.push_str(&names[i]),
            Self::Of(limits) => push_name(out, limits, i),
        }
    }
}

/// The number of decimal digits of `n`.
fn digits(mut n: u64) -> usize {
    let mut digits = 1;
    while n >= 10 {
        n /= 10;
        digits += 1;
    }
    digits
}

/// The `RateLimit` value of `decisions` under `names`, in a string of exactly its length:
/// `"<name>";r=<remaining>;t=<seconds>` per limit, joined by `, `.
fn state_value(names: Names<'_>, decisions: &[Decision]) -> String {
    let members = decisions.iter().take(names.count()).enumerate();
    let mut len = 0;
    for (i, decision) in members.clone() {
        len += usize::from(i > 0) * 2
            + names.len(i)
            + 3
            + digits(decision.remaining)
            + 3
            + digits(reset_seconds(decision.reset_after));
    }
    let mut state = String::with_capacity(len);
    for (i, decision) in members {
        if i > 0 {
            state.push_str(", ");
        }
        names.push(&mut state, i);
        state.push_str(";r=");
        push_decimal(&mut state, decision.remaining);
        state.push_str(";t=");
        push_decimal(&mut state, reset_seconds(decision.reset_after));
    }
    debug_assert_eq!(state.len(), state.capacity());
    state
}

/// Appends the `RateLimit-Policy` member of `limits[i]` (after a separator if not the first).
fn push_policy(policy: &mut String, limits: &[Limit], i: usize, capacity: u64) {
    if i > 0 {
        policy.push_str(", ");
    }
    push_name(policy, limits, i);
    policy.push_str(";q=");
    push_decimal(policy, capacity);
    let p = &limits[i].policy;
    if limits[i].holds_slot() {
        // A concurrency limit: `q` slots at once, in the draft's quota unit for them; no
        // window (a slot comes back when its call ends).
        policy.push_str(";qu=\"concurrent-requests\"");
        return;
    }
    // Time to grant `capacity` units at `limit` per period.
    let window_ms = u128::from(p.period_ms()) * u128::from(p.capacity()) / u128::from(p.limit());
    if window_ms % 1000 == 0 {
        policy.push_str(";w=");
        // Below 2^64: period_ms × capacity ÷ limit, with capacity ≤ 2^50 and period_ms < 2^42.
        push_decimal(policy, u64::try_from(window_ms / 1000).unwrap_or(u64::MAX));
    }
}

/// The fields, with the `RateLimit-Policy` value given when it is already formatted.
fn fields_with(
    limits: &[Limit],
    verdict: &Verdict,
    style: HeaderStyle,
    policy: Option<&str>,
) -> Fields {
    let mut fields = Vec::with_capacity(3);
    let decisions = verdict.decisions();
    // The one place the IETF fields are written, per draft.
    if let Some(IetfDraft::Draft11) = style.ietf() {
        let policy = if let Some(policy) = policy {
            policy.to_owned()
        } else {
            let mut policy = String::with_capacity(24 * limits.len());
            for (i, decision) in decisions.iter().take(limits.len()).enumerate() {
                push_policy(&mut policy, limits, i, decision.limit);
            }
            policy
        };
        fields.push(("ratelimit-policy", policy));
        fields.push(("ratelimit", state_value(Names::Of(limits), decisions)));
    }
    if style.legacy()
        && let Some(d) = verdict.binding()
    {
        fields.push(("x-ratelimit-limit", decimal_string(d.limit)));
        fields.push(("x-ratelimit-remaining", decimal_string(d.remaining)));
        fields.push((
            "x-ratelimit-reset",
            decimal_string(reset_seconds(d.reset_after)),
        ));
    }
    fields
}

/// The policy name of `limits[i]` as a structured-field string: the last segment of its scope,
/// with `-<i+1>` appended when an earlier limit already has that name.
#[cfg(all(test, feature = "tower"))]
pub(crate) fn push_member_name(out: &mut String, limits: &[Limit], i: usize) {
    push_name(out, limits, i);
}

fn push_name(out: &mut String, limits: &[Limit], i: usize) {
    let name = short_name(limits[i].scope);
    out.push('"');
    // Scopes are made of `A-Z a-z 0-9 _ : . - /` (key::valid_scope): no escaping needed.
    out.push_str(name);
    if limits[..i].iter().any(|l| short_name(l.scope) == name) {
        out.push('-');
        push_decimal(out, i as u64 + 1);
    }
    out.push('"');
}

/// The length [`push_name`] writes.
fn name_len(limits: &[Limit], i: usize) -> usize {
    let name = short_name(limits[i].scope);
    let mut len = 2 + name.len();
    if limits[..i].iter().any(|l| short_name(l.scope) == name) {
        len += 1 + itoa::Buffer::new().format(i as u64 + 1).len();
    }
    len
}

/// Joins a list field's members for `limits` (`ours`, as [`rate_fields`] formats them) to the
/// members a response already carries (`theirs`: a route's own `#[rate_limit]` under a
/// [`crate::RateLimitLayer`]), so that the response has **one** field and one naming rule:
/// each member is named after its limit's scope, with its 1-based position in the field
/// appended when an earlier member of the field has that name (`"api"`, `"api-2"`).
#[cfg(feature = "tower")]
pub(crate) fn join_members(theirs: &str, ours: &str, limits: &[Limit]) -> String {
    let theirs = theirs.trim();
    if theirs.is_empty() {
        return ours.to_owned();
    }
    let member_name = |member: &str| -> Option<String> {
        let rest = member.trim_start().strip_prefix('"')?;
        Some(rest[..rest.find('"')?].to_owned())
    };
    let mut names: Vec<String> = theirs.split(',').filter_map(member_name).collect();
    let members: Vec<&str> = ours.split(',').map(str::trim).collect();
    let mut out = String::with_capacity(theirs.len() + ours.len() + 8);
    out.push_str(theirs);
    for (i, member) in members.iter().enumerate() {
        out.push_str(", ");
        let (Some(limit), Some(old)) = (
            limits.get(i).filter(|_| members.len() == limits.len()),
            member_name(member),
        ) else {
            out.push_str(member);
            continue;
        };
        let base = short_name(limit.scope);
        let mut name = base.to_owned();
        if names.iter().any(|n| n == base) {
            name.push('-');
            push_decimal(&mut name, (names.len() + 1) as u64);
        }
        out.push('"');
        out.push_str(&name);
        out.push('"');
        out.push_str(&member.trim_start()[old.len() + 2..]);
        names.push(base.to_owned());
    }
    out
}

fn short_name(scope: &str) -> &str {
    let tail = scope.rsplit("::").next().unwrap_or(scope);
    tail.rsplit('/').next().unwrap_or(tail)
}

/// Appends `s` as a JSON string literal.
pub(crate) fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one table of gRPC codes, for every refusal the pipeline renders.
    #[test]
    fn every_refusal_has_its_grpc_code() {
        let code = |status| Refusal::new(status, "e", "m").grpc_code();
        assert_eq!(code(429), 8);
        assert_eq!(code(503), 14);
        assert_eq!(code(403), 7);
        assert_eq!(code(400), 3);
        assert_eq!(code(401), 16);
        assert_eq!(code(500), 13);
        assert_eq!(code(418), 2);
        assert_eq!(Refusal::forbidden().grpc_code(), 7);
        assert_eq!(Refusal::store_unavailable().grpc_code(), 14);
    }
    use crate::algorithm::Algorithm;
    use crate::decision::Decision;
    use crate::limit::By;
    use crate::policy::Policy;
    use std::sync::LazyLock;

    fn limit(scope: &'static str, algo: Algorithm, num: u64, ms: u64, burst: u64) -> Limit {
        Limit {
            policy: Policy::from_parts(algo, num, ms, burst, 1).unwrap(),
            scope,
            by: By::Ip,
            shadow: false,
            failure_policy: None,
            lease: None,
            replica_ack: false,
        }
    }

    #[test]
    fn ietf_fields_name_each_policy_and_round_seconds_up() {
        let limits = [
            limit("app::login", Algorithm::Sliding, 3, 10_000, 3),
            limit("app::login", Algorithm::Token, 5, 1_000, 10),
            limit("app::daily", Algorithm::Fixed, 100, 1_500, 100),
        ];
        let ms = Duration::from_millis;
        let v = Verdict::new(vec![
            Decision::new(true, 3, 2, ms(9_002), ms(0)),
            Decision::new(true, 10, 9, ms(100), ms(0)),
            Decision::new(true, 100, 99, ms(1_500), ms(0)),
        ]);
        let f = rate_fields(&limits, &v, HeaderStyle::default());
        assert_eq!(
            f,
            vec![
                (
                    "ratelimit-policy",
                    "\"login\";q=3;w=10, \"login-2\";q=10;w=2, \"daily\";q=100".to_owned()
                ),
                (
                    "ratelimit",
                    "\"login\";r=2;t=10, \"login-2\";r=9;t=1, \"daily\";r=99;t=2".to_owned()
                ),
            ]
        );
        let legacy = rate_fields(&limits[..1], &v, HeaderStyle::Legacy);
        assert_eq!(
            legacy,
            vec![
                ("x-ratelimit-limit", "3".to_owned()),
                ("x-ratelimit-remaining", "2".to_owned()),
                ("x-ratelimit-reset", "10".to_owned()),
            ]
        );
        assert_eq!(
            rate_fields(&limits, &v, HeaderStyle::Both(IetfDraft::Draft11)).len(),
            5
        );
    }

    /// A fresh fixed window of 60 s reads `t=60`, as `w`, not `t=61` (the stores end a window
    /// up to 1 ms after its period). `Retry-After` stays rounded up.
    #[test]
    fn a_fresh_window_reads_t_equal_to_w() {
        let store = crate::store::MemoryStore::new();
        for (algorithm, num, period_ms) in [
            (Algorithm::Fixed, 5, 60_000),
            (Algorithm::Fixed, 3, 10_000),
            (Algorithm::Sliding, 3, 10_000),
        ] {
            let limits = [limit("search", algorithm, num, period_ms, num)];
            let key = format!("{algorithm}:{num}:{period_ms}");
            let checks = [crate::store::Check::new(&key, &limits[0].policy)];
            let v = store.check_now(&checks).unwrap();
            let fields = rate_fields(&limits, &v, HeaderStyle::default());
            let w = period_ms / 1000;
            assert_eq!(
                fields[0].1,
                format!("\"search\";q={num};w={w}"),
                "{algorithm}"
            );
            assert_eq!(
                fields[1].1,
                format!("\"search\";r={};t={w}", num - 1),
                "{algorithm}"
            );
        }
        // The rounding: up, less the store's millisecond; never below what is left otherwise.
        for (us, t) in [
            (60_000_000, 60),
            (60_000_999, 60),
            (60_001_000, 60),
            (60_001_001, 61),
            (1, 0),
            (1_001, 1),
        ] {
            assert_eq!(reset_seconds(Duration::from_micros(us)), t, "{us}");
        }
        assert_eq!(whole_seconds(Duration::from_micros(60_000_001)), 61);
    }

    #[test]
    fn a_429_waits_whole_seconds_rounded_up_and_at_least_one() {
        let limits = [limit("login", Algorithm::Sliding, 3, 10_000, 3)];
        let settings = HttpSettings {
            message: "slow \"down\"\n".to_owned(),
            ..HttpSettings::default()
        };
        for (wait_ms, secs) in [(1, 1), (0, 1), (1_000, 1), (1_001, 2), (9_999, 10)] {
            let v = Verdict::new(vec![Decision::new(
                false,
                3,
                0,
                Duration::from_secs(10),
                Duration::from_millis(wait_ms),
            )]);
            let r = Refusal::too_many_requests(&limits, &v, &settings);
            assert_eq!(r.status, 429);
            assert!(r.fields.contains(&("retry-after", secs.to_string())));
            assert_eq!(
                r.body,
                format!(
                    "{{\"error\":\"too_many_requests\",\"message\":\"slow \\\"down\\\"\\n\",\"retry_after\":{secs}}}"
                )
            );
        }
    }

    /// A sliding 3 per 10 s whose calls fell close together: the stores put the slot a few
    /// microseconds (Redis: up to a millisecond) past the window. `Retry-After` and the body
    /// never pass the window's 10 s; a wait under it still rounds up; the exact wait (what
    /// gRPC's `RetryInfo` carries) is kept.
    #[test]
    fn a_wait_in_seconds_never_passes_the_limit_s_window() {
        let limits = [limit("login", Algorithm::Sliding, 3, 10_000, 3)];
        let settings = HttpSettings::default();
        let us = Duration::from_micros;
        for (wait_us, reset_us, secs) in [
            (10_000_001, 10_000_003, 10),
            (10_001_000, 10_001_000, 10),
            (9_300_000, 10_000_000, 10),
            (1_200_000, 10_000_000, 2),
            (1_200_000, 1_200_000, 2),
            (0, 0, 1),
        ] {
            let v = Verdict::new(vec![Decision::new(false, 3, 0, us(reset_us), us(wait_us))]);
            let r = Refusal::too_many_requests(&limits, &v, &settings);
            assert!(
                r.fields.contains(&("retry-after", secs.to_string())),
                "{wait_us} µs: {:?}",
                r.fields
            );
            assert!(
                r.body.ends_with(&format!("\"retry_after\":{secs}}}")),
                "{}",
                r.body
            );
            assert_eq!(r.retry_after, Some(us(wait_us)), "{wait_us} µs");
        }
    }

    #[test]
    fn static_limits_reuse_their_policy_field_and_match_the_formatted_one() {
        static LOGIN: LazyLock<[Limit; 2]> = LazyLock::new(|| {
            [
                limit("app::login", Algorithm::Sliding, 3, 10_000, 3),
                limit("app::login", Algorithm::Token, 5, 1_000, 10),
            ]
        });
        static DAILY: LazyLock<[Limit; 1]> =
            LazyLock::new(|| [limit("app::daily", Algorithm::Fixed, 100, 1_500, 100)]);
        static LOGIN_POLICY: PolicyField = PolicyField::new();
        static DAILY_POLICY: PolicyField = PolicyField::new();
        let ms = Duration::from_millis;
        let login = Verdict::new(vec![
            Decision::new(true, 3, 2, ms(9_002), ms(0)),
            Decision::new(true, 10, 9, ms(100), ms(0)),
        ]);
        let daily = Verdict::new(vec![Decision::new(true, 100, 99, ms(1_500), ms(0))]);
        let cases = [
            (&LOGIN[..], &LOGIN_POLICY, &login),
            (&DAILY[..], &DAILY_POLICY, &daily),
        ];
        for _ in 0..2 {
            for style in [
                HeaderStyle::default(),
                HeaderStyle::Both(IetfDraft::Draft11),
                HeaderStyle::Legacy,
            ] {
                for (limits, policy, v) in cases {
                    let fields = static_rate_fields(limits, policy, v, style);
                    assert_eq!(fields.to_list(), rate_fields(limits, v, style));
                    if style == HeaderStyle::default() {
                        // The usual set, without a list, and a value of exactly its length.
                        let FieldSet::Ietf { state, .. } = fields else {
                            panic!("{fields:?}");
                        };
                        assert_eq!(state.len(), state.capacity());
                    }
                }
            }
        }
        assert_eq!(
            static_rate_fields(&DAILY[..], &DAILY_POLICY, &daily, HeaderStyle::default()),
            FieldSet::Ietf {
                policy: "\"daily\";q=100",
                state: "\"daily\";r=99;t=2".to_owned()
            }
        );
        // A verdict that does not match the limits one to one is formatted from its decisions.
        let other = Verdict::new(vec![Decision::new(true, 7, 6, ms(1_000), ms(0))]);
        assert_eq!(
            static_rate_fields(&DAILY[..], &DAILY_POLICY, &other, HeaderStyle::default()).to_list()
                [0],
            ("ratelimit-policy", "\"daily\";q=7".to_owned())
        );
        assert_eq!(
            static_rate_fields(&LOGIN[..], &LOGIN_POLICY, &daily, HeaderStyle::default()).to_list(),
            rate_fields(&LOGIN[..], &daily, HeaderStyle::default())
        );
    }

    #[test]
    fn numbers_are_written_exactly() {
        for n in [0, 1, 9, 10, 99, 100, 12_345, u64::from(u32::MAX), u64::MAX] {
            assert_eq!(decimal_string(n), n.to_string());
            assert_eq!(decimal_string(n).capacity(), n.to_string().len());
            assert_eq!(digits(n), n.to_string().len());
        }
        // A repeated name gets its position; the value is exactly as long as it says.
        let limits = [
            limit("a::x", Algorithm::Fixed, 10, 1_000, 10),
            limit("b::x", Algorithm::Fixed, 10, 1_000, 10),
        ];
        let ms = Duration::from_millis;
        let decisions = [
            Decision::new(true, 10, 0, ms(0), ms(0)),
            Decision::new(true, 10, 1_000_000, ms(2), ms(0)),
        ];
        let state = state_value(Names::Of(&limits), &decisions);
        assert_eq!(state, "\"x\";r=0;t=0, \"x-2\";r=1000000;t=1");
        assert_eq!(state.len(), state.capacity());
    }

    #[test]
    fn json_strings_are_escaped() {
        let mut s = String::new();
        push_json_string(&mut s, "a\"b\\c\u{1}é");
        assert_eq!(s, "\"a\\\"b\\\\c\\u0001é\"");
    }
}
