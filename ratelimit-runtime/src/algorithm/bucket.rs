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
//!
//! State: a level `L` at `now` is the integer `E = now·rate + L` ("empty at", in units of
//! `1 / rate` µs), kept as the Redis scripts keep it: the millisecond `ms` it falls in (the key
//! expires at the next one) and `units = E − ms·1000·rate`, below `1000·rate`. The level at any
//! later time `t` is then `max((ms·1000 − t)·rate + units, 0)`, exactly. A level above a full
//! bucket plus one capacity of settled debt (`2·burst` calls) was written by a clock ahead of
//! this one: it is brought back to that, from now (`normalize`).

use super::{Evaluation, Params, Receipt, ceil_div, floor_div, sat};

/// A bucket's level, as when it is empty (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Level {
    /// The millisecond in which the bucket is empty again (ms since the epoch).
    pub ms: u64,
    /// The level at the start of that millisecond, in units of `1 / (period_µs / g)` of a call
    /// (below `1000·rate`).
    pub units: u64,
}

/// The bucket's scale: `(rate, unit)`, the units drained per µs and the units of one call
/// (`num / g` and `period_µs / g` with `g = gcd(num, period_µs)`, computed once per policy by
/// [`Params::new`]).
fn scale(p: &Params) -> (u128, u128) {
    (u128::from(p.rate), u128::from(p.unit))
}

impl Level {
    /// A level of `level` units at `now`: `w = (now mod 1000)·rate + level` past the start of
    /// now's millisecond.
    pub fn of(level: u128, rate: u128, now: u64) -> Self {
        if let (Ok(level), Ok(rate)) = (u64::try_from(level), u64::try_from(rate))
            && let Some(b) = Self::of_narrow(level, rate, now)
        {
            return b;
        }
        let per_ms = 1000 * rate;
        let w = u128::from(now % 1000) * rate + level;
        let ms = floor_div(w, per_ms);
        Self {
            ms: sat(u128::from(now / 1000) + ms),
            units: sat(w - ms * per_ms.max(1)),
        }
    }

    /// [`Level::of`] in `u64`: `None` when a number would not fit (or `rate` is 0). Within
    /// the policy bounds (a level of at most 2^53 units, 1000·rate at most 2^52) every number
    /// fits, and 64-bit division is several times cheaper than 128-bit; the same numbers
    /// either way.
    fn of_narrow(level: u64, rate: u64, now: u64) -> Option<Self> {
        let per_ms = rate.checked_mul(1000).filter(|&m| m > 0)?;
        let w = (now % 1000).checked_mul(rate)?.checked_add(level)?;
        let ms = w / per_ms;
        Some(Self {
            ms: (now / 1000).checked_add(ms)?,
            units: w - ms * per_ms,
        })
    }

    /// The level at `now`: `(ms·1000 − now)·rate + units`, at least 0.
    fn at_time(&self, rate: u128, now: u64) -> u128 {
        // 64 bits within the policy bounds (see `of`), 128 past them.
        if let (Some(ms_us), Ok(rate)) = (self.ms.checked_mul(1000), i64::try_from(rate))
            && let (Ok(ms_us), Ok(now)) = (i64::try_from(ms_us), i64::try_from(now))
            && let Some(level) = (ms_us - now)
                .checked_mul(rate)
                .and_then(|l| l.checked_add(i64::try_from(self.units).ok()?))
        {
            return u128::try_from(level).unwrap_or(0);
        }
        let ahead = i128::from(self.ms) * 1000 - i128::from(now);
        let rate = i128::try_from(rate).unwrap_or(i128::MAX);
        let level = ahead
            .saturating_mul(rate)
            .saturating_add(i128::from(self.units));
        u128::try_from(level).unwrap_or(0)
    }

    /// [`Level::at_time`] in `u64`: `None` when a number would not fit.
    fn at_time_narrow(&self, rate: u64, now: u64) -> Option<u64> {
        let ms_us = self.ms.checked_mul(1000)?;
        if ms_us >= now {
            (ms_us - now).checked_mul(rate)?.checked_add(self.units)
        } else {
            // Behind the millisecond: what is left of `units`, at least 0.
            Some(
                self.units
                    .saturating_sub((now - ms_us).saturating_mul(rate)),
            )
        }
    }

    /// When the level an admitted call left (`e` its evaluation at `now`) is back to 0, µs:
    /// [`Level::idle_at`] of that level, read off the evaluation without a division.
    pub(crate) fn idle_after(e: &Evaluation, now: u64) -> u64 {
        now.saturating_add(e.after_reset_us)
    }

    /// When the level is back to 0, µs.
    pub(crate) fn idle_at(&self, p: &Params) -> u64 {
        self.ms
            .saturating_mul(1000)
            .saturating_add(self.units.div_ceil(p.rate.max(1)))
    }
}

/// How long `2·burst` calls take to drain at `rate` units per µs, `unit` units a call, µs
/// (rounded down; 0 where the numbers do not fit, which only turns off
/// [`normalize`]'s shortcut).
pub(crate) const fn drain_us(burst: u64, unit: u64, rate: u64) -> u64 {
    match burst.checked_mul(unit) {
        Some(capacity) => match capacity.checked_mul(2) {
            Some(most) if rate > 0 => most / rate,
            _ => 0,
        },
        None => 0,
    }
}

/// A level above a full bucket plus one capacity of settled debt (`2·burst` calls) was written
/// by a clock ahead of this one (a failover to a replica behind): brought back to that from
/// now, never held against the caller longer (GCRA's `tat > now + tau`).
#[inline]
pub(crate) fn normalize(b: &mut Level, p: &Params, now: u64) -> bool {
    // The level is below `(ms·1000 + 1000 − now)·rate` (its units are below a millisecond's
    // drain): when that span is at most the drain time of the most, so is the level, and
    // there is nothing to bring back. One comparison on every check of a bucket that is not
    // ahead, instead of the level's multiplications.
    if b.ms
        .checked_mul(1000)
        .and_then(|us| us.checked_add(1000))
        .is_some_and(|end| end <= now.saturating_add(p.bucket_drain_us))
    {
        return false;
    }
    normalize_ahead(b, p, now)
}

/// [`normalize`] past its shortcut: the level computed and compared with the most.
fn normalize_ahead(b: &mut Level, p: &Params, now: u64) -> bool {
    // 64 bits within the policy bounds (the most is 2^53 units), 128 past them.
    let narrow = p
        .burst
        .checked_mul(p.unit)
        .and_then(|c| c.checked_mul(2))
        .zip(b.at_time_narrow(p.rate, now));
    let (level, most) = if let Some((most, level)) = narrow {
        (u128::from(level), u128::from(most))
    } else {
        let (rate, unit) = scale(p);
        (
            b.at_time(rate, now),
            u128::from(p.burst).saturating_mul(unit).saturating_mul(2),
        )
    };
    if level > most {
        *b = Level::of(most, u128::from(p.rate), now);
        true
    } else {
        false
    }
}

/// Evaluates one call; the level it leaves when admitted.
#[inline]
pub fn evaluate(b: Option<&Level>, p: &Params, now: u64) -> (Evaluation, Option<Level>) {
    evaluate_narrow(b, p, now).unwrap_or_else(|| evaluate_wide(b, p, now))
}

/// [`evaluate`] in `u64`, where the policy bounds keep every number (a level of at most
/// 2^53 units, `1000·rate` at most 2^52): `None` when one would not fit (a policy built past
/// the bounds, as the rules' own tests do), for [`evaluate_wide`]. The same numbers wherever
/// it answers (`narrow_and_wide_agree`), without 128-bit arithmetic or a width check per
/// division (the memory store's check: 692 → 665 instructions).
#[inline]
fn evaluate_narrow(b: Option<&Level>, p: &Params, now: u64) -> Option<(Evaluation, Option<Level>)> {
    let (rate, unit) = (p.rate, p.unit);
    if rate == 0 || unit == 0 {
        return None;
    }
    let level = match b {
        Some(b) => b.at_time_narrow(rate, now)?,
        None => 0,
    };
    let capacity = p.burst.checked_mul(unit)?;
    let after = p.cost.checked_mul(unit)?.checked_add(level)?;
    let admitted = after <= capacity;
    // `after` is `level` and `cost` whole calls: its calls, rounded up, are `level`'s and `cost`
    // (the sum is at most `after`, so it fits), one division fewer.
    let calls = level.div_ceil(unit);
    let e = Evaluation {
        admitted,
        now_remaining: p.burst.saturating_sub(calls),
        now_reset_us: level.div_ceil(rate),
        after_remaining: p.burst.saturating_sub(calls + p.cost),
        after_reset_us: after.div_ceil(rate),
        retry_us: if admitted {
            0
        } else {
            (after - capacity).div_ceil(rate)
        },
    };
    let next = if admitted {
        Some(Level::of_narrow(after, rate, now)?)
    } else {
        None
    };
    Some((e, next))
}

/// [`evaluate`] in `u128`, where nothing overflows.
fn evaluate_wide(b: Option<&Level>, p: &Params, now: u64) -> (Evaluation, Option<Level>) {
    let (rate, unit) = scale(p);
    let level = b.map_or(0, |b| b.at_time(rate, now));
    // Saturating: `Params` built past the policy bounds (the rules' own tests) must not wrap.
    let capacity = u128::from(p.burst).saturating_mul(unit);
    let after = level.saturating_add(u128::from(p.cost).saturating_mul(unit));
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
    let next = admitted.then(|| Level::of(after, rate, now));
    (e, next)
}

/// Gives back what the call still holds: `cost` units less what has drained since the take
/// (counted as if the call's own units drained first, the most that can be given back without
/// admitting more than if the call had never been made). A level back to 0 is deleted (`None`).
pub fn refund(b: Level, r: &Receipt, p: &Params, now: u64) -> Option<Level> {
    let (rate, unit) = scale(p);
    let drained = u128::from(now.saturating_sub(r.at_us)).saturating_mul(rate);
    let give = u128::from(p.cost)
        .saturating_mul(unit)
        .saturating_sub(drained);
    if give == 0 {
        return Some(b);
    }
    let level = b.at_time(rate, now).saturating_sub(give);
    (level > 0).then(|| Level::of(level, rate, now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The `u64` path answers exactly as the `u128` one wherever it answers, and answers
        /// for every state the policy bounds allow (a level of at most two capacities).
        #[test]
        fn narrow_and_wide_agree(
            limit in 1u64..=1 << 20,
            period_ms in 1u64..=1 << 24,
            burst in 1u64..=1 << 32,
            cost in 1u64..=1 << 32,
            stamp in 0u64..=1 << 50,
            level in any::<u64>(),
            held in any::<bool>(),
            later in 0u64..=1 << 40,
            wide_numbers in any::<bool>(),
        ) {
            let p = if wide_numbers {
                // Past the bounds: numbers the u64 path may refuse.
                Params::new(limit << 40, period_ms.saturating_mul(1000) << 20, burst << 30, cost)
            } else {
                Params::new(limit, period_ms * 1000, burst, cost)
            };
            // Most states a bucket holds: at most two capacities (a full bucket and a debt).
            let most = u64::try_from(2 * u128::from(p.burst) * u128::from(p.unit)).unwrap_or(u64::MAX);
            let level = if held { level % most.saturating_add(1).max(1) } else { level };
            let b = Level::of(u128::from(level), u128::from(p.rate), stamp);
            for now in [stamp, stamp.saturating_add(later), stamp.saturating_sub(later)] {
                for state in [None, Some(&b)] {
                    if let Some(narrow) = evaluate_narrow(state, &p, now) {
                        prop_assert_eq!(narrow, evaluate_wide(state, &p, now));
                    }
                }
                let (mut n, mut w) = (b, b);
                prop_assert_eq!(normalize(&mut n, &p, now), wide_normalize(&mut w, &p, now));
                prop_assert_eq!(n, w);
            }
            // An admitted call's level is idle when its evaluation says, never sooner than
            // the level's own time (the janitor drops an idle state): the same within the
            // bounds.
            for now in [stamp, stamp.saturating_add(later)] {
                for state in [None, Some(&b)] {
                    if let (e, Some(next)) = evaluate(state, &p, now) {
                        let idle = Level::idle_after(&e, now);
                        prop_assert!(idle >= next.idle_at(&p), "{e:?} {next:?}");
                        if !wide_numbers && stamp < 1 << 50 && later < 1 << 40 {
                            prop_assert_eq!(idle, next.idle_at(&p));
                        }
                    }
                }
            }
            let capacity = u128::from(p.burst) * u128::from(p.unit);
            let bounded = capacity <= 1 << 52
                && u128::from(p.rate) * 1000 <= 1 << 52
                && u128::from(level) <= 2 * capacity
                && stamp < 1 << 50;
            if bounded && u128::from(p.cost) * u128::from(p.unit) <= capacity {
                for now in [stamp, stamp + later] {
                    prop_assert!(evaluate_narrow(Some(&b), &p, now).is_some());
                    prop_assert!(evaluate_narrow(None, &p, now).is_some());
                }
            }
        }
    }

    /// Parameters past every bound (only the rules' own tests build them: `Policy` refuses
    /// them) never overflow: no panic in a debug build, no wrapped level in a release one.
    #[test]
    fn numbers_past_the_bounds_saturate() {
        let max = u64::MAX;
        for p in [
            Params::new(max, max, max, max),
            Params::new(1, max, max, max),
            Params::new(max, 1000, max, 1),
            Params::new(max - 1, max, max / 2, max / 3),
        ] {
            for state in [
                None,
                Some(Level {
                    ms: max,
                    units: max,
                }),
                Some(Level { ms: 0, units: 0 }),
            ] {
                for now in [0, 1, max / 2, max] {
                    let (e, next) = evaluate(state.as_ref(), &p, now);
                    assert!(e.now_remaining <= p.burst && e.after_remaining <= p.burst);
                    if let Some(mut b) = state.or(next) {
                        normalize(&mut b, &p, now);
                        let r = Receipt {
                            at_us: 0,
                            reset_us: 0,
                            first: 0,
                            cost: p.cost,
                        };
                        let _ = refund(b, &r, &p, now);
                        let _ = b.idle_at(&p);
                    }
                }
            }
        }
    }

    /// `normalize` as it was written in `u128` alone, for `narrow_and_wide_agree`.
    fn wide_normalize(b: &mut Level, p: &Params, now: u64) -> bool {
        let (rate, unit) = scale(p);
        let most = 2 * u128::from(p.burst) * unit;
        if b.at_time(rate, now) > most {
            *b = Level::of(most, rate, now);
            true
        } else {
            false
        }
    }

    /// Around the shortcut's edge (a level of exactly the most, one unit more, and every
    /// millisecond near the drain time), [`normalize`] answers as the plain comparison does.
    #[test]
    fn normalize_s_shortcut_answers_as_the_comparison_at_its_edge() {
        for p in [
            Params::new(3, 10_000_000, 3, 1),
            Params::new(1, 3_600_000_000, 1_000, 1),
            Params::new(1_000, 1_000_000, 50, 7),
            Params::new(7, 999, 2, 1),
        ] {
            let (rate, unit) = scale(&p);
            let most = 2 * u128::from(p.burst) * unit;
            let now = 1_700_000_000_000_000;
            for level in [most.saturating_sub(1), most, most + 1, most + rate * 1000] {
                let b = Level::of(level, rate, now);
                for later in (0..3_000)
                    .step_by(7)
                    .chain([p.bucket_drain_us, p.bucket_drain_us + 1])
                {
                    for at in [now + later, now.saturating_sub(later)] {
                        let (mut fast, mut plain) = (b, b);
                        assert_eq!(
                            normalize(&mut fast, &p, at),
                            wide_normalize(&mut plain, &p, at),
                            "{p:?} level {level} at {at}"
                        );
                        assert_eq!(fast, plain);
                    }
                }
            }
        }
    }

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
    fn a_level_from_a_clock_ahead_is_brought_back_to_one_capacity_of_debt() {
        // 1 per s, burst 1 (unit 1_000_000, rate 1): a level stamped 60 s ahead reads as 61
        // calls; it is brought back to 2 (a full bucket and one of debt) from now.
        let p = Params::new(1, 1_000_000, 1, 1);
        let mut b = Level::of(1_000_000, 1, 70_000_000);
        assert!(normalize(&mut b, &p, 10_000_000));
        assert_eq!(b, Level::of(2_000_000, 1, 10_000_000));
        let (e, _) = evaluate(Some(&b), &p, 10_000_000);
        assert_eq!(e.retry_us, 2_000_000);
        assert!(evaluate(Some(&b), &p, 12_000_000).0.admitted);
        // A settled debt of one capacity is kept as it is.
        let mut debt = Level::of(2_000_000, 1, 10_000_000);
        assert!(!normalize(&mut debt, &p, 10_000_000));
    }

    #[test]
    fn the_state_is_when_the_bucket_empties() {
        // 3 per 10 s (rate 3, unit 10_000_000): a call at 1_234_567 µs empties at
        // 1_234_567 + 3_333_333.3 µs = 4_567_900.3 µs: in millisecond 4567, whose start is
        // 2701 units (900.3 µs × 3) before.
        let p = Params::new(3, 10_000_000, 3, 1);
        let (_, b) = evaluate(None, &p, 1_234_567);
        let b = b.unwrap();
        assert_eq!(
            b,
            Level {
                ms: 4567,
                units: 2701
            }
        );
        assert_eq!(b.idle_at(&p), 4_567_901);
        assert_eq!(b.at_time(3, 1_234_567), 10_000_000);
        assert_eq!(b.at_time(3, 4_567_900), 1);
        assert_eq!(b.at_time(3, 4_567_901), 0);
    }

    #[test]
    fn a_refund_gives_back_only_what_has_not_drained() {
        let p = Params::new(1, 1_000_000, 2, 1);
        let b = Level::of(2_000_000, 1, 0);
        let r = Receipt {
            at_us: 0,
            reset_us: 0,
            first: 0,
            cost: p.cost,
        };
        // Half a unit drained since the take: half is given back.
        let after = refund(b, &r, &p, 500_000).unwrap();
        assert_eq!(after.at_time(1, 500_000), 1_000_000);
        // All of it drained: nothing to give.
        assert_eq!(refund(b, &r, &p, 1_000_000), Some(b));
    }
}
