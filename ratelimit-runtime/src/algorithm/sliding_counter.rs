//! Sliding-window counter (`scripts/sliding_counter.lua`): the current and the previous fixed
//! window's counts, the previous weighted by the part of it still inside the trailing interval.
//!
//! Windows are aligned on the store's clock (window `i` is `[i·period, (i+1)·period)`). At `now`,
//! `elapsed` into the current window, the estimate of the trailing interval's load is
//! `prev · (period - elapsed) / period + cur`, and a call of `cost` fits when the estimate plus
//! `cost` is at most `num`. In integers: with the period and `elapsed` in whole milliseconds
//! (elapsed rounded down, so the previous window weighs at least its true share),
//! `prev·(P - e) + (cur + cost)·P ≤ num·P`.
//!
//! # Accuracy
//!
//! O(1) state, approximate: the estimate assumes the previous window's calls were spread evenly.
//! * It never admits more than `num` in one aligned window (the estimate is at least `cur`).
//! * Against an exact sliding log, it can over-admit when the previous window's calls came at
//!   its very end (the estimate forgets them linearly while they are all still in the trailing
//!   interval): a trailing interval of length `period` then holds up to `2·num` admitted units
//!   (the bound, approached as `num` calls at the end of one window are followed by calls
//!   spread over the next: 199 against `num = 100` in `tests/tests/it/o1_algorithms.rs`). It under-admits when they came at its start (they are still
//!   weighed after they left the interval). For traffic at a steady rate the estimate is exact.
//!
//! The state is one Redis string `"<window>:<cur>:<prev>"` with a TTL to the end of the next
//! window (when `cur` stops counting): two counters per caller, whatever `num` is.

use super::{Evaluation, Params, Receipt, floor_div};

/// The counts of the window `window` (`cur`) and of the one before it (`prev`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    /// The index of the current window (`now / period`).
    pub window: u64,
    /// Units admitted in window `window`.
    pub cur: u64,
    /// Units admitted in window `window - 1`.
    pub prev: u64,
}

impl Counters {
    /// The counts as seen from window `index`: `(cur, prev)`.
    fn at(self, index: u64) -> (u64, u64) {
        if self.window == index {
            (self.cur, self.prev)
        } else if self.window.saturating_add(1) == index {
            (0, self.cur)
        } else {
            (0, 0)
        }
    }

    /// When the counts stop weighing anything: the end of the window after `window`, µs.
    pub(crate) fn idle_at(self, p: &Params) -> u64 {
        self.window.saturating_add(2).saturating_mul(p.period_us)
    }

    /// When the counts an admitted call left (`e` its evaluation at `now`) stop weighing
    /// anything, µs: [`Counters::idle_at`] of them, read off the evaluation (its
    /// `after_reset_us` runs to the end of the next window) without a multiplication.
    pub(crate) fn idle_after(e: &Evaluation, now: u64) -> u64 {
        now.saturating_add(e.after_reset_us)
    }
}

/// Counters of a window ahead of the clock's (a clock behind the one that wrote them) count as
/// the current window's.
pub(crate) fn normalize(c: &mut Counters, p: &Params, now: u64) -> bool {
    let period = p.period_us.max(1);
    // `window > now / period` is `window · period > now` (an overflow is past any `now`): the
    // division only when the counters are ahead.
    let ahead = c.window.checked_mul(period).is_none_or(|start| start > now);
    if ahead {
        c.window = now / period;
    }
    ahead
}

/// The index of the window `now` falls in (`now / period`), without the division when it is
/// the counters' own window, the one that `window · period ≤ now < (window + 1) · period`
/// names: the common case, as the window moves once a period.
fn window_of(c: Option<&Counters>, period: u64, now: u64) -> u64 {
    if let Some(c) = c
        && let Some(start) = c.window.checked_mul(period)
        && start <= now
        && now - start < period
    {
        return c.window;
    }
    now / period
}

/// The window of a policy of `period_us` in whole milliseconds, as the rule weighs it: at
/// least one ([`Params::window_ms`], computed once per policy).
pub(crate) const fn window_ms(period_us: u64) -> u64 {
    let period = if period_us < 1000 { 1000 } else { period_us };
    period / 1000
}

/// Evaluates one call; the counters it leaves when admitted.
#[inline(always)]
#[allow(
    clippy::inline_always,
    reason = "inlined into the memory store's check, measured: `#[inline]` alone leaves it a call"
)]
pub fn evaluate(c: Option<&Counters>, p: &Params, now: u64) -> (Evaluation, Option<Counters>) {
    let period = p.period_us.max(1000);
    let index = window_of(c, period, now);
    let start = index * period;
    let (cur, prev) = c.map_or((0, 0), |c| c.at(index));
    let (pms, e) = (p.window_ms, (now - start) / 1000);
    let (admitted, now_remaining, after_remaining) =
        weigh(cur, prev, pms, e, p).unwrap_or_else(|| weigh_wide(cur, prev, pms, e, p));
    let window_end = start + period;
    let mut out = Evaluation {
        admitted,
        now_remaining,
        now_reset_us: if cur > 0 {
            window_end + period - now
        } else if prev > 0 {
            window_end - now
        } else {
            0
        },
        after_remaining,
        after_reset_us: window_end + period - now,
        retry_us: 0,
    };
    if !admitted {
        out.retry_us = retry(p, now, start, cur, prev);
        return (out, None);
    }
    let next = Counters {
        window: index,
        cur: cur.saturating_add(p.cost),
        prev,
    };
    (out, Some(next))
}

/// Whether the call fits and the units left before and after it, in `u64` (`pms` ≥ 1, `e <
/// pms`): every number fits for the policies the bounds allow (`num × period_ms ≤ 2^52`) unless a
/// settled debt raised the counts far past `num`; `None` then, for [`weigh_wide`].
fn weigh(cur: u64, prev: u64, pms: u64, e: u64, p: &Params) -> Option<(bool, u64, u64)> {
    let load = prev
        .checked_mul(pms - e)?
        .checked_add(cur.checked_mul(pms)?)?;
    let quota = p.limit.checked_mul(pms)?;
    let after = load.checked_add(p.cost.checked_mul(pms)?)?;
    // With no previous count the load is whole calls: `num − cur`, without a division.
    let now_remaining = if prev == 0 {
        p.limit.saturating_sub(cur)
    } else {
        quota.saturating_sub(load) / pms
    };
    // `after` is `load` and `cost` whole calls: `⌊(quota − after) / pms⌋` is `now_remaining −
    // cost`, both 0 once the call does not fit.
    Some((
        after <= quota,
        now_remaining,
        now_remaining.saturating_sub(p.cost),
    ))
}

/// [`weigh`] in `u128`, where nothing overflows. Out of line: only a settled debt far past
/// `num` comes here, and its 128-bit products are then not computed ahead on every check.
#[cold]
#[inline(never)]
fn weigh_wide(cur: u64, prev: u64, pms: u64, e: u64, p: &Params) -> (bool, u64, u64) {
    let (pms, e) = (u128::from(pms), u128::from(e));
    let (num, cost) = (u128::from(p.limit), u128::from(p.cost));
    let (cur, prev) = (u128::from(cur), u128::from(prev));
    let load = prev * (pms - e) + cur * pms;
    let quota = num * pms;
    let after = load + cost * pms;
    let remaining = |taken: u128| super::sat(floor_div(quota.saturating_sub(taken), pms));
    (after <= quota, remaining(load), remaining(after))
}

/// The wait until the same call fits with no other calls: later in this window, as the
/// previous window's weight decays; or in the next, where this window's count is the one that
/// decays. Out of line: only a rejected call needs it, and its 128-bit products would
/// otherwise be computed ahead of every check.
#[inline(never)]
fn retry(p: &Params, now: u64, start: u64, cur: u64, prev: u64) -> u64 {
    let period = p.period_us.max(1000);
    let pms = u128::from(p.window_ms);
    let (num, cost) = (u128::from(p.limit), u128::from(p.cost));
    // The first elapsed millisecond `e` at which `weight · (pms - e) ≤ room · pms`.
    // Nothing to decay (weight 0): at once.
    let first_ms = |weight: u128, room: u128| {
        if weight == 0 {
            0
        } else {
            pms.saturating_sub(floor_div(room * pms, weight))
        }
    };
    let (cur, prev) = (u128::from(cur), u128::from(prev));
    if cur + cost <= num {
        let e = first_ms(prev, num - cur - cost);
        if e < pms {
            return super::sat((u128::from(start) + e * 1000).saturating_sub(u128::from(now)));
        }
    }
    // Next window: this window's count is the previous one's.
    let e = first_ms(cur, num.saturating_sub(cost)).min(pms);
    super::sat((u128::from(start) + u128::from(period) + e * 1000).saturating_sub(u128::from(now)))
}

/// Gives back exactly the call's units, from the window it was counted in (found from the
/// take's time), while that window still counts. Counters back to zero are deleted (`None`).
pub fn refund(c: Counters, r: &Receipt, p: &Params) -> Option<Counters> {
    let taken_in = r.at_us / p.period_us.max(1);
    let mut c = c;
    if c.window == taken_in {
        c.cur = c.cur.saturating_sub(p.cost);
    } else if c.window == taken_in.saturating_add(1) {
        c.prev = c.prev.saturating_sub(p.cost);
    } else {
        return Some(c);
    }
    (c.cur > 0 || c.prev > 0).then_some(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(limit: u64, period_ms: u64, cost: u64) -> Params {
        Params::new(limit, period_ms * 1000, limit, cost)
    }

    proptest! {
        /// The idle time read off an admitted call's evaluation is the counters' own: the
        /// memory store's fast path keeps the one, the janitor and the slow path the other.
        #[test]
        fn idle_after_is_the_counters_idle_time(
            limit in 1u64..=1 << 20,
            period_ms in 1u64..=1 << 32,
            cost in 1u64..=1 << 10,
            window_back in 0u64..=3,
            cur in 0u64..=1 << 20,
            prev in 0u64..=1 << 20,
            now in 0u64..=1 << 52,
        ) {
            let p = Params::new(limit, period_ms * 1000, limit, cost);
            let held = Counters {
                window: (now / p.period_us).saturating_sub(window_back),
                cur,
                prev,
            };
            for state in [None, Some(&held)] {
                if let (e, Some(next)) = evaluate(state, &p, now) {
                    prop_assert_eq!(Counters::idle_after(&e, now), next.idle_at(&p));
                }
            }
        }
    }

    fn run(c: &mut Option<Counters>, p: &Params, now: u64) -> Evaluation {
        let (e, next) = evaluate(c.as_ref(), p, now);
        if let Some(n) = next {
            *c = Some(n);
        }
        e
    }

    #[test]
    fn the_previous_window_weighs_its_share_of_the_trailing_interval() {
        let p = p(10, 1000, 1);
        let mut c = None;
        // 10 calls at the end of window 5.
        for _ in 0..10 {
            assert!(run(&mut c, &p, 5_999_000).admitted);
        }
        assert!(!run(&mut c, &p, 5_999_000).admitted);
        // A quarter into window 6: the previous window weighs 3/4 → 7.5 → 2 more fit.
        let now = 6_250_000;
        let e = run(&mut c, &p, now);
        assert!(e.admitted);
        assert_eq!(e.after_remaining, 1);
        assert!(run(&mut c, &p, now).admitted);
        let e = run(&mut c, &p, now);
        assert!(!e.admitted);
        // 2 + 10·(1000 - e)/1000 + 1 ≤ 10 once e ≥ 300 ms.
        assert_eq!(e.retry_us, 50_000);
        assert!(!evaluate(c.as_ref(), &p, 6_299_999).0.admitted);
        assert!(evaluate(c.as_ref(), &p, 6_300_000).0.admitted);
    }

    #[test]
    fn a_full_window_waits_for_the_next_one_to_decay_it() {
        let p = p(4, 1000, 1);
        let mut c = None;
        for _ in 0..4 {
            assert!(run(&mut c, &p, 3_000_000).admitted);
        }
        let e = run(&mut c, &p, 3_000_000);
        // In window 4 the 4 weigh 4·(1000 - e)/1000; one more fits once that is ≤ 3: e ≥ 250.
        assert_eq!(e.retry_us, 1_250_000);
        assert!(!evaluate(c.as_ref(), &p, 4_249_999).0.admitted);
        assert!(evaluate(c.as_ref(), &p, 4_250_000).0.admitted);
        assert_eq!(e.now_reset_us, 2_000_000);
    }

    #[test]
    fn a_refund_gives_back_in_the_window_it_was_counted_in() {
        let p = p(4, 1000, 2);
        let r = Receipt {
            at_us: 3_100_000,
            reset_us: 0,
            first: 0,
            cost: p.cost,
        };
        let c = Counters {
            window: 3,
            cur: 3,
            prev: 1,
        };
        assert_eq!(refund(c, &r, &p).map(|c| c.cur), Some(1));
        let moved = Counters {
            window: 4,
            cur: 1,
            prev: 2,
        };
        assert_eq!(refund(moved, &r, &p).map(|c| (c.cur, c.prev)), Some((1, 0)));
        let done = Counters {
            window: 3,
            cur: 2,
            prev: 0,
        };
        assert_eq!(refund(done, &r, &p), None);
    }
}
