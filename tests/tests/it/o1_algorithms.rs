//! The two O(1) algorithms against their definitions, on the memory store with a manual clock
//! (the same rules as the Redis scripts, to the microsecond):
//!
//! * GCRA never admits more than `burst` at once, nor more than `burst + d / T` in any interval
//!   of length `d` (`T = ⌈period / num⌉`): `num` per `time` in the long run;
//! * the sliding counter never admits more than `num` in one aligned window, and its documented
//!   accuracy bound against an exact sliding log holds on the adversarial traces: at most
//!   `2·num` in a trailing interval (it gets close), and down to none where the log admits `num`.

use std::time::Duration;

use proptest::prelude::*;
use ratelimit_runtime::store::ManualClock;
use ratelimit_runtime::{Algorithm, MemoryStore, Policy, store::Check};

fn policy(algo: Algorithm, num: u64, period: Duration, burst: u64, cost: u64) -> Policy {
    Policy::new(algo, num, period)
        .and_then(|p| p.with_burst(burst))
        .and_then(|p| p.with_cost(cost))
        .expect("a valid policy")
}

/// A store on a manual clock, and the µs it has reached.
struct Run {
    clock: ManualClock,
    store: MemoryStore,
    now: u64,
}

impl Run {
    fn new() -> Self {
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(clock.clone());
        Self {
            clock,
            store,
            now: 0,
        }
    }

    fn at(&mut self, us: u64) {
        assert!(us >= self.now);
        self.clock.advance(Duration::from_micros(us - self.now));
        self.now = us;
    }

    fn call(&self, p: &Policy) -> bool {
        self.store
            .check_now(&[Check::new("k", p)])
            .expect("memory store")
            .is_admitted()
    }
}

/// The most units admitted in any trailing interval `(t - period, t]`.
fn worst_trailing(admitted: &[(u64, u64)], period_us: u64) -> u64 {
    let mut worst = 0;
    for (i, &(t, _)) in admitted.iter().enumerate() {
        let inside: u64 = admitted[..=i]
            .iter()
            .filter(|&&(s, _)| s + period_us > t)
            .map(|&(_, n)| n)
            .sum();
        worst = worst.max(inside);
    }
    worst
}

/// Runs the same calls (time µs, cost 1) through a policy, returning the admitted ones.
fn admitted_on(p: &Policy, calls: &[u64]) -> Vec<(u64, u64)> {
    let mut run = Run::new();
    let mut out = Vec::new();
    for &t in calls {
        run.at(t);
        if run.call(p) {
            out.push((t, 1));
        }
    }
    out
}

/// `num` calls in the last millisecond of one window, then one call a millisecond through the
/// next: the counter forgets the first window linearly while all of it is still inside the
/// trailing interval. The exact log admits nothing more until the burst has left it.
#[test]
fn the_sliding_counter_over_admits_at_most_num_more_than_the_log() {
    let num = 100;
    let period = Duration::from_secs(1);
    let period_us = 1_000_000;
    let mut calls: Vec<u64> = vec![999_000; usize::try_from(num).unwrap()];
    calls.extend((0..1000).map(|ms| 1_000_000 + ms * 1000));
    let counter = admitted_on(
        &policy(Algorithm::SlidingCounter, num, period, num, 1),
        &calls,
    );
    let log = admitted_on(&policy(Algorithm::Sliding, num, period, num, 1), &calls);
    let (counter_worst, log_worst) = (
        worst_trailing(&counter, period_us),
        worst_trailing(&log, period_us),
    );
    eprintln!("adversarial trace: sliding counter {counter_worst}, sliding log {log_worst}");
    assert_eq!(log_worst, num, "the log is exact");
    assert!(
        counter_worst <= 2 * num,
        "the documented bound: {counter_worst}"
    );
    assert!(
        counter_worst > num * 19 / 10,
        "the adversarial trace reaches close to the bound: {counter_worst}"
    );
}

/// `num` calls at the start of one window, then `num` just after the start of the next: the log
/// admits them all (the first ones just left the trailing interval; their scores run 1 µs
/// apart), the counter still weighs them.
#[test]
fn the_sliding_counter_can_under_admit_down_to_none() {
    let num = 100;
    let period = Duration::from_secs(1);
    let mut calls: Vec<u64> = vec![0; usize::try_from(num).unwrap()];
    calls.extend(std::iter::repeat_n(
        1_000_100,
        usize::try_from(num).unwrap(),
    ));
    let counter = admitted_on(
        &policy(Algorithm::SlidingCounter, num, period, num, 1),
        &calls,
    );
    let log = admitted_on(&policy(Algorithm::Sliding, num, period, num, 1), &calls);
    assert_eq!(log.len(), 200, "the log admits the second burst");
    assert_eq!(counter.len(), 100, "the counter still weighs the first");
}

/// At a steady rate under the quota the counter's estimate stays under it too: it admits
/// everything, as the log does. (Right at the quota's rate it admits a few fewer: the elapsed
/// time is rounded down to the millisecond, so the previous window weighs a little more.)
#[test]
fn at_a_steady_rate_the_sliding_counter_admits_what_the_log_admits() {
    let num = 50;
    let period = Duration::from_secs(1);
    // One call every 25 ms (40 a second against 50), for five periods.
    let calls: Vec<u64> = (0..200).map(|i| i * 25_000).collect();
    let counter = admitted_on(
        &policy(Algorithm::SlidingCounter, num, period, num, 1),
        &calls,
    );
    let log = admitted_on(&policy(Algorithm::Sliding, num, period, num, 1), &calls);
    assert_eq!(counter.len(), log.len());
    assert_eq!(counter.len(), 200);
}

fn trace() -> impl Strategy<Value = Vec<(u64, u64)>> {
    // (µs to the next call, cost)
    proptest::collection::vec(
        (
            prop_oneof![Just(0_u64), 0..50_u64, 0..5_000_u64, 0..2_000_000_u64],
            1..4_u64,
        ),
        1..120,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// GCRA: never more than `burst` units in an instant, and at most `burst + d / T` in any
    /// interval of length `d`.
    #[test]
    fn gcra_admits_at_most_burst_plus_one_unit_per_emission_interval(
        num in 1..20_u64,
        period_ms in prop_oneof![Just(1_u64), Just(7), Just(1000), 1..3000_u64],
        burst in 1..20_u64,
        steps in trace(),
    ) {
        let mut run = Run::new();
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        let t = (period_ms * 1000).div_ceil(num);
        let mut at = 0;
        for (step, cost) in steps {
            at += step;
            run.at(at);
            let cost = cost.min(burst);
            let p = policy(Algorithm::Gcra, num, Duration::from_millis(period_ms), burst, cost);
            if run.call(&p) {
                admitted.push((at, cost));
            }
        }
        for (i, &(from, _)) in admitted.iter().enumerate() {
            let mut units = 0;
            for &(to, n) in &admitted[i..] {
                units += n;
                prop_assert!(
                    units <= burst + (to - from) / t,
                    "{} units in [{}, {}] µs: burst {}, T {} µs", units, from, to, burst, t
                );
            }
        }
    }

    /// The sliding counter: never more than `num` units in one aligned window, never more than
    /// `2·num` in a trailing interval.
    #[test]
    fn the_sliding_counter_keeps_its_bounds(
        num in 1..30_u64,
        period_ms in prop_oneof![Just(1_u64), Just(10), Just(1000)],
        steps in trace(),
    ) {
        let mut run = Run::new();
        let period_us = period_ms * 1000;
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        let mut at = 0;
        for (step, cost) in steps {
            at += step;
            run.at(at);
            let cost = cost.min(num);
            let p = policy(Algorithm::SlidingCounter, num, Duration::from_millis(period_ms), num, cost);
            if run.call(&p) {
                admitted.push((at, cost));
            }
        }
        let mut per_window = std::collections::HashMap::<u64, u64>::new();
        for &(t, n) in &admitted {
            *per_window.entry(t / period_us).or_default() += n;
        }
        for (w, n) in per_window {
            prop_assert!(n <= num, "{} units in window {}", n, w);
        }
        prop_assert!(worst_trailing(&admitted, period_us) <= 2 * num);
    }
}
