//! Fixed window (`scripts/fixed.lua`): at most `num` units per window; the window starts at the
//! first admitted call and lasts `period`.
//!
//! The state is what Redis holds: a counter and the millisecond its key expires at (`SET key
//! cost PXAT ⌊t / 1000⌋ + p` from the script's clock `t` — not `PX p`, which Redis 7.0 counts
//! from its live clock, later than `t` when the server pauses mid-script — then `INCRBY`, which
//! keeps the expiry). Redis counts expiry in whole milliseconds: a key set at `t` µs expires
//! at ms `⌊t / 1000⌋ + p`, exists while
//! the clock's millisecond is at most that (`PTTL` 0 included: a script sees a frozen clock, so
//! the key cannot vanish between its reads and its `INCRBY`), and `PTTL` answers the
//! difference. A window is live while its key exists and is gone from the next millisecond on,
//! which is what `reset_after` and `retry_after` report: a window lasts at least `period`, and a
//! wait is never early.

use super::{Evaluation, Params, Receipt};

/// A window: units taken, and the millisecond its key expires at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Units taken in this window.
    pub count: u64,
    /// Redis's expiry of the key: the last millisecond it exists.
    pub expires_ms: u64,
}

impl Window {
    /// The key's `PTTL` at `now` µs (0 in its last millisecond).
    fn pttl(&self, now: u64) -> u64 {
        self.expires_ms.saturating_sub(now / 1000)
    }

    /// Whether the key still exists at `now` µs: through its expiry millisecond.
    fn exists(&self, now: u64) -> bool {
        now / 1000 <= self.expires_ms
    }

    /// When the window is no longer live, µs: the millisecond after its expiry.
    pub(crate) fn idle_at(&self) -> u64 {
        self.expires_ms.saturating_add(1).saturating_mul(1000)
    }
}

fn period_ms(p: &Params) -> u64 {
    p.period_us.div_ceil(1000)
}

/// A window with more than a period left was stamped by a clock ahead of this one: it is cut
/// to one period from now (the script's `PEXPIRE`).
pub(crate) fn normalize(w: &mut Window, p: &Params, now: u64) -> bool {
    let pttl = w.pttl(now);
    if pttl > period_ms(p) {
        w.expires_ms = (now / 1000).saturating_add(period_ms(p));
        true
    } else {
        false
    }
}

/// Evaluates one call; the window it leaves when admitted.
pub fn evaluate(w: Option<&Window>, p: &Params, now: u64) -> (Evaluation, Option<Window>) {
    // (count, µs until the window is gone) of a live window.
    let live = w.and_then(|w| {
        let pttl = w.pttl(now);
        w.exists(now).then(|| {
            let pttl = pttl.min(period_ms(p));
            let left = (pttl * 1000 + 1000 - now % 1000).min(p.period_us + 1000);
            (*w, left)
        })
    });
    let count = live.map_or(0, |(w, _)| w.count);
    let left = live.map_or(0, |(_, left)| left);
    let admitted = count.saturating_add(p.cost) <= p.limit;
    let e = Evaluation {
        admitted,
        now_remaining: p.limit.saturating_sub(count),
        now_reset_us: left,
        after_remaining: p.limit.saturating_sub(count).saturating_sub(p.cost),
        // A new window's key lives through ms ⌊now / 1000⌋ + period: gone the one after.
        after_reset_us: if live.is_some() {
            left
        } else {
            p.period_us + 1000 - now % 1000
        },
        retry_us: if admitted { 0 } else { left },
    };
    let next = admitted.then(|| match live {
        Some((w, _)) => Window {
            count: w.count.saturating_add(p.cost),
            expires_ms: w.expires_ms,
        },
        None => Window {
            count: p.cost,
            expires_ms: (now / 1000).saturating_add(period_ms(p)),
        },
    });
    (e, next)
}

/// A wait (`reset_after` or `retry_after`, µs) of a call of fixed-window limits only as the
/// Redis stores answer it (`scripts/fixed_only.lua`, which reads no clock without a call id): counted
/// from the start of `now`'s millisecond, so whole milliseconds, never earlier than the rule's
/// and less than 1 ms later. No wait (0) stays none.
///
/// ```
/// use ratelimit_runtime::algorithm::fixed::whole_ms;
/// assert_eq!(whole_ms(999_750, 5_000_250), 1_000_000);
/// assert_eq!(whole_ms(0, 5_000_250), 0);
/// ```
pub fn whole_ms(wait_us: u64, now: u64) -> u64 {
    if wait_us == 0 {
        0
    } else {
        wait_us.saturating_add(now % 1000)
    }
}

/// A fixed window's receipt as a take's reply carries it (the Redis store's `take_briefly`,
/// whose receipts are not written to keys): the start of the take's millisecond, and the whole
/// milliseconds from there to the window's end ([`whole_ms`]).
///
/// It ends where the receipt `r` ends (`at + reset`), so [`refund`] gives back by it what it
/// gives back by `r`; the script reads it off the window's stored end (`PEXPIRETIME`, less the
/// key's `PTTL`) without reading the server's clock. Only the companion script reads its time:
/// its guard against a clock behind the take's and the receipt's life (10 s at most), for
/// which it is up to 999 µs earlier than `r`'s (later by as much as a server paused
/// mid-script, whose `PTTL` counts from its live clock).
///
/// ```
/// use ratelimit_runtime::algorithm::{Receipt, fixed::receipt_in_reply};
/// let taken = Receipt { at_us: 5_000_250, reset_us: 999_750, first: 0, cost: 1 };
/// let replied = receipt_in_reply(&taken);
/// assert_eq!((replied.at_us, replied.reset_us), (5_000_000, 1_000_000));
/// assert_eq!(replied.at_us + replied.reset_us, taken.at_us + taken.reset_us);
/// ```
#[must_use]
pub fn receipt_in_reply(r: &Receipt) -> Receipt {
    if r.reset_us == 0 {
        return *r;
    }
    let gone = r.at_us % 1000;
    Receipt {
        at_us: r.at_us - gone,
        reset_us: whole_ms(r.reset_us, r.at_us),
        ..*r
    }
}

/// Gives back `cost` while the call's window is still the key's: more than 2 ms before that
/// window's end (`at + reset`), and the key's window ends no later than 2 ms after it (a newer
/// window ends later). A window left empty is deleted (`None`).
pub fn refund(w: Window, r: &Receipt, p: &Params, now: u64) -> Option<Window> {
    let window_end = r.at_us.saturating_add(r.reset_us);
    let pttl = w.pttl(now);
    if now.saturating_add(2000) >= window_end || !w.exists(now) {
        return Some(w);
    }
    let key_end = now + pttl * 1000 + 1000 - now % 1000;
    if key_end > window_end.saturating_add(2000) {
        return Some(w);
    }
    if w.count <= p.cost {
        None
    } else {
        Some(Window {
            count: w.count - p.cost,
            expires_ms: w.expires_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(limit: u64, period_ms: u64, cost: u64) -> Params {
        Params::new(limit, period_ms * 1000, limit, cost)
    }

    #[test]
    fn a_window_opens_at_the_first_call_and_ends_a_period_later() {
        let p = p(2, 1000, 1);
        let now = 5_000_250;
        let (e, w) = evaluate(None, &p, now);
        assert!(e.admitted);
        assert_eq!((e.after_remaining, e.after_reset_us), (1, 1_000_750));
        let w = w.unwrap();
        assert_eq!(w.expires_ms, 6_000);
        let (e, w) = evaluate(Some(&w), &p, now);
        let w = w.unwrap();
        assert_eq!((w.count, e.after_remaining), (2, 0));
        // Full: rejected until the key is gone, at the millisecond after its expiry; the
        // window lasts at least a period, and the wait is exact.
        let (e, none) = evaluate(Some(&w), &p, now + 10);
        assert!(!e.admitted && none.is_none());
        assert_eq!(e.retry_us, 6_001_000 - (now + 10));
        assert!(!evaluate(Some(&w), &p, 6_000_999).0.admitted);
        let (e, w2) = evaluate(Some(&w), &p, 6_001_000);
        assert!(e.admitted, "{e:?}");
        assert_eq!(w2.unwrap().count, 1);
    }

    #[test]
    fn a_window_from_a_clock_ahead_is_cut_to_one_period() {
        let p = p(1, 1000, 1);
        let mut w = Window {
            count: 1,
            expires_ms: 70_000,
        };
        assert!(normalize(&mut w, &p, 5_000_000));
        assert_eq!(w.expires_ms, 6_000);
        assert!(!normalize(&mut w, &p, 5_000_000));
    }

    #[test]
    fn a_refund_gives_back_only_inside_the_calls_window() {
        let p = p(3, 1000, 1);
        let w = Window {
            count: 2,
            expires_ms: 6_000,
        };
        let r = Receipt {
            at_us: 5_000_000,
            reset_us: 1_001_000,
            first: 0,
            cost: p.cost,
        };
        assert_eq!(refund(w, &r, &p, 5_000_100).map(|w| w.count), Some(1));
        // Too close to the end: nothing.
        assert_eq!(refund(w, &r, &p, 5_999_500), Some(w));
        // A newer window (ends later than the receipt's): nothing.
        let newer = Window {
            count: 2,
            expires_ms: 7_000,
        };
        assert_eq!(refund(newer, &r, &p, 5_000_100), Some(newer));
        let one = Window {
            count: 1,
            expires_ms: 6_000,
        };
        assert_eq!(refund(one, &r, &p, 5_000_100), None);
    }
}
