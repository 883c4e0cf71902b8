//! What a limit is ([`Policy`]): an [`Algorithm`] and its numbers, checked against the rules.

use std::fmt;
use std::time::Duration;

use crate::algorithm::{Algorithm, Params};

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
    /// `sliding_counter`, `concurrency`.
    UnknownAlgorithm,
    /// `num`, `burst` or `cost` is above 2^50: the Redis scripts count in doubles,
    /// exact only below 2^53, and every number they return must stay exact.
    TooManyUnits,
    /// A bucket too fine to keep exact: the Redis scripts keep a bucket's level as an integer
    /// in units of `1 / (period_µs / gcd(num, period_µs))`, and `burst` of those, and the
    /// `1000 × num / gcd(num, period_µs)` units of one millisecond's drain, must stay within
    /// 2^52.
    BucketTooFine,
    /// A sliding log above 10,000 units (one entry per admitted unit).
    SlidingLogTooLarge,
    /// GCRA faster than one unit per microsecond.
    GcraTooFast,
    /// GCRA whose burst tolerance `burst × ⌈period_µs / num⌉` passes 2^52.
    GcraTooFine,
    /// A sliding counter whose `num × period_ms` passes 2^52.
    CounterTooLarge,
    /// A concurrency limit above 10,000 slots (one lease per call in flight).
    TooManySlots,
    /// A concurrency limit whose `cost` is not 1 (a call holds one slot).
    SlotCost,
    /// A [`Lease`](crate::lease::Lease) shorter than 1 ms or longer than 1 s.
    LeaseTime,
    /// A [`Lease`](crate::lease::Lease) whose largest take is 0 or above 2^50.
    LeaseUnits,
    /// A [`Lease`](crate::lease::Lease) on the sliding log or a concurrency limit, which cannot take
    /// units early.
    LeaseAlgorithm,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for PolicyError {}

pub(crate) mod key_suffix;
#[allow(unreachable_pub)] // some rules are the macro's only
pub(crate) mod rules;

use self::key_suffix::KeySuffix;

pub(crate) use self::rules::MAX_BUCKET_SCALE;
use self::rules::Violation;
#[cfg(test)]
pub(crate) use self::rules::{MAX_SLIDING_LOG, MAX_UNITS};

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
            Violation::TooManySlots => Self::TooManySlots,
            Violation::SlotCost => Self::SlotCost,
            Violation::LeaseTime => Self::LeaseTime,
            Violation::LeaseUnits => Self::LeaseUnits,
            Violation::LeaseAlgorithm => Self::LeaseAlgorithm,
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
            Self::TooManySlots => Violation::TooManySlots,
            Self::SlotCost => Violation::SlotCost,
            Self::LeaseTime => Violation::LeaseTime,
            Self::LeaseUnits => Violation::LeaseUnits,
            Self::LeaseAlgorithm => Violation::LeaseAlgorithm,
            Self::UnknownAlgorithm => return None,
        })
    }

    /// What is wrong, as [`fmt::Display`] writes it; usable in `const` code (the policies
    /// `#[rate_limit]` builds are checked at compile time).
    pub const fn message(self) -> &'static str {
        match self.violation() {
            Some(v) => v.message(),
            None => {
                "unknown algorithm: expected one of \"fixed\", \"sliding\", \"leaky\", \"token\", \"gcra\", \"sliding_counter\", \"concurrency\""
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
    params: Params,
    /// The policy's part of its keys, written once, when the policy is built (a key is put
    /// together on every call).
    key_suffix: KeySuffix,
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
        // The cost is not in the key (a call's cost may vary): the suffix stays.
        Self::checked(
            self.algorithm,
            self.limit,
            self.period_ms,
            self.burst,
            cost,
            self.key_suffix,
        )
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
        let key_suffix = KeySuffix::of(algorithm, limit, period_ms, burst);
        Self::checked(algorithm, limit, period_ms, burst, cost, key_suffix)
    }

    /// [`Policy::from_parts`] with its key suffix already written.
    const fn checked(
        algorithm: Algorithm,
        limit: u64,
        period_ms: u64,
        burst: u64,
        cost: u64,
        key_suffix: KeySuffix,
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
            params: Params::new(limit, period_ms.saturating_mul(1000), burst, cost),
            key_suffix,
        })
    }

    /// The rules' parameters of this policy, borrowed (the memory store reads them on every
    /// check; [`Params::of`] copies them).
    pub(crate) const fn params(&self) -> &Params {
        &self.params
    }

    /// The policy's part of its keys (see [`crate::key`]).
    pub(crate) fn key_suffix(&self) -> &[u8] {
        self.key_suffix.as_bytes()
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
    /// `limit` a [`Decision`](crate::Decision) reports.
    pub const fn capacity(&self) -> u64 {
        rules::capacity(self.algorithm.kind(), self.limit, self.burst)
    }

    /// This policy's share on one of `instances` processes that each count alone (what
    /// [`FailurePolicy::Local`](crate::FailurePolicy::Local) checks during an outage when the
    /// limiter was built with [`Builder::local_share`](crate::limiter::Builder::local_share)): the same
    /// algorithm, period and cost, with `num` and `burst` each divided by `instances`, rounded
    /// down, and at least 1. One share is the policy itself.
    ///
    /// `instances` shares of `num` admit at most `instances × max(1, ⌊num / instances⌋) ≤
    /// max(num, instances)` in a window: the quota itself when `num ≥ instances`, one call per
    /// process when `num < instances` (a process can admit no less than one call and still be a
    /// limit). The same holds for `burst`; a bucket (token, leaky, GCRA) thus admits at most
    /// `max(burst, instances) + max(num, instances)` in a period across the fleet, as the
    /// policy itself admits `burst + num` from full.
    ///
    /// A bucket so large that its scaled rate could no longer be kept exact
    /// ([`PolicyError::BucketTooFine`], [`PolicyError::GcraTooFine`]: a `num` that no longer
    /// divides the period) gets the largest burst that is: less, never more.
    ///
    /// # Errors
    ///
    /// [`PolicyError::CostExceedsCapacity`] when one call's `cost` is more than the share's
    /// capacity: no call could be admitted without giving this process more than its share.
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, Policy, PolicyError};
    ///
    /// let four = NonZeroU32::new(4).unwrap();
    /// let p = Policy::new(Algorithm::Fixed, 100, Duration::from_secs(60))?;
    /// assert_eq!(p.share(four)?.limit(), 25);
    /// let bucket = Policy::new(Algorithm::Token, 10, Duration::from_secs(1))?.with_burst(30)?;
    /// let shared = bucket.share(four)?;
    /// assert_eq!((shared.limit(), shared.burst()), (2, 7));
    /// // Fewer units than processes: one each.
    /// let tiny = Policy::new(Algorithm::Sliding, 3, Duration::from_secs(60))?;
    /// assert_eq!(tiny.share(four)?.limit(), 1);
    /// // A call costing more than the share can never be admitted within it.
    /// assert_eq!(p.with_cost(30)?.share(four), Err(PolicyError::CostExceedsCapacity));
    /// # Ok::<(), PolicyError>(())
    /// ```
    pub fn share(&self, instances: std::num::NonZeroU32) -> Result<Self, PolicyError> {
        let n = u64::from(instances.get());
        if n == 1 {
            return Ok(*self);
        }
        let part = |units: u64| (units / n).max(1);
        let limit = part(self.limit);
        let mut burst = part(self.burst);
        // A smaller `num` may share fewer factors with the period: the bucket's scale (or GCRA's
        // interval) gets finer, and the largest exact burst smaller. Both divisors are at most
        // the longest period in µs (< 2^52), so that burst is at least 1.
        let micros = self.period_ms.saturating_mul(1000);
        let step = match self.algorithm.kind() {
            rules::Kind::Bucket => micros / rules::gcd(limit, micros).max(1),
            rules::Kind::Gcra => micros.div_ceil(limit),
            _ => 1,
        };
        burst = burst.min(MAX_BUCKET_SCALE / step.max(1));
        Self::from_parts(self.algorithm, limit, self.period_ms, burst, self.cost)
    }
}

// What the numeric rules and the parse error say about an algorithm are the policy's own
// vocabulary (`rules`, `PolicyError`): written here, so `algorithm` never reads `policy`.

impl Algorithm {
    /// How this algorithm's numbers are bounded.
    pub(crate) const fn kind(self) -> rules::Kind {
        match self {
            Self::Fixed => rules::Kind::Window,
            Self::Sliding => rules::Kind::Log,
            Self::Leaky | Self::Token => rules::Kind::Bucket,
            Self::Gcra => rules::Kind::Gcra,
            Self::SlidingCounter => rules::Kind::Counter,
            Self::Concurrency => rules::Kind::Slots,
        }
    }
}

impl std::str::FromStr for Algorithm {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .chain([Self::Concurrency])
            .find(|a| a.as_str() == s)
            .ok_or(PolicyError::UnknownAlgorithm)
    }
}

impl Params {
    /// The parameters of `policy` (computed when the policy was built).
    pub const fn of(policy: &Policy) -> Self {
        *policy.params()
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
        // The algorithms whose own bounds allow 2^50 per second, or 2^48 for the buckets (a
        // millisecond's drain within 2^52 units: see below; the others: see further below).
        for algo in [Algorithm::Fixed, Algorithm::Leaky, Algorithm::Token] {
            let bucket = matches!(algo, Algorithm::Leaky | Algorithm::Token);
            let burst = if bucket { MAX_UNITS } else { 1 };
            let max = at(algo, if bucket { 1 << 48 } else { MAX_UNITS }, 1, 1);
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
        // And 1000 × num / gcd(num, period_µs) ≤ 2^52: one millisecond's drain, in the units
        // the scripts keep within a millisecond.
        // 2^48 a second (a gcd of 2^6 with 10^6 µs) drains 2^42 units a millisecond, and
        // 1000 × 2^42 fits; 2^50 a millisecond (2^47 units) does not.
        assert!(Policy::from_parts(Algorithm::Token, 1 << 48, 1000, 1, 1).is_ok());
        assert_eq!(
            Policy::from_parts(Algorithm::Token, MAX_UNITS, 1, 1, 1),
            Err(PolicyError::BucketTooFine)
        );
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
}

#[cfg(test)]
mod share_tests {
    use std::num::NonZeroU32;

    use proptest::prelude::*;

    use super::*;
    use crate::algorithm::{self, State};

    fn n(instances: u32) -> NonZeroU32 {
        NonZeroU32::new(instances).unwrap()
    }

    #[test]
    fn a_share_is_the_floor_of_num_and_burst_at_least_one() {
        let minute = Duration::from_secs(60);
        let fixed = Policy::new(Algorithm::Fixed, 10, minute).unwrap();
        assert_eq!(fixed.share(n(3)).unwrap().limit(), 3, "floor(10 / 3)");
        assert_eq!(
            fixed.share(n(20)).unwrap().limit(),
            1,
            "num < instances: one each"
        );
        assert_eq!(fixed.share(n(1)).unwrap(), fixed, "one share is the policy");
        let hundred = Policy::new(Algorithm::Sliding, 100, minute).unwrap();
        assert_eq!(hundred.share(n(4)).unwrap().capacity(), 25);
        for algo in [Algorithm::Token, Algorithm::Leaky, Algorithm::Gcra] {
            let p = Policy::new(algo, 10, minute)
                .unwrap()
                .with_burst(30)
                .unwrap();
            let s = p.share(n(4)).unwrap();
            assert_eq!(
                (
                    s.algorithm(),
                    s.limit(),
                    s.burst(),
                    s.capacity(),
                    s.period_ms()
                ),
                (algo, 2, 7, 7, 60_000),
                "{algo}"
            );
            assert_eq!(p.share(n(50)).unwrap().capacity(), 1, "{algo}");
        }
        let counter = Policy::new(Algorithm::SlidingCounter, 9, minute).unwrap();
        assert_eq!(counter.share(n(2)).unwrap().capacity(), 4);
    }

    #[test]
    fn a_cost_above_the_share_is_refused_never_admitted() {
        let p = Policy::new(Algorithm::Fixed, 100, Duration::from_secs(60))
            .unwrap()
            .with_cost(30)
            .unwrap();
        assert_eq!(p.share(n(4)), Err(PolicyError::CostExceedsCapacity));
        assert_eq!(p.share(n(3)).unwrap().capacity(), 33);
        assert_eq!(p.share(n(3)).unwrap().cost(), 30);
    }

    #[test]
    fn a_bucket_whose_scaled_rate_is_finer_keeps_the_largest_exact_burst() {
        // 10^6 per second divides the period: a coarse scale, room for a burst of 2^50. A
        // third of it does not: the burst shrinks to what stays exact.
        let p = Policy::from_parts(Algorithm::Leaky, 1_000_000, 1000, MAX_UNITS, 1).unwrap();
        let s = p.share(n(3)).unwrap();
        assert_eq!(s.limit(), 333_333);
        assert_eq!(s.burst(), MAX_BUCKET_SCALE / 1_000_000);
        // GCRA: 7 a second has an interval of ⌈10^6 / 7⌉ µs, one a second of 10^6 µs.
        let burst = MAX_BUCKET_SCALE / 142_858;
        let g = Policy::from_parts(Algorithm::Gcra, 7, 1000, burst, 1).unwrap();
        let s = g.share(n(4)).unwrap();
        assert_eq!((s.limit(), s.burst()), (1, MAX_BUCKET_SCALE / 1_000_000));
        assert!(s.burst() < burst / 4);
    }

    /// Units the policy admits to calls at `times` (µs, sorted), from no state.
    fn admitted(p: &Policy, times: &[u64]) -> u64 {
        let params = p.params();
        let mut state: Option<State> = None;
        let mut units = 0;
        for &now in times {
            let (e, next) = algorithm::evaluate(p.algorithm(), state.as_ref(), params, now);
            if e.admitted {
                units += p.cost();
                state = next;
            }
        }
        units
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Every algorithm: within one period, a share admits at most its `num` (windows) or
        /// its `burst + num` (buckets, from full), and `instances` shares at most
        /// `max(num, instances)` (and `max(burst, instances)`), what the fleet is promised.
        #[test]
        fn a_share_never_admits_more_than_its_part_of_a_window(
            algo in proptest::sample::select(Algorithm::ALL.to_vec()),
            num in 1u64..=400,
            burst in 1u64..=400,
            cost in 1u64..=3,
            period_ms in 1u64..=10_000,
            instances in 1u32..=16,
            offsets in proptest::collection::vec(0u64..1_000_000_000, 0..300),
        ) {
            let burst = if algo.kind().has_burst() { burst } else { num };
            let Ok(p) = Policy::from_parts(algo, num, period_ms, burst, cost) else {
                return Ok(());
            };
            let share = match p.share(n(instances)) {
                Ok(s) => s,
                Err(e) => {
                    prop_assert_eq!(e, PolicyError::CostExceedsCapacity);
                    let part = if algo.kind().has_burst() { burst } else { num };
                    prop_assert!(cost > (part / u64::from(instances)).max(1));
                    return Ok(());
                }
            };
            let k = u64::from(instances);
            prop_assert_eq!((share.algorithm(), share.period_ms(), share.cost()), (algo, period_ms, cost));
            prop_assert!(share.limit() <= (num / k).max(1));
            prop_assert!(share.burst() <= (burst / k).max(1));
            prop_assert!(k * share.limit() <= num.max(k));
            prop_assert!(k * share.burst() <= burst.max(k));
            // One period, starting on a window's edge (the sliding counter's windows are
            // aligned to the period), from no state.
            let period_us = period_ms * 1000;
            let start = 7 * period_us;
            let mut times: Vec<u64> = offsets.iter().map(|o| start + o % period_us).collect();
            times.sort_unstable();
            let units = admitted(&share, &times);
            let bound = if algo.kind().has_burst() {
                share.burst() + share.limit()
            } else {
                share.limit()
            };
            prop_assert!(units <= bound, "{:?} admitted {} > {}", share, units, bound);
        }
    }
}
