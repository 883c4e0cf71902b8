//! What `#[rate_limit]` writes: [`Limit`]s (a policy, a scope, a `by`), the rendering of `key`
//! templates, and the one place where a limit's store key is put together for a caller
//! ([`key_of`], through [`keys_for`] for plain functions, HTTP handlers and the rest alike).
//!
//! The macro reaches these items through `crate::__private`, which only re-exports them.

use crate::algorithm::Algorithm;
use crate::key;
use crate::lease::Lease;
use crate::policy::Policy;

/// Who a caller is, from the `by` argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    /// One bucket for the scope.
    Global,
    /// The peer IP (trusted proxies honoured, IPv6 grouped).
    Ip,
    /// The request path without the query.
    Url,
    /// The `UserId` in the request extensions.
    User,
    /// Header `appId`.
    AppId,
    /// Any header; the name is lower-case.
    Header(&'static str),
}

impl By {
    /// The key source of this `by` value (`None` for `global`).
    pub(crate) fn source(self) -> Option<key::Source<'static>> {
        Some(match self {
            Self::Global => return None,
            Self::Ip => key::Source::Ip,
            Self::Url => key::Source::Url,
            Self::User => key::Source::User,
            Self::AppId => key::Source::AppId,
            Self::Header(name) => key::Source::Header(name),
        })
    }
}

/// One `#[rate_limit]` attribute, as the macro wrote it; also how the admin calls
/// ([`RateLimiter::peek`](crate::RateLimiter::peek),
/// [`RateLimiter::reset`](crate::RateLimiter::reset),
/// [`RateLimiter::block`](crate::RateLimiter::block)) name a limit.
///
/// An admin call builds a caller's keys exactly as the attribute does, from the same three
/// things: the policy (algorithm, `num`, `time`, `burst`, `cost`), the scope and the `by`.
/// Give the function an explicit `scope` and declare the same limit as a `const` next to it:
///
/// ```
/// use ratelimit_runtime::{Algorithm, By, Limit, Policy};
///
/// // On the handler:
/// // #[rate_limit(algo = "sliding", num = 3, time = 10, by = "user", scope = "login")]
///
/// /// `login`'s limit, for the admin calls: the same algorithm, num, time (ms), burst, cost,
/// /// scope and by.
/// pub const LOGIN: Limit = Limit::new(
///     match Policy::from_parts(Algorithm::Sliding, 3, 10_000, 3, 1) {
///         Ok(p) => p,
///         Err(_) => panic!("invalid policy"),
///     },
///     "login",
///     By::User,
/// );
/// assert_eq!(LOGIN.scope, "login");
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Limit {
    /// The limit.
    pub policy: Policy,
    /// The bucket name (default: the function's module path and name).
    pub scope: &'static str,
    /// Who a caller is.
    pub by: By,
    /// Shadow mode (`shadow = true`): checked and counted as usual, a rejection is only
    /// logged and counted (`shadow_rejected`), never enforced.
    pub shadow: bool,
    /// What a call gets when the store fails or does not answer in time, for this limit
    /// (`on_store_error = "deny" | "local" | "allow"`); `None`: the limiter's
    /// [`Settings::failure_policy`](crate::limiter::Settings::failure_policy). One call checks all its
    /// limits in one store call, so when that fails the call is answered by the strictest
    /// policy among its limits ([`FailurePolicy::stricter`]: deny, then local, then allow): a
    /// limit that must hold is never loosened by a lenient one stacked with it. A limit in
    /// shadow mode never refuses a call, so its own policy applies only once it is enforced.
    pub failure_policy: Option<FailurePolicy>,
    /// Whether a process takes this limit's units a lease at a time for a hot key
    /// (`lease = "100ms"`, `lease_max`; see [`crate::lease`]); `None`: every call is checked
    /// at the store.
    pub lease: Option<Lease>,
    /// Whether this limit's admitted calls wait for a replica to acknowledge their write
    /// (the attribute's `replica_ack = true`, [`Limit::with_replica_ack`]; the limiter's
    /// [`Builder::replica_ack`](crate::limiter::Builder::replica_ack) asks it of every limit).
    pub replica_ack: bool,
}

impl Limit {
    /// Whether a call holds a slot of this limit until it ends (a concurrency limit): its check
    /// is a take under a call id, and the call's end releases it.
    pub(crate) fn holds_slot(&self) -> bool {
        self.policy.algorithm() == crate::algorithm::Algorithm::Concurrency
    }

    /// A limit (enforced, not in shadow mode).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, By, Limit, Policy};
    /// let policy = Policy::new(Algorithm::Fixed, 5, Duration::from_secs(60))?;
    /// let limit = Limit::new(policy, "sms", By::Global);
    /// assert!(!limit.shadow);
    /// # Ok::<(), ratelimit_runtime::PolicyError>(())
    /// ```
    pub const fn new(policy: Policy, scope: &'static str, by: By) -> Self {
        Self {
            policy,
            scope,
            by,
            shadow: false,
            failure_policy: None,
            lease: None,
            replica_ack: false,
        }
    }

    /// The same limit in shadow mode.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, By, Limit, Policy};
    /// let policy = Policy::new(Algorithm::Fixed, 5, Duration::from_secs(60))?;
    /// assert!(Limit::new(policy, "sms", By::Global).in_shadow().shadow);
    /// # Ok::<(), ratelimit_runtime::PolicyError>(())
    /// ```
    #[must_use]
    pub const fn in_shadow(mut self) -> Self {
        self.shadow = true;
        self
    }

    /// The same limit with a failure policy of its own (see [`Limit::failure_policy`]): the
    /// attribute's `on_store_error`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, By, FailurePolicy, Limit, Policy};
    /// let policy = Policy::new(Algorithm::Fixed, 3, Duration::from_secs(60))?;
    /// // #[rate_limit(num = 3, time = 60, by = "user", scope = "login", on_store_error = "deny")]
    /// let login = Limit::new(policy, "login", By::User).failure_policy(FailurePolicy::Deny);
    /// assert_eq!(login.failure_policy, Some(FailurePolicy::Deny));
    /// # Ok::<(), ratelimit_runtime::PolicyError>(())
    /// ```
    #[must_use]
    pub const fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.failure_policy = Some(policy);
        self
    }

    /// The same limit, its admitted calls waiting for a replica to acknowledge their write (see
    /// [`Builder::replica_ack`](crate::limiter::Builder::replica_ack), which asks it of every limit): a
    /// Cluster failover never forgets an admitted call of this limit. A write no replica
    /// acknowledged in time is answered by the failure policy; a limit that must never admit
    /// more than its quota pairs it with [`FailurePolicy::Deny`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, By, FailurePolicy, Limit, Policy};
    /// let policy = Policy::new(Algorithm::Fixed, 3, Duration::from_secs(60))?;
    /// let login = Limit::new(policy, "login", By::User)
    ///     .failure_policy(FailurePolicy::Deny)
    ///     .with_replica_ack();
    /// assert!(login.replica_ack);
    /// # Ok::<(), ratelimit_runtime::PolicyError>(())
    /// ```
    #[must_use]
    pub const fn with_replica_ack(mut self) -> Self {
        self.replica_ack = true;
        self
    }

    /// The same limit, taking its units a lease at a time on a hot key (the attribute's
    /// `lease`; see [`crate::lease`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, By, lease::Lease, Limit, Policy};
    /// let policy = Policy::new(Algorithm::Gcra, 50_000, Duration::from_secs(1))?;
    /// // #[rate_limit(algo = "gcra", num = 50000, time = 1, scope = "feed", lease = "100ms")]
    /// let feed = Limit::new(policy, "feed", By::Global).with_lease(Lease::new(Duration::from_millis(100))?)?;
    /// assert_eq!(feed.lease.map(|l| l.ttl()), Some(Duration::from_millis(100)));
    /// # Ok::<(), ratelimit_runtime::PolicyError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`crate::PolicyError::LeaseAlgorithm`] on the sliding log and a concurrency limit,
    /// which cannot take units early.
    pub const fn with_lease(mut self, lease: Lease) -> Result<Self, crate::policy::PolicyError> {
        if let Err(e) = crate::lease::check(&self.policy, &lease) {
            return Err(e);
        }
        self.lease = Some(lease);
        Ok(self)
    }
}

/// One piece of a `key` template: literal text, or an argument formatted with `Display`.
#[derive(Clone, Copy)]
pub enum Piece<'a> {
    /// Literal text.
    Text(&'static str),
    /// An argument (`{phone}`, `{form.phone}`).
    Arg(&'a dyn std::fmt::Display),
}

impl std::fmt::Debug for Piece<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Text(t) => f.debug_tuple("Text").field(t).finish(),
            Self::Arg(a) => f.debug_tuple("Arg").field(&format_args!("{a}")).finish(),
        }
    }
}

/// Renders a `key` template: the only allocation the macro adds per call.
///
/// A template with one argument renders as written. With two or more, each argument is
/// written as its length in bytes, `~`, then itself, so that no two argument lists render
/// alike (`"{a}:{b}"` with `a = "x:y", b = "z"` and with `a = "x", b = "y:z"` are two callers,
/// not one).
///
/// ```
/// use ratelimit_runtime::__private::{render, Piece};
/// let phone = "+15550100";
/// assert_eq!(render(&[Piece::Text("sms:"), Piece::Arg(&phone)]), "sms:+15550100");
/// let (a, b) = ("x:y", "z");
/// assert_eq!(render(&[Piece::Arg(&a), Piece::Text(":"), Piece::Arg(&b)]), "3~x:y:1~z");
/// ```
pub fn render(pieces: &[Piece<'_>]) -> String {
    use std::fmt::Write as _;
    let framed = pieces.iter().filter(|p| matches!(p, Piece::Arg(_))).count() > 1;
    let mut out = String::new();
    for piece in pieces {
        match piece {
            Piece::Text(t) => out.push_str(t),
            Piece::Arg(a) if framed => {
                let start = out.len();
                let _ = write!(out, "{a}");
                let len = (out.len() - start).to_string();
                out.insert_str(start, &len);
                out.insert(start + len.len(), '~');
            }
            Piece::Arg(a) => {
                let _ = write!(out, "{a}");
            }
        }
    }
    out
}

/// A policy from the macro's already-checked arguments; evaluated at compile time, where an
/// invalid one fails the build.
///
/// # Panics
///
/// When the arguments break a rule of [`Policy::from_parts`], with that rule's message: in the
/// `static` the macro emits, a compile error.
pub const fn policy(
    algorithm: Algorithm,
    num: u64,
    period_ms: u64,
    burst: u64,
    cost: u64,
) -> Policy {
    // The macro checks the same rules (the same file, `policy/rules.rs`) with spans; this is
    // the backstop, a compile error with the same message.
    match Policy::from_parts(algorithm, num, period_ms, burst, cost) {
        Ok(p) => p,
        Err(e) => panic!("{}", e.message()),
    }
}

/// `time = CONST`: a `Duration` const as the whole milliseconds a policy counts in (saturating;
/// the policy's rules then reject a period that is too long, at compile time).
pub const fn period_ms(period: std::time::Duration) -> u64 {
    let ms = period.as_millis();
    if ms > u64::MAX as u128 {
        u64::MAX
    } else {
        #[allow(clippy::cast_possible_truncation)] // checked just above
        {
            ms as u64
        }
    }
}

/// The key of `limit` for one caller: its rendered `key` template (if any) and its value for
/// `by` (`None` for `global`). The one place where a limit's key is put together.
pub(crate) fn key_of(
    prefix: &str,
    limit: &Limit,
    template: Option<&str>,
    by: Option<&[u8]>,
) -> String {
    let mut parts = [key::Part::new(key::Source::Key, &[]); 2];
    let mut n = 0;
    if let Some(t) = template {
        parts[n] = key::Part::new(key::Source::Key, t.as_bytes());
        n += 1;
    }
    if let (Some(value), Some(source)) = (by, limit.by.source()) {
        parts[n] = key::Part::new(source, value);
        n += 1;
    }
    key::build(prefix, limit.scope, &parts[..n], &limit.policy)
}

/// Builds the keys of `limits` for one caller ([`key_of`] for each): `templates[i]` is limit
/// `i`'s rendered `key` template (if any), `by_value(by)` its caller's value for `by` (`None`
/// for `global`), or the reason the caller cannot be keyed.
pub(crate) fn keys_for<V: AsRef<[u8]>, E>(
    prefix: &str,
    limits: &[Limit],
    templates: &[Option<&str>],
    mut by_value: impl FnMut(By) -> Result<Option<V>, E>,
) -> Result<Vec<String>, E> {
    let mut keys = Vec::with_capacity(limits.len());
    for (i, limit) in limits.iter().enumerate() {
        let by = by_value(limit.by)?;
        let template = templates.get(i).copied().flatten();
        keys.push(key_of(
            prefix,
            limit,
            template,
            by.as_ref().map(AsRef::as_ref),
        ));
    }
    Ok(keys)
}

/// What a check does when the store fails or does not answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Fail open: admit the call and log the failure (throttled), for those who choose it by
    /// name: a limit that only protects capacity, where an outage of the limiter must never
    /// refuse a call. While the store is away (an outage, and every Cluster failover, a few
    /// seconds each) such a limit admits everything. One exception, under every
    /// policy: a store that answered but cannot record the call
    /// ([`StoreError::cannot_record`](crate::StoreError::cannot_record): a memory store whose every entry is a live caller, a
    /// Redis at its `maxmemory`; someone minting keys) refuses it as under
    /// [`FailurePolicy::Deny`] — a flood of keys never switches other callers' limits off.
    Allow,
    /// Fail closed: reject the call (503 for handlers, [`RateLimitError::StoreUnavailable`](crate::RateLimitError::StoreUnavailable) for
    /// plain functions). For limits that protect something costly or abusable (logins, SMS,
    /// payments), where letting everything through is worse than refusing for a while.
    Deny,
    /// **The default.** Check the same limits against an in-process memory store until the store answers again
    /// (every limit of the call, when one of them asks for it; the memory store is made by the
    /// first call that needs it): the limits still hold, per process (see the bound below). A store
    /// that cannot record the call ([`StoreError::cannot_record`](crate::StoreError::cannot_record)) is not failing: its calls
    /// are refused, not checked here (a caller at 2 of 5 in Redis would get 5 more). When that
    /// local store is full of live entries ([`StoreError::Full`](crate::StoreError::Full)), a call that needs a new key
    /// there is rejected as with [`FailurePolicy::Deny`]: no other caller's local state is
    /// dropped to make room.
    ///
    /// **With N processes, each keeping its own count, the fleet admits up to N × `num`**
    /// during an outage, unless the limiter knows N: with
    /// [`Builder::local_share(N)`](crate::limiter::Builder::local_share) each process checks every limit
    /// against its share ([`Policy::share`]: `num` and `burst` divided by N, rounded down, at
    /// least 1; the keys are the same). The fleet then admits at most
    /// `N × max(1, ⌊num / N⌋) ≤ max(num, N)` per window: at most `num` when `num ≥ N` (100 a
    /// minute over 4 processes: 25 each, 100 in all; 10 over 3: 3 each, 9 in all), and one
    /// call per process when `num < N` (10 over 20: 20 in all). The buckets scale `burst` the
    /// same way. A call whose cost is more than its share's capacity is refused as under
    /// [`FailurePolicy::Deny`]: admitting it would give this process more than its share.
    /// The decisions (and the rate-limit headers) report the share's numbers.
    ///
    /// ```
    /// use ratelimit_runtime::{FailurePolicy, RateLimiter};
    /// // One of 4 replicas: while Redis is down, 100 a minute becomes 25 a minute here.
    /// let limiter = RateLimiter::builder()
    ///     .redis_url("redis://127.0.0.1:6379")
    ///     .failure_policy(FailurePolicy::Local)
    ///     .local_share(4)
    ///     .build_lazy()?;
    /// # let _ = limiter;
    /// # Ok::<(), ratelimit_runtime::ConfigError>(())
    /// ```
    ///
    /// Why the default: a store is away for ordinary reasons (a restart, a network blip, each
    /// Cluster failover for the seconds a replica takes to be promoted), and a client can make
    /// a store slow. A limit written `num = 3` stays a limit of 3 a period per process
    /// meanwhile (its share, with `local_share`), instead of switching off.
    #[default]
    Local,
}

impl FailurePolicy {
    /// The policy as the attribute's `on_store_error` spells it: `"allow"`, `"deny"` or
    /// `"local"` (also the `policy` field of the limiter's warnings).
    ///
    /// ```
    /// use ratelimit_runtime::FailurePolicy;
    /// assert_eq!(FailurePolicy::Deny.as_str(), "deny");
    /// ```
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
            Self::Local => "local",
        }
    }

    /// The stricter of two policies: [`FailurePolicy::Deny`], then [`FailurePolicy::Local`],
    /// then [`FailurePolicy::Allow`]. A call whose store call fails is answered by the
    /// strictest policy among its limits ([`crate::Limit::failure_policy`]; the limiter's for
    /// a limit that names none), so a limit that must hold is never loosened by a lenient one
    /// stacked with it.
    ///
    /// ```
    /// use ratelimit_runtime::FailurePolicy;
    /// assert_eq!(FailurePolicy::Allow.stricter(FailurePolicy::Local), FailurePolicy::Local);
    /// assert_eq!(FailurePolicy::Deny.stricter(FailurePolicy::Local), FailurePolicy::Deny);
    /// ```
    #[must_use]
    pub const fn stricter(self, other: Self) -> Self {
        const fn rank(p: FailurePolicy) -> u8 {
            match p {
                FailurePolicy::Allow => 0,
                FailurePolicy::Local => 1,
                FailurePolicy::Deny => 2,
            }
        }
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }
}
