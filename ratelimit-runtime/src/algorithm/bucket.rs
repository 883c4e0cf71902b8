//! Token and leaky bucket (`scripts/bucket.lua`): one rule under two names.
//!
//! A bucket of capacity `burst` holds a level that drains continuously at `num / period`; a call
//! raises it by `cost` when the result fits under `burst`. For the leaky bucket the level is
//! what is in the bucket (empty at start); for the token bucket it is the tokens missing from a
//! full bucket (full at start, refilled at the same rate): the arithmetic is the same.
//!
//! Exact in integers: with `g = gcd(num, period_µs)`, the level is kept in units of
//! `1 / (period_µs / g)` of a call, so it drains by exactly `num / g` units per µs and no
//! fraction ever accumulates (50 calls against a burst of 50 admit exactly 50). The policy
//! bounds keep `burst × period_µs / g` at most 2^52, where the scripts' doubles are exact.

use super::{Evaluation, Params, Receipt, ceil_div, sat};

/// A level (in the bucket's units) as of a time (µs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Level {
    /// The level, in units of `1 / (period_µs / g)` of a call.
    pub level: u64,
    /// When it was that, µs.
    pub at: u64,
}

/// The bucket's scale: `(rate, unit)`, the units drained per µs and the units of one call
/// (`num / g` and `period_µs / g` with `g = gcd(num, period_µs)`, computed once per policy by
/// [`Params::new`]).
fn scale(p: &Params) -> (u128, u128) {
    (u128::from(p.rate), u128::from(p.unit))
}

impl Level {
    /// The level at `now` (a stamp from the future counts as now).
    fn at_time(&self, rate: u128, now: u64) -> u128 {
        let elapsed = u128::from(now.saturating_sub(self.at));
        u128::from(self.level).saturating_sub(elapsed.saturating_mul(rate))
    }

    /// When the level is back to 0, µs.
    pub(crate) fn idle_at(&self, p: &Params) -> u64 {
        let (rate, _) = scale(p);
        self.at
            .saturating_add(sat(ceil_div(u128::from(self.level), rate)))
    }
}

/// A level stamped in the future (a clock that went back) is stamped now: it drains from now
/// on, instead of staying put for the whole skew.
pub(crate) fn normalize(b: &mut Level, now: u64) -> bool {
    if b.at > now {
        b.at = now;
        true
    } else {
        false
    }
}

/// Evaluates one call; the level it leaves when admitted.
pub fn evaluate(b: Option<&Level>, p: &Params, now: u64) -> (Evaluation, Option<Level>) {
    let (rate, unit) = scale(p);
    let level = b.map_or(0, |b| b.at_time(rate, now));
    let capacity = u128::from(p.burst) * unit;
    let after = level + u128::from(p.cost) * unit;
    let admitted = after <= capacity;
    let burst = u128::from(p.burst);
    let e = Evaluation {
        admitted,
        now_remaining: sat(burst.saturating_sub(ceil_div(level, unit))),
        now_reset_us: sat(ceil_div(level, rate)),
        after_remaining: sat(burst.saturating_sub(ceil_div(after, unit))),
        after_reset_us: sat(ceil_div(after, rate)),
        retry_us: if admitted {
            0
        } else {
            sat(ceil_div(after - capacity, rate))
        },
    };
    let next = admitted.then(|| Level {
        level: sat(after),
        at: now,
    });
    (e, next)
}

/// Gives back what the call still holds: `cost` units less what has drained since the take
/// (counted as if the call's own units drained first, the most that can be given back without
/// admitting more than if the call had never been made). A level back to 0 is deleted (`None`).
pub fn refund(b: Level, r: &Receipt, p: &Params, now: u64) -> Option<Level> {
    let (rate, unit) = scale(p);
    let drained = u128::from(now.saturating_sub(r.at_us)).saturating_mul(rate);
    let give = (u128::from(p.cost) * unit).saturating_sub(drained);
    if give == 0 {
        return Some(b);
    }
    let level = b.at_time(rate, now).saturating_sub(give);
    (level > 0).then(|| Level {
        level: sat(level),
        at: now,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fractional_rates_stay_exact() {
        // 3 per 10 s, burst 3: a call every 3.333… s once the bucket is full.
        let p = Params::new(3, 10_000_000, 3, 1);
        let mut b = None;
        for _ in 0..3 {
            let (e, next) = evaluate(b.as_ref(), &p, 0);
            assert!(e.admitted);
            b = next;
        }
        let (e, _) = evaluate(b.as_ref(), &p, 0);
        assert!(!e.admitted);
        assert_eq!(e.retry_us, 3_333_334);
        assert!(!evaluate(b.as_ref(), &p, 3_333_333).0.admitted);
        assert!(evaluate(b.as_ref(), &p, 3_333_334).0.admitted);
        assert_eq!(e.now_reset_us, 10_000_000);
    }

    #[test]
    fn a_stamp_from_the_future_drains_from_now() {
        let p = Params::new(1, 1_000_000, 1, 1);
        let mut b = Level {
            level: 1_000_000,
            at: 70_000_000,
        };
        assert!(normalize(&mut b, 10_000_000));
        let (e, _) = evaluate(Some(&b), &p, 10_000_000);
        assert_eq!(e.retry_us, 1_000_000);
        assert!(evaluate(Some(&b), &p, 11_000_000).0.admitted);
    }

    #[test]
    fn a_refund_gives_back_only_what_has_not_drained() {
        let p = Params::new(1, 1_000_000, 2, 1);
        let b = Level {
            level: 2_000_000,
            at: 0,
        };
        let r = Receipt {
            at_us: 0,
            reset_us: 0,
            first: 0,
        };
        // Half a unit drained since the take: half is given back.
        let after = refund(b, &r, &p, 500_000).unwrap();
        assert_eq!(after.level, 1_000_000);
        // All of it drained: nothing to give.
        assert_eq!(refund(b, &r, &p, 1_000_000), Some(b));
    }
}
