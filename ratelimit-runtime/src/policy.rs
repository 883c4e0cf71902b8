//! What a limit is ([`Policy`]) and what a check answers ([`Decision`], [`Verdict`]).

use std::fmt;
use std::time::Duration;

/// The six rate-limiting algorithms (`burst` is the capacity of the buckets, `leaky` and
/// `token`, and of `gcra`; the windows' capacity is `num`).
///
/// ```
/// use ratelimit_runtime::Algorithm;
/// assert_eq!("sliding".parse::<Algorithm>(), Ok(Algorithm::Sliding));
/// assert_eq!(Algorithm::Token.as_str(), "token");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// At most `num` admissions per window; the window starts at the first admitted call and
    /// lasts `period`. One counter with a TTL.
    Fixed,
    /// At most `num` admissions in any trailing interval of length `period` (no boundary burst).
    Sliding,
    /// A bucket of capacity `burst` that drains continuously at `num / period`; a call adds
    /// `cost` if it fits.
    Leaky,
    /// A bucket of capacity `burst`, full at start, refilled continuously at `num / period`; a
    /// call takes `cost` tokens if there are enough.
    Token,
    /// The generic cell rate algorithm: the token bucket (capacity `burst`, one unit per
    /// `period / num`) kept as one integer, the theoretical arrival time.
    Gcra,
    /// The current and previous fixed windows' counts, the previous weighted by its share of
    /// the trailing interval: O(1) state, approximate (see [`crate::algorithm::sliding_counter`]).
    SlidingCounter,
}

impl Algorithm {
    /// Every algorithm, in the order of their wire codes.
    pub const ALL: [Algorithm; 6] = [
        Self::Fixed,
        Self::Sliding,
        Self::Leaky,
        Self::Token,
        Self::Gcra,
        Self::SlidingCounter,
    ];

    /// The name used in the attribute (`algo = "…"`) and in store keys.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Fixed => "fixed",
            Self::Sliding => "sliding",
            Self::Leaky => "leaky",
            Self::Token => "token",
            Self::Gcra => "gcra",
            Self::SlidingCounter => "sliding_counter",
        }
    }

    /// The number the Lua scripts know this algorithm by.
    pub(crate) const fn code(self) -> u8 {
        match self {
            Self::Fixed => 1,
            Self::Sliding => 2,
            Self::Leaky => 3,
            Self::Token => 4,
            Self::Gcra => 5,
            Self::SlidingCounter => 6,
        }
    }
}

impl Algorithm {
    /// How this algorithm's numbers are bounded.
    const fn kind(self) -> rules::Kind {
        match self {
            Self::Fixed => rules::Kind::Window,
            Self::Sliding => rules::Kind::Log,
            Self::Leaky | Self::Token => rules::Kind::Bucket,
            Self::Gcra => rules::Kind::Gcra,
            Self::SlidingCounter => rules::Kind::Counter,
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Algorithm {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or(PolicyError::UnknownAlgorithm)
    }
}

/// Why a [`Policy`] could not be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PolicyError {
    /// `num` was 0.
    ZeroLimit,
    /// The period was shorter than one millisecond.
    ZeroPeriod,
    /// The period was longer than the stores can represent (about 100 years).
    PeriodTooLong,
    /// `burst` was 0.
    ZeroBurst,
    /// `cost` was 0.
    ZeroCost,
    /// `cost` was larger than the capacity (`num` for fixed/sliding, `burst` for buckets): no
    /// call could ever be admitted.
    CostExceedsCapacity,
    /// The algorithm name is not one of `fixed`, `sliding`, `leaky`, `token`, `gcra`,
    /// `sliding_counter`.
    UnknownAlgorithm,
    /// `num`, `burst` or `cost` is above [`MAX_UNITS`]: the Redis scripts count in doubles,
    /// exact only below 2^53, and every number they return must stay exact.
    TooManyUnits,
    /// A bucket too fine to keep exact: the Redis scripts keep a bucket's level as an integer
    /// in units of `1 / (period_µs / gcd(num, period_µs))`, and `burst` of those must stay
    /// within [`MAX_BUCKET_SCALE`].
    BucketTooFine,
    /// A sliding log above [`MAX_SLIDING_LOG`] (one entry per admitted unit).
    SlidingLogTooLarge,
    /// GCRA faster than one unit per microsecond.
    GcraTooFast,
    /// GCRA whose burst tolerance `burst × ⌈period_µs / num⌉` passes [`MAX_BUCKET_SCALE`].
    GcraTooFine,
    /// A sliding counter whose `num × period_ms` passes [`MAX_BUCKET_SCALE`].
    CounterTooLarge,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for PolicyError {}

#[allow(unreachable_pub)] // some rules are the macro's only
pub(crate) mod rules;

use self::rules::Violation;
pub use self::rules::{MAX_BUCKET_SCALE, MAX_SLIDING_LOG, MAX_UNITS};

impl PolicyError {
    pub(crate) const fn from_violation(v: Violation) -> Self {
        match v {
            Violation::ZeroLimit => Self::ZeroLimit,
            Violation::ZeroPeriod => Self::ZeroPeriod,
            Violation::PeriodTooLong => Self::PeriodTooLong,
            Violation::ZeroBurst => Self::ZeroBurst,
            Violation::ZeroCost => Self::ZeroCost,
            Violation::TooManyUnits => Self::TooManyUnits,
            Violation::BucketTooFine => Self::BucketTooFine,
            Violation::CostExceedsCapacity => Self::CostExceedsCapacity,
            Violation::SlidingLogTooLarge => Self::SlidingLogTooLarge,
            Violation::GcraTooFast => Self::GcraTooFast,
            Violation::GcraTooFine => Self::GcraTooFine,
            Violation::CounterTooLarge => Self::CounterTooLarge,
        }
    }

    /// The rule this error reports, when it is one of the numeric rules.
    const fn violation(self) -> Option<Violation> {
        Some(match self {
            Self::ZeroLimit => Violation::ZeroLimit,
            Self::ZeroPeriod => Violation::ZeroPeriod,
            Self::PeriodTooLong => Violation::PeriodTooLong,
            Self::ZeroBurst => Violation::ZeroBurst,
            Self::ZeroCost => Violation::ZeroCost,
            Self::TooManyUnits => Violation::TooManyUnits,
            Self::BucketTooFine => Violation::BucketTooFine,
            Self::CostExceedsCapacity => Violation::CostExceedsCapacity,
            Self::SlidingLogTooLarge => Violation::SlidingLogTooLarge,
            Self::GcraTooFast => Violation::GcraTooFast,
            Self::GcraTooFine => Violation::GcraTooFine,
            Self::CounterTooLarge => Violation::CounterTooLarge,
            Self::UnknownAlgorithm => return None,
        })
    }

    /// What is wrong, as [`fmt::Display`] writes it; usable in `const` code (the policies
    /// `#[rate_limit]` builds are checked at compile time).
    pub const fn message(self) -> &'static str {
        match self.violation() {
            Some(v) => v.message(),
            None => {
                "unknown algorithm: expected one of \"fixed\", \"sliding\", \"leaky\", \"token\", \"gcra\", \"sliding_counter\""
            }
        }
    }
}

/// One limit: an algorithm, a quota of `limit` calls per `period`, a bucket capacity (`burst`)
/// and the units one call takes (`cost`).
///
/// A policy is valid by construction: every constructor checks its input.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_runtime::{Algorithm, Policy};
///
/// let p = Policy::new(Algorithm::Token, 5, Duration::from_secs(1))?
///     .with_burst(10)?
///     .with_cost(2)?;
/// assert_eq!((p.limit(), p.burst(), p.cost()), (5, 10, 2));
/// # Ok::<(), ratelimit_runtime::PolicyError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Policy {
    algorithm: Algorithm,
    limit: u64,
    period_ms: u64,
    burst: u64,
    cost: u64,
    /// The rules' parameters, derived from the fields above once, when the policy is built
    /// (the memory store reads them on every check).
    params: crate::algorithm::Params,
}

// The derived parameters are left out: they follow from the fields shown.
#[allow(clippy::missing_fields_in_debug)]
impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("algorithm", &self.algorithm)
            .field("limit", &self.limit)
            .field("period_ms", &self.period_ms)
            .field("burst", &self.burst)
            .field("cost", &self.cost)
            .finish()
    }
}

impl Policy {
    /// A policy of `limit` calls per `period`, with `burst = limit` and `cost = 1`.
    pub const fn new(
        algorithm: Algorithm,
        limit: u64,
        period: Duration,
    ) -> Result<Self, PolicyError> {
        let ms = period.as_millis();
        if ms > rules::MAX_PERIOD_MS as u128 {
            return Err(PolicyError::PeriodTooLong);
        }
        #[allow(clippy::cast_possible_truncation)] // checked just above
        Self::from_parts(algorithm, limit, ms as u64, limit, 1)
    }

    /// Sets the bucket capacity (meaningful for `leaky`, `token` and `gcra`; the windows ignore
    /// it).
    pub const fn with_burst(self, burst: u64) -> Result<Self, PolicyError> {
        Self::from_parts(self.algorithm, self.limit, self.period_ms, burst, self.cost)
    }

    /// Sets the units one call takes.
    pub const fn with_cost(self, cost: u64) -> Result<Self, PolicyError> {
        Self::from_parts(self.algorithm, self.limit, self.period_ms, self.burst, cost)
    }

    /// Builds and checks a policy from its raw parts (the period in milliseconds). The one place
    /// where a policy's rules live.
    pub const fn from_parts(
        algorithm: Algorithm,
        limit: u64,
        period_ms: u64,
        burst: u64,
        cost: u64,
    ) -> Result<Self, PolicyError> {
        if let Err(v) = rules::check(algorithm.kind(), limit, period_ms, burst, cost) {
            return Err(PolicyError::from_violation(v));
        }
        Ok(Self {
            algorithm,
            limit,
            period_ms,
            burst,
            cost,
            params: crate::algorithm::Params::new(
                limit,
                period_ms.saturating_mul(1000),
                burst,
                cost,
            ),
        })
    }

    /// The rules' parameters of this policy ([`crate::algorithm::Params::of`]).
    pub(crate) const fn params(&self) -> crate::algorithm::Params {
        self.params
    }

    /// The algorithm.
    pub const fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Calls allowed per period (`num`); for buckets, the refill/drain rate is `limit / period`.
    pub const fn limit(&self) -> u64 {
        self.limit
    }

    /// The period.
    pub const fn period(&self) -> Duration {
        Duration::from_millis(self.period_ms)
    }

    /// The period in whole milliseconds.
    pub const fn period_ms(&self) -> u64 {
        self.period_ms
    }

    /// The bucket capacity (`num` unless set).
    pub const fn burst(&self) -> u64 {
        self.burst
    }

    /// Units one call takes.
    pub const fn cost(&self) -> u64 {
        self.cost
    }

    /// How many units fit at once: `burst` for the buckets, `limit` for the windows. This is the
    /// `limit` a [`Decision`] reports.
    pub const fn capacity(&self) -> u64 {
        rules::capacity(self.algorithm.kind(), self.limit, self.burst)
    }
}

/// What one limit answered for one call.
///
/// `remaining` is what is left *after* this call: when the call as a whole was rejected (by
/// this limit or by another limit checked with it), nothing was taken and `remaining` is what
/// is left now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    /// Whether this limit, on its own, admits the call.
    pub admitted: bool,
    /// The policy's capacity ([`Policy::capacity`]).
    pub limit: u64,
    /// Units left after this call.
    pub remaining: u64,
    /// Time until the quota is whole again.
    pub reset_after: Duration,
    /// When not admitted: the earliest time the same call would be admitted by this limit.
    pub retry_after: Option<Duration>,
}

impl Decision {
    /// Builds a decision; `retry_after` is kept only for a rejection.
    pub fn new(
        admitted: bool,
        limit: u64,
        remaining: u64,
        reset_after: Duration,
        retry_after: Duration,
    ) -> Self {
        Self {
            admitted,
            limit,
            remaining,
            reset_after,
            retry_after: (!admitted).then_some(retry_after),
        }
    }
}

/// The answer for one call checked against one or more limits at once.
///
/// The call is admitted only when every limit admits it; when any limit rejects it, no limit
/// took anything.
#[derive(Clone)]
pub struct Verdict {
    decisions: Decisions,
}

/// A verdict's decisions: one limit's inline (the common call, answered without a heap
/// allocation), several in a `Vec`.
#[derive(Clone)]
enum Decisions {
    One(Decision),
    Many(Vec<Decision>),
}

impl Verdict {
    /// Wraps the decisions, one per limit, in the order the limits were given.
    pub fn new(decisions: Vec<Decision>) -> Self {
        Self {
            decisions: Decisions::Many(decisions),
        }
    }

    /// The verdict of a call checked against one limit: the same as
    /// `Verdict::new(vec![decision])`, without the allocation.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Decision, Verdict};
    ///
    /// let d = Decision::new(true, 10, 9, Duration::from_secs(1), Duration::ZERO);
    /// assert_eq!(Verdict::one(d), Verdict::new(vec![d]));
    /// assert_eq!(Verdict::one(d).decisions(), [d]);
    /// ```
    pub const fn one(decision: Decision) -> Self {
        Self {
            decisions: Decisions::One(decision),
        }
    }

    /// Whether every limit admitted the call.
    pub fn is_admitted(&self) -> bool {
        self.decisions().iter().all(|d| d.admitted)
    }

    /// One decision per limit, in the order the limits were given.
    pub fn decisions(&self) -> &[Decision] {
        match &self.decisions {
            Decisions::One(d) => std::slice::from_ref(d),
            Decisions::Many(v) => v,
        }
    }

    /// The decision that binds: when rejected, the rejecting limit with the longest
    /// `retry_after`; when admitted, the limit with the fewest units left. This is the one HTTP
    /// headers report.
    pub fn binding(&self) -> Option<&Decision> {
        if self.is_admitted() {
            self.decisions().iter().min_by_key(|d| d.remaining)
        } else {
            self.decisions()
                .iter()
                .filter(|d| !d.admitted)
                .max_by_key(|d| d.retry_after)
        }
    }

    /// When rejected: the earliest time the whole call could be admitted (the longest
    /// `retry_after` among the rejecting limits).
    pub fn retry_after(&self) -> Option<Duration> {
        self.decisions().iter().filter_map(|d| d.retry_after).max()
    }
}

// By their decisions, however they are held.
impl PartialEq for Verdict {
    fn eq(&self, other: &Self) -> bool {
        self.decisions() == other.decisions()
    }
}

impl Eq for Verdict {}

impl fmt::Debug for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verdict")
            .field("decisions", &self.decisions())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_zero_and_impossible_policies() {
        let s = Duration::from_secs(1);
        assert_eq!(
            Policy::new(Algorithm::Fixed, 0, s),
            Err(PolicyError::ZeroLimit)
        );
        assert_eq!(
            Policy::new(Algorithm::Fixed, 1, Duration::from_micros(999)),
            Err(PolicyError::ZeroPeriod)
        );
        let p = Policy::new(Algorithm::Token, 2, s).unwrap();
        assert_eq!(p.with_cost(3), Err(PolicyError::CostExceedsCapacity));
        assert_eq!(p.with_burst(4).unwrap().with_cost(3).unwrap().cost(), 3);
        assert_eq!(p.with_burst(0), Err(PolicyError::ZeroBurst));
        assert_eq!(
            Policy::new(Algorithm::Fixed, 1, Duration::from_secs(200 * 365 * 86400)),
            Err(PolicyError::PeriodTooLong)
        );
    }

    #[test]
    fn numbers_stay_within_the_bounds_that_keep_every_reply_exact() {
        let day = 86_400_000;
        let at = |algo, num, burst, cost| Policy::from_parts(algo, num, 1000, burst, cost);
        // The algorithms whose own bounds allow 2^50 per second (the others: see below).
        for algo in [Algorithm::Fixed, Algorithm::Leaky, Algorithm::Token] {
            let burst = if matches!(algo, Algorithm::Leaky | Algorithm::Token) {
                MAX_UNITS
            } else {
                1
            };
            let max = at(algo, MAX_UNITS, 1, 1);
            assert!(max.is_ok(), "{algo}: {max:?}");
            assert_eq!(
                at(algo, MAX_UNITS + 1, 1, 1),
                Err(PolicyError::TooManyUnits),
                "{algo}"
            );
            assert_eq!(
                at(algo, MAX_UNITS, MAX_UNITS + 1, 1),
                Err(PolicyError::TooManyUnits),
                "{algo}"
            );
            assert_eq!(
                Policy::from_parts(algo, u64::MAX, day, burst, 1),
                Err(PolicyError::TooManyUnits),
                "{algo}"
            );
        }
        // Buckets: burst × period_µs / gcd(num, period_µs) ≤ 2^52.
        let period_us: u64 = 1_000_000;
        let max_burst = MAX_BUCKET_SCALE / period_us;
        let bucket = |burst| Policy::from_parts(Algorithm::Token, 7, 1000, burst, 1);
        assert!(bucket(max_burst).is_ok());
        assert_eq!(bucket(max_burst + 1), Err(PolicyError::BucketTooFine));
        // A num sharing the period's factors makes the scale coarser: more burst fits.
        let coarse = Policy::from_parts(Algorithm::Leaky, 1_000_000, 1000, MAX_BUCKET_SCALE, 1);
        assert_eq!(coarse, Err(PolicyError::TooManyUnits));
        let coarse = Policy::from_parts(Algorithm::Leaky, 1_000_000, 1000, MAX_UNITS, 1);
        assert!(coarse.is_ok(), "{coarse:?}");
        // The longest period with a fine rate still has room for a useful burst.
        let century = Policy::from_parts(Algorithm::Token, 7, rules::MAX_PERIOD_MS, 1, 1);
        assert!(century.is_ok(), "{century:?}");
        assert_eq!(
            Policy::from_parts(Algorithm::Token, 7, rules::MAX_PERIOD_MS, 2, 1),
            Err(PolicyError::BucketTooFine)
        );
    }

    #[test]
    fn policy_errors_say_what_the_shared_rules_say() {
        use rules::Violation;
        for v in [
            Violation::ZeroLimit,
            Violation::ZeroPeriod,
            Violation::PeriodTooLong,
            Violation::ZeroBurst,
            Violation::ZeroCost,
            Violation::TooManyUnits,
            Violation::BucketTooFine,
            Violation::CostExceedsCapacity,
        ] {
            let e = PolicyError::from_violation(v);
            assert_eq!(e.violation(), Some(v));
            assert_eq!(e.to_string(), v.message());
        }
        assert!(
            PolicyError::UnknownAlgorithm
                .to_string()
                .contains("sliding")
        );
    }

    #[test]
    fn the_bucket_rule_never_overflows_on_extreme_input() {
        for (num, ms, burst) in [(1, u64::MAX, 1), (u64::MAX, u64::MAX, u64::MAX), (0, 0, 0)] {
            let _ = rules::check_bucket_scale(num, ms, burst);
            let _ = rules::check(rules::Kind::Bucket, num, ms, burst, burst);
        }
        assert_eq!(
            rules::check_bucket_scale(1, u64::MAX, 1),
            Err(rules::Violation::BucketTooFine)
        );
    }

    #[test]
    fn the_o1_algorithms_and_the_sliding_log_have_bounds_of_their_own() {
        let second = 1000;
        let at = |algo, num, period_ms, burst| Policy::from_parts(algo, num, period_ms, burst, 1);
        // The sliding log: at most 10,000 entries.
        assert!(at(Algorithm::Sliding, MAX_SLIDING_LOG, second, 1).is_ok());
        assert_eq!(
            at(Algorithm::Sliding, MAX_SLIDING_LOG + 1, second, 1),
            Err(PolicyError::SlidingLogTooLarge)
        );
        assert!(
            PolicyError::SlidingLogTooLarge
                .to_string()
                .contains("sliding_counter")
        );
        // GCRA: at most one unit per µs, and burst·T ≤ 2^52.
        assert!(at(Algorithm::Gcra, 1_000_000, second, 1).is_ok());
        assert_eq!(
            at(Algorithm::Gcra, 1_000_001, second, 1),
            Err(PolicyError::GcraTooFast)
        );
        let t = 1_000_000 / 7 + 1;
        assert!(at(Algorithm::Gcra, 7, second, MAX_BUCKET_SCALE / t).is_ok());
        assert_eq!(
            at(Algorithm::Gcra, 7, second, MAX_BUCKET_SCALE / t + 1),
            Err(PolicyError::GcraTooFine)
        );
        // The sliding counter: num × period_ms ≤ 2^52; its capacity is num, GCRA's burst.
        let day = 86_400_000;
        assert!(at(Algorithm::SlidingCounter, MAX_BUCKET_SCALE / day, day, 1).is_ok());
        assert_eq!(
            at(
                Algorithm::SlidingCounter,
                MAX_BUCKET_SCALE / day + 1,
                day,
                1
            ),
            Err(PolicyError::CounterTooLarge)
        );
        assert_eq!(at(Algorithm::Gcra, 5, second, 9).unwrap().capacity(), 9);
        assert_eq!(
            at(Algorithm::SlidingCounter, 5, second, 9)
                .unwrap()
                .capacity(),
            5
        );
    }

    #[test]
    fn verdict_binding_picks_the_longest_wait_or_the_fewest_left() {
        let ms = Duration::from_millis;
        let roomy = Decision::new(true, 10, 3, ms(5), ms(0));
        let short_wait = Decision::new(false, 5, 0, ms(50), ms(40));
        let long_wait = Decision::new(false, 5, 0, ms(90), ms(80));
        let rejected = Verdict::new(vec![roomy, short_wait, long_wait]);
        assert!(!rejected.is_admitted());
        assert_eq!(rejected.binding(), Some(&long_wait));
        assert_eq!(rejected.retry_after(), Some(ms(80)));
        let tight = Decision::new(true, 10, 1, ms(5), ms(0));
        let v = Verdict::new(vec![roomy, tight]);
        assert!(v.is_admitted());
        assert_eq!(v.binding(), Some(&tight));
        assert_eq!(v.retry_after(), None);
    }
}
