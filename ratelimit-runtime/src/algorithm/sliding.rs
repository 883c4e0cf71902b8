//! Sliding log (`scripts/sliding.lua`): at most `num` units in any trailing interval of length
//! `period`, with no boundary burst.
//!
//! The state is what Redis holds: one sorted-set entry per admitted unit, scored by its time in
//! µs. Scores strictly increase: a call's `cost` entries get the scores `first .. first + cost -
//! 1`, where `first` is now, or one past the newest entry when that is not older than now, so two
//! calls in the same microsecond are two sets of entries. An entry counts while `score + period >
//! now`. Here consecutive scores are kept as runs `(start, len)`, so a call of any cost is one
//! run, and each run also carries the number of units pushed before it: the units live at a time
//! and the `k`-th live score (what `retry_after` waits for) are two binary searches, not a scan
//! of the log, and an admission drops the expired runs from the front and pushes one at the back
//! (what Redis's `ZCOUNT`, `ZRANGE` and `ZADD` do on its sorted set).

use std::collections::VecDeque;

use super::{Evaluation, Params, Receipt};

/// One run of consecutive scores.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// The first score.
    start: i64,
    /// How many consecutive scores (at least 1).
    len: u64,
    /// Units of the runs before this one, counted from an arbitrary origin (wrapping): only
    /// differences between runs of one log mean anything.
    before: u64,
}

impl Run {
    /// One past the last score.
    fn end(&self) -> i64 {
        self.start.saturating_add(signed(self.len))
    }
}

/// The admitted units, oldest first, as runs of consecutive scores.
///
/// Two logs are equal when they hold the same scores (however their runs were counted).
#[derive(Debug, Clone, Default)]
pub struct Log {
    /// Ascending and disjoint.
    runs: VecDeque<Run>,
}

impl PartialEq for Log {
    fn eq(&self, other: &Self) -> bool {
        self.runs().eq(other.runs())
    }
}

impl Eq for Log {}

fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn unsigned(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

impl Log {
    /// A log of these runs `(first score, number of consecutive scores)`, ascending and
    /// disjoint (empty runs are left out).
    pub fn from_runs(runs: impl IntoIterator<Item = (i64, u64)>) -> Self {
        let mut log = Self::default();
        for (start, len) in runs {
            if len > 0 {
                log.push(start, len);
            }
        }
        log
    }

    /// The runs `(first score, number of consecutive scores)`, oldest first.
    pub fn runs(&self) -> impl DoubleEndedIterator<Item = (i64, u64)> + ExactSizeIterator + '_ {
        self.runs.iter().map(|r| (r.start, r.len))
    }

    /// The units pushed before the first score, counted as [`Run::before`].
    fn origin(&self) -> u64 {
        self.runs.front().map_or(0, |r| r.before)
    }

    /// The units pushed before the newest score's end, counted as [`Run::before`].
    fn end_count(&self) -> u64 {
        self.runs.back().map_or(0, |r| r.before.wrapping_add(r.len))
    }

    /// The count (as [`Run::before`]) of the first score at or after `from`.
    fn position(&self, from: i64) -> u64 {
        // The runs wholly before `from` are a prefix.
        let i = self.runs.partition_point(|r| r.end() <= from);
        match self.runs.get(i) {
            Some(r) => r
                .before
                .wrapping_add(unsigned(from.saturating_sub(r.start))),
            None => self.end_count(),
        }
    }

    /// Units live at `now` (scores at or after `from`).
    fn live(&self, from: i64) -> u64 {
        self.end_count().wrapping_sub(self.position(from))
    }

    /// The newest score.
    fn newest(&self) -> Option<i64> {
        self.runs.back().map(|r| r.end() - 1)
    }

    /// The `k`-th live score (1-based), oldest first.
    fn nth_live(&self, from: i64, k: u64) -> Option<i64> {
        if k == 0 || k > self.live(from) {
            return None;
        }
        // Counts relative to the first run's, which increase along the log.
        let origin = self.origin();
        let target = self.position(from).wrapping_add(k - 1).wrapping_sub(origin);
        let i = self
            .runs
            .partition_point(|r| r.before.wrapping_add(r.len).wrapping_sub(origin) <= target);
        let r = self.runs.get(i)?;
        Some(
            r.start
                .saturating_add(signed(target.wrapping_sub(r.before.wrapping_sub(origin)))),
        )
    }

    /// Drops every score before `from`.
    fn trim(&mut self, from: i64) {
        while let Some(r) = self.runs.front_mut() {
            let end = r.end();
            if end <= from {
                self.runs.pop_front();
            } else {
                if r.start < from {
                    let gone = unsigned(from - r.start);
                    *r = Run {
                        start: from,
                        len: unsigned(end - from),
                        before: r.before.wrapping_add(gone),
                    };
                }
                break;
            }
        }
    }

    /// Adds `len` scores from `first` (after every score held).
    fn push(&mut self, first: i64, len: u64) {
        if let Some(last) = self.runs.back_mut()
            && last.end() == first
        {
            last.len = last.len.saturating_add(len);
            return;
        }
        let before = self.end_count();
        self.runs.push_back(Run {
            start: first,
            len,
            before,
        });
    }

    /// Removes the scores `lo ..= hi`.
    fn remove(&mut self, lo: i64, hi: i64) {
        let mut kept = Vec::with_capacity(self.runs.len() + 1);
        for r in &self.runs {
            let (start, len) = (r.start, r.len);
            let end = r.end() - 1;
            if end < lo || start > hi {
                kept.push((start, len));
                continue;
            }
            if start < lo {
                kept.push((start, unsigned(lo - start)));
            }
            if end > hi {
                kept.push((hi + 1, unsigned(end - hi)));
            }
        }
        *self = Self::from_runs(kept);
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
    match log.newest() {
        // A log ending in the future is live (its newest score is), hence `n > 0`.
        Some(newest)
            if newest > signed(now).saturating_add(signed(p.limit))
                && log.live(live_from(p, now)) > 0 =>
        {
            let skew = newest - signed(now);
            for run in &mut log.runs {
                run.start -= skew;
            }
            true
        }
        _ => false,
    }
}

/// The evaluation of one call on `log` (`None`: empty) and the first score it takes when
/// admitted.
fn judge(log: Option<&Log>, p: &Params, now: u64) -> (Evaluation, i64) {
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
    }
    (e, first)
}

/// Evaluates one call; the log it leaves when admitted.
pub fn evaluate(log: Option<&Log>, p: &Params, now: u64) -> (Evaluation, Option<Log>) {
    let (e, first) = judge(log, p, now);
    if !e.admitted {
        return (e, None);
    }
    let mut next = log.cloned().unwrap_or_default();
    next.trim(live_from(p, now));
    next.push(first, p.cost);
    (e, Some(next))
}

/// [`evaluate`] on a log held in place (`live`: whether it is, else it reads as no log): an
/// admission updates it to the log [`evaluate`] leaves, without copying it; a rejection leaves
/// it as it was.
pub fn evaluate_in_place(log: &mut Log, live: bool, p: &Params, now: u64) -> Evaluation {
    let (e, first) = judge(live.then_some(&*log), p, now);
    if e.admitted {
        if live {
            log.trim(live_from(p, now));
        } else {
            log.runs.clear();
        }
        log.push(first, p.cost);
    }
    e
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
        assert!(l.runs().eq([(10_000_000, 3)]));
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
        let mut l = Log::from_runs([(70_000_000, 2)]);
        assert!(normalize(&mut l, &p, 10_000_000));
        assert!(l.runs().eq([(9_999_999, 2)]));
        assert!(!normalize(&mut l, &p, 10_000_000));
    }

    #[test]
    fn a_refund_removes_only_the_calls_own_scores() {
        let p = p(5, 1_000_000, 2);
        let l = Log::from_runs([(100, 5)]);
        let r = Receipt {
            at_us: 0,
            reset_us: 0,
            first: 101,
            cost: p.cost,
        };
        assert!(refund(l.clone(), &r, &p).runs().eq([(100, 1), (103, 2)]));
        let twice = refund(refund(l, &r, &p), &r, &p);
        assert!(twice.runs().eq([(100, 1), (103, 2)]), "idempotent");
    }
}
