//! Concurrency (`scripts/concurrency.lua`): at most `num` calls in flight per key. Each
//! admitted call holds a slot, a *lease* that ends `period` after it was taken; the call
//! releases it when it ends (completion, error, panic, a dropped future), and a lease whose
//! end has passed counts no more, so a slot that no one releases (a killed process, a
//! runtime gone) comes back within `period`.
//!
//! The state is what Redis holds: a sorted set of the holders' call ids, each scored by the
//! end of its lease in µs. A check first drops the leases that ended (score ≤ now), counts
//! the others, and adds the call when one more fits; a release removes the call's id. A
//! holder without a call id (a check of [`crate::Store::check`] rather than a take) is
//! anonymous: it holds its slot until its lease ends.
//!
//! The numbers: `remaining` is the free slots; `reset_after` the time until the last lease
//! ends (every slot free even if nothing is released); a refused call's `retry_after` the time
//! until the earliest lease ends, at most [`RETRY_US`] (slots are usually released long before
//! their lease ends, so a waiting caller tries again soon). A call holds one slot (`cost` is
//! always 1: the policy rules refuse another).

use super::{Evaluation, Params};

/// The longest `retry_after` of a refused call, µs (20 ms): a slot comes back when a holder
/// ends, which no clock predicts; the lease's end is only the latest it can come.
pub const RETRY_US: u64 = 20_000;

/// One holder: the end of its lease (µs) and its call id (empty: anonymous).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// When the lease ends, µs: the slot is held while `now < end`.
    pub end: u64,
    /// The call that holds it (the Redis member), empty when anonymous.
    pub holder: Box<str>,
}

/// The holders of one key, by the end of their lease (ascending; ties in arrival order).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Holders {
    /// The leases, earliest end first.
    pub leases: Vec<Lease>,
}

impl Holders {
    /// When the key is idle (no lease left): the last lease's end.
    pub(crate) fn idle_at(&self) -> u64 {
        self.leases.iter().map(|l| l.end).max().unwrap_or(0)
    }

    /// The leases still held at `now`.
    fn live(&self, now: u64) -> impl Iterator<Item = &Lease> {
        self.leases.iter().filter(move |l| l.end > now)
    }

    /// Removes the lease of `holder` (a release); `true` when it held one. An anonymous
    /// holder is never released.
    pub fn release(&mut self, holder: &str) -> bool {
        if holder.is_empty() {
            return false;
        }
        let before = self.leases.len();
        self.leases.retain(|l| &*l.holder != holder);
        self.leases.len() != before
    }
}

/// Leases that end more than a period from now were stamped by a clock ahead of this one:
/// they end a period from now (the script's `ZADD XX`).
pub(crate) fn normalize(h: &mut Holders, p: &Params, now: u64) -> bool {
    let latest = now.saturating_add(p.period_us);
    let mut changed = false;
    for lease in &mut h.leases {
        if lease.end > latest {
            lease.end = latest;
            changed = true;
        }
    }
    changed
}

/// Evaluates one call of `holder` (empty: anonymous); the holders it leaves when admitted
/// (expired leases dropped, the call's lease added; a holder that already holds a lease
/// renews it).
pub fn evaluate(
    h: Option<&Holders>,
    p: &Params,
    now: u64,
    holder: &str,
) -> (Evaluation, Option<Holders>) {
    let mut live: Vec<Lease> = h
        .map(|h| h.live(now).cloned().collect())
        .unwrap_or_default();
    if !holder.is_empty() {
        // The same call taken again (a retried script): its lease counts once.
        live.retain(|l| &*l.holder != holder);
    }
    let count = u64::try_from(live.len()).unwrap_or(u64::MAX);
    let first = live.iter().map(|l| l.end).min();
    let last = live.iter().map(|l| l.end).max();
    let admitted = count < p.limit;
    let e = Evaluation {
        admitted,
        now_remaining: p.limit.saturating_sub(count),
        now_reset_us: last.map_or(0, |end| end - now),
        after_remaining: p.limit.saturating_sub(count).saturating_sub(1),
        after_reset_us: p.period_us,
        retry_us: if admitted {
            0
        } else {
            first.map_or(0, |end| (end - now).min(RETRY_US))
        },
    };
    let next = admitted.then(|| {
        live.push(Lease {
            end: now.saturating_add(p.period_us),
            holder: holder.into(),
        });
        Holders { leases: live }
    });
    (e, next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(limit: u64, lease_ms: u64) -> Params {
        Params::new(limit, lease_ms * 1000, limit, 1)
    }

    #[test]
    fn at_most_num_holders_and_a_release_frees_a_slot() {
        let p = p(2, 1000);
        let (e, h) = evaluate(None, &p, 10, "a");
        assert!(e.admitted);
        assert_eq!((e.after_remaining, e.after_reset_us), (1, 1_000_000));
        let (e, h) = evaluate(h.as_ref(), &p, 20, "b");
        assert_eq!(e.after_remaining, 0);
        let mut h = h.unwrap();
        let (e, none) = evaluate(Some(&h), &p, 30, "c");
        assert!(!e.admitted && none.is_none());
        // The earliest lease ends at 1_000_010, but a refusal waits at most RETRY_US.
        assert_eq!(e.retry_us, RETRY_US);
        assert_eq!(e.now_reset_us, 1_000_020 - 30);
        assert!(h.release("a"));
        assert!(!h.release("a"), "once");
        assert!(evaluate(Some(&h), &p, 40, "c").0.admitted);
    }

    #[test]
    fn an_unreleased_lease_ends_a_period_after_its_take() {
        let p = p(1, 1000);
        let (_, h) = evaluate(None, &p, 0, "");
        let h = h.unwrap();
        let (e, _) = evaluate(Some(&h), &p, 999_990, "b");
        assert!(!e.admitted);
        assert_eq!(e.retry_us, 10);
        assert!(evaluate(Some(&h), &p, 1_000_000, "b").0.admitted);
        // Anonymous holders are never released by name.
        let mut h = h;
        assert!(!h.release(""));
    }

    #[test]
    fn a_lease_from_a_clock_ahead_ends_a_period_from_now() {
        let p = p(3, 1000);
        let mut h = Holders {
            leases: vec![Lease {
                end: 90_000_000,
                holder: "a".into(),
            }],
        };
        assert!(normalize(&mut h, &p, 5_000_000));
        assert_eq!(h.leases[0].end, 6_000_000);
        assert!(!normalize(&mut h, &p, 5_000_000));
    }

    #[test]
    fn a_call_taken_twice_holds_one_slot() {
        let p = p(2, 1000);
        let (_, h) = evaluate(None, &p, 0, "a");
        let (e, h) = evaluate(h.as_ref(), &p, 5, "a");
        assert_eq!(e.after_remaining, 1);
        assert_eq!(h.unwrap().leases.len(), 1);
    }
}
