//! Sliding log (`scripts/sliding.lua`): at most `num` units in any trailing interval of length
//! `period`, with no boundary burst.
//!
//! The state is what Redis holds: one sorted-set entry per admitted unit, scored by its time in
//! µs. Scores strictly increase: a call's `cost` entries get the scores `first .. first + cost -
//! 1`, where `first` is now, or one past the newest entry when that is not older than now, so two
//! calls in the same microsecond are two sets of entries. An entry counts while `score + period >
//! now`. Here consecutive scores are kept as runs `(start, len)`, so a call of any cost is one
//! run.

use std::collections::VecDeque;

use super::{Evaluation, Params, Receipt};

/// The admitted units, oldest first, as runs of consecutive scores.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Log {
    /// `(first score, number of consecutive scores)`, ascending and disjoint.
    pub runs: VecDeque<(i64, u64)>,
}

fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn unsigned(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

impl Log {
    /// Units live at `now` (scores at or after `from`).
    fn live(&self, from: i64) -> u64 {
        self.runs
            .iter()
            .map(|&(start, len)| {
                let end = start.saturating_add(signed(len));
                unsigned(end.saturating_sub(start.max(from)))
            })
            .fold(0, u64::saturating_add)
    }

    /// The newest score.
    fn newest(&self) -> Option<i64> {
        self.runs
            .back()
            .map(|&(start, len)| start.saturating_add(signed(len)) - 1)
    }

    /// The `k`-th live score (1-based), oldest first.
    fn nth_live(&self, from: i64, mut k: u64) -> Option<i64> {
        for &(start, len) in &self.runs {
            let end = start.saturating_add(signed(len));
            let first = start.max(from);
            let here = unsigned(end.saturating_sub(first));
            if k <= here {
                return Some(first.saturating_add(signed(k)) - 1);
            }
            k -= here;
        }
        None
    }

    /// Drops every score before `from`.
    fn trim(&mut self, from: i64) {
        while let Some(&(start, len)) = self.runs.front() {
            let end = start.saturating_add(signed(len));
            if end <= from {
                self.runs.pop_front();
            } else {
                if start < from {
                    self.runs[0] = (from, unsigned(end - from));
                }
                break;
            }
        }
    }

    /// Adds `len` scores from `first` (after every score held).
    fn push(&mut self, first: i64, len: u64) {
        if let Some(last) = self.runs.back_mut()
            && last.0.saturating_add(signed(last.1)) == first
        {
            last.1 = last.1.saturating_add(len);
            return;
        }
        self.runs.push_back((first, len));
    }

    /// Removes the scores `lo ..= hi`.
    fn remove(&mut self, lo: i64, hi: i64) {
        let mut kept = VecDeque::with_capacity(self.runs.len() + 1);
        for &(start, len) in &self.runs {
            let end = start.saturating_add(signed(len)) - 1;
            if end < lo || start > hi {
                kept.push_back((start, len));
                continue;
            }
            if start < lo {
                kept.push_back((start, unsigned(lo - start)));
            }
            if end > hi {
                kept.push_back((hi + 1, unsigned(end - hi)));
            }
        }
        self.runs = kept;
    }

    /// One period after the newest score, µs.
    pub(crate) fn idle_at(&self, p: &Params) -> u64 {
        self.newest()
            .map_or(0, |t| unsigned(t.saturating_add(signed(p.period_us))))
    }
}

/// The first score that counts at `now`: `score + period > now`.
fn live_from(p: &Params, now: u64) -> i64 {
    signed(now) - signed(p.period_us) + 1
}

/// A log whose newest entry is more than `num` µs ahead of now was stamped by a clock ahead of
/// this one (a healthy log ends at most `num` µs ahead, one µs per unit): every entry is moved
/// back by the skew, so that the log ends now and keeps its spacing.
pub(crate) fn normalize(log: &mut Log, p: &Params, now: u64) -> bool {
    let n = log.live(live_from(p, now));
    match log.newest() {
        Some(newest) if n > 0 && newest > signed(now).saturating_add(signed(p.limit)) => {
            let skew = newest - signed(now);
            for run in &mut log.runs {
                run.0 -= skew;
            }
            true
        }
        _ => false,
    }
}

/// Evaluates one call; the log it leaves when admitted.
pub fn evaluate(log: Option<&Log>, p: &Params, now: u64) -> (Evaluation, Option<Log>) {
    let from = live_from(p, now);
    let n = log.map_or(0, |l| l.live(from));
    let newest = if n > 0 {
        log.and_then(Log::newest)
    } else {
        None
    };
    let now_i = signed(now);
    let period = signed(p.period_us);
    let admitted = n.saturating_add(p.cost) <= p.limit;
    let first = match newest {
        Some(t) if t >= now_i => t + 1,
        _ => now_i,
    };
    let after_newest = first.saturating_add(signed(p.cost)) - 1;
    let mut e = Evaluation {
        admitted,
        now_remaining: p.limit.saturating_sub(n),
        now_reset_us: newest.map_or(0, |t| unsigned(t + period - now_i)),
        after_remaining: p.limit.saturating_sub(n).saturating_sub(p.cost),
        after_reset_us: unsigned(after_newest + period - now_i),
        retry_us: 0,
    };
    if !admitted {
        // The call fits once the (n + cost - limit)-th oldest live entry expires.
        let k = n.saturating_add(p.cost) - p.limit;
        e.retry_us = log
            .and_then(|l| l.nth_live(from, k))
            .map_or(0, |t| unsigned(t + period - now_i));
        return (e, None);
    }
    let mut next = log.cloned().unwrap_or_default();
    next.trim(from);
    next.push(first, p.cost);
    (e, Some(next))
}

/// Removes exactly the call's own entries (`first .. first + cost - 1`), never another caller's.
pub fn refund(mut log: Log, r: &Receipt, p: &Params) -> Log {
    if r.first >= 1 {
        let lo = signed(r.first);
        log.remove(lo, lo.saturating_add(signed(p.cost)) - 1);
    }
    log
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(limit: u64, period_us: u64, cost: u64) -> Params {
        Params::new(limit, period_us, limit, cost)
    }

    #[test]
    fn calls_in_one_microsecond_get_distinct_scores_and_expire_in_order() {
        let p = p(3, 1_000_000, 1);
        let mut log = None::<Log>;
        for _ in 0..3 {
            let (e, next) = evaluate(log.as_ref(), &p, 10_000_000);
            assert!(e.admitted);
            log = next;
        }
        let l = log.unwrap();
        assert_eq!(l.runs, [(10_000_000, 3)]);
        let (e, _) = evaluate(Some(&l), &p, 10_000_000);
        assert!(!e.admitted);
        // The oldest entry (10_000_000) leaves at 11_000_000.
        assert_eq!(e.retry_us, 1_000_000);
        assert!(!evaluate(Some(&l), &p, 10_999_999).0.admitted);
        assert!(evaluate(Some(&l), &p, 11_000_000).0.admitted);
    }

    #[test]
    fn a_log_from_a_clock_ahead_is_moved_back_to_end_now() {
        let p = p(2, 1_000_000, 1);
        let mut l = Log {
            runs: [(70_000_000, 2)].into(),
        };
        assert!(normalize(&mut l, &p, 10_000_000));
        assert_eq!(l.runs, [(9_999_999, 2)]);
        assert!(!normalize(&mut l, &p, 10_000_000));
    }

    #[test]
    fn a_refund_removes_only_the_calls_own_scores() {
        let p = p(5, 1_000_000, 2);
        let l = Log {
            runs: [(100, 5)].into(),
        };
        let r = Receipt {
            at_us: 0,
            reset_us: 0,
            first: 101,
        };
        assert_eq!(refund(l.clone(), &r, &p).runs, [(100, 1), (103, 2)]);
        let twice = refund(refund(l, &r, &p), &r, &p);
        assert_eq!(twice.runs, [(100, 1), (103, 2)], "idempotent");
    }
}
