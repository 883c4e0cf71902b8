//! Each algorithm against its definition, over thousands of generated traces.
//!
//! The properties are stated from what an algorithm promises (the rules in `Algorithm`'s docs),
//! never from the numbers the current code computes, so any correct implementation passes them.
//! They run through the public [`Store`] API of a [`MemoryStore`] on a [`ManualClock`], in whole
//! microseconds (the unit the Redis scripts count in).
//!
//! A trace is a random start, then steps: the clock moves (0 µs, a few µs, across a millisecond
//! boundary, about one refill, a period ± 1 µs, several periods), one call of a random cost is
//! made, and sometimes a probe follows it at once:
//!
//! * **retry** — a rejected call is tried again 1 µs before its `retry_after` (without taking
//!   anything) and then at `retry_after`;
//! * **drain** — unit calls at the same instant, as many as the decision's `remaining`, then one
//!   more;
//! * **reset** — no calls until 1 µs before `reset_after`, then until `reset_after`.
//!
//! To look at a limit without taking from it, a call is stacked with a "wall": a spent fixed
//! window of one call per 100 years. The wall rejects the call, so no limit takes anything
//! (the store's promise), and the limit's own decision says whether it alone would admit the
//! call, what is left and when the quota is whole.
//!
//! Definitions, with `P` the period in µs:
//!
//! * `fixed` — a window opens at the first admitted call after the previous one ended and holds
//!   at most `num` units. As on Redis, the window's key expires `period` after the millisecond
//!   it was set in and is gone the millisecond after that: a window opened at `t` µs ends at
//!   `(⌊t / 1000⌋ + period_ms + 1) · 1000` µs.
//! * `sliding` — at most `num` units in any trailing interval `(t − P, t]`.
//! * `token` — a bucket of `burst` tokens, full at start, refilled at `num / P` per µs: any
//!   interval `[a, b]` admits at most `burst + num · (b − a) / P` units, and a call is admitted
//!   exactly when its cost is there.
//! * `leaky` — a level that drains at `num / P` per µs, raised by each admitted call's cost:
//!   it never exceeds `burst`, and a call is admitted exactly when it fits.
//!
//! Levels are computed in exact integers (units of `1 / P` of a call), so "exactly" means
//! exactly.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use ratelimit_runtime::store::ManualClock;
use ratelimit_runtime::{Algorithm, Decision, MemoryStore, Policy, Store, Verdict, store::Check};

/// Microseconds in a millisecond.
const MS: u64 = 1000;

/// The wall's key (see the module docs).
const WALL: &str = "wall";

/// Traces per property (each algorithm has six properties: several thousand traces each).
const CASES: u32 = 512;

/// The longest trace, in steps (probes add calls of their own).
const STEPS: usize = 32;

/// Runs a memory store's future, which is ready at its first poll.
fn ready<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => unreachable!("the memory store answers without waiting"),
    }
}

fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// One limit under test: its key and its numbers (the cost is chosen per call).
#[derive(Debug, Clone, Copy)]
struct Limit {
    key: &'static str,
    algorithm: Algorithm,
    num: u64,
    period_ms: u64,
    burst: u64,
}

impl Limit {
    fn period_us(&self) -> u64 {
        self.period_ms * MS
    }

    /// What fits at once: `burst` for the buckets, `num` for the windows.
    fn capacity(&self) -> u64 {
        match self.algorithm {
            Algorithm::Leaky | Algorithm::Token => self.burst,
            _ => self.num,
        }
    }

    fn policy(&self, cost: u64) -> Policy {
        Policy::from_parts(self.algorithm, self.num, self.period_ms, self.burst, cost)
            .expect("generated policies are valid")
    }
}

/// A memory store on a manual clock, the time it is at (µs) and the wall.
struct Bench {
    clock: ManualClock,
    store: MemoryStore,
    now: u64,
    wall: Policy,
}

impl Bench {
    fn new(start: u64) -> Self {
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(clock.clone());
        let century_ms = 100 * 365 * 24 * 3600 * 1000;
        let wall = Policy::from_parts(Algorithm::Fixed, 1, century_ms, 1, 1).expect("a valid wall");
        let mut bench = Self {
            clock,
            store,
            now: 0,
            wall,
        };
        bench.advance(start);
        assert!(
            bench
                .verdict(&[Check::new(WALL, &bench.wall)])
                .is_admitted()
        );
        bench
    }

    fn advance(&mut self, by_us: u64) {
        self.clock.advance(Duration::from_micros(by_us));
        self.now += by_us;
    }

    fn verdict(&self, checks: &[Check<'_>]) -> Verdict {
        ready(self.store.check(checks)).expect("the memory store answers every check")
    }

    /// One call of `cost` on one limit.
    fn call(&self, limit: &Limit, cost: u64) -> Decision {
        let policy = limit.policy(cost);
        self.verdict(&[Check::new(limit.key, &policy)]).decisions()[0]
    }

    /// What a call of `cost` would get, without taking anything (stacked with the wall).
    fn look(&self, limit: &Limit, cost: u64) -> Decision {
        let policy = limit.policy(cost);
        let v = self.verdict(&[Check::new(limit.key, &policy), Check::new(WALL, &self.wall)]);
        assert!(!v.is_admitted(), "the wall rejects every call");
        v.decisions()[0]
    }
}

/// One step of a trace, as generated; [`Step::dt`] and [`Step::cost`] read it for a limit.
#[derive(Debug, Clone, Copy)]
struct Step {
    dt_kind: u8,
    dt_raw: u64,
    cost_raw: u64,
    probe: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    None,
    Retry,
    Drain,
    Reset,
}

impl Step {
    /// How far the clock moves before the call, µs.
    fn dt(&self, limit: &Limit, now: u64) -> u64 {
        let p = limit.period_us();
        let r = self.dt_raw;
        match self.dt_kind % 8 {
            0 => 0,
            1 => r % 10,
            2 => r % MS,
            // Around one unit's refill.
            3 => r % (p / limit.num + 2),
            // A period, 1 µs either way.
            4 => p - 1 + r % 3,
            // To a millisecond boundary, 1 µs either way.
            5 => (MS - now % MS + r % 3).saturating_sub(1),
            6 => r % (2 * p),
            _ => r % (5 * p),
        }
    }

    /// The call's cost: often 1, often the whole capacity, otherwise anything that fits.
    fn cost(&self, limit: &Limit) -> u64 {
        let cap = limit.capacity();
        match self.cost_raw % 5 {
            0 | 1 => 1,
            2 => cap,
            _ => 1 + (self.cost_raw / 5) % cap,
        }
    }

    fn probe(&self) -> Probe {
        match self.probe % 8 {
            5 => Probe::Retry,
            6 => Probe::Drain,
            7 => Probe::Reset,
            _ => Probe::None,
        }
    }
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (any::<u8>(), any::<u64>(), any::<u64>(), any::<u8>()).prop_map(
            |(dt_kind, dt_raw, cost_raw, probe)| Step {
                dt_kind,
                dt_raw,
                cost_raw,
                probe,
            },
        ),
        1..=STEPS,
    )
}

/// A limit of `algorithm`: small and large quotas, fractional rates (3 per 10 s), periods from
/// 1 ms to 1 day, and for the buckets a `burst` that is often not `num`.
fn limit(key: &'static str, algorithm: Algorithm) -> impl Strategy<Value = Limit> {
    let num = prop_oneof![Just(1_u64), Just(2), Just(3), 1..=12_u64, Just(50)];
    let period_ms = prop_oneof![
        Just(1_u64),
        Just(2),
        Just(7),
        Just(1000),
        Just(10_000),
        Just(86_400_000),
        1..=3000_u64
    ];
    (num, period_ms, 0..=16_u64).prop_map(move |(num, period_ms, burst)| Limit {
        key,
        algorithm,
        num,
        period_ms,
        burst: match algorithm {
            Algorithm::Leaky | Algorithm::Token if burst > 0 => burst,
            _ => num,
        },
    })
}

/// Where a trace starts, read for a limit by [`start_for`].
fn start() -> impl Strategy<Value = u64> {
    any::<u64>()
}

/// Where a trace on `limit` starts: anywhere in its first three periods, at any microsecond
/// (so at any phase of a millisecond).
fn start_for(limit: &Limit, raw: u64) -> u64 {
    raw % (3 * limit.period_us() + MS)
}

/// The admitted calls of one limit: `(time µs, cost)`, in order.
type Log = Vec<(u64, u64)>;

/// The window a fixed limit's admitted call at `t` opens ends here (see the module docs).
fn fixed_window_end(limit: &Limit, t: u64) -> u64 {
    (t / MS + limit.period_ms + 1) * MS
}

/// The fixed windows of `log`: `(start, end, units)`.
fn fixed_windows(limit: &Limit, log: &[(u64, u64)]) -> Vec<(u64, u64, u64)> {
    let mut windows: Vec<(u64, u64, u64)> = Vec::new();
    for &(t, cost) in log {
        match windows.last_mut() {
            Some(w) if t < w.1 => w.2 += cost,
            _ => windows.push((t, fixed_window_end(limit, t), cost)),
        }
    }
    windows
}

/// The level of an ideal bucket (in units of `1 / P` of a call) at `now`, after `log`.
fn bucket_level(limit: &Limit, log: &[(u64, u64)], now: u64) -> u128 {
    let rate = u128::from(limit.num);
    let unit = u128::from(limit.period_us());
    let mut level = 0_u128;
    let mut at = 0;
    for &(t, cost) in log {
        level = level.saturating_sub(rate * u128::from(t - at)) + u128::from(cost) * unit;
        at = t;
    }
    level.saturating_sub(rate * u128::from(now - at))
}

/// "Never more than the quota in any window the algorithm promises", over a whole log.
fn check_quota(limit: &Limit, log: &Log) -> Result<(), TestCaseError> {
    let p = limit.period_us();
    match limit.algorithm {
        Algorithm::Fixed => {
            for (start, end, units) in fixed_windows(limit, log) {
                prop_assert!(
                    units <= limit.num,
                    "the fixed window [{start}, {end}) µs admitted {units} > num = {}",
                    limit.num
                );
            }
        }
        Algorithm::Sliding => {
            for &(t, _) in log {
                let units: u64 = log
                    .iter()
                    .filter(|&&(s, _)| s + p > t && s <= t)
                    .map(|&(_, c)| c)
                    .sum();
                prop_assert!(
                    units <= limit.num,
                    "the trailing period ({}, {t}] µs admitted {units} > num = {}",
                    t.saturating_sub(p),
                    limit.num
                );
            }
        }
        _ => {
            // Both definitions of the one bucket rule: the token bucket's interval bound and the
            // leaky bucket's level.
            let unit = u128::from(p);
            for (i, &(a, _)) in log.iter().enumerate() {
                let mut units = 0_u128;
                for &(b, cost) in &log[i..] {
                    units += u128::from(cost);
                    let allowed =
                        u128::from(limit.burst) * unit + u128::from(limit.num) * u128::from(b - a);
                    prop_assert!(
                        units * unit <= allowed,
                        "[{a}, {b}] µs admitted {units} > burst {} + num {} × {} µs / {p} µs",
                        limit.burst,
                        limit.num,
                        b - a
                    );
                }
            }
            for (i, &(t, _)) in log.iter().enumerate() {
                let level = bucket_level(limit, &log[..=i], t);
                prop_assert!(
                    level <= u128::from(limit.burst) * unit,
                    "the level after the call at {t} µs is {level} / {p} > burst = {}",
                    limit.burst
                );
            }
        }
    }
    Ok(())
}

/// What the definition says of a call of `cost` at `now` after `log`: `Some(admitted)` when it
/// decides, `None` when the definition leaves room (the sliding log counts a unit admitted at
/// `r` until at most `r + P + num` µs: units in one microsecond are spread over consecutive
/// microseconds, so the log cannot promise the exact instant a unit leaves).
fn definition_admits(limit: &Limit, log: &Log, now: u64, cost: u64) -> Option<bool> {
    let p = limit.period_us();
    match limit.algorithm {
        Algorithm::Fixed => match fixed_windows(limit, log).last() {
            Some(&(_, end, units)) if now < end => Some(units + cost <= limit.num),
            _ => Some(true),
        },
        Algorithm::Sliding => {
            let recent: u64 = log
                .iter()
                .filter(|&&(s, _)| s + p + limit.num > now)
                .map(|&(_, c)| c)
                .sum();
            (recent + cost <= limit.num).then_some(true)
        }
        _ => {
            let unit = u128::from(p);
            let level = bucket_level(limit, log, now);
            Some(level + u128::from(cost) * unit <= u128::from(limit.burst) * unit)
        }
    }
}

/// The statement a single-limit run checks (every run makes the same calls and probes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Statement {
    Quota,
    Admits,
    RetryAfter,
    Remaining,
    ResetAfter,
    Bounds,
}

/// Every decision's own bounds: `remaining ≤ limit`, `limit` is the capacity, a rejection
/// carries a positive `retry_after` and an admission none, and `reset_after` is zero exactly
/// when the quota is whole.
fn check_bounds(limit: &Limit, d: &Decision, now: u64) -> Result<(), TestCaseError> {
    prop_assert_eq!(d.limit, limit.capacity(), "at {} µs: {:?}", now, d);
    prop_assert!(d.remaining <= d.limit, "at {now} µs: {d:?}");
    match d.retry_after {
        Some(retry) => prop_assert!(!d.admitted && retry > Duration::ZERO, "at {now} µs: {d:?}"),
        None => prop_assert!(
            d.admitted,
            "at {now} µs: a rejection without retry_after: {d:?}"
        ),
    }
    prop_assert_eq!(
        d.reset_after == Duration::ZERO,
        d.remaining == d.limit && !d.admitted,
        "at {} µs: reset_after is zero exactly when nothing is held: {:?}",
        now,
        d
    );
    Ok(())
}

/// One trace on one limit, checking one statement (every run makes the same calls and
/// probes, whatever it checks).
struct Run<'l> {
    limit: &'l Limit,
    statement: Statement,
    bench: Bench,
    log: Log,
}

impl Run<'_> {
    /// One call: the decision checked against the definition and its bounds, and logged.
    fn call(&mut self, cost: u64) -> Result<Decision, TestCaseError> {
        let now = self.bench.now;
        let expected = definition_admits(self.limit, &self.log, now, cost);
        let d = self.bench.call(self.limit, cost);
        if self.statement == Statement::Admits
            && let Some(expected) = expected
        {
            prop_assert_eq!(
                d.admitted,
                expected,
                "a call of cost {} at {} µs after {:?}: {:?}",
                cost,
                now,
                self.log,
                d
            );
        }
        if self.statement == Statement::Bounds {
            check_bounds(self.limit, &d, now)?;
        }
        if d.admitted {
            self.log.push((now, cost));
        }
        Ok(d)
    }

    /// A rejected call of `cost` with `retry_after` `retry` µs: 1 µs earlier it is still
    /// rejected, at `retry` it is admitted.
    fn retry(&mut self, cost: u64, retry: u64) -> Result<(), TestCaseError> {
        self.bench.advance(retry - 1);
        let early = self.bench.look(self.limit, cost);
        self.bench.advance(1);
        let on_time = self.call(cost)?;
        if self.statement == Statement::RetryAfter {
            prop_assert!(
                !early.admitted,
                "retry_after {retry} µs, yet the call is admitted 1 µs earlier, at {} µs: {early:?} (log {:?})",
                self.bench.now - 1,
                self.log
            );
            prop_assert!(
                on_time.admitted,
                "retry_after {retry} µs, yet the call at {} µs is rejected: {on_time:?}",
                self.bench.now
            );
        }
        Ok(())
    }

    /// After a decision with `remaining` left, as many unit calls at the same instant are
    /// admitted and the next is not.
    fn drain(&mut self, remaining: u64) -> Result<(), TestCaseError> {
        let checked = self.statement == Statement::Remaining;
        for n in 1..=remaining {
            let unit = self.call(1)?;
            prop_assert!(
                !checked || unit.admitted,
                "remaining {remaining} at {} µs, yet unit call {n} is rejected: {unit:?}",
                self.bench.now
            );
        }
        let over = self.call(1)?;
        prop_assert!(
            !checked || !over.admitted,
            "remaining {remaining} at {} µs, yet unit call {} is admitted too: {over:?}",
            self.bench.now,
            remaining + 1
        );
        Ok(())
    }

    /// After a decision with `reset_after` `reset` µs and no calls, the quota is not whole 1 µs
    /// before `reset` and whole at `reset`.
    fn reset(&mut self, reset: u64) -> Result<(), TestCaseError> {
        let checked = self.statement == Statement::ResetAfter;
        let cap = self.limit.capacity();
        if reset > 0 {
            self.bench.advance(reset - 1);
            let early = self.bench.look(self.limit, 1);
            prop_assert!(
                !checked || early.remaining < cap,
                "reset_after {reset} µs, yet the quota is whole 1 µs earlier, at {} µs: {early:?} (log {:?})",
                self.bench.now,
                self.log
            );
            self.bench.advance(1);
        }
        let whole = self.bench.look(self.limit, 1);
        prop_assert!(
            !checked || (whole.remaining == cap && whole.reset_after == Duration::ZERO),
            "reset_after {reset} µs, yet at {} µs the quota is not whole: {whole:?} (log {:?})",
            self.bench.now,
            self.log
        );
        Ok(())
    }
}

fn run(
    limit: &Limit,
    start: u64,
    steps: &[Step],
    statement: Statement,
) -> Result<(), TestCaseError> {
    let mut run = Run {
        limit,
        statement,
        bench: Bench::new(start_for(limit, start)),
        log: Log::new(),
    };
    for step in steps {
        run.bench.advance(step.dt(limit, run.bench.now));
        let cost = step.cost(limit);
        let d = run.call(cost)?;
        match step.probe() {
            Probe::None => {}
            Probe::Retry => {
                if let Some(retry) = d.retry_after {
                    run.retry(cost, us(retry))?;
                }
            }
            Probe::Drain => run.drain(d.remaining)?,
            Probe::Reset => run.reset(us(d.reset_after))?,
        }
    }
    if statement == Statement::Quota {
        check_quota(limit, &run.log)?;
    }
    Ok(())
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: CASES,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

macro_rules! properties {
    ($algo:ident, $algorithm:expr, $quota:ident, $admits:ident) => {
        mod $algo {
            use super::*;

            proptest! {
                #![proptest_config(config())]

                #[test]
                fn $quota(limit in limit("k", $algorithm), start in start(), steps in steps()) {
                    run(&limit, start, &steps, Statement::Quota)?;
                }

                #[test]
                fn $admits(limit in limit("k", $algorithm), start in start(), steps in steps()) {
                    run(&limit, start, &steps, Statement::Admits)?;
                }

                #[test]
                fn a_call_at_retry_after_is_admitted_and_one_microsecond_earlier_is_not(
                    limit in limit("k", $algorithm), start in start(), steps in steps()
                ) {
                    run(&limit, start, &steps, Statement::RetryAfter)?;
                }

                #[test]
                fn remaining_unit_calls_at_the_same_instant_are_admitted_and_the_next_is_not(
                    limit in limit("k", $algorithm), start in start(), steps in steps()
                ) {
                    run(&limit, start, &steps, Statement::Remaining)?;
                }

                #[test]
                fn the_quota_is_whole_at_reset_after_and_not_one_microsecond_earlier(
                    limit in limit("k", $algorithm), start in start(), steps in steps()
                ) {
                    run(&limit, start, &steps, Statement::ResetAfter)?;
                }

                #[test]
                fn decisions_stay_within_their_bounds(
                    limit in limit("k", $algorithm), start in start(), steps in steps()
                ) {
                    run(&limit, start, &steps, Statement::Bounds)?;
                }
            }
        }
    };
}

properties!(
    fixed,
    Algorithm::Fixed,
    each_window_admits_at_most_num,
    a_call_is_admitted_exactly_when_its_window_has_room
);
properties!(
    sliding,
    Algorithm::Sliding,
    any_trailing_period_admits_at_most_num,
    a_call_is_admitted_when_the_trailing_period_and_num_microseconds_have_room
);
properties!(
    leaky,
    Algorithm::Leaky,
    the_level_never_exceeds_burst,
    a_call_is_admitted_exactly_when_it_fits_under_burst
);
properties!(
    token,
    Algorithm::Token,
    any_interval_admits_at_most_burst_plus_the_refill,
    a_call_is_admitted_exactly_when_its_tokens_are_there
);

/// Two limits of different algorithms (generated in pairs).
fn two_limits() -> impl Strategy<Value = (Limit, Limit)> {
    (0..4_usize, 1..4_usize).prop_flat_map(|(a, shift)| {
        let b = (a + shift) % 4;
        (limit("a", Algorithm::ALL[a]), limit("b", Algorithm::ALL[b]))
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stacked {
    AdmittedWhenEachAdmits,
    RejectedTakesNothing,
    EachKeepsItsQuota,
}

/// One trace of calls stacked on two limits (and some calls on one of them alone).
fn run_stacked(
    (a, b): &(Limit, Limit),
    start: u64,
    steps: &[Step],
    statement: Stacked,
) -> Result<(), TestCaseError> {
    let mut bench = Bench::new(start_for(a, start));
    let (mut log_a, mut log_b) = (Log::new(), Log::new());
    for step in steps {
        bench.advance(step.dt(a, bench.now));
        let (cost_a, cost_b) = (step.cost(a), step.cost(b));
        match step.probe % 8 {
            6 => {
                if bench.call(a, cost_a).admitted {
                    log_a.push((bench.now, cost_a));
                }
            }
            7 => {
                if bench.call(b, cost_b).admitted {
                    log_b.push((bench.now, cost_b));
                }
            }
            _ => {
                let (before_a, before_b) = (bench.look(a, cost_a), bench.look(b, cost_b));
                let (pa, pb) = (a.policy(cost_a), b.policy(cost_b));
                let v = bench.verdict(&[Check::new(a.key, &pa), Check::new(b.key, &pb)]);
                let [da, db] = v.decisions() else {
                    return Err(TestCaseError::fail(format!("two decisions: {v:?}")));
                };
                if statement == Stacked::AdmittedWhenEachAdmits {
                    prop_assert_eq!(
                        da.admitted,
                        before_a.admitted,
                        "at {} µs: {:?}",
                        bench.now,
                        v
                    );
                    prop_assert_eq!(
                        db.admitted,
                        before_b.admitted,
                        "at {} µs: {:?}",
                        bench.now,
                        v
                    );
                    prop_assert_eq!(v.is_admitted(), da.admitted && db.admitted);
                }
                if v.is_admitted() {
                    log_a.push((bench.now, cost_a));
                    log_b.push((bench.now, cost_b));
                } else if statement == Stacked::RejectedTakesNothing {
                    let (after_a, after_b) = (bench.look(a, cost_a), bench.look(b, cost_b));
                    for (before, during, after) in
                        [(before_a, da, after_a), (before_b, db, after_b)]
                    {
                        prop_assert_eq!(before, after, "at {} µs, around {:?}", bench.now, v);
                        prop_assert_eq!(
                            (during.remaining, during.reset_after),
                            (before.remaining, before.reset_after),
                            "at {} µs, a rejected call reports what is left now: {:?}",
                            bench.now,
                            v
                        );
                    }
                }
            }
        }
    }
    if statement == Stacked::EachKeepsItsQuota {
        check_quota(a, &log_a)?;
        check_quota(b, &log_b)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn a_stacked_call_is_admitted_exactly_when_each_limit_admits_it_alone(
        limits in two_limits(), start in start(), steps in steps()
    ) {
        run_stacked(&limits, start, &steps, Stacked::AdmittedWhenEachAdmits)?;
    }

    #[test]
    fn a_rejected_stacked_call_takes_nothing_from_either_limit(
        limits in two_limits(), start in start(), steps in steps()
    ) {
        run_stacked(&limits, start, &steps, Stacked::RejectedTakesNothing)?;
    }

    #[test]
    fn stacked_limits_each_keep_their_own_quota(
        limits in two_limits(), start in start(), steps in steps()
    ) {
        run_stacked(&limits, start, &steps, Stacked::EachKeepsItsQuota)?;
    }
}

// ---------------------------------------------------------------------------------------------
// Settling (`settle = …`): at one instant, a call taken at an estimate and settled to what it
// used leaves the limit as a take of what it used would: `remaining` drops by the units used,
// the excess over the estimate counted up to one full capacity (and `remaining` never below 0).

mod settling {
    use super::*;

    /// What a settle to `used` units of a call estimated at `estimate` counts, on a limit of
    /// `capacity`.
    fn counted(estimate: u64, used: u64, capacity: u64) -> u64 {
        if used <= estimate {
            used
        } else {
            estimate + (used - estimate).min(capacity)
        }
    }

    fn remaining(store: &MemoryStore, key: &str, policy: &Policy) -> u64 {
        let unit = policy.with_cost(1).expect("cost 1");
        store.peek_now(&[Check::new(key, &unit)]).decisions()[0].remaining
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn a_settled_call_counts_what_it_used(
            algorithm in prop::sample::select(Algorithm::ALL.to_vec()),
            num in 1_u64..60,
            extra_burst in 0_u64..40,
            period_ms in 1_000_u64..100_000,
            before in 0_u64..60,
            estimate in 1_u64..60,
            used in 0_u64..200,
        ) {
            let clock = ManualClock::new();
            clock.advance(Duration::from_secs(1_000));
            let store = MemoryStore::with_clock(clock);
            let mut policy = Policy::new(algorithm, num, Duration::from_millis(period_ms))
                .map_err(|e| TestCaseError::reject(e.to_string()))?;
            if matches!(algorithm, Algorithm::Token | Algorithm::Leaky | Algorithm::Gcra) {
                policy = policy
                    .with_burst(num + extra_burst)
                    .map_err(|e| TestCaseError::reject(e.to_string()))?;
            }
            let capacity = policy.capacity();
            // An estimate that fits after the calls before it (at one instant nothing drains).
            let estimate = 1 + estimate % capacity;
            let before = before % (capacity - estimate + 1);
            let unit = policy.with_cost(1).expect("cost 1");
            for _ in 0..before {
                store.check_now(&[Check::new("k", &unit)]).expect("check");
            }
            let estimated = policy.with_cost(estimate).expect("an estimate within the capacity");
            let r0 = remaining(&store, "k", &policy);
            let checks = [Check::new("k", &estimated)];
            prop_assert!(store.take_now(&checks, "c0ffee").expect("take").is_admitted());
            store.settle_now(&checks, "c0ffee", &[used]).expect("settle");
            prop_assert_eq!(
                remaining(&store, "k", &policy),
                r0.saturating_sub(counted(estimate, used, capacity)),
                "{} {}/{} ms burst {}: {} before, estimate {}, used {}",
                algorithm, num, period_ms, capacity, before, estimate, used
            );
        }
    }
}
