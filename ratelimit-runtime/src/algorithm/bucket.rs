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
//! State: the level `L` and the µs `at` it was written at. The level at any later time `t` is
//! `max(L − (t − at)·rate, 0)`, exactly, and an admitted call writes its level at `now`: no
//! division to keep the state. The Redis scripts keep the same state as the number `E =
//! at·rate + L` ("empty at", in units of `1 / rate` µs), split as Lua's doubles need it: the
//! millisecond `ms` it falls in (the key expires at the next one) and `units = E −
//! ms·1000·rate`, below `1000·rate`; the level at `t` is then `max((ms·1000 − t)·rate + units,
//! 0)`, the same number (the conformance test holds the two forms equal, decision by decision).
//! A level above a full bucket plus one capacity of settled debt (`2·burst` calls) was written
//! by a clock ahead of this one: it is brought back to that, from now (`normalize`).

use super::{Evaluation, Params, Receipt, ceil_div, sat};

/// A bucket's level and when it was written (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Level {
    /// When the level was written, µs.
    pub at_us: u64,
    /// The level then, in units of `1 / (period_µs / g)` of a call.
    pub units: u64,
}

/// The bucket's scale: `(rate, unit)`, the units drained per µs and the units of one call
/// (`num / g` and `period_µs / g` with `g = gcd(num, period_µs)`, computed once per policy by
/// [`Params::new`]).
fn scale(p: &Params) -> (u128, u128) {
    (u128::from(p.rate), u128::from(p.unit))
}

impl Level {
    /// A level of `level` units at `now`, exactly: a level past `u64` (only a bucket written by
    /// a clock ahead holds one within the policy bounds) is the same state stamped later, when
    /// what is left of it fits. Saturates only for `Params` built past the bounds.
    pub fn of(level: u128, rate: u128, now: u64) -> Self {
        if let Ok(units) = u64::try_from(level) {
            return Self { at_us: now, units };
        }
        let later = ceil_div(level - u128::from(u64::MAX), rate.max(1));
        Self {
            at_us: sat(u128::from(now) + later),
            units: sat(level.saturating_sub(later.saturating_mul(rate))),
        }
    }

    /// The level at `now`: `units − (now − at)·rate`, at least 0 (`units + (at − now)·rate`
    /// for a level written by a clock ahead). Never overflows: a `u64` times a `u64` and a
    /// `u64` fit in `u128`.
    fn at_time(&self, rate: u128, now: u64) -> u128 {
        let units = u128::from(self.units);
        if now >= self.at_us {
            units.saturating_sub(u128::from(now - self.at_us) * rate)
        } else {
            units + u128::from(self.at_us - now) * rate
        }
    }

    /// [`Level::at_time`] in `u64`: `None` when a level written by a clock ahead would not
    /// fit.
    #[inline]
    fn at_time_narrow(&self, rate: u64, now: u64) -> Option<u64> {
        if now >= self.at_us {
            Some(
                self.units
                    .saturating_sub((now - self.at_us).saturating_mul(rate)),
            )
        } else {
            (self.at_us - now)
                .checked_mul(rate)?
                .checked_add(self.units)
        }
    }

    /// When the level an admitted call left (`e` its evaluation at `now`) is back to 0, µs:
    /// [`Level::idle_at`] of that level, read off the evaluation without a division.
    pub(crate) fn idle_after(e: &Evaluation, now: u64) -> u64 {
        now.saturating_add(e.after_reset_us)
    }

    /// When the level is back to 0, µs.
    pub(crate) fn idle_at(&self, p: &Params) -> u64 {
        self.at_us
            .saturating_add(self.units.div_ceil(p.rate.max(1)))
    }
}

/// The most a bucket may hold, two capacities (a full bucket and a settled debt), in units;
/// `u64::MAX` where it does not fit, which every `u64` level is at most.
pub(crate) const fn most_units(burst: u64, unit: u64) -> u64 {
    match burst.checked_mul(unit) {
        Some(capacity) => capacity.saturating_mul(2),
        None => u64::MAX,
    }
}

/// A level above a full bucket plus one capacity of settled debt (`2·burst` calls) was written
/// by a clock ahead of this one (a failover to a replica behind): brought back to that from
/// now, never held against the caller longer (GCRA's `tat > now + tau`).
#[inline(always)]
#[allow(
    clippy::inline_always,
    reason = "inlined into the memory store's check, measured: `#[inline]` alone leaves it a call"
)]
pub(crate) fn normalize(b: &mut Level, p: &Params, now: u64) -> bool {
    // Written at or before `now`, a level is at most what it was then: when that is at most
    // the most, there is nothing to bring back. Two comparisons on every check of a bucket
    // that is not ahead.
    if b.at_us <= now && b.units <= p.bucket_most {
        return false;
    }
    normalize_ahead(b, p, now)
}

/// [`normalize`] past its shortcut: the level computed and compared with the most. Out of
/// line: only a level written by a clock ahead, or above the most, comes here.
#[cold]
#[inline(never)]
fn normalize_ahead(b: &mut Level, p: &Params, now: u64) -> bool {
    let (rate, unit) = scale(p);
    let most = u128::from(p.burst).saturating_mul(unit).saturating_mul(2);
    if b.at_time(rate, now) > most {
        *b = Level::of(most, rate, now);
        true
    } else {
        false
    }
}

/// Evaluates one call; the level it leaves when admitted.
#[inline(always)]
#[allow(
    clippy::inline_always,
    reason = "inlined into the memory store's check, measured: `#[inline]` alone leaves it a call"
)]
pub fn evaluate(b: Option<&Level>, p: &Params, now: u64) -> (Evaluation, Option<Level>) {
    evaluate_narrow(b, p, now).unwrap_or_else(|| evaluate_wide(b, p, now))
}

/// [`evaluate`] in `u64`, where the policy bounds keep every number (a capacity of at most
/// 2^52 units, a level of at most two): `None` when one would not fit (a level written by a
/// clock ahead and not yet brought back, a policy built past the bounds, as the rules' own
/// tests do), for [`evaluate_wide`]. The same numbers wherever it answers
/// (`narrow_and_wide_agree`), without 128-bit arithmetic or a width check per division.
#[inline(always)]
#[allow(
    clippy::inline_always,
    reason = "inlined into the memory store's check, measured: `#[inline]` alone leaves it a call"
)]
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
    let next = admitted.then_some(Level {
        at_us: now,
        units: after,
    });
    Some((e, next))
}

/// [`evaluate`] in `u128`, where nothing overflows. Out of line: only a level from a clock
/// ahead or a policy past the bounds comes here, and its 128-bit products are then not
/// computed ahead of every check.
#[cold]
#[inline(never)]
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

    /// The receipt of a call of `p`'s cost taken at `at_us`.
    fn taken_at(at_us: u64, p: &Params) -> Receipt {
        Receipt {
            at_us,
            reset_us: 0,
            first: 0,
            cost: p.cost,
        }
    }

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
            // bounds (a capacity of at most 2^52 units).
            let capacity = u128::from(p.burst) * u128::from(p.unit);
            for now in [stamp, stamp.saturating_add(later)] {
                for state in [None, Some(&b)] {
                    if let (e, Some(next)) = evaluate(state, &p, now) {
                        let idle = Level::idle_after(&e, now);
                        prop_assert!(idle >= next.idle_at(&p), "{e:?} {next:?}");
                        if capacity <= 1 << 52 && stamp < 1 << 50 && later < 1 << 40 {
                            prop_assert_eq!(idle, next.idle_at(&p));
                        }
                    }
                }
            }
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
                    at_us: max,
                    units: max,
                }),
                Some(Level { at_us: 0, units: 0 }),
            ] {
                for now in [0, 1, max / 2, max] {
                    let (e, next) = evaluate(state.as_ref(), &p, now);
                    assert!(e.now_remaining <= p.burst && e.after_remaining <= p.burst);
                    if let Some(mut b) = state.or(next) {
                        normalize(&mut b, &p, now);
                        let r = taken_at(0, &p);
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

    /// Around the shortcut's edge (a level of exactly the most, one unit more, written a
    /// little before or after now, and near the drain time of the most), [`normalize`]
    /// answers as the plain comparison does.
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
            let drain = u64::try_from(most / rate).unwrap();
            let now = 1_700_000_000_000_000;
            for level in [most.saturating_sub(1), most, most + 1, most + rate * 1000] {
                let b = Level::of(level, rate, now);
                for later in (0..3_000).step_by(7).chain([drain, drain + 1]) {
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
    fn the_state_is_the_level_and_when_it_was_written() {
        // 3 per 10 s (rate 3, unit 10_000_000): a call at 1_234_567 µs leaves one call's
        // units, which drain by 3 a µs: the bucket is empty at 1_234_567 + 3_333_333.3 µs =
        // 4_567_900.3 µs, so idle from 4_567_901.
        let p = Params::new(3, 10_000_000, 3, 1);
        let (_, b) = evaluate(None, &p, 1_234_567);
        let b = b.unwrap();
        assert_eq!(
            b,
            Level {
                at_us: 1_234_567,
                units: 10_000_000
            }
        );
        assert_eq!(b.idle_at(&p), 4_567_901);
        assert_eq!(b.at_time(3, 1_234_567), 10_000_000);
        assert_eq!(b.at_time(3, 4_567_900), 1);
        assert_eq!(b.at_time(3, 4_567_901), 0);
    }

    proptest! {
        /// `Level::of` keeps any level a bucket within the bounds can hold, past `u64` too (a
        /// clock ahead by up to 2^40 µs at the fastest drain): the same level at every time.
        #[test]
        fn of_keeps_the_level_exactly(
            rate in 1u64..=1 << 42,
            ahead_us in 0u64..=1 << 40,
            units in any::<u64>(),
            now in 0u64..=1 << 52,
            later in 0u64..=1 << 41,
        ) {
            let rate = u128::from(rate);
            let level = u128::from(units) + u128::from(ahead_us) * rate;
            let b = Level::of(level, rate, now);
            for t in [now, now + later, now.saturating_sub(later)] {
                let exact = (level + u128::from(now) * rate).saturating_sub(u128::from(t) * rate);
                prop_assert_eq!(b.at_time(rate, t), exact);
            }
        }
    }

    /// A refund computes the level at its own time, which may be past `u64` for a bucket
    /// written by a clock ahead (within the policy bounds: the fastest drain, a clock 10 s
    /// ahead). The state it leaves is that level exactly, so the bucket is idle when the
    /// take's level less the refund drains, not sooner (the janitor would forget it), and
    /// the next check finds it over the most, as the Redis script's exact state reads.
    #[test]
    fn a_refund_of_a_bucket_from_a_clock_ahead_keeps_its_level_exactly() {
        let limit = (1 << 42) - 1;
        let p = Params::new(limit, 1_000, limit, 1);
        let rate = u128::from(p.rate);
        // A take at 110 s (the clock ahead) of a bucket empty then, refunded at 100 s.
        let taken = Level::of(1_000, rate, 110_000_000);
        let r = taken_at(100_000_000, &p);
        let back = refund(taken, &r, &p, 100_000_000).unwrap();
        assert!(back.at_time(rate, 100_000_000) > u128::from(u64::MAX));
        assert_eq!(back.idle_at(&p), 110_000_000);
        assert_eq!(back.at_time(rate, 105_000_000), 5_000_000 * rate);
        let mut held = back;
        assert!(normalize(&mut held, &p, 105_000_000));
        assert!(!evaluate(Some(&held), &p, 105_000_000).0.admitted);
    }

    #[test]
    fn a_refund_gives_back_only_what_has_not_drained() {
        let p = Params::new(1, 1_000_000, 2, 1);
        let b = Level::of(2_000_000, 1, 0);
        let r = taken_at(0, &p);
        // Half a unit drained since the take: half is given back.
        let after = refund(b, &r, &p, 500_000).unwrap();
        assert_eq!(after.at_time(1, 500_000), 1_000_000);
        // All of it drained: nothing to give.
        assert_eq!(refund(b, &r, &p, 1_000_000), Some(b));
    }
}
