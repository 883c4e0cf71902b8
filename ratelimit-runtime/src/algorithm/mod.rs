//! The rules of the algorithms, as pure functions: state, parameters and the time in, decision
//! and new state out. No store, map or lock in sight.
//!
//! Each rule lives in one Rust file here and in one Lua file under `src/scripts/` (what the
//! Redis stores run), written the same way: the same state, the same integer units, the same
//! formulas, line for line. The memory store hosts these functions; the conformance test
//! (`tests/tests/it/conformance.rs`) runs seeded traces through both and compares every decision.
//!
//! * [`fixed`] — a counter whose window starts at the first admitted call and lasts a period;
//! * [`sliding`] — a log of admission times, one per unit, in microseconds;
//! * [`bucket`] — the token and the leaky bucket, which are one rule: a level that drains at
//!   `num / period` and that a call raises by `cost` when it fits under `burst` (the token
//!   bucket's level is the tokens missing from a full bucket);
//! * [`gcra`] — the token bucket as one integer, the theoretical arrival time;
//! * [`sliding_counter`] — two fixed windows' counts, the previous one weighted by its share of
//!   the trailing interval: O(1) state, approximate within a documented bound;
//! * [`concurrency`] — not a rate: the calls in flight, one lease each, released when the
//!   call ends or when its lease does.
//!
//! Time is whole microseconds on the store's own clock. Every function is total: no input
//! panics, arithmetic saturates (the policy bounds keep every real value far from the limits).

pub mod bucket;
pub mod concurrency;
pub mod fixed;
pub mod gcra;
pub mod sliding;
pub mod sliding_counter;

use crate::decision::Decision;
use std::fmt;
use std::time::Duration;

/// The six rate-limiting algorithms (`burst` is the capacity of the buckets, `leaky` and
/// `token`, and of `gcra`; the windows' capacity is `num`), and the concurrency limit.
///
/// ```
/// use ratelimit_runtime::Algorithm;
/// assert_eq!("sliding".parse::<Algorithm>(), Ok(Algorithm::Sliding));
/// assert_eq!(Algorithm::Token.as_str(), "token");
/// assert_eq!("concurrency".parse::<Algorithm>(), Ok(Algorithm::Concurrency));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// At most `num` admissions per window; the window starts at the first admitted call and
    /// lasts `period`. One counter with a TTL.
    Fixed,
    /// At most `num` admissions in any trailing interval of length `period` (no boundary burst).
    Sliding,
    /// A bucket of capacity `burst` that drains continuously at `num / period`; a call adds
    /// `cost` if it fits.
    Leaky,
    /// A bucket of capacity `burst`, full at start, refilled continuously at `num / period`; a
    /// call takes `cost` tokens if there are enough.
    Token,
    /// The generic cell rate algorithm: the token bucket (capacity `burst`, one unit per
    /// `period / num`) kept as one integer, the theoretical arrival time.
    Gcra,
    /// The current and previous fixed windows' counts, the previous weighted by its share of
    /// the trailing interval: O(1) state, approximate (see [`sliding_counter`]).
    SlidingCounter,
    /// Not a rate: at most `num` calls **in flight** per key. A call holds a slot from before
    /// its body until it ends in any way (it returns, fails, panics or its future is dropped);
    /// `period` is the slot's lease, the longest it is held when no one releases it (a killed
    /// process). See [`concurrency`] for its numbers; a call always holds one slot (`cost` is
    /// refused). Not in [`Algorithm::ALL`], the rate-limiting algorithms.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{Algorithm, Policy, PolicyError};
    ///
    /// // At most 5 calls at once; a slot nobody releases comes back after 30 seconds.
    /// let p = Policy::new(Algorithm::Concurrency, 5, Duration::from_secs(30))?;
    /// assert_eq!(p.capacity(), 5);
    /// assert_eq!(p.with_cost(2), Err(PolicyError::SlotCost));
    /// # Ok::<(), PolicyError>(())
    /// ```
    Concurrency,
}

impl Algorithm {
    /// Every rate-limiting algorithm, in the order of their wire codes ([`Algorithm::Concurrency`],
    /// code 7, is a limit of another kind and is not listed).
    pub const ALL: [Algorithm; 6] = [
        Self::Fixed,
        Self::Sliding,
        Self::Leaky,
        Self::Token,
        Self::Gcra,
        Self::SlidingCounter,
    ];

    /// Every algorithm by its wire code (`BY_CODE[code - 1]`): [`Algorithm::ALL`], then
    /// [`Algorithm::Concurrency`].
    #[doc(hidden)]
    pub const BY_CODE: [Algorithm; 7] = [
        Self::Fixed,
        Self::Sliding,
        Self::Leaky,
        Self::Token,
        Self::Gcra,
        Self::SlidingCounter,
        Self::Concurrency,
    ];

    /// The name used in the attribute (`algo = "…"`) and in store keys.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Fixed => "fixed",
            Self::Sliding => "sliding",
            Self::Leaky => "leaky",
            Self::Token => "token",
            Self::Gcra => "gcra",
            Self::SlidingCounter => "sliding_counter",
            Self::Concurrency => "concurrency",
        }
    }

    /// The number the Lua scripts know this algorithm by.
    pub(crate) const fn code(self) -> u8 {
        match self {
            Self::Fixed => 1,
            Self::Sliding => 2,
            Self::Leaky => 3,
            Self::Token => 4,
            Self::Gcra => 5,
            Self::SlidingCounter => 6,
            Self::Concurrency => 7,
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A limit's parameters in the rules' units (the same numbers the Redis scripts receive), and
/// what the rules derive from them once per policy instead of once per check (the bucket's
/// scale, GCRA's emission interval).
///
/// Build it with [`Params::new`] or [`Params::of`], which compute the derived numbers; the four
/// public fields are to be read, not changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Params {
    /// Units per period (`num`).
    pub limit: u64,
    /// The period in microseconds.
    pub period_us: u64,
    /// The bucket capacity (`burst`).
    pub burst: u64,
    /// Units one call takes.
    pub cost: u64,
    /// The bucket's drain: units of its level per µs (`num / g`, `g = gcd(num, period_µs)`).
    pub(crate) rate: u64,
    /// The bucket's units of one call (`period_µs / g`).
    pub(crate) unit: u64,
    /// GCRA's emission interval `T`, µs.
    pub(crate) interval: u64,
    /// The sliding counter's window in whole milliseconds (at least 1), the unit it weighs
    /// the previous window in.
    pub(crate) window_ms: u64,
    /// The most a bucket may hold (two capacities: a full bucket and a settled debt), in its
    /// units (`u64::MAX` where it does not fit): a level at most that, written at or before
    /// now, needs no [`bucket::normalize`].
    pub(crate) bucket_most: u64,
}

impl Params {
    /// Parameters from their parts (`period_us` in microseconds), unchecked: the rules' own
    /// tests and the conformance test build them directly; stores use [`Params::of`].
    pub const fn new(limit: u64, period_us: u64, burst: u64, cost: u64) -> Self {
        let g = gcd(limit, period_us);
        let g = if g == 0 { 1 } else { g };
        Self {
            limit,
            period_us,
            burst,
            cost,
            rate: limit / g,
            unit: period_us / g,
            interval: gcra::interval_of(limit, period_us),
            window_ms: sliding_counter::window_ms(period_us),
            bucket_most: bucket::most_units(burst, period_us / g),
        }
    }
}

/// What evaluating one limit against its state finds (the scripts' `d`).
///
/// `now_*` describe the state as it is, `after_*` the state once the call is taken (meaningful
/// when admitted). Counts saturate at 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Evaluation {
    /// Whether the call fits.
    pub admitted: bool,
    /// Units left now.
    pub now_remaining: u64,
    /// Microseconds until the quota is whole again, now.
    pub now_reset_us: u64,
    /// Units left once the call is taken.
    pub after_remaining: u64,
    /// Microseconds until the quota is whole again once the call is taken.
    pub after_reset_us: u64,
    /// When rejected: microseconds until the same call would be admitted.
    pub retry_us: u64,
}

impl Evaluation {
    /// The decision of a call that was taken (every limit admitted it).
    pub fn taken(&self, capacity: u64) -> Decision {
        Decision::new(
            true,
            capacity,
            self.after_remaining.min(capacity),
            Duration::from_micros(self.after_reset_us),
            Duration::ZERO,
        )
    }

    /// The decision of a call that was not taken: the state as it is, with `admitted` and
    /// `retry_us` of this limit's own evaluation in the call.
    pub fn untaken(&self, capacity: u64, admitted: bool, retry_us: u64) -> Decision {
        Decision::new(
            admitted,
            capacity,
            self.now_remaining.min(capacity),
            Duration::from_micros(self.now_reset_us),
            Duration::from_micros(retry_us),
        )
    }
}

/// The state of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// A fixed window.
    Fixed(fixed::Window),
    /// A sliding log.
    Sliding(sliding::Log),
    /// A token or leaky bucket.
    Bucket(bucket::Level),
    /// GCRA's theoretical arrival time.
    Gcra(gcra::Tat),
    /// A sliding-window counter.
    SlidingCounter(sliding_counter::Counters),
    /// The holders of a concurrency limit.
    Concurrency(concurrency::Holders),
}

/// What a take leaves beside its key, for its refund or settle (the scripts' receipt): what
/// the call took, so that nothing gives back more, whatever check the caller hands in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Receipt {
    /// The store's time at the take, µs.
    pub at_us: u64,
    /// The limit's `reset_after` after the take, µs.
    pub reset_us: u64,
    /// The sliding log's first score of the call (0 for the other algorithms).
    pub first: u64,
    /// The units the call took of the limit (its cost at the take): the most a refund gives
    /// back, and the estimate a settle starts from.
    pub cost: u64,
}

/// Evaluates one limit: the evaluation, and the state the call leaves when admitted.
///
/// A state of another algorithm than `algorithm` reads as no state.
pub fn evaluate(
    algorithm: Algorithm,
    state: Option<&State>,
    p: &Params,
    now: u64,
) -> (Evaluation, Option<State>) {
    evaluate_for(algorithm, state, p, now, "")
}

/// [`evaluate`] for the call `holder` (its call id; empty: none): the holder a concurrency
/// limit's lease names, so that the call's release finds it. The other algorithms ignore it.
pub fn evaluate_for(
    algorithm: Algorithm,
    state: Option<&State>,
    p: &Params,
    now: u64,
    holder: &str,
) -> (Evaluation, Option<State>) {
    match algorithm {
        Algorithm::Fixed => {
            let w = match state {
                Some(State::Fixed(w)) => Some(w),
                _ => None,
            };
            let (e, next) = fixed::evaluate(w, p, now);
            (e, next.map(State::Fixed))
        }
        Algorithm::Sliding => {
            let log = match state {
                Some(State::Sliding(l)) => Some(l),
                _ => None,
            };
            let (e, next) = sliding::evaluate(log, p, now);
            (e, next.map(State::Sliding))
        }
        Algorithm::Leaky | Algorithm::Token => {
            let level = match state {
                Some(State::Bucket(b)) => Some(b),
                _ => None,
            };
            let (e, next) = bucket::evaluate(level, p, now);
            (e, next.map(State::Bucket))
        }
        Algorithm::Gcra => {
            let tat = match state {
                Some(State::Gcra(t)) => Some(t),
                _ => None,
            };
            let (e, next) = gcra::evaluate(tat, p, now);
            (e, next.map(State::Gcra))
        }
        Algorithm::SlidingCounter => {
            let counters = match state {
                Some(State::SlidingCounter(c)) => Some(c),
                _ => None,
            };
            let (e, next) = sliding_counter::evaluate(counters, p, now);
            (e, next.map(State::SlidingCounter))
        }
        Algorithm::Concurrency => {
            let holders = match state {
                Some(State::Concurrency(h)) => Some(h),
                _ => None,
            };
            let (e, next) = concurrency::evaluate(holders, p, now, holder);
            (e, next.map(State::Concurrency))
        }
    }
}

/// [`evaluate`] on a state held in place, for the states whose admission changes a part of
/// them (the sliding log: expired runs off the front, one run onto the back) rather than
/// rewrites them: `Some` when `state` is of such an `algorithm`, with the evaluation; an
/// admission has updated `state` to what [`evaluate`] leaves, a rejection left it as it was.
/// `live`: whether `state` is live (else it reads as no state). `None`: use [`evaluate`].
pub fn evaluate_in_place(
    algorithm: Algorithm,
    state: &mut State,
    live: bool,
    p: &Params,
    now: u64,
) -> Option<Evaluation> {
    match (algorithm, state) {
        (Algorithm::Sliding, State::Sliding(log)) => {
            Some(sliding::evaluate_in_place(log, live, p, now))
        }
        _ => None,
    }
}

/// State stamped in the future (a clock that went back, a failover to a replica whose clock is
/// behind) rewritten as stamped now; `true` when it changed. For the windows and the log the
/// skew is not counted, so no caller is locked out beyond the true `retry_after`; GCRA and the
/// buckets keep one integer with no stamp, so a backlog past the most it can be (a full burst;
/// a full bucket plus one capacity of debt) is brought back to that most: a skew costs a
/// caller at most that much waiting, never an admission.
pub fn normalize(state: &mut State, p: &Params, now: u64) -> bool {
    match state {
        State::Fixed(w) => fixed::normalize(w, p, now),
        State::Sliding(l) => sliding::normalize(l, p, now),
        State::Bucket(b) => bucket::normalize(b, p, now),
        State::Gcra(t) => gcra::normalize(t, p, now),
        State::SlidingCounter(c) => sliding_counter::normalize(c, p, now),
        State::Concurrency(h) => concurrency::normalize(h, p, now),
    }
}

/// Gives back `p.cost` units of what a call whose take left `receipt` still holds, never more
/// than the receipt says it took (`receipt.cost`): the new state (`None`: the key is deleted),
/// or the state unchanged. A concurrency limit gives back by its holder's name
/// ([`concurrency::Holders::release`]), not by receipt: unchanged here.
pub fn refund(state: Option<State>, receipt: &Receipt, p: &Params, now: u64) -> Option<State> {
    let units = p.cost.min(receipt.cost);
    if receipt.at_us > now || units == 0 {
        return state;
    }
    let p = &Params { cost: units, ..*p };
    match state {
        Some(State::Fixed(w)) => fixed::refund(w, receipt, p, now).map(State::Fixed),
        Some(State::Sliding(l)) => Some(State::Sliding(sliding::refund(l, receipt, p))),
        Some(State::Bucket(b)) => bucket::refund(b, receipt, p, now).map(State::Bucket),
        Some(State::Gcra(t)) => gcra::refund(t, receipt, p, now).map(State::Gcra),
        Some(State::SlidingCounter(c)) => {
            sliding_counter::refund(c, receipt, p).map(State::SlidingCounter)
        }
        Some(State::Concurrency(h)) => Some(State::Concurrency(h)),
        None => None,
    }
}

/// The capacity a charge runs under (2^52, the most the scripts' doubles hold exactly): far
/// above any real one, so the rule of [`evaluate`] admits the charge.
pub const WAIVED_CAPACITY: u64 = 1 << 52;

/// The units a settle charges for `used` units reported used: at most [`WAIVED_CAPACITY`],
/// the most the scripts take, which is more than any capacity (the excess charged is one
/// capacity either way). The one conversion of every settle entry point, so that a huge value
/// (`u64::MAX`, 2^53) is "the whole quota and more" on every store, never a number a script
/// refuses (which would leave the call counted at its estimate).
///
/// ```
/// use ratelimit_runtime::algorithm::{WAIVED_CAPACITY, settled_units};
/// assert_eq!(settled_units(250), 250);
/// assert_eq!(settled_units(u64::MAX), WAIVED_CAPACITY);
/// ```
pub const fn settled_units(used: u64) -> u64 {
    if used > WAIVED_CAPACITY {
        WAIVED_CAPACITY
    } else {
        used
    }
}

/// Settles one limit of a call to the `actual` units it used (`settle = …`): the new state
/// (`None`: no state, the key is deleted), the state unchanged when there is nothing to
/// settle. The estimate is what the call's `receipt` says it took ([`Receipt::cost`]), or
/// `p.cost` (the caller's word) once the receipt is gone.
///
/// * **Less than the estimate**: the difference is given back by the call's `receipt`, by the
///   algorithm's own [`refund`] rule for that many units (so never more than the call still
///   holds, and nothing without a receipt: a late settle fails closed).
/// * **More**: the excess, up to one full capacity (`num` for the windows, `burst` for the
///   buckets), is charged whatever the state holds: the rule of [`evaluate`] with the capacity
///   waived ([`WAIVED_CAPACITY`]), after the state is normalized as a check normalizes it. The
///   cap keeps a value the caller influences from locking a shared limit for good: a call that
///   used more than a whole capacity is charged the capacity. The state may then hold more
///   than the capacity, a debt the next calls see
///   as a rejection until it is worked off: a fixed window until its end, a sliding log until
///   the charged entries leave the trailing interval, a sliding counter as its weighted
///   windows decay, the buckets (token, leaky) until their level drains below the capacity.
///   GCRA's state cannot tell a debt from a clock ahead of the store's, which it brings back to
///   a full backlog, so its debt is at most one full burst.
///
/// `state` is the live state (none when idle); `now` the store's time.
pub fn settle(
    algorithm: Algorithm,
    state: Option<State>,
    receipt: Option<&Receipt>,
    p: &Params,
    actual: u64,
    now: u64,
) -> Option<State> {
    use std::cmp::Ordering;
    if algorithm == Algorithm::Concurrency {
        return state; // a slot is held, not spent: nothing to settle
    }
    let actual = settled_units(actual);
    let estimate = receipt.map_or(p.cost, |r| r.cost);
    match actual.cmp(&estimate) {
        Ordering::Equal => state,
        Ordering::Less => match receipt {
            Some(r) => refund(
                state,
                r,
                &Params {
                    cost: estimate - actual,
                    ..*p
                },
                now,
            ),
            None => state,
        },
        Ordering::Greater => {
            let mut state = state;
            if let Some(s) = &mut state {
                normalize(s, p, now);
            }
            // At most one full capacity: a value the caller influences (a reply's token
            // count) can put its bucket one period in debt, never lock it for good.
            let waived = match algorithm {
                Algorithm::Fixed | Algorithm::Sliding | Algorithm::SlidingCounter => Params {
                    limit: WAIVED_CAPACITY,
                    cost: (actual - estimate).min(p.limit),
                    ..*p
                },
                Algorithm::Leaky | Algorithm::Token | Algorithm::Gcra | Algorithm::Concurrency => {
                    Params {
                        burst: WAIVED_CAPACITY,
                        cost: (actual - estimate).min(p.burst),
                        ..*p
                    }
                }
            };
            let (_, next) = evaluate(algorithm, state.as_ref(), &waived, now);
            next.or(state)
        }
    }
}

/// When `state` becomes idle (equal to no state at all), µs: a fixed window when it ends, a
/// sliding log one period after its newest entry, a bucket when its level is back to 0, GCRA at
/// its theoretical arrival time, a sliding counter when its current window stops weighing.
pub fn idle_at(state: &State, p: &Params) -> u64 {
    match state {
        State::Fixed(w) => w.idle_at(),
        State::Sliding(l) => l.idle_at(p),
        State::Bucket(b) => b.idle_at(p),
        State::Gcra(t) => t.idle_at(),
        State::SlidingCounter(c) => c.idle_at(p),
        State::Concurrency(h) => h.idle_at(),
    }
}

/// `a / b` rounded up (`b > 0`). In `u64` when both fit, as they do for every policy the bounds
/// allow: a `u128` division is a library call several times slower, on the memory store's hot
/// path.
pub(crate) fn ceil_div(a: u128, b: u128) -> u128 {
    match (u64::try_from(a), u64::try_from(b)) {
        (Ok(a), Ok(b)) => u128::from(a.div_ceil(b.max(1))),
        _ => a.div_ceil(b.max(1)),
    }
}

/// `a / b` rounded down (`b > 0`), in `u64` when both fit (see [`ceil_div`]).
pub(crate) fn floor_div(a: u128, b: u128) -> u128 {
    match (u64::try_from(a), u64::try_from(b)) {
        (Ok(a), Ok(b)) => u128::from(a / b.max(1)),
        _ => a / b.max(1),
    }
}

/// Greatest common divisor.
pub(crate) const fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// A `u128` as a `u64`, saturating.
pub(crate) fn sat(n: u128) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}
