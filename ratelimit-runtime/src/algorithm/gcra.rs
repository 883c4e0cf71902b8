//! GCRA, the generic cell rate algorithm (`scripts/gcra.lua`): a token bucket kept as one
//! integer, the theoretical arrival time.
//!
//! Each unit is due one emission interval `T` after the previous one; the state is the time
//! `tat` at which the bucket would be full again (the backlog ends). A call of `cost` units fits
//! when the backlog after it, `max(tat, now) + cost·T - now`, is at most the burst tolerance
//! `burst·T`, and then moves `tat` to `max(tat, now) + cost·T`.
//!
//! This is the token bucket of capacity `burst` refilled at one token per `T`: the backlog
//! `tat - now` is the tokens missing from a full bucket times `T`, so `remaining`, `reset_after`
//! and `retry_after` are the token bucket's, to the microsecond. `T` is `period / num` in whole
//! microseconds, rounded up when `num` does not divide the period: then the rate is at most one
//! microsecond per unit slower than `num / period` (never faster), and the equivalence with the
//! token bucket of that rate is exact. Time is the store's own, in µs; the state is one integer
//! (Redis: `SET key <tat> PX <tat - now>`), so a key is idle exactly when its bucket is full.

use super::{Evaluation, Params, Receipt};

/// The theoretical arrival time, µs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tat(pub u64);

/// The emission interval `T`: `period / num` µs, rounded up (at least 1 µs); computed once
/// per policy by [`Params::new`].
pub fn emission_interval(p: &Params) -> u64 {
    p.interval
}

/// The emission interval of `num` units per `period_us` µs: `period / num`, rounded up, at
/// least 1 µs.
pub(crate) const fn interval_of(limit: u64, period_us: u64) -> u64 {
    let limit = if limit == 0 { 1 } else { limit };
    let t = period_us.div_ceil(limit);
    if t == 0 { 1 } else { t }
}

/// The burst tolerance `burst·T`, µs: the longest backlog the bucket holds.
fn tolerance(p: &Params) -> u64 {
    p.burst.saturating_mul(emission_interval(p))
}

impl Tat {
    /// When the bucket is full again, µs.
    pub(crate) fn idle_at(self) -> u64 {
        self.0
    }
}

/// A `tat` further ahead than a full backlog was stamped by a clock ahead of this one: it is
/// brought back to a full backlog from now, never held against the caller beyond that.
pub(crate) fn normalize(tat: &mut Tat, p: &Params, now: u64) -> bool {
    let most = now.saturating_add(tolerance(p));
    if tat.0 > most {
        tat.0 = most;
        true
    } else {
        false
    }
}

/// Evaluates one call; the `tat` it leaves when admitted.
pub fn evaluate(tat: Option<&Tat>, p: &Params, now: u64) -> (Evaluation, Option<Tat>) {
    let t = emission_interval(p);
    let tau = tolerance(p);
    let start = tat.map_or(now, |tat| tat.0.max(now));
    let backlog = start - now;
    let after = backlog.saturating_add(p.cost.saturating_mul(t));
    let admitted = after <= tau;
    let e = Evaluation {
        admitted,
        now_remaining: p.burst.saturating_sub(backlog.div_ceil(t)),
        now_reset_us: backlog,
        after_remaining: p.burst.saturating_sub(after.div_ceil(t)),
        after_reset_us: after,
        retry_us: if admitted { 0 } else { after - tau },
    };
    (e, admitted.then(|| Tat(now.saturating_add(after))))
}

/// Gives back what the call still holds: `cost·T` less the time gone since the take (the part
/// of its backlog not yet worked off). A bucket full again is deleted (`None`).
pub fn refund(tat: Tat, r: &Receipt, p: &Params, now: u64) -> Option<Tat> {
    let give = p
        .cost
        .saturating_mul(emission_interval(p))
        .saturating_sub(now.saturating_sub(r.at_us));
    if give == 0 {
        return Some(tat);
    }
    let back = tat.0.saturating_sub(give);
    (back > now).then_some(Tat(back))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_one_unit_per_emission_interval() {
        // 10 per second (T = 100 ms), burst 3.
        let p = Params::new(10, 1_000_000, 3, 1);
        let now = 50_000_000;
        let mut tat = None;
        for left in [2, 1, 0] {
            let (e, next) = evaluate(tat.as_ref(), &p, now);
            assert!(e.admitted);
            assert_eq!(e.after_remaining, left);
            tat = next;
        }
        let (e, none) = evaluate(tat.as_ref(), &p, now);
        assert!(!e.admitted && none.is_none());
        assert_eq!(e.retry_us, 100_000);
        assert_eq!(e.now_reset_us, 300_000);
        assert!(!evaluate(tat.as_ref(), &p, now + 99_999).0.admitted);
        assert!(evaluate(tat.as_ref(), &p, now + 100_000).0.admitted);
    }

    #[test]
    fn the_interval_rounds_up_so_the_rate_is_never_faster() {
        // 3 per 10 s: T = 3_333_334 µs.
        let p = Params::new(3, 10_000_000, 1, 1);
        assert_eq!(emission_interval(&p), 3_333_334);
        let (_, tat) = evaluate(None, &p, 0);
        let (e, _) = evaluate(tat.as_ref(), &p, 0);
        assert_eq!(e.retry_us, 3_333_334);
    }

    #[test]
    fn a_tat_from_a_clock_ahead_is_brought_back_to_a_full_backlog() {
        let p = Params::new(1, 1_000_000, 2, 1);
        let mut tat = Tat(90_000_000);
        assert!(normalize(&mut tat, &p, 10_000_000));
        assert_eq!(tat, Tat(12_000_000));
        let (e, _) = evaluate(Some(&tat), &p, 10_000_000);
        assert_eq!(e.retry_us, 1_000_000);
    }

    #[test]
    fn a_refund_gives_back_only_the_backlog_not_yet_worked_off() {
        let p = Params::new(1, 1_000_000, 5, 2);
        let r = Receipt {
            at_us: 0,
            reset_us: 0,
            first: 0,
            cost: p.cost,
        };
        // Took 2 s of backlog at 0; half a second later 1.5 s of it is still held.
        assert_eq!(
            refund(Tat(3_000_000), &r, &p, 500_000),
            Some(Tat(1_500_000))
        );
        assert_eq!(
            refund(Tat(3_000_000), &r, &p, 2_000_000),
            Some(Tat(3_000_000))
        );
        assert_eq!(refund(Tat(2_000_000), &r, &p, 100_000), None);
    }
}
