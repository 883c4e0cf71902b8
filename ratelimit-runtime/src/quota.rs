//! [`Quota`]: a limit's numbers chosen at run time — a caller's plan, or an override of a
//! scope's quota from configuration.

use std::fmt;
use std::time::Duration;

use crate::algorithm::Algorithm;

use crate::policy::{Policy, PolicyError, rules};

/// How many calls a caller may make per period, chosen at run time: the caller's plan (put in
/// the request extensions by the auth layer, or passed as an argument, for limits written
/// with `quota = …`), or an override of a scope's quota ([`crate::limiter::Builder::override_quota`],
/// [`crate::RateLimiter::set_quota`]). [`Quota::unlimited`] lets every call through without
/// asking the store.
///
/// The algorithm and the cost stay the attribute's; a quota gives `num`, the period and
/// (for the buckets and GCRA) `burst`.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_runtime::Quota;
///
/// let free = Quota::per_minute(60)?;
/// let pro = Quota::new(6_000, Duration::from_secs(60))?.with_burst(100)?;
/// assert_eq!((free.num(), free.period()), (60, Duration::from_secs(60)));
/// assert_eq!(pro.burst(), 100);
/// assert!(Quota::unlimited().is_unlimited());
/// assert!(Quota::per_minute(0).is_err());
/// # Ok::<(), ratelimit_runtime::PolicyError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    /// 0 for unlimited.
    num: u64,
    period_ms: u64,
    /// 0: the same as `num`.
    burst: u64,
}

impl Quota {
    /// `num` calls per `period` (at least 1 ms, at most 100 years; `num` at most
    /// 2^50). The bounds of the algorithm it is used with (a sliding log of
    /// at most 10,000, a bucket's scale) are checked when it is applied: a quota a limit
    /// cannot keep is then [`crate::RateLimitError::InvalidQuota`].
    pub fn new(num: u64, period: Duration) -> Result<Self, PolicyError> {
        let ms = u64::try_from(period.as_millis()).map_err(|_| PolicyError::PeriodTooLong)?;
        if num == 0 {
            return Err(PolicyError::ZeroLimit);
        }
        if let Err(v) = rules::check_period(ms) {
            return Err(PolicyError::from_violation(v));
        }
        if rules::check_units(num).is_err() {
            return Err(PolicyError::TooManyUnits);
        }
        Ok(Self {
            num,
            period_ms: ms,
            burst: 0,
        })
    }

    /// `num` calls per second.
    pub fn per_second(num: u64) -> Result<Self, PolicyError> {
        Self::new(num, Duration::from_secs(1))
    }

    /// `num` calls per minute.
    pub fn per_minute(num: u64) -> Result<Self, PolicyError> {
        Self::new(num, Duration::from_secs(60))
    }

    /// `num` calls per hour.
    pub fn per_hour(num: u64) -> Result<Self, PolicyError> {
        Self::new(num, Duration::from_secs(3600))
    }

    /// No limit: the call is admitted without asking the store, and no rate-limit fields
    /// describe that limit.
    pub const fn unlimited() -> Self {
        Self {
            num: 0,
            period_ms: 0,
            burst: 0,
        }
    }

    /// The bucket capacity (for `algo = "leaky" | "token" | "gcra"`; the windows ignore it).
    pub fn with_burst(self, burst: u64) -> Result<Self, PolicyError> {
        if self.is_unlimited() {
            return Ok(self);
        }
        if burst == 0 {
            return Err(PolicyError::ZeroBurst);
        }
        if rules::check_units(burst).is_err() {
            return Err(PolicyError::TooManyUnits);
        }
        Ok(Self { burst, ..self })
    }

    /// Whether this is [`Quota::unlimited`].
    pub const fn is_unlimited(&self) -> bool {
        self.num == 0
    }

    /// Calls per period (0 when unlimited).
    pub const fn num(&self) -> u64 {
        self.num
    }

    /// The period (zero when unlimited).
    pub const fn period(&self) -> Duration {
        Duration::from_millis(self.period_ms)
    }

    /// The bucket capacity: `num` unless set.
    pub const fn burst(&self) -> u64 {
        if self.burst == 0 {
            self.num
        } else {
            self.burst
        }
    }

    /// The policy of `algorithm` with this quota's numbers and `cost`; `None` when unlimited.
    pub(crate) fn apply(
        &self,
        algorithm: Algorithm,
        cost: u64,
    ) -> Result<Option<Policy>, PolicyError> {
        if self.is_unlimited() {
            return Ok(None);
        }
        Policy::from_parts(algorithm, self.num, self.period_ms, self.burst(), cost).map(Some)
    }
}

#[allow(clippy::missing_fields_in_debug)] // `burst` is shown as `burst()`: `num` when unset
impl fmt::Debug for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_unlimited() {
            return f.write_str("Quota::unlimited()");
        }
        f.debug_struct("Quota")
            .field("num", &self.num)
            .field("period", &self.period())
            .field("burst", &self.burst())
            .finish()
    }
}

/// What a `quota = "{…}"` argument may be: a [`Quota`], an `Option<Quota>` (`None`: the
/// caller has none, which is an error, as a missing user is), or a reference to either.
pub trait AsQuota {
    /// The quota, if any.
    fn as_quota(&self) -> Option<Quota>;
}

impl AsQuota for Quota {
    fn as_quota(&self) -> Option<Quota> {
        Some(*self)
    }
}

impl AsQuota for Option<Quota> {
    fn as_quota(&self) -> Option<Quota> {
        *self
    }
}

impl<T: AsQuota + ?Sized> AsQuota for &T {
    fn as_quota(&self) -> Option<Quota> {
        (**self).as_quota()
    }
}

impl<T: AsQuota + ?Sized> AsQuota for &mut T {
    fn as_quota(&self) -> Option<Quota> {
        (**self).as_quota()
    }
}

impl<T: AsQuota + ?Sized> AsQuota for std::sync::Arc<T> {
    fn as_quota(&self) -> Option<Quota> {
        (**self).as_quota()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    fn quota_of_ref<Q: AsQuota>(q: &Q) -> Option<Quota> {
        q.as_quota()
    }

    #[test]
    fn quotas_are_checked_and_applied_with_the_base_algorithm_and_cost() {
        let q = Quota::per_minute(100).unwrap();
        let p = q.apply(Algorithm::Sliding, 2).unwrap().unwrap();
        assert_eq!(
            (p.algorithm(), p.limit(), p.period_ms(), p.cost()),
            (Algorithm::Sliding, 100, 60_000, 2)
        );
        assert_eq!(Quota::unlimited().apply(Algorithm::Sliding, 2), Ok(None));
        // A quota the algorithm cannot keep is an error when applied, never a panic.
        let huge = Quota::per_minute(20_000).unwrap();
        assert_eq!(
            huge.apply(Algorithm::Sliding, 2),
            Err(PolicyError::SlidingLogTooLarge)
        );
        assert_eq!(
            Quota::new(1, Duration::from_micros(10)),
            Err(PolicyError::ZeroPeriod)
        );
        assert_eq!(
            Quota::new(1, Duration::MAX),
            Err(PolicyError::PeriodTooLong)
        );
        assert_eq!(Quota::per_second(u64::MAX), Err(PolicyError::TooManyUnits));
        assert_eq!(q.with_burst(0), Err(PolicyError::ZeroBurst));
        assert_eq!(Some(q).as_quota(), Some(q));
        assert_eq!(quota_of_ref(&&None::<Quota>), None);
    }
}
