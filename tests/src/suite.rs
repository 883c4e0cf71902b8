//! The shared scenario suite: one set of scenarios, run on every store.
//!
//! A store's test file implements [`Harness`] (how to get a store handle, how to let store time
//! pass, how to keep keys apart) and calls each scenario, for each algorithm where it applies.
//! The same scenarios are exact on a memory store with a manual clock and hold on Redis with real
//! time: every assertion is stated between a lower and an upper bound of the store time that can
//! have gone by ([`StoreTime`]), so with a manual clock the bounds meet and the numbers are
//! exact, and with real time they widen by what was measured, never by a guess about speed.
//! Where an answer is exact only if the calls fall within one window or one unit's time (how
//! many are left, whether a 4th call is rejected), a try that the measured time shows was too
//! slow to tell is run again on fresh keys ([`until_in_time`]): a stalled machine makes a test
//! slower, never wrong.
//!
//! Every scenario (and helper) fails by panicking, as tests do, when the store breaks its
//! contract or fails.
#![allow(
    clippy::missing_panics_doc,
    reason = "every function here is a test step that fails by panicking (see the module docs)"
)]

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimit_runtime::{Algorithm, Decision, Policy, Store, Verdict, key, store::Check};
use tokio::sync::Barrier;
use tokio::task::JoinSet;

/// What a scenario needs from a store under test.
pub trait Harness: Send + Sync {
    /// A store handle. `conn` picks one of several independent connections for Redis
    /// (`conn % number_of_connections`); the memory harness returns the same store every time.
    fn store(&self, conn: usize) -> Arc<dyn Store>;
    /// Let `d` of store time pass: memory advances its `ManualClock`; Redis sleeps for real.
    fn pass(&self, d: Duration) -> impl Future<Output = ()> + Send;
    /// A key prefix unique to this harness instance/test, so scenarios never share keys.
    fn unique(&self, name: &str) -> String;
}

/// The algorithms whose numbers follow from the calls alone (windows that start at the first
/// call, buckets): every one but the sliding counter, whose aligned windows fall where the
/// store's clock puts them.
pub const FROM_FIRST_CALL: [Algorithm; 5] = [
    Algorithm::Fixed,
    Algorithm::Sliding,
    Algorithm::Leaky,
    Algorithm::Token,
    Algorithm::Gcra,
];

/// The algorithms that refill continuously: the buckets and GCRA.
pub const BUCKETS: [Algorithm; 3] = [Algorithm::Leaky, Algorithm::Token, Algorithm::Gcra];

/// A long period, for scenarios where real time must not matter.
#[allow(
    clippy::duration_suboptimal_units,
    reason = "Duration::from_hours is newer than the workspace's rust-version"
)]
pub const HOUR: Duration = Duration::from_secs(60 * 60);

/// How far two durations reported by different stores may differ (their resolutions differ:
/// nanoseconds in memory, microseconds in Redis).
pub const TOLERANCE: Duration = Duration::from_millis(1);

/// Bounds on the store time gone by since [`StoreTime::start`].
///
/// * lower bound: what was passed with [`StoreTime::pass`] (a manual clock moves only then; a
///   real clock moves at least that much while the harness sleeps);
/// * upper bound: the larger of what was passed and the real time spent in `pass`, plus the real
///   time spent outside `pass`. With a manual clock that is the passed time plus a little real
///   time; with real time it is the real time since the start.
#[derive(Debug, Clone, Copy)]
pub struct StoreTime {
    start: Instant,
    passed: Duration,
    in_pass: Duration,
}

impl StoreTime {
    /// Starts measuring now.
    pub fn start() -> Self {
        Self {
            start: Instant::now(),
            passed: Duration::ZERO,
            in_pass: Duration::ZERO,
        }
    }

    /// Lets `d` of store time pass through the harness, and records it.
    pub async fn pass(&mut self, h: &impl Harness, d: Duration) {
        let t = Instant::now();
        h.pass(d).await;
        self.passed += d;
        self.in_pass += t.elapsed();
    }

    /// At least this much store time has gone by since the start.
    pub fn lower(&self) -> Duration {
        self.passed
    }

    /// At most this much store time has gone by since the start.
    pub fn upper(&self) -> Duration {
        let outside = self.start.elapsed().saturating_sub(self.in_pass);
        self.passed.max(self.in_pass) + outside
    }
}

/// What one try of a timed scenario found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Try {
    /// The calls fell where the scenario needs them, and every answer was checked.
    Checked,
    /// The store time measured around the calls may have passed a window's or a unit's end
    /// between them (a stalled machine): the exact answers cannot be told apart from a refill,
    /// so nothing was checked.
    TooSlow,
}

/// How many tries [`until_in_time`] makes before it fails.
pub const TRIES: u32 = 8;

/// Runs `run(0)`, `run(1)`, … until one try is [`Try::Checked`]; each try must use keys of its
/// own (the try's number in the scenario's name). With a manual clock the first try is checked;
/// with real time a try is run again only when the measured time says it was too slow to tell.
pub async fn until_in_time<F, Fut>(what: &str, mut run: F)
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Try>,
{
    for attempt in 0..TRIES {
        if run(attempt).await == Try::Checked {
            return;
        }
        eprintln!("{what}: try {attempt} was too slow to tell; again on fresh keys");
    }
    panic!("{what}: none of {TRIES} tries ran its calls within the time they needed");
}

/// A policy from constant test parameters.
///
/// # Panics
/// When the parameters do not make a valid policy (a bug in the scenario).
pub fn policy(algo: Algorithm, limit: u64, period: Duration, burst: u64, cost: u64) -> Policy {
    Policy::new(algo, limit, period)
        .and_then(|p| p.with_burst(burst))
        .and_then(|p| p.with_cost(cost))
        .unwrap_or_else(|e| panic!("bad test policy: {e}"))
}

/// The store key of `policy` in scenario `name`: the harness's unique prefix, the scenario as
/// the scope (so the limits stacked in one scenario share a Redis Cluster hash tag).
pub fn key_of(h: &impl Harness, name: &str, policy: &Policy) -> String {
    key::build(&h.unique(name), name, &[], policy)
}

/// Checks `limits` together as one call on connection `conn`.
///
/// # Panics
/// When the store fails, or answers a different number of decisions.
pub async fn check_on(h: &impl Harness, conn: usize, limits: &[(&str, &Policy)]) -> Verdict {
    let checks: Vec<Check<'_>> = limits.iter().map(|&(k, p)| Check::new(k, p)).collect();
    let verdict = h
        .store(conn)
        .check(&checks)
        .await
        .unwrap_or_else(|e| panic!("store failed: {e}"));
    assert_eq!(
        verdict.decisions().len(),
        limits.len(),
        "one decision per limit"
    );
    verdict
}

/// Checks one limit on connection 0.
pub async fn check_one(h: &impl Harness, key: &str, policy: &Policy) -> Decision {
    let v = check_on(h, 0, &[(key, policy)]).await;
    let d = v.decisions()[0];
    assert_eq!(v.is_admitted(), d.admitted);
    assert_eq!(
        d.limit,
        policy.capacity(),
        "a decision reports the capacity"
    );
    assert_eq!(
        d.retry_after.is_some(),
        !d.admitted,
        "retry_after is given exactly on rejection: {d:?}"
    );
    d
}

/// Asserts `lo - TOLERANCE <= actual <= hi + TOLERANCE`.
///
/// # Panics
/// When it is not.
#[track_caller]
pub fn assert_between(what: &str, actual: Duration, lo: Duration, hi: Duration) {
    let lo = lo.saturating_sub(TOLERANCE);
    let hi = hi + TOLERANCE;
    assert!(
        lo <= actual && actual <= hi,
        "{what}: {actual:?} is not within [{lo:?}, {hi:?}]"
    );
}

/// The time `units` take to refill/drain at `limit / period`, in nanoseconds rounded up.
pub fn units_time(policy: &Policy, units: u64) -> Duration {
    let ns = policy.period().as_nanos() * u128::from(units);
    let limit = u128::from(policy.limit());
    Duration::from_nanos(u64::try_from(ns.div_ceil(limit)).unwrap_or(u64::MAX))
}

/// How many whole units refill/drain in `d` at `limit / period`.
pub fn units_in(policy: &Policy, d: Duration) -> u64 {
    let units = d.as_nanos() * u128::from(policy.limit()) / policy.period().as_nanos();
    u64::try_from(units).unwrap_or(u64::MAX)
}

/// 200 concurrent calls, in 8 task groups of 25 (group `g` on connection `g`), against
/// `num = 50` with a long period: exactly 50 are admitted, and the admitted ones saw every
/// `remaining` from 49 down to 0 exactly once.
pub async fn exactness(h: &impl Harness, algo: Algorithm) {
    let p = policy(algo, 50, HOUR, 50, 1);
    let key: Arc<str> = key_of(h, &format!("exactness-{algo}"), &p).into();
    let barrier = Arc::new(Barrier::new(200));
    let mut tasks = JoinSet::new();
    for group in 0..8 {
        let store = h.store(group);
        for _ in 0..25 {
            let (store, key, barrier) = (store.clone(), key.clone(), barrier.clone());
            tasks.spawn(async move {
                barrier.wait().await;
                store.check(&[Check::new(&key, &p)]).await
            });
        }
    }
    let mut remaining = Vec::new();
    let mut rejected = 0;
    while let Some(joined) = tasks.join_next().await {
        let verdict = joined
            .unwrap_or_else(|e| panic!("task failed: {e}"))
            .unwrap_or_else(|e| panic!("store failed: {e}"));
        let d = verdict.decisions()[0];
        if d.admitted {
            remaining.push(d.remaining);
        } else {
            assert_eq!(d.remaining, 0, "{algo}: a rejection with units left: {d:?}");
            rejected += 1;
        }
    }
    assert_eq!(remaining.len(), 50, "{algo}: admitted out of 200");
    assert_eq!(rejected, 150, "{algo}: rejected out of 200");
    remaining.sort_unstable();
    assert_eq!(remaining, (0..50).collect::<Vec<u64>>(), "{algo}");
    let d = check_one(h, &key, &p).await;
    assert!(!d.admitted, "{algo}: a 201st call was admitted");
}

/// A fixed window admits `num`, rejects until the window's end (`retry_after` says when), then
/// starts a new window at the next admitted call.
pub async fn fixed_admits_again_after_window(h: &impl Harness) {
    until_in_time("fixed window again", |attempt| {
        fixed_admits_again_after_window_try(h, attempt)
    })
    .await;
}

async fn fixed_admits_again_after_window_try(h: &impl Harness, attempt: u32) -> Try {
    let period = Duration::from_secs(1);
    let p = policy(Algorithm::Fixed, 3, period, 3, 1);
    let key = key_of(h, &format!("fixed-again-{attempt}"), &p);
    let mut t = StoreTime::start();
    let mut calls = Vec::with_capacity(5);
    for _ in 0..5 {
        calls.push(check_one(h, &key, &p).await);
    }
    if t.upper() + TOLERANCE >= period {
        return Try::TooSlow;
    }
    for (left, d) in (0..3).rev().zip(&calls) {
        assert!(d.admitted);
        assert_eq!(d.remaining, left);
        assert_between(
            "reset_after",
            d.reset_after,
            period.saturating_sub(t.upper()),
            period,
        );
    }
    let d = calls[3];
    assert!(!d.admitted, "a 4th call in the window was admitted");
    assert_eq!(d.remaining, 0);
    let retry = d.retry_after.unwrap_or_default();
    assert_between(
        "retry_after",
        retry,
        period.saturating_sub(t.upper()),
        period,
    );
    assert_eq!(d.reset_after, retry, "a fixed window resets when it ends");
    // A rejected call does not move the window.
    let again = calls[4];
    assert!(!again.admitted);
    assert_between(
        "retry_after of a second rejection",
        again.retry_after.unwrap_or_default(),
        period.saturating_sub(t.upper()),
        retry,
    );

    t.pass(h, retry + TOLERANCE).await;
    let t2 = StoreTime::start();
    let mut calls = Vec::with_capacity(4);
    for _ in 0..4 {
        calls.push(check_one(h, &key, &p).await);
    }
    if t2.upper() + TOLERANCE >= period {
        return Try::TooSlow;
    }
    let d = calls[0];
    assert!(d.admitted, "the window did not end at retry_after");
    assert_eq!(d.remaining, 2, "a new window starts with a full quota");
    assert_between(
        "reset_after of the new window",
        d.reset_after,
        period.saturating_sub(t2.upper()),
        period,
    );
    assert!(calls[1].admitted && calls[2].admitted);
    assert!(
        !calls[3].admitted,
        "a 4th call in the new window was admitted"
    );
    Try::Checked
}

/// `num - 1` calls late in a fixed window and `num` right after it: the fixed window admits them
/// all (a burst of `2 * num - 1` within a third of the period), the sliding window admits only 1
/// more (the first call of the scenario has left its trailing interval, the late ones have not).
pub async fn sliding_has_no_boundary_burst(h: &impl Harness) {
    for algo in [Algorithm::Fixed, Algorithm::Sliding] {
        until_in_time(&format!("{algo}: boundary burst"), |attempt| {
            boundary_burst_try(h, algo, attempt)
        })
        .await;
    }
}

async fn boundary_burst_try(h: &impl Harness, algo: Algorithm, attempt: u32) -> Try {
    let num = 5;
    let period = Duration::from_secs(1);
    let p = policy(algo, num, period, num, 1);
    let key = key_of(h, &format!("boundary-{algo}-{attempt}"), &p);
    let mut t = StoreTime::start();
    assert!(check_one(h, &key, &p).await.admitted, "{algo}: first call");
    t.pass(h, period * 8 / 10).await;
    let mut late = StoreTime::start();
    for i in 1..num {
        let d = check_one(h, &key, &p).await;
        assert!(d.admitted, "{algo}: late call {i}");
    }
    // The late calls must fall in the first call's window.
    if t.upper() + TOLERANCE >= period {
        return Try::TooSlow;
    }
    // Now at least 1.1 periods after the first call: its window has ended.
    late.pass(h, period * 3 / 10).await;
    let after = StoreTime::start();
    let mut admitted = 0;
    for _ in 0..num {
        if check_one(h, &key, &p).await.admitted {
            admitted += 1;
        }
    }
    // Fixed: these calls must fall in one new window; sliding: the late calls must still be
    // inside their trailing interval.
    if after.upper() + TOLERANCE >= period || late.upper() + TOLERANCE >= period {
        return Try::TooSlow;
    }
    match algo {
        Algorithm::Fixed => assert_eq!(admitted, num, "fixed: a new window admits all"),
        _ => assert_eq!(admitted, 1, "sliding: boundary burst admitted"),
    }
    Try::Checked
}

/// Leaky and token buckets and GCRA: `burst` calls at once, then a rejection whose
/// `retry_after` is one unit's time; after half the period, exactly half the quota more.
///
/// # Panics
/// For the windows, which are not buckets.
pub async fn buckets_refill_at_rate(h: &impl Harness, algo: Algorithm) {
    assert!(
        matches!(algo, Algorithm::Leaky | Algorithm::Token | Algorithm::Gcra),
        "buckets_refill_at_rate is for leaky, token and gcra"
    );
    let period = Duration::from_secs(1);
    let p = policy(algo, 10, period, 10, 1);
    let key = key_of(h, &format!("refill-{algo}"), &p);
    let mut t = StoreTime::start();
    let mut first = 0;
    let rejection = loop {
        let d = check_one(h, &key, &p).await;
        if !d.admitted {
            break d;
        }
        first += 1;
        assert!(first <= 1000, "{algo}: the bucket never empties");
    };
    assert!(first >= 10, "{algo}: a full bucket admitted only {first}");
    assert!(
        first <= 10 + units_in(&p, t.upper()),
        "{algo}: admitted {first} at once from a bucket of 10"
    );
    assert_eq!(rejection.remaining, 0, "{algo}");
    let one_unit = units_time(&p, 1);
    assert_between(
        "retry_after of an empty bucket",
        rejection.retry_after.unwrap_or_default(),
        Duration::from_nanos(1),
        one_unit,
    );

    t.pass(h, period / 2).await;
    let mut second = 0;
    let last = loop {
        let d = check_one(h, &key, &p).await;
        if !d.admitted {
            break d;
        }
        second += 1;
        assert!(second <= 1000, "{algo}: the bucket never empties");
    };
    assert!(second >= 5, "{algo}: half a period refilled only {second}");
    assert!(
        first + second <= 10 + units_in(&p, t.upper()),
        "{algo}: admitted {first} + {second} in {:?}",
        t.upper()
    );
    assert_between(
        "reset_after of an empty bucket",
        last.reset_after,
        period.saturating_sub(one_unit),
        period,
    );
}

/// A call of `cost = 3` against a quota of 10 leaves 7, 4, 1, then is rejected with 1 left and
/// takes nothing; a call of cost 1 then takes the last unit.
pub async fn cost_takes_units(h: &impl Harness, algo: Algorithm) {
    assert!(
        algo != Algorithm::SlidingCounter,
        "the sliding counter's waits depend on where its aligned windows fall"
    );
    let period = HOUR;
    let p3 = policy(algo, 10, period, 10, 3);
    let p1 = policy(algo, 10, period, 10, 1);
    let key = key_of(h, &format!("cost-{algo}"), &p3);
    assert_eq!(
        key,
        key_of(h, &format!("cost-{algo}"), &p1),
        "cost is not in the key"
    );
    let t = StoreTime::start();
    for left in [7, 4, 1] {
        let d = check_one(h, &key, &p3).await;
        assert!(d.admitted, "{algo}: cost 3 with {} left", left + 3);
        assert_eq!(d.remaining, left, "{algo}");
    }
    let d = check_one(h, &key, &p3).await;
    assert!(!d.admitted, "{algo}: cost 3 with 1 left was admitted");
    assert_eq!(d.remaining, 1, "{algo}: a rejected call took units");
    let retry = d.retry_after.unwrap_or_default();
    let expected = match algo {
        // The window (fixed) / the oldest entries (sliding) end a period after the first call.
        Algorithm::Fixed | Algorithm::Sliding => period,
        // Two more units are needed: (3 - 1) / rate and (9 + 3 - 10) / rate.
        _ => units_time(&p3, 2),
    };
    assert_between(
        "retry_after",
        retry,
        expected.saturating_sub(t.upper()),
        expected,
    );
    let d = check_one(h, &key, &p1).await;
    assert!(d.admitted, "{algo}: cost 1 with 1 left");
    assert_eq!(d.remaining, 0, "{algo}");
    let d = check_one(h, &key, &p1).await;
    assert!(!d.admitted, "{algo}: cost 1 with 0 left");
    assert_eq!(d.remaining, 0, "{algo}");
}

/// The numbers of a decision: `remaining` counts down, `reset_after` and `retry_after` follow
/// the algorithm's rule, a call clearly before `retry_after` fails and one just after it
/// succeeds.
pub async fn decision_numbers(h: &impl Harness, algo: Algorithm) {
    assert!(
        algo != Algorithm::SlidingCounter,
        "the sliding counter's numbers depend on where its aligned windows fall: see sliding_counter_weighs_the_previous_window"
    );
    until_in_time(&format!("{algo}: decision numbers"), |attempt| {
        decision_numbers_try(h, algo, attempt)
    })
    .await;
}

async fn decision_numbers_try(h: &impl Harness, algo: Algorithm, attempt: u32) -> Try {
    let period = Duration::from_secs(1);
    let p = policy(algo, 3, period, 3, 1);
    let key = key_of(h, &format!("numbers-{algo}-{attempt}"), &p);
    let bucket = matches!(algo, Algorithm::Leaky | Algorithm::Token | Algorithm::Gcra);
    let t = StoreTime::start();
    let mut calls = Vec::with_capacity(4);
    for _ in 0..3 {
        calls.push(check_one(h, &key, &p).await);
    }
    let mut since = StoreTime::start();
    calls.push(check_one(h, &key, &p).await);
    // The counts are exact while no unit has refilled (a bucket) or the window is open.
    let exact_for = if bucket { units_time(&p, 1) } else { period };
    if t.upper() + TOLERANCE >= exact_for {
        return Try::TooSlow;
    }
    for (taken, d) in (1..=3).zip(&calls) {
        assert!(d.admitted, "{algo}: call {taken}");
        assert_eq!(d.remaining, 3 - taken, "{algo}: remaining counts down");
        let expected = if bucket {
            // token: (B - tokens) / rate; leaky: level / rate.
            units_time(&p, taken)
        } else {
            period
        };
        assert_between(
            "reset_after",
            d.reset_after,
            expected.saturating_sub(t.upper()),
            expected,
        );
    }
    let d = calls[3];
    assert!(!d.admitted, "{algo}: a 4th call was admitted");
    assert_eq!(d.remaining, 0, "{algo}");
    let retry = d.retry_after.unwrap_or_default();
    let (expected_retry, expected_reset) = if bucket {
        (units_time(&p, 1), period)
    } else {
        (period, period)
    };
    assert_between(
        "retry_after",
        retry,
        expected_retry.saturating_sub(t.upper()),
        expected_retry,
    );
    assert_between(
        "reset_after",
        d.reset_after,
        expected_reset.saturating_sub(t.upper()),
        expected_reset,
    );

    // Clearly before retry_after: still rejected, and the wait shrank by the time passed.
    since.pass(h, retry / 2).await;
    let d = check_one(h, &key, &p).await;
    if since.upper() + TOLERANCE < retry {
        assert!(!d.admitted, "{algo}: admitted before retry_after");
        assert_between(
            "retry_after later",
            d.retry_after.unwrap_or_default(),
            retry.saturating_sub(since.upper()),
            retry.saturating_sub(retry / 2),
        );
    }
    // Just after retry_after: admitted.
    if !d.admitted {
        since
            .pass(h, retry.saturating_sub(retry / 2) + TOLERANCE)
            .await;
        let d = check_one(h, &key, &p).await;
        assert!(
            d.admitted,
            "{algo}: rejected just after retry_after ({retry:?}): {d:?}"
        );
    }
    Try::Checked
}

/// Two limits checked as one call: while one rejects, the other's `remaining` does not move, and
/// checking the other alone shows that nothing was taken from it. First a token limit with a
/// fixed limit (each rejecting in turn), then every pair of algorithms.
pub async fn stacked_rejection_consumes_nothing(h: &impl Harness) {
    let mut pairs = vec![(Algorithm::Token, Algorithm::Fixed)];
    for a in Algorithm::ALL {
        for b in Algorithm::ALL {
            pairs.push((a, b));
        }
    }
    pairs.push((Algorithm::Fixed, Algorithm::Token));
    for (i, (tight_algo, loose_algo)) in pairs.into_iter().enumerate() {
        // `tight` admits 2 calls, `loose` 10; the loose one is checked first in half the
        // cases, so the rejecting limit is not always the last.
        let tight = policy(tight_algo, 2, HOUR, 2, 1);
        let loose = policy(loose_algo, 10, HOUR, 10, 1);
        let scope = format!("stacked-{i}");
        let (tk, lk) = (key_of(h, &scope, &tight), key_of(h, &scope, &loose));
        assert_ne!(tk, lk);
        let tight_first = i % 2 == 0;
        let limits: Vec<(&str, &Policy)> = if tight_first {
            vec![(&tk, &tight), (&lk, &loose)]
        } else {
            vec![(&lk, &loose), (&tk, &tight)]
        };
        let (ti, li) = if tight_first { (0, 1) } else { (1, 0) };
        let what = format!("{tight_algo} (2) with {loose_algo} (10)");
        for (conn, n) in [(1, 1), (2, 2)] {
            let v = check_on(h, conn, &limits).await;
            assert!(v.is_admitted(), "{what}: call {n}");
            assert_eq!(v.decisions()[ti].remaining, 2 - n, "{what}");
            assert_eq!(v.decisions()[li].remaining, 10 - n, "{what}");
        }
        for n in 0..3 {
            let v = check_on(h, n, &limits).await;
            assert!(!v.is_admitted(), "{what}: call {} admitted", n + 3);
            let (dt, dl) = (v.decisions()[ti], v.decisions()[li]);
            assert!(!dt.admitted && dt.retry_after.is_some(), "{what}: {dt:?}");
            assert!(dl.admitted, "{what}: the loose limit admits on its own");
            assert_eq!(
                dl.remaining, 8,
                "{what}: the rejected call took from the loose limit"
            );
            assert_eq!(dl.retry_after, None);
            assert_eq!(v.retry_after(), dt.retry_after);
            assert_eq!(v.binding(), Some(&dt));
        }
        let d = check_one(h, &lk, &loose).await;
        assert!(d.admitted, "{what}");
        assert_eq!(d.remaining, 7, "{what}: the loose limit alone");
    }
}

/// One call that names the same key twice applies once per limit, in order, each seeing what
/// the ones before it took; when the second would not fit, the whole call is rejected and takes
/// nothing. Every store gives exactly these numbers (on Redis the two were once evaluated
/// against the old state and both committed, so the counter passed its limit, the reply failed
/// and the breaker opened for every key).
pub async fn same_key_twice_applies_in_order(h: &impl Harness, algo: Algorithm) {
    let pol = policy(algo, 5, HOUR, 5, 1);
    let key = key_of(h, &format!("twice-{algo}"), &pol);
    let twice = [(key.as_str(), &pol), (key.as_str(), &pol)];
    for n in 1..=2 {
        let v = check_on(h, 0, &twice).await;
        assert!(v.is_admitted(), "{algo}: call {n}");
        let left: Vec<u64> = v.decisions().iter().map(|d| d.remaining).collect();
        assert_eq!(left, [5 - (2 * n - 1), 5 - 2 * n], "{algo}: call {n}");
    }
    // One unit left: the first limit alone would fit, the second not; nothing is taken.
    for _ in 0..3 {
        let v = check_on(h, 0, &twice).await;
        assert!(!v.is_admitted(), "{algo}");
        let ds = v.decisions();
        assert!(ds[0].admitted && !ds[1].admitted, "{algo}: {ds:?}");
        assert_eq!((ds[0].remaining, ds[1].remaining), (1, 1), "{algo}: {ds:?}");
        assert!(
            ds[1].retry_after.is_some_and(|r| r > Duration::ZERO),
            "{algo}: {ds:?}"
        );
    }
    let last = check_one(h, &key, &pol).await;
    assert!(last.admitted, "{algo}: the rejected calls took nothing");
    assert_eq!(last.remaining, 0, "{algo}");
    assert!(!check_one(h, &key, &pol).await.admitted, "{algo}");
}

/// The sliding counter within one aligned window and across into the next: `num` admitted in a
/// window, then, in the next, the previous window's count weighs its share of the trailing
/// interval — what the estimate admits and when `retry_after` says it will.
pub async fn sliding_counter_weighs_the_previous_window(h: &impl Harness) {
    until_in_time("sliding counter weighs", |attempt| {
        sliding_counter_weighs_try(h, attempt)
    })
    .await;
}

async fn sliding_counter_weighs_try(h: &impl Harness, attempt: u32) -> Try {
    let period = Duration::from_secs(1);
    let p = policy(Algorithm::SlidingCounter, 4, period, 4, 1);
    // The five calls must fall in one aligned window: on a stalled machine they can straddle
    // its end (then the next window's weighing answers, which the rest does not describe).
    // Within one window every call's `reset_after` (the window's end plus a period) only
    // shrinks, and stays above a period.
    let key = key_of(h, &format!("counter-weighs-{attempt}"), &p);
    let mut calls = Vec::with_capacity(5);
    for _ in 0..5 {
        calls.push(check_one(h, &key, &p).await);
    }
    let one_window = calls
        .windows(2)
        .all(|w| w[1].reset_after <= w[0].reset_after)
        && calls[4].reset_after > period;
    if !one_window {
        return Try::TooSlow;
    }
    for (left, d) in (0..4).rev().zip(&calls) {
        assert!(d.admitted, "a call within the quota");
        assert_eq!(d.remaining, left);
        assert!(d.reset_after > Duration::ZERO && d.reset_after <= 2 * period);
    }
    let d = calls[4];
    assert!(!d.admitted, "a 5th call in the window");
    let retry = d.retry_after.unwrap_or_default();
    // 4 in this window: one more fits once 1/4 of the next window is gone (4·3/4 + 1 = 4), and
    // at most when the window ends plus that quarter.
    assert!(
        retry > period / 4 && retry <= period + period / 4 + TOLERANCE,
        "{retry:?}"
    );
    let mut t = StoreTime::start();
    t.pass(h, retry + TOLERANCE).await;
    let d = check_one(h, &key, &p).await;
    if t.upper() < retry + period / 8 {
        assert!(
            d.admitted,
            "rejected just after retry_after ({retry:?}): {d:?}"
        );
    }
    // The previous window still weighs: far fewer than 4 more fit at once.
    let mut more = u64::from(d.admitted);
    while check_one(h, &key, &p).await.admitted {
        more += 1;
        assert!(more <= 4, "the previous window's calls are forgotten");
    }
    Try::Checked
}

/// Every scenario, for every algorithm where it applies.
pub async fn all(h: &impl Harness) {
    for algo in Algorithm::ALL {
        exactness(h, algo).await;
    }
    for algo in FROM_FIRST_CALL {
        cost_takes_units(h, algo).await;
        decision_numbers(h, algo).await;
    }
    fixed_admits_again_after_window(h).await;
    sliding_has_no_boundary_burst(h).await;
    sliding_counter_weighs_the_previous_window(h).await;
    for algo in BUCKETS {
        buckets_refill_at_rate(h, algo).await;
    }
    stacked_rejection_consumes_nothing(h).await;
    for algo in Algorithm::ALL {
        same_key_twice_applies_in_order(h, algo).await;
    }
}
