//! The rules a policy's numbers must follow, in one place for the runtime and the macro.
//!
//! The runtime's `Policy::from_parts` applies them when a policy is built, and `#[rate_limit]`
//! applies them at compile time, pointing at the offending argument. A proc-macro crate cannot
//! export ordinary items, so both crates compile this very file (`ratelimit-macros/src/rules.rs`
//! is a link to it, which `cargo package` turns into a copy): it uses nothing but `core`.
//!
//! The numeric bounds keep every number exact in the Redis scripts, which count in doubles
//! (exact only below 2^53).

/// The longest period a policy may have, in milliseconds (100 years), so that microsecond
/// timestamps stay exact in Lua's doubles.
pub const MAX_PERIOD_MS: u64 = 100 * 365 * 24 * 3600 * 1000;

/// The largest `num`, `burst` or `cost` (2^50): counts, their sums and differences stay exact
/// integers in the Redis scripts' doubles (exact up to 2^53) and in every reply.
pub const MAX_UNITS: u64 = 1 << 50;

/// The largest bucket capacity in the scripts' integer scale (2^52): `burst × period_µs / g`
/// with `g = gcd(num, period_µs)`. A level plus a cost is then below 2^53, so every bucket
/// number stays exact.
pub const MAX_BUCKET_SCALE: u64 = 1 << 52;

/// The largest `num` of a sliding log (10,000): it keeps one entry per admitted unit (about 120
/// bytes each in Redis); beyond it, the sliding counter or GCRA, whose state does not grow.
pub const MAX_SLIDING_LOG: u64 = 10_000;

/// The longest lease (`lease = …`), in milliseconds: units taken early sit at most this long in
/// one process.
pub const MAX_LEASE_MS: u64 = 1000;

/// The most units one lease takes when `lease_max` is not given.
pub const DEFAULT_LEASE_UNITS: u64 = 1000;

/// How an algorithm's numbers are bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A fixed window: `num` per window.
    Window,
    /// The sliding log: one entry per unit.
    Log,
    /// The token and leaky buckets: a level in units of `1 / (period_µs / g)`.
    Bucket,
    /// GCRA: a theoretical arrival time, one unit per `⌈period_µs / num⌉` µs.
    Gcra,
    /// The sliding counter: two counts weighed in milliseconds.
    Counter,
    /// A concurrency limit: one lease per call in flight, one slot per call.
    Slots,
}

impl Kind {
    /// Whether the capacity is `burst` (the buckets and GCRA) rather than `num`.
    pub const fn has_burst(self) -> bool {
        matches!(self, Self::Bucket | Self::Gcra)
    }
}

/// A rule that a policy's numbers break.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// `num` is 0.
    ZeroLimit,
    /// The period is shorter than one millisecond.
    ZeroPeriod,
    /// The period is longer than [`MAX_PERIOD_MS`].
    PeriodTooLong,
    /// `burst` is 0.
    ZeroBurst,
    /// `cost` is 0.
    ZeroCost,
    /// `num`, `burst` or `cost` is above [`MAX_UNITS`].
    TooManyUnits,
    /// A bucket whose capacity in the scripts' scale is above [`MAX_BUCKET_SCALE`].
    BucketTooFine,
    /// `cost` is larger than the capacity: no call could ever be admitted.
    CostExceedsCapacity,
    /// A sliding log of more than [`MAX_SLIDING_LOG`] units.
    SlidingLogTooLarge,
    /// GCRA faster than one unit per microsecond.
    GcraTooFast,
    /// GCRA whose burst tolerance `burst × ⌈period_µs / num⌉` is above [`MAX_BUCKET_SCALE`].
    GcraTooFine,
    /// A sliding counter whose `num × period_ms` is above [`MAX_BUCKET_SCALE`].
    CounterTooLarge,
    /// A concurrency limit of more than [`MAX_SLIDING_LOG`] slots.
    TooManySlots,
    /// A concurrency limit with a `cost` other than 1: a call holds one slot.
    SlotCost,
    /// A lease (`lease = …`) shorter than 1 ms or longer than [`MAX_LEASE_MS`].
    LeaseTime,
    /// A lease's largest take (`lease_max`) of 0 or above [`MAX_UNITS`].
    LeaseUnits,
    /// A lease on an algorithm that cannot take units early (the sliding log, a concurrency
    /// limit).
    LeaseAlgorithm,
}

impl Violation {
    /// What is wrong and what is accepted, for people.
    pub const fn message(self) -> &'static str {
        match self {
            Self::ZeroLimit => "`num` must be a positive integer",
            Self::ZeroPeriod => "the period must be at least 1ms",
            Self::PeriodTooLong => "the period must be at most 100 years",
            Self::ZeroBurst => "`burst` must be a positive integer",
            Self::ZeroCost => "`cost` must be a positive integer",
            Self::TooManyUnits => {
                "`num`, `burst` and `cost` must be at most 2^50 (1125899906842624), so that every number the Redis scripts return stays exact"
            }
            Self::BucketTooFine => {
                "the bucket cannot be kept exact: burst × (period in µs / gcd(num, period in µs)) must be at most 2^52; lower `burst` or `time`, or pick a `num` that divides the period in microseconds"
            }
            Self::CostExceedsCapacity => {
                "`cost` is larger than the capacity (`num`, or `burst` for buckets): no call could ever be admitted"
            }
            Self::SlidingLogTooLarge => {
                "a sliding log keeps one entry per admitted call: `num` must be at most 10000; for larger quotas use algo = \"sliding_counter\" (two counters, approximate) or \"gcra\" (one integer, exact)"
            }
            Self::GcraTooFast => {
                "gcra admits at most one call per microsecond: `num` must be at most the period in microseconds"
            }
            Self::GcraTooFine => {
                "gcra's burst tolerance burst × (period in µs / num) must be at most 2^52: lower `burst` or `time`"
            }
            Self::CounterTooLarge => {
                "the sliding counter cannot be kept exact: num × period in ms must be at most 2^52"
            }
            Self::TooManySlots => {
                "a concurrency limit keeps one lease per call in flight: `num` must be at most 10000"
            }
            Self::SlotCost => {
                "a concurrency limit counts calls in flight, one slot each: `cost` must be 1 (leave it out)"
            }
            Self::LeaseTime => {
                "a lease lives from 1ms to 1s (\"100ms\" is a good start): it is how long units taken early may sit in one process, unused by the others"
            }
            Self::LeaseUnits => "`lease_max` must be a positive integer, at most 2^50",
            Self::LeaseAlgorithm => {
                "leases work with algo = \"fixed\", \"sliding_counter\", \"token\", \"leaky\" and \"gcra\", where units taken early never admit more than the rule allows; the sliding log stamps each call with its own time (taking early would stamp calls before they happen), and a concurrency limit counts calls in flight, not units: remove `lease`"
            }
        }
    }
}

/// The greatest common divisor (`gcd(0, b) = b`).
pub const fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        let r = a % b;
        a = b;
        b = r;
    }
    a
}

/// How many units fit at once: `burst` for the buckets and GCRA, `num` for the windows.
pub const fn capacity(kind: Kind, num: u64, burst: u64) -> u64 {
    if kind.has_burst() { burst } else { num }
}

/// Whether a period of `period_ms` milliseconds is one a store can keep.
pub const fn check_period(period_ms: u64) -> Result<(), Violation> {
    if period_ms == 0 {
        Err(Violation::ZeroPeriod)
    } else if period_ms > MAX_PERIOD_MS {
        Err(Violation::PeriodTooLong)
    } else {
        Ok(())
    }
}

/// Whether `n` units (a `num`, `burst` or `cost`) stay exact in the scripts.
pub const fn check_units(n: u64) -> Result<(), Violation> {
    if n > MAX_UNITS {
        Err(Violation::TooManyUnits)
    } else {
        Ok(())
    }
}

/// Whether a bucket of `burst` refilled (or drained) at `num` per `period_ms` can be kept exact:
/// `burst × period_µs / gcd(num, period_µs)` (its capacity in its own units) and
/// `1000 × num / gcd(num, period_µs)` (the units one millisecond drains: the scripts keep the
/// level within the millisecond it empties in, `scripts/bucket.lua`) must both be at most
/// [`MAX_BUCKET_SCALE`].
pub const fn check_bucket_scale(num: u64, period_ms: u64, burst: u64) -> Result<(), Violation> {
    let Some(micros) = period_ms.checked_mul(1000) else {
        return Err(Violation::BucketTooFine);
    };
    let g = gcd(num, micros);
    // `gcd` is 0 only when both are; then the step is the period itself.
    let step = match micros.checked_div(g) {
        Some(step) => step,
        None => micros,
    };
    let rate = match num.checked_div(g) {
        Some(rate) => rate,
        None => 0,
    };
    match (burst.checked_mul(step), rate.checked_mul(1000)) {
        (Some(scale), Some(per_ms)) if scale <= MAX_BUCKET_SCALE && per_ms <= MAX_BUCKET_SCALE => {
            Ok(())
        }
        _ => Err(Violation::BucketTooFine),
    }
}

/// The bounds of one algorithm's own numbers (after [`check_units`]): the bucket scale, the
/// sliding log's size, GCRA's interval and tolerance, the sliding counter's weighed counts.
pub const fn check_kind(kind: Kind, num: u64, period_ms: u64, burst: u64) -> Result<(), Violation> {
    match kind {
        Kind::Window => Ok(()),
        Kind::Bucket => check_bucket_scale(num, period_ms, burst),
        Kind::Log => {
            if num > MAX_SLIDING_LOG {
                Err(Violation::SlidingLogTooLarge)
            } else {
                Ok(())
            }
        }
        Kind::Gcra => {
            let Some(micros) = period_ms.checked_mul(1000) else {
                return Err(Violation::GcraTooFine);
            };
            if num > micros {
                return Err(Violation::GcraTooFast);
            }
            let interval = match micros.checked_div(num) {
                Some(q) if q * num == micros => q,
                Some(q) => q + 1,
                None => micros,
            };
            match burst.checked_mul(interval) {
                Some(tolerance) if tolerance <= MAX_BUCKET_SCALE => Ok(()),
                _ => Err(Violation::GcraTooFine),
            }
        }
        Kind::Counter => match num.checked_mul(period_ms) {
            Some(n) if n <= MAX_BUCKET_SCALE => Ok(()),
            _ => Err(Violation::CounterTooLarge),
        },
        Kind::Slots => {
            if num > MAX_SLIDING_LOG {
                Err(Violation::TooManySlots)
            } else {
                Ok(())
            }
        }
    }
}

/// Whether a call of `cost` can ever fit in `capacity` units.
pub const fn check_cost(cost: u64, capacity: u64) -> Result<(), Violation> {
    if cost > capacity {
        Err(Violation::CostExceedsCapacity)
    } else {
        Ok(())
    }
}

/// Every rule, in order, for a policy of `num` per `period_ms` with a capacity of `burst` (for
/// a bucket) and `cost` units a call: the first rule broken, if any.
pub const fn check(
    kind: Kind,
    num: u64,
    period_ms: u64,
    burst: u64,
    cost: u64,
) -> Result<(), Violation> {
    if num == 0 {
        return Err(Violation::ZeroLimit);
    }
    if let Err(e) = check_period(period_ms) {
        return Err(e);
    }
    if burst == 0 {
        return Err(Violation::ZeroBurst);
    }
    if cost == 0 {
        return Err(Violation::ZeroCost);
    }
    if check_units(num).is_err() || check_units(burst).is_err() || check_units(cost).is_err() {
        return Err(Violation::TooManyUnits);
    }
    if let Err(e) = check_kind(kind, num, period_ms, burst) {
        return Err(e);
    }
    if matches!(kind, Kind::Slots) && cost != 1 {
        return Err(Violation::SlotCost);
    }
    check_cost(cost, capacity(kind, num, burst))
}

/// A lease of `ttl_ms` taking at most `max_units` at once, on an algorithm of `kind`: a
/// lease takes units before the calls that use them, which only the algorithms whose rule
/// allows a call to use units taken earlier support.
pub const fn check_lease(kind: Kind, ttl_ms: u64, max_units: u64) -> Result<(), Violation> {
    if matches!(kind, Kind::Log | Kind::Slots) {
        return Err(Violation::LeaseAlgorithm);
    }
    if ttl_ms == 0 || ttl_ms > MAX_LEASE_MS {
        return Err(Violation::LeaseTime);
    }
    if max_units == 0 || max_units > MAX_UNITS {
        return Err(Violation::LeaseUnits);
    }
    Ok(())
}
