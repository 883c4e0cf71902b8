//! Conformance: the algorithms' Rust rules (`ratelimit_runtime::algorithm`, hosted by the
//! memory store) and the exact Lua the Redis and Redis Cluster stores send decide alike, field
//! by field (`admitted`, `limit`, `remaining`, `reset_after`, `retry_after`), on seeded random
//! traces.
//!
//! The Lua runs in an embedded Lua 5.1 (the version Redis embeds) against an in-process
//! stand-in for the Redis commands the scripts use, whose `TIME` the test sets, so both sides
//! see the same microsecond (`conformance/standin.rs`). The stand-in is kept honest by
//! comparing it with a real `redis-server`: command by command, and on a smaller run of the same
//! kind of traces (long periods, so that the real clock moving does not matter).
//!
//! Time: the memory store runs on a clock the test sets (it can go back, to plant state
//! stamped in the future); the stand-in's `TIME` is that clock plus [`EPOCH_US`], a whole number
//! of milliseconds (fixed windows depend on where milliseconds start).

mod declared;
mod fast_paths;
mod lua_store;
mod model;
mod scripts;
mod slots;
mod standin;
pub(crate) mod trace;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ratelimit_runtime::algorithm::fixed;
use ratelimit_runtime::store::Clock;
use ratelimit_runtime::store::redis::ReplyReceipt;
use ratelimit_runtime::{
    Algorithm, Decision, MemoryStore, Policy, RedisStore, Store, StoreError, Verdict, store::Check,
};
use ratelimit_tests::redis_server::{self, RedisServer};
use redis::aio::MultiplexedConnection;

use lua_store::{LuaStore, Mode, compensate_call, driver_call};
use model::Model;
use standin::{LuaRedis, Reply};
use trace::Rng;

/// The stand-in's `TIME` minus the memory store's clock, µs: November 2023, a whole number of
/// weeks, so that every period of the traces (1 ms … 1 day, 3 and 7 ms) divides it and the
/// sliding counter's aligned windows fall at the same instants on both sides.
const EPOCH_US: u64 = 1_700_092_800_000_000;

/// Where the memory clock starts, µs (116 days: room to set it back by periods of a day).
const START_US: u64 = 10_000_000_000_000;

/// A clock that can be set back, as a wall clock can (the memory store's own clocks cannot).
#[derive(Debug, Clone, Default)]
struct SettableClock(Arc<AtomicU64>);

impl Clock for SettableClock {
    fn now(&self) -> Duration {
        Duration::from_micros(self.0.load(Ordering::SeqCst))
    }
}

/// The sides on one clock: the memory store, and the Lua on the stand-in both ways the Redis
/// stores run it (the library's functions, and the scripts for servers without Functions).
struct Pair {
    clock: SettableClock,
    memory: MemoryStore,
    lua: LuaStore,
    lua_scripts: LuaStore,
    now: u64,
    runtime: tokio::runtime::Runtime,
}

impl Pair {
    fn new() -> Self {
        let clock = SettableClock::default();
        clock.0.store(START_US, Ordering::SeqCst);
        Self {
            memory: MemoryStore::with_clock(clock.clone()),
            clock,
            lua: LuaStore::new(EPOCH_US + START_US),
            lua_scripts: LuaStore::with_mode(EPOCH_US + START_US, Mode::Scripts),
            now: START_US,
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime"),
        }
    }

    /// The same sides, the Lua ones running `sources` (the stores' texts, or mutants of them).
    fn with_sources(sources: &scripts::Sources) -> Self {
        let mut pair = Self::new();
        pair.lua = LuaStore::with_sources(EPOCH_US + START_US, Mode::Functions, sources.clone());
        pair.lua_scripts =
            LuaStore::with_sources(EPOCH_US + START_US, Mode::Scripts, sources.clone());
        pair
    }

    fn set(&mut self, now: u64) {
        self.now = now;
        self.clock.0.store(now, Ordering::SeqCst);
        self.lua.lua().set_time_us(EPOCH_US + now);
        self.lua_scripts.lua().set_time_us(EPOCH_US + now);
    }

    /// The same call through the stores' `Store::check`: memory, the library's functions,
    /// the scripts.
    #[allow(clippy::type_complexity, reason = "three results side by side")]
    fn check(
        &self,
        checks: &[Check<'_>],
    ) -> (
        Result<Verdict, StoreError>,
        Result<Verdict, StoreError>,
        Result<Verdict, StoreError>,
    ) {
        let memory: &dyn Store = &self.memory;
        let lua: &dyn Store = &self.lua;
        let scripts: &dyn Store = &self.lua_scripts;
        let now = self.now;
        self.runtime.block_on(async {
            (
                memory.check(checks).await.map(|v| as_sent(checks, v, now)),
                lua.check(checks).await,
                scripts.check(checks).await,
            )
        })
    }
}

/// The verdict of `checks` at `now_us` (µs, either clock: they differ by whole milliseconds)
/// as the Redis stores answer it: a call sent to the fixed windows' own function
/// answers its waits from the start of the current millisecond (`fixed::whole_ms`); any other
/// call as the rules give them.
pub(crate) fn as_sent(checks: &[Check<'_>], v: Verdict, now_us: u64) -> Verdict {
    let texts = ratelimit_runtime::store::redis::script_sources();
    if texts.for_checks(checks).0 != texts.fixed_only_function {
        return v;
    }
    let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    let whole = |us: u64| Duration::from_micros(fixed::whole_ms(us, now_us));
    Verdict::new(
        v.decisions()
            .iter()
            .map(|d| {
                Decision::new(
                    d.admitted,
                    d.limit,
                    d.remaining,
                    whole(us(d.reset_after)),
                    whole(d.retry_after.map_or(0, us)),
                )
            })
            .collect(),
    )
}

/// One limit of a trace: a caller's key and its policy (the cost is drawn per call).
#[derive(Debug, Clone)]
struct Limit {
    key: String,
    policy: Policy,
}

/// Steps compared, per algorithm (each limit of each call counts once).
#[derive(Debug, Default)]
struct Counts(BTreeMap<&'static str, u64>);

impl Counts {
    fn add_all(&mut self, algorithms: &[Algorithm]) {
        for a in algorithms {
            *self.0.entry(a.as_str()).or_default() += 1;
        }
    }

    fn add(&mut self, checks: &[Check<'_>]) {
        for c in checks {
            *self.0.entry(c.policy.algorithm().as_str()).or_default() += 1;
        }
    }

    fn at_least(&self, n: u64) {
        for a in Algorithm::ALL {
            let got = self.0.get(a.as_str()).copied().unwrap_or(0);
            assert!(got >= n, "only {got} steps of {a:?} compared: {:?}", self.0);
        }
    }
}

/// How a trace moves.
#[derive(Debug, Clone, Copy)]
struct Shape {
    steps: usize,
    /// Percent of steps that set the clock back (up to two periods).
    back: u64,
    /// Each call checks every limit (stacked; all but the last in a quarter of the calls,
    /// when there are three or more) instead of one caller's.
    stacked: bool,
}

fn describe(checks: &[Check<'_>]) -> String {
    checks
        .iter()
        .map(|c| {
            let p = c.policy;
            format!(
                "{}[{:?} num={} period={}ms burst={} cost={}]",
                c.key,
                p.algorithm(),
                p.limit(),
                p.period_ms(),
                p.burst(),
                p.cost()
            )
        })
        .collect::<Vec<_>>()
        .join(" + ")
}

/// The longest period and the shortest unit time (period / num) of `limits`, µs.
fn scales(limits: &[Limit]) -> (u64, u64) {
    let period = limits
        .iter()
        .map(|l| l.policy.period_ms() * 1000)
        .max()
        .unwrap_or(1000);
    let unit = limits
        .iter()
        .map(|l| (l.policy.period_ms() * 1000 / l.policy.limit()).max(1))
        .min()
        .unwrap_or(1);
    (period, unit)
}

/// The µs of the longest `retry_after` among rejected limits (0 when admitted).
fn retry_of(v: &Verdict) -> u64 {
    v.decisions()
        .iter()
        .filter_map(|d| d.retry_after)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .max()
        .unwrap_or(0)
}

/// Where the clock may go back to from `now`: not before the time any state that is idle
/// now went idle (`whole_at`, from each key's last `reset_after`). Going back further would
/// bring idle state back to life on one side only: the memory store keeps an idle entry until
/// a sweep, Redis a key until its millisecond TTL. Live state may be stamped in the future.
fn back_floor(whole_at: &BTreeMap<String, u64>, now: u64) -> u64 {
    whole_at
        .values()
        .filter(|&&w| w <= now)
        .max()
        .copied()
        .unwrap_or(0)
}

/// Records, per key, when its quota is whole again (now + `reset_after`).
fn note_whole(whole_at: &mut BTreeMap<String, u64>, checks: &[Check<'_>], v: &Verdict, now: u64) {
    let mut seen: BTreeMap<&str, u64> = BTreeMap::new();
    for (c, d) in checks.iter().zip(v.decisions()) {
        let at = now + u64::try_from(d.reset_after.as_micros()).unwrap_or(u64::MAX);
        let e = seen.entry(c.key).or_insert(0);
        *e = (*e).max(at);
    }
    for (k, at) in seen {
        whole_at.insert(k.to_owned(), at);
    }
}

/// Runs one trace through both stores and compares every decision; panics on the first
/// difference with the trace's seed, the step, both verdicts and the steps before it.
fn run_trace(seed: u64, limits: &[Limit], shape: Shape, counts: &mut Counts) {
    let mut rng = Rng::new(seed);
    let mut pair = Pair::new();
    let (period, unit) = scales(limits);
    let mut retry = 0;
    let mut history: Vec<String> = Vec::new();
    let mut whole_at = BTreeMap::new();
    for step in 0..shape.steps {
        let mut now = pair.now + trace::step(&mut rng, pair.now, period, unit, retry);
        if rng.chance(shape.back) {
            now = now
                .saturating_sub(rng.between(1, 2 * period))
                .max(back_floor(&whole_at, now));
        }
        pair.set(now);
        let chosen: Vec<&Limit> = if shape.stacked {
            // Now and then one limit fewer, so that the scripts' per-limit tables (made for
            // two limits) are filled past that size and to it within one trace.
            let fewer = limits.len() > 2 && rng.chance(25);
            limits[..limits.len() - usize::from(fewer)].iter().collect()
        } else {
            vec![rng.pick(limits)]
        };
        let policies: Vec<Policy> = chosen
            .iter()
            .map(|l| {
                let cost = trace::cost(&mut rng, &l.policy);
                l.policy.with_cost(cost).expect("cost within capacity")
            })
            .collect();
        let checks: Vec<Check<'_>> = chosen
            .iter()
            .zip(&policies)
            .map(|(l, p)| Check::new(&l.key, p))
            .collect();
        let (memory, lua, scripts) = pair.check(&checks);
        let line = format!(
            "step {step} at {now} µs: {}\n  memory: {memory:?}\n  lua:    {lua:?}\n  script: {scripts:?}",
            describe(&checks)
        );
        match (&memory, &lua, &scripts) {
            (Ok(m), Ok(l), Ok(e)) if m == l && m == e => {}
            _ => {
                let before = history[history.len().saturating_sub(12)..].join("\n");
                panic!(
                    "trace seed {seed:#x}: Rust and Lua differ\n{line}\nsteps before:\n{before}"
                );
            }
        }
        // Every key the scripts write has a TTL, also after a rejected call that named one
        // key twice (its working copies are dropped; the keys keep their own expiry).
        for lua in [&pair.lua, &pair.lua_scripts] {
            let left = lua.lua().db().immortal_keys();
            assert!(
                left.is_empty(),
                "trace seed {seed:#x}: keys left without a TTL: {left:?} after\n{line}"
            );
        }
        if let Ok(v) = &memory {
            note_whole(&mut whole_at, &checks, v, now);
        }
        retry = memory.map_or(0, |v| retry_of(&v));
        counts.add(&checks);
        history.push(line);
    }
}

fn limits_of(rng: &mut Rng, algorithms: &[Algorithm], trace: u64) -> Vec<Limit> {
    algorithms
        .iter()
        .enumerate()
        .map(|(i, &a)| Limit {
            key: format!("t{trace}:{i}:{}", a.as_str()),
            policy: trace::policy(rng, a),
        })
        .collect()
}

/// At least 10,000 random steps per algorithm: one to three callers of one algorithm per
/// trace, each with its own policy (`burst` ≠ `num`, 3 per 10 s, 1 ms and 1 day periods), costs
/// from 1 to the capacity, time steps of 0 and 1 µs, across millisecond boundaries, periods and
/// exactly `retry_after`; a fifth of the traces also set the clock back now and then.
#[test]
fn each_algorithm_decides_alike_in_rust_and_lua_on_random_traces() {
    let mut counts = Counts::default();
    for (n, algorithm) in Algorithm::ALL.into_iter().enumerate() {
        for t in 0..48_u64 {
            let seed = 0xC0FF_EE00 + 1000 * n as u64 + t;
            let mut rng = Rng::new(seed ^ 0x5EED);
            let callers = usize::try_from(rng.between(1, 3)).unwrap_or(1);
            let limits = limits_of(&mut rng, &vec![algorithm; callers], t);
            let back = if t % 5 == 0 { 3 } else { 0 };
            let shape = Shape {
                steps: 220,
                back,
                stacked: false,
            };
            run_trace(seed, &limits, shape, &mut counts);
        }
    }
    counts.at_least(10_000);
    println!("steps compared: {:?}", counts.0);
}

/// Stacked limits of mixed algorithms in one call (the combined script, all or nothing), with
/// the same key named twice in a third of the traces (each limit sees what the earlier took).
#[test]
fn stacked_limits_of_mixed_algorithms_decide_alike() {
    let mut counts = Counts::default();
    for t in 0..60_u64 {
        let seed = 0x57AC_0000 + t;
        let mut rng = Rng::new(seed ^ 0x5EED);
        let n = usize::try_from(rng.between(2, 4)).unwrap_or(2);
        let algorithms: Vec<Algorithm> = (0..n).map(|_| *rng.pick(&Algorithm::ALL)).collect();
        let mut limits = limits_of(&mut rng, &algorithms, t);
        if t % 3 == 0 {
            let twice = limits[0].clone();
            limits.insert(1, twice);
        }
        let shape = Shape {
            steps: 150,
            back: if t % 4 == 0 { 3 } else { 0 },
            stacked: true,
        };
        run_trace(seed, &limits, shape, &mut counts);
    }
    println!("steps compared: {:?}", counts.0);
}

/// The clock set back often (up to two periods), so state is read stamped in the future:
/// buckets and logs are re-stamped to now and windows cut to one period, alike on both sides.
#[test]
fn state_stamped_in_the_future_is_read_alike() {
    let mut counts = Counts::default();
    for (n, algorithm) in Algorithm::ALL.into_iter().enumerate() {
        for t in 0..12_u64 {
            let seed = 0xF0_7E00 + 100 * n as u64 + t;
            let mut rng = Rng::new(seed ^ 0x5EED);
            let mut algorithms = vec![algorithm];
            if t % 2 == 1 {
                algorithms.push(*rng.pick(&Algorithm::ALL));
            }
            let limits = limits_of(&mut rng, &algorithms, t);
            let shape = Shape {
                steps: 150,
                back: 12,
                stacked: t % 2 == 1,
            };
            run_trace(seed, &limits, shape, &mut counts);
        }
    }
    counts.at_least(1000);
    println!("steps compared: {:?}", counts.0);
}

/// A sliding log of 1,200 per second with calls of up to 1,200 units: the scripts' `ZADD` in
/// batches of 500 and the future-stamp shift in batches of 1,000 arguments.
#[test]
fn sliding_calls_of_many_units_decide_alike() {
    let mut counts = Counts::default();
    for t in 0..8_u64 {
        let limits = [Limit {
            key: format!("big{t}"),
            policy: Policy::from_parts(Algorithm::Sliding, 1200, 1000, 1200, 1).expect("valid"),
        }];
        let shape = Shape {
            steps: 40,
            back: 15,
            stacked: false,
        };
        run_trace(0xB16_0000 + t, &limits, shape, &mut counts);
    }
}

/// A call of more limits than the scripts pack in one `struct.pack` (the prelude's
/// `PACK_CHUNK`, 400 numbers: 200 rows without receipts, 80 with them) is answered limit by
/// limit all the same, every row in its limit's place: on the fixed windows' own function and
/// on the driver, as functions and as scripts, with the receipts in the reply and without.
#[test]
fn a_stack_of_more_limits_than_one_pack_is_answered_limit_by_limit() {
    const LIMITS: u64 = 210;
    let keys: Vec<String> = (0..LIMITS).map(|i| format!("many{i}")).collect();
    for algorithm in [Algorithm::Fixed, Algorithm::Gcra] {
        // Limit i admits i + 2 in 30 s: each row tells which limit it is.
        let policies: Vec<Policy> = (0..LIMITS)
            .map(|i| Policy::new(algorithm, i + 2, Duration::from_secs(30)).expect("valid"))
            .collect();
        let checks: Vec<Check<'_>> = keys
            .iter()
            .zip(&policies)
            .map(|(key, policy)| Check::new(key, policy))
            .collect();
        for mode in [Mode::Functions, Mode::Scripts] {
            let lua = LuaStore::with_mode(EPOCH_US + START_US, mode);
            let first = lua.take(&checks, None).expect("a verdict");
            let (second, receipts) = lua.take_in_reply(&checks).expect("a verdict");
            for (taken, v) in [(1, first), (2, second)] {
                assert!(v.is_admitted(), "{algorithm}, {mode:?}");
                let rows: Vec<(u64, u64)> = v
                    .decisions()
                    .iter()
                    .map(|d| (d.limit, d.remaining))
                    .collect();
                let expected: Vec<(u64, u64)> =
                    (0..LIMITS).map(|i| (i + 2, i + 2 - taken)).collect();
                assert_eq!(rows, expected, "{algorithm}, {mode:?}, take {taken}");
            }
            assert_eq!(receipts.len(), keys.len(), "{algorithm}, {mode:?}");
            assert!(
                receipts
                    .iter()
                    .all(|r| r.at_us > EPOCH_US && r.reset_us > 0),
                "{algorithm}, {mode:?}: {receipts:?}"
            );
        }
    }
}

/// State with a fraction in it (written by hand or by another program: a GCRA key's value
/// `0.5`, a sliding log's score ending in `.5`) gives an admitted take a reply of whole
/// numbers, which the store reads, never one it refuses (which would fail a call the server
/// counted): the scripts round the figures down.
#[test]
fn a_fraction_in_a_keys_state_gives_a_reply_the_store_reads() {
    let now_us = EPOCH_US + START_US;
    let words =
        |text: String| -> Vec<Vec<u8>> { text.split(' ').map(|w| w.as_bytes().to_vec()).collect() };
    let gcra = Policy::new(Algorithm::Gcra, 10, Duration::from_secs(1)).expect("valid");
    let sliding = Policy::new(Algorithm::Sliding, 10, Duration::from_secs(30)).expect("valid");
    for mode in [Mode::Functions, Mode::Scripts] {
        let lua = LuaStore::with_mode(now_us, mode);
        for command in [
            format!("SET g 0.5 PXAT {}", now_us / 1000 + 50),
            format!("ZADD s {}.5 a", now_us + 3),
            "PEXPIRE s 60000".to_owned(),
        ] {
            let reply = lua.lua().db().command(&words(command));
            assert!(!matches!(reply, Reply::Error(_)), "{reply:?}");
        }
        for (key, policy) in [("g", &gcra), ("s", &sliding)] {
            let checks = [Check::new(key, policy)];
            let taken = lua.take(&checks, None);
            assert!(
                taken.as_ref().is_ok_and(Verdict::is_admitted),
                "{mode:?}, {key}: {taken:?}"
            );
            let taken = lua.take_in_reply(&checks);
            assert!(
                taken
                    .as_ref()
                    .is_ok_and(|(v, receipts)| v.is_admitted() && receipts.len() == 1),
                "{mode:?}, {key}: {taken:?}"
            );
        }
    }
}

/// A key's state that reads as no number (`nan`, `inf`: written by hand or by another program)
/// is decided alike by the usual call of one limit, which the driver hands to its rule's
/// `check_one`, and by the general path (the same call under a call id): the same verdict, or
/// the same error, and the same key after. A NaN compares false both ways, so a shortcut whose
/// test were not exactly the negation of `evaluate`'s would admit what `evaluate` rejects.
#[test]
fn state_that_reads_as_no_number_is_decided_alike_by_the_shortcut_and_the_general_path() {
    let now_us = EPOCH_US + START_US;
    let words =
        |text: String| -> Vec<Vec<u8>> { text.split(' ').map(|w| w.as_bytes().to_vec()).collect() };
    let read = |lua: &LuaStore| {
        let redis = lua.lua();
        let value = redis.db().command(&words("GET k".to_owned()));
        let ttl = redis.db().command(&words("PTTL k".to_owned()));
        format!("{value:?} {ttl:?}")
    };
    for mode in [Mode::Functions, Mode::Scripts] {
        for algorithm in [
            Algorithm::Gcra,
            Algorithm::Leaky,
            Algorithm::Token,
            Algorithm::SlidingCounter,
            Algorithm::Sliding,
        ] {
            let policy = Policy::new(algorithm, 10, Duration::from_secs(1)).expect("valid");
            for value in ["nan", "-nan", "inf", "-inf", "1e999", "nan:1:1", "1:nan:1"] {
                let shortcut = LuaStore::with_mode(now_us, mode);
                let general = LuaStore::with_mode(now_us, mode);
                for lua in [&shortcut, &general] {
                    let set = format!("SET k {value} PXAT {}", now_us / 1000 + 50);
                    let reply = lua.lua().db().command(&words(set));
                    assert!(!matches!(reply, Reply::Error(_)), "{reply:?}");
                }
                let checks = [Check::new("k", &policy)];
                let by_shortcut = shortcut.take(&checks, None);
                let by_general = general.take(&checks, Some("a1"));
                let what = format!("{mode:?}, {algorithm:?}, {value}");
                // An error's first line (its traceback names the functions it ran through).
                let outcome = |r: Result<Verdict, StoreError>| {
                    let text = format!("{r:?}");
                    text.split("\\n").next().unwrap_or_default().to_owned()
                };
                assert_eq!(outcome(by_shortcut), outcome(by_general), "{what}");
                assert_eq!(read(&shortcut), read(&general), "{what}: the key after");
            }
        }
    }
}

/// A call of one limit under a call id whose KEYS leave out its receipt (the key and its block
/// marker only: the shape of the usual call, which the driver answers by a shortcut) is
/// refused, as any call whose declared keys are not its own, and takes nothing: a call id sent
/// without its receipt would otherwise be taken once more on every retry.
#[test]
fn a_call_id_without_its_declared_receipt_is_refused() {
    let now_us = EPOCH_US + START_US;
    for mode in [Mode::Functions, Mode::Scripts] {
        for algorithm in Algorithm::ALL {
            let policy = Policy::new(algorithm, 10, Duration::from_secs(1)).expect("valid");
            let checks = [Check::new("k", &policy)];
            let lua = LuaStore::with_mode(now_us, mode);
            let (keys, mut argv) = lua_store::driver_call(&checks, None);
            argv.push(b"a1".to_vec());
            let reply = lua.run_driver(&checks, &keys, &argv);
            assert!(
                matches!(&reply, Reply::Error(e) if e.contains("receipts")),
                "{mode:?}, {algorithm:?}: {reply:?}"
            );
            let left = lua.lua().db().command(&[b"EXISTS".to_vec(), b"k".to_vec()]);
            assert!(
                matches!(left, Reply::Int(0)),
                "{mode:?}, {algorithm:?}: {left:?}"
            );
        }
    }
}

/// The checks a refund or settle of a call taken at `taken` hands in: mostly the take's, and
/// one time in four other costs (a caller's claim, which the receipt's units bound).
fn claimed(rng: &mut Rng, limits: &[Limit], taken: Vec<Policy>) -> Vec<Policy> {
    if !rng.chance(25) {
        return taken;
    }
    limits
        .iter()
        .map(|l| {
            l.policy
                .with_cost(trace::cost(rng, &l.policy))
                .expect("cost")
        })
        .collect()
}

/// The Redis Cluster store's compensation: takes that leave receipts (the driver with a call
/// id), refunds by receipt (`refund.lua`: at once, late, twice, after the clock went back),
/// settles to what a call used (nothing, less, as much or more than its estimate: a debt) and
/// peeks, through the companion script on the stand-in and through the pure rules
/// (`algorithm::refund`) on a state map; refunds and settles sometimes hand in other costs than
/// the take's (the receipt's units decide).
#[test]
#[allow(
    clippy::too_many_lines,
    reason = "one trace loop: the operations side by side"
)]
fn cluster_takes_with_receipts_and_refunds_decide_alike() {
    let mut counts = Counts::default();
    let mut refunds = 0;
    let mut settles = 0;
    let mut returns = 0;
    for t in 0..60_u64 {
        let seed = 0xC1_0000 + t;
        let mut rng = Rng::new(seed ^ 0x5EED);
        let n = usize::try_from(rng.between(1, 3)).unwrap_or(1);
        let algorithms: Vec<Algorithm> = (0..n).map(|_| *rng.pick(&Algorithm::ALL)).collect();
        let mut limits = limits_of(&mut rng, &algorithms, t);
        if t % 4 == 0 {
            let twice = limits[0].clone();
            limits.push(twice);
        }
        let (period, unit) = scales(&limits);
        let mut whole_at = BTreeMap::new();
        let mut model = Model::default();
        model.now = START_US;
        let lua = LuaStore::new(EPOCH_US + START_US);
        let mut taken: Vec<(String, Vec<Policy>)> = Vec::new();
        // Takes with their receipts in the reply: the id, the policies, the receipts.
        let mut in_reply: Vec<(String, Vec<Policy>, Vec<ReplyReceipt>)> = Vec::new();
        let mut retry = 0;
        let mut history: Vec<String> = Vec::new();
        for step in 0..200 {
            let mut now = model.now + trace::step(&mut rng, model.now, period, unit, retry);
            if rng.chance(3) {
                now = now
                    .saturating_sub(rng.between(1, 2 * period))
                    .max(back_floor(&whole_at, now));
            }
            model.now = now;
            lua.lua().set_time_us(EPOCH_US + now);
            let op = rng.below(100);
            let (what, policies) = if op < 35 || (op < 65 && taken.is_empty()) {
                let policies: Vec<Policy> = limits
                    .iter()
                    .map(|l| {
                        l.policy
                            .with_cost(trace::cost(&mut rng, &l.policy))
                            .expect("cost")
                    })
                    .collect();
                let id = format!("{seed:x}{step:x}");
                if rng.chance(40) {
                    (Op::TakeInReply(id), policies)
                } else {
                    taken.push((id.clone(), policies.clone()));
                    (Op::Take(Some(id)), policies)
                }
            } else if op < 65 && !in_reply.is_empty() && rng.chance(30) {
                returns += 1;
                let i = usize::try_from(rng.below(in_reply.len() as u64)).unwrap_or(0);
                let (id, policies, receipts) = in_reply[i].clone();
                // Sometimes returned again: the first return's marker keeps it from giving
                // back twice.
                if rng.chance(70) {
                    in_reply.remove(i);
                }
                (Op::Return(id, receipts), policies)
            } else if op < 65 && rng.chance(40) {
                settles += 1;
                let i = usize::try_from(rng.below(taken.len() as u64)).unwrap_or(0);
                let (id, policies) = taken[i].clone();
                // Sometimes settled again (a retry): the marker keeps it from settling twice.
                if rng.chance(70) {
                    taken.remove(i);
                }
                // What the call used: nothing, less, the same or more than its estimate (up to
                // several capacities: a debt).
                let actual = policies
                    .iter()
                    .map(|p| match rng.below(4) {
                        0 => 0,
                        1 => rng.between(0, p.cost()),
                        2 => p.cost(),
                        _ => p.cost() + rng.between(1, 3 * p.capacity()),
                    })
                    .collect();
                let policies = claimed(&mut rng, &limits, policies);
                (Op::Settle(id, actual), policies)
            } else if op < 65 {
                refunds += 1;
                let i = if rng.chance(70) {
                    taken.len() - 1
                } else {
                    rng.pick(&(0..taken.len()).collect::<Vec<_>>()).to_owned()
                };
                let (id, policies) = taken[i].clone();
                if rng.chance(50) {
                    taken.remove(i);
                }
                let policies = claimed(&mut rng, &limits, policies);
                (Op::Refund(id), policies)
            } else {
                let policies: Vec<Policy> = limits
                    .iter()
                    .map(|l| {
                        l.policy
                            .with_cost(trace::cost(&mut rng, &l.policy))
                            .expect("cost")
                    })
                    .collect();
                if op < 80 {
                    (Op::Peek, policies)
                } else {
                    (Op::Take(None), policies)
                }
            };
            let checks: Vec<Check<'_>> = limits
                .iter()
                .zip(&policies)
                .map(|(l, p)| Check::new(&l.key, p))
                .collect();
            let (rust, script): (Result<Verdict, StoreError>, _) = match &what {
                Op::Take(id) => (
                    Ok(model.take(&checks, id.as_deref())),
                    lua.take(&checks, id.as_deref()),
                ),
                Op::TakeInReply(id) => {
                    let rust = model.take_in_reply(&checks, id);
                    let expected = if rust.is_admitted() {
                        model.replied(&checks, id, EPOCH_US)
                    } else {
                        Vec::new()
                    };
                    let script = lua.take_in_reply(&checks).map(|(verdict, receipts)| {
                        assert_eq!(
                            receipts, expected,
                            "trace seed {seed:#x} step {step}: the receipts in the reply are the rule's"
                        );
                        // A rejected take took nothing: the store returns nothing of it.
                        if !receipts.is_empty() {
                            in_reply.push((id.clone(), policies.clone(), receipts));
                        }
                        verdict
                    });
                    (Ok(rust), script)
                }
                Op::Return(id, receipts) => (
                    Ok(model.compensate(&checks, Some(id))),
                    lua.give_back(&checks, id, receipts),
                ),
                Op::Refund(id) => (
                    Ok(model.compensate(&checks, Some(id))),
                    lua.compensate(&checks, Some(id)),
                ),
                Op::Settle(id, actual) => (
                    Ok(model.settle(&checks, id, actual)),
                    lua.settle(&checks, id, actual),
                ),
                Op::Peek => (
                    Ok(model.compensate(&checks, None)),
                    lua.compensate(&checks, None),
                ),
            };
            let line = format!(
                "step {step} at {now} µs: {what:?} {}\n  rust: {rust:?}\n  lua:  {script:?}",
                describe(&checks)
            );
            match (&rust, &script) {
                (Ok(r), Ok(l)) if r == l => {}
                _ => {
                    let before = history[history.len().saturating_sub(12)..].join("\n");
                    panic!(
                        "trace seed {seed:#x}: Rust and Lua differ\n{line}\nsteps before:\n{before}"
                    );
                }
            }
            if let Ok(v) = &rust {
                note_whole(&mut whole_at, &checks, v, now);
            }
            retry = rust.map_or(0, |v| retry_of(&v));
            counts.add(&checks);
            history.push(line);
        }
    }
    assert!(refunds > 1000, "only {refunds} refunds");
    assert!(settles > 1000, "only {settles} settles");
    assert!(returns > 500, "only {returns} returns");
    println!(
        "steps compared: {:?}, refunds: {refunds}, settles: {settles}, returns: {returns}",
        counts.0
    );
}

/// Redis 7.0 counts a relative expiry (`PX`, `PEXPIRE`) from its live clock, which runs on
/// while a script runs: a server descheduled between the script's `TIME` and its `SET … PX` (a
/// loaded host) gives the key a later expiry than the script computed. No refund may depend on
/// that: a take made while the server paused, refunded later, gives back what the rules give
/// back. (A fixed window created with `PX` had its refund refused after a pause of over 2 ms,
/// which made the Cluster's cross-slot test fail on loaded machines; it is created with `PXAT`
/// from the script's own clock now.) The same for a take into a window an earlier call opened,
/// which reads the window's end: read with `PTTL`, a pause of over 2 ms read it early, the receipt
/// named that early end, and the refund, finding the key's window ending later, was refused
/// (Redis 6.2 under load lost a unit in the Cluster's cross-slot tests); it reads the stored
/// expiry now. Fixed windows are taken both ways the stores send them: alone, to their own
/// function (`fixed_only.lua`), and in a stack with another algorithm, to the driver, which
/// reads them with `fixed.lua`; the second is run here by sending the call to the driver.
#[test]
fn a_take_made_while_the_server_paused_is_refunded_alike() {
    for algorithm in Algorithm::ALL {
        let via_driver: &[bool] = if algorithm == Algorithm::Fixed {
            &[false, true]
        } else {
            &[false]
        };
        for (opened, lag_ms, via_driver) in [false, true].into_iter().flat_map(|o| {
            [0_u64, 3, 25]
                .into_iter()
                .flat_map(move |l| via_driver.iter().map(move |&d| (o, l, d)))
        }) {
            let policy = Policy::new(algorithm, 10, Duration::from_hours(1))
                .and_then(|p| p.with_cost(2))
                .expect("a policy");
            let key = format!("ratelimit:{{conformance:k=pause}}:{}", algorithm.as_str());
            let checks = [Check::new(&key, &policy)];
            let mut model = Model::default();
            model.now = START_US - 500_000;
            let lua = if via_driver {
                LuaStore::with_sources(EPOCH_US + START_US - 500_000, Mode::Functions, {
                    let mut s = scripts::sources();
                    s.fixed_only_function.clone_from(&s.check_function);
                    s
                })
            } else {
                LuaStore::new(EPOCH_US + START_US - 500_000)
            };
            // The driver answers waits to the µs, the fixed windows' function from the start
            // of the millisecond (`as_sent`): through the driver, what is compared is what
            // each limit admitted and has left.
            let same = |script: &Verdict, rust: &Verdict| {
                let fields = |v: &Verdict| -> Vec<(bool, u64)> {
                    v.decisions()
                        .iter()
                        .map(|d| (d.admitted, d.remaining))
                        .collect()
                };
                if via_driver {
                    fields(script) == fields(rust)
                } else {
                    script == rust
                }
            };
            if opened {
                // An earlier call, half a second before, opened the window (its state is there).
                let first = lua.take(&checks, None).expect("the first call");
                let rust = model.take(&checks, None);
                assert!(
                    same(&first, &rust),
                    "{algorithm:?}: the first call: {first:?} against {rust:?}"
                );
            }
            model.now = START_US;
            lua.lua().set_time_us(EPOCH_US + START_US);
            let case = format!(
                "{algorithm:?}, server paused {lag_ms} ms in the take{}{}",
                if opened { " into an open window" } else { "" },
                if via_driver {
                    ", through the driver"
                } else {
                    ""
                }
            );
            lua.lua().set_lag_us(lag_ms * 1000);
            let take = lua.take(&checks, Some("a1")).expect("the take");
            assert!(take.is_admitted(), "{case}");
            let rust = model.take(&checks, Some("a1"));
            assert!(
                same(&take, &rust),
                "{case}: the take: {take:?} against {rust:?}"
            );
            lua.lua().set_lag_us(0);
            for (at, what) in [
                (START_US + 1_000_000, "the refund"),
                (START_US + 1_000_001, "the next call"),
            ] {
                model.now = at;
                lua.lua().set_time_us(EPOCH_US + at);
                let (rust, script) = if what == "the refund" {
                    (
                        model.compensate(&checks, Some("a1")),
                        lua.compensate(&checks, Some("a1")),
                    )
                } else {
                    (model.take(&checks, None), lua.take(&checks, None))
                };
                let script = script.unwrap_or_else(|e| panic!("{case}: {what}: {e}"));
                assert!(
                    same(&script, &rust),
                    "{case}: {what}: {script:?} against {rust:?}"
                );
            }
            // The refund gave the 2 units back: after the next call and this one (and the first),
            // 6 (4) of 10 are left.
            let after = model.take(&checks, None);
            assert_eq!(
                after.decisions()[0].remaining,
                if opened { 4 } else { 6 },
                "{case}: the model refunded"
            );
        }
    }
}

/// Redis 7.0 counts `PTTL` from its live clock too: a limit whose state is read while the
/// server is paused mid-script must decide as the rules do, and leave the state they leave (the
/// next call, without a pause, agrees field by field). GCRA keeps its state in the key's expiry
/// and read it as now + `PTTL`: a pause read it early, which gave the caller room the rule does
/// not (one unit a millisecond at 1,000 a second); it reads the stored expiry now.
#[test]
fn a_limit_read_while_the_server_paused_decides_alike() {
    for algorithm in Algorithm::ALL {
        let policy = Policy::new(algorithm, 1000, Duration::from_secs(1)).expect("a policy");
        let key = format!("ratelimit:{{conformance:k=read}}:{}", algorithm.as_str());
        let checks = [Check::new(&key, &policy)];
        let mut model = Model::default();
        let lua = LuaStore::new(EPOCH_US + START_US);
        for (step, lag_ms) in [0_u64, 0, 3, 0, 7, 0, 0].into_iter().enumerate() {
            let at = START_US + 100 * u64::try_from(step).unwrap_or(0);
            model.now = at;
            lua.lua().set_time_us(EPOCH_US + at);
            lua.lua().set_lag_us(lag_ms * 1000);
            let script = lua.take(&checks, None).expect("a take");
            let rust = model.take(&checks, None);
            let case = format!("{algorithm:?}, step {step}, server paused {lag_ms} ms");
            let (s, r) = (script.decisions()[0], rust.decisions()[0]);
            // While paused, PTTL reads short: only the reported times may differ.
            assert_eq!(
                (s.admitted, s.remaining),
                (r.admitted, r.remaining),
                "{case}"
            );
            if lag_ms == 0 {
                assert_eq!(script, rust, "{case}");
            }
        }
    }
}

#[derive(Debug)]
enum Op {
    Take(Option<String>),
    /// A take whose receipts come back in its reply (`RedisStore::take_briefly`); the model
    /// takes under the call id, as with receipt keys.
    TakeInReply(String),
    /// The return of such a take by its reply's receipts; the model refunds by its receipts.
    Return(String, Vec<ReplyReceipt>),
    Refund(String),
    Settle(String, Vec<u64>),
    Peek,
}

// ---------------------------------------------------------------------------------------------
// The stand-in against a real redis-server.

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

async fn eval_real(
    conn: &mut MultiplexedConnection,
    script: &str,
    keys: &[Vec<u8>],
    argv: &[Vec<u8>],
) -> Reply {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script).arg(keys.len());
    for k in keys {
        cmd.arg(k.as_slice());
    }
    for a in argv {
        cmd.arg(a.as_slice());
    }
    match cmd.query_async::<redis::Value>(conn).await {
        Ok(v) => Reply::from_redis(&v),
        Err(e) => Reply::Error(e.to_string()),
    }
}

async fn fcall_real(
    conn: &mut MultiplexedConnection,
    function: &str,
    keys: &[Vec<u8>],
    argv: &[Vec<u8>],
) -> Reply {
    let mut cmd = redis::cmd("FCALL");
    cmd.arg(function).arg(keys.len());
    for k in keys {
        cmd.arg(k.as_slice());
    }
    for a in argv {
        cmd.arg(a.as_slice());
    }
    match cmd.query_async::<redis::Value>(conn).await {
        Ok(v) => Reply::from_redis(&v),
        Err(e) => Reply::Error(e.to_string()),
    }
}

/// What a call runs: one of the library's functions (by name) or a script (its text).
enum Entry {
    Function(String),
    Script(String),
}

/// The companion's code in `mode`.
fn companion(lua: &LuaStore, mode: Mode) -> Entry {
    match mode {
        Mode::Functions => Entry::Function(lua.scripts().compensate_function.clone()),
        Mode::Scripts => Entry::Script(lua.scripts().compensate.clone()),
    }
}

async fn server_time_us(conn: &mut MultiplexedConnection) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
    s * 1_000_000 + us
}

/// The command-level comparison: each command's reply appended to one array.
const COMMANDS: &str = r"
local out = {}
local function add(v)
  -- An error reply inside an array would fail the whole reply in the client: as text.
  if type(v) == 'table' and v.err then v = 'error: ' .. v.err end
  out[#out + 1] = v
end
local function ttl_class(k)
  local t = redis.call('PTTL', k)
  if t > 0 then return 'positive' end
  return t
end
redis.call('DEL', 'c:s', 'c:z', 'c:n', 'c:x', 'c:w', 'c:w2', 'c:n2', 'c:g')
add(redis.call('SET', 'c:s', 5, 'PX', 100000))
add(redis.call('GET', 'c:s'))
add(ttl_class('c:s'))
add(redis.call('INCRBY', 'c:s', 3))
add(redis.call('DECRBY', 'c:s', 2))
add(ttl_class('c:s'))
add(redis.call('PEXPIRE', 'c:s', 50000))
add(redis.call('PEXPIRE', 'c:missing', 50000))
add(redis.call('PEXPIREAT', 'c:s', math.floor(tonumber(redis.call('TIME')[1]) * 1000 + 40000)))
add(ttl_class('c:s'))
add(redis.call('PEXPIREAT', 'c:missing', math.floor(tonumber(redis.call('TIME')[1]) * 1000 + 40000)))
add(redis.call('PTTL', 'c:missing'))
add(redis.call('GET', 'c:missing'))
add(redis.call('SET', 'c:n', 1234567890123456))
add(redis.call('GET', 'c:n'))
add(ttl_class('c:n'))
add(redis.call('SET', 'c:n', 0.5))
add(redis.call('GET', 'c:n'))
add(redis.call('SET', 'c:n', 1700000000000001 - 1000000))
add(redis.call('GET', 'c:n'))
add(redis.pcall('INCRBY', 'c:n', 1))
add(redis.pcall('SET', 'c:n', 1, 'PX', 0))
add(redis.call('ZADD', 'c:z', 10, '10', 20, '20', 30, '30'))
add(redis.call('ZADD', 'c:z', 15, '10'))
add(redis.call('ZADD', 'c:z', '1700000000000001', '1700000000000001'))
add(redis.call('ZCOUNT', 'c:z', '(10', '+inf'))
add(redis.call('ZCOUNT', 'c:z', '(15', '+inf'))
add(redis.call('ZCOUNT', 'c:z', '15', '+inf'))
add(redis.call('ZCOUNT', 'c:z', '-inf', '(20'))
add(redis.call('ZCOUNT', 'c:z', '(1700000000000000', '+inf'))
add(redis.call('ZRANGE', 'c:z', 0, -1, 'WITHSCORES'))
add(redis.call('ZRANGE', 'c:z', -1, -1, 'WITHSCORES'))
add(redis.call('ZRANGE', 'c:z', 5, 9, 'WITHSCORES'))
add(redis.call('ZRANGE', 'c:missing', 0, -1, 'WITHSCORES'))
add(redis.call('ZRANGEBYSCORE', 'c:z', '(15', '+inf', 'WITHSCORES', 'LIMIT', 1, 1))
add(redis.call('ZRANGEBYSCORE', 'c:z', '(15', '+inf', 'WITHSCORES', 'LIMIT', 0, 1))
add(redis.call('ZRANGEBYSCORE', 'c:z', '(15', '+inf', 'WITHSCORES', 'LIMIT', 5, 1))
add(ttl_class('c:z'))
add(redis.call('PEXPIRE', 'c:z', 100000))
add(ttl_class('c:z'))
add(redis.call('ZADD', 'c:z', 40, '40'))
add(ttl_class('c:z'))
add(redis.pcall('GET', 'c:z'))
add(redis.pcall('ZCOUNT', 'c:s', '-inf', '+inf'))
add(redis.pcall('ZCOUNT', 'c:z', 'x', '+inf'))
add(redis.call('SET', 'c:g', 7, 'PXAT', math.floor(tonumber(redis.call('TIME')[1]) * 1000 + 5000)))
add(ttl_class('c:g'))
add(redis.call('GET', 'c:g'))
add(redis.call('SET', 'c:g', 8, 'PXAT', 1))
add(redis.call('EXISTS', 'c:g'))
add(redis.call('COPY', 'c:z', 'c:w'))
add(ttl_class('c:w'))
add(redis.call('ZRANGE', 'c:w', 0, -1, 'WITHSCORES'))
add(redis.call('COPY', 'c:missing', 'c:w2'))
add(redis.call('EXISTS', 'c:w2'))
add(redis.call('SET', 'c:g', 7, 'PXAT', math.floor(tonumber(redis.call('TIME')[1]) * 1000 + 5000)))
add(ttl_class('c:g'))
add(redis.call('GET', 'c:g'))
add(redis.call('SET', 'c:g', 8, 'PXAT', 1))
add(redis.call('EXISTS', 'c:g'))
add(redis.call('COPY', 'c:z', 'c:w'))
add(redis.call('ZREMRANGEBYSCORE', 'c:w', '-inf', 20))
add(redis.call('RENAME', 'c:w', 'c:z'))
add(ttl_class('c:z'))
add(redis.call('ZRANGE', 'c:z', 0, -1, 'WITHSCORES'))
add(redis.pcall('RENAME', 'c:missing', 'c:z'))
add(redis.call('SET', 'c:n', 7, 'PX', 60000))
add(redis.call('COPY', 'c:n', 'c:n2'))
add(redis.call('INCRBY', 'c:n2', 3))
add(ttl_class('c:n2'))
add(redis.call('RENAME', 'c:n2', 'c:n'))
add(redis.call('GET', 'c:n'))
add(ttl_class('c:n'))
add(redis.call('ZREMRANGEBYSCORE', 'c:z', '-inf', '+inf'))
add(redis.call('EXISTS', 'c:z'))
add(redis.call('DEL', 'c:z', 'c:s', 'c:n'))
local t = redis.call('TIME')
add(#t == 2 and type(t[1]) == 'string' and type(t[2]) == 'string')
add({ 3.9, -3.9, 2^53, true, false, 'x' })
add({ 1, 2, nil, 4 })
add(redis.error_reply('ERR ratelimit: something'))
add(redis.status_reply('FINE'))
return out
";

/// A limit's argument that is not five whole numbers joined by `:`, each from 1 (the period
/// from 1,000 µs) below 2^53, is refused with an error reply before anything is read or
/// written: digits only, so no sign, fraction, exponent, space, `nan` or `inf`, whatever
/// `tonumber` would make of it. Leading zeros are the same number. So in every script that
/// reads limits (the check, the peek, the refund and the settle, whose units used are digits
/// only too), as functions and as scripts.
#[test]
fn limits_that_are_not_whole_numbers_are_refused() {
    let b = |text: &str| text.as_bytes().to_vec();
    let keys = [b("k"), b("k:b")];
    let with_receipt = [b("k"), b("k:b"), b("k:r:ab:1")];
    // One fixed-window limit: the check goes where the store sends it (its own function,
    // which hands a call it does not decide to the driver).
    let fixed = Policy::new(Algorithm::Fixed, 10, Duration::from_secs(10)).expect("valid");
    let checks = [Check::new("k", &fixed)];
    for mode in [Mode::Functions, Mode::Scripts] {
        let lua = LuaStore::with_mode(EPOCH_US + START_US, mode);
        let refused = |what: &str, reply: Reply, says: &str| match reply {
            Reply::Error(e) => assert!(e.contains(says), "{mode:?}, {what}: {e}"),
            other => panic!("{mode:?}, {what}: expected an error reply, got {other:?}"),
        };
        for bad in [
            "1:10:60000000:10:1.5",
            "1:nan:60000000:10:1",
            "1:10:inf:10:1",
            "1:10:60000000:-inf:1",
            "1:10:60000000:10:9007199254740992",
            "1:10:999:10:1",
            "1:0:60000000:10:1",
            "1:10:60000000:10:x",
            "1:1e1:6e7:10:1",
            "1:10:60000000:10: 5",
            "1:10:60000000:10:-1",
            "1:10:60000000:10",
            "1:10:60000000:10:1:1",
            "1::60000000:10:1",
            "1:10:60000000:10:1\n",
        ] {
            let says = "invalid parameters";
            let check = lua.run_driver(&checks, &keys, &[b(bad)]);
            refused(&format!("check {bad:?}"), check, says);
            let peek = lua.run_companion(&keys, &[b("peek"), b(bad)]);
            refused(&format!("peek {bad:?}"), peek, says);
            let refund = lua.run_companion(&with_receipt, &[b("refund"), b("ab"), b(bad)]);
            refused(&format!("refund {bad:?}"), refund, says);
            let settle = lua.run_companion(&with_receipt, &[b("settle"), b("ab"), b(bad), b("1")]);
            refused(&format!("settle {bad:?}"), settle, says);
        }
        // An unknown algorithm, and an argument without `:` (read as a call id, with no
        // limit).
        for (bad, says) in [
            ("9:10:60000000:10:1", "no algorithm with code 9"),
            ("10", "expected one argument per key"),
            ("", "expected one argument per key"),
        ] {
            let check = lua.run_driver(&checks, &keys, &[b(bad)]);
            refused(&format!("check {bad:?}"), check, says);
        }
        // How long a take's receipts are kept, after its call id: 1 to 10000 whole ms.
        for bad in [
            "0",
            "10001",
            "01500",
            "1.5",
            "-1",
            " 1",
            "1e3",
            "",
            "99999999999999999999",
        ] {
            let limit = b("1:10:60000000:10:1");
            let check = lua.run_driver(&checks, &with_receipt, &[limit, b("ab"), b(bad)]);
            refused(
                &format!("receipts kept {bad:?}"),
                check,
                "expected one argument per key",
            );
        }
        // A settle's units used: digits only, at most 2^52.
        for bad in ["1e0", " 1", "-1", "0x10", "1.0", "", "4503599627370497"] {
            let argv = [b("settle"), b("ab"), b("1:10:60000000:10:1"), b(bad)];
            let settle = lua.run_companion(&with_receipt, &argv);
            refused(
                &format!("settle's units {bad:?}"),
                settle,
                "invalid actual units",
            );
        }
        assert!(
            lua.lua().db().shapes().is_empty(),
            "{mode:?}: a refused call wrote something"
        );
        // Admitted, as the store reads the reply.
        let reply = lua.run_driver(&checks, &keys, &[b("01:010:60000000:10:1")]);
        let admitted = lua_store::parse(&reply, &checks).is_ok_and(|v| v.is_admitted());
        assert!(admitted, "{mode:?}, leading zeros: admitted, got {reply:?}");
    }
}

/// Commands the scripts use, each sent through `redis.call` / `redis.pcall` in one script to the
/// stand-in and to a real server: the same replies. Covers expiry classes, counters that keep
/// their TTL, sorted-set bounds, ranks, limits and score formatting, member updates, emptied
/// sets, COPY / RENAME (values and expiries kept), error replies, number arguments and the Lua → reply conversion.
#[test]
fn standin_answers_commands_like_a_real_server() {
    let server = RedisServer::start();
    let rt = runtime();
    let real = rt.block_on(async {
        let mut conn = server.connection().await;
        eval_real(&mut conn, COMMANDS, &[], &[]).await
    });
    let mut lua = LuaRedis::new();
    lua.allow_undeclared_keys();
    lua.set_time_us(EPOCH_US + START_US);
    let standin = lua.eval(COMMANDS, &[], &[]);
    let (Reply::Array(real), Reply::Array(standin)) = (&real, &standin) else {
        panic!("expected arrays:\nreal:     {real:?}\nstand-in: {standin:?}");
    };
    // The stand-in words errors as Redis 7 does; Redis 6.2 says `invalid expire time in set`
    // (no script reads the text of an error).
    let old_wording = Reply::Bulk(b"error: ERR invalid expire time in set".to_vec());
    let new_wording = Reply::Bulk(b"error: ERR invalid expire time in 'set' command".to_vec());
    let mut diff = String::new();
    for (i, (r, s)) in real.iter().zip(standin).enumerate() {
        let r = if *r == old_wording { &new_wording } else { r };
        if r != s {
            let _ = writeln!(diff, "reply {}: real {r:?}, stand-in {s:?}", i + 1);
        }
    }
    assert_eq!(real.len(), standin.len(), "{diff}");
    assert!(
        diff.is_empty(),
        "the stand-in differs from redis-server:\n{diff}"
    );
    assert_eq!(real.len(), 81);
}

/// What a key holds, comparable across the two servers (times inside values differ).
fn key_shape(key: &str, kind: &str, value: Option<&[u8]>, len: i64, ttl: i64) -> String {
    let fixed = key.contains(":fixed") && !key.contains(":r:");
    let value = if fixed {
        String::from_utf8_lossy(value.unwrap_or_default()).into_owned()
    } else {
        String::new()
    };
    let ttl = match ttl {
        t if t > 0 => "ttl",
        -1 => "no ttl",
        _ => "gone",
    };
    format!("{key} {kind} {value} {len} {ttl}")
}

async fn real_shapes(conn: &mut MultiplexedConnection) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(conn)
        .await
        .expect("KEYS");
    keys.sort();
    let mut out = Vec::new();
    for key in keys {
        let kind: String = redis::cmd("TYPE")
            .arg(&key)
            .query_async(conn)
            .await
            .expect("TYPE");
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(conn)
            .await
            .expect("PTTL");
        let (value, len): (Option<Vec<u8>>, i64) = if kind == "zset" {
            (
                None,
                redis::cmd("ZCARD")
                    .arg(&key)
                    .query_async(conn)
                    .await
                    .expect("ZCARD"),
            )
        } else {
            (
                redis::cmd("GET")
                    .arg(&key)
                    .query_async(conn)
                    .await
                    .expect("GET"),
                0,
            )
        };
        out.push(key_shape(&key, &kind, value.as_deref(), len, ttl));
    }
    out
}

fn standin_shapes(lua: &LuaStore) -> Vec<String> {
    lua.lua()
        .db()
        .shapes()
        .into_iter()
        .map(|(k, s)| {
            let key = String::from_utf8_lossy(&k).into_owned();
            match s {
                standin::Shape::Str { value, ttl } => {
                    key_shape(&key, "string", Some(&value), 0, if ttl { 1 } else { -1 })
                }
                standin::Shape::Zset { len, ttl } => key_shape(
                    &key,
                    "zset",
                    None,
                    i64::try_from(len).unwrap_or(i64::MAX),
                    if ttl { 1 } else { -1 },
                ),
            }
        })
        .collect()
}

/// The same kind of traces, smaller, through the exact scripts on the stand-in and on a real
/// `redis-server`: limits of a day (the real clock moves a few ms meanwhile, which no count
/// notices), takes, takes with receipts, refunds and peeks. `admitted` and `remaining` agree
/// exactly, `reset_after` and `retry_after` within the real time that went by, and both
/// servers are left with the same keys (type, TTL, counters, set sizes). Bucket refunds are left
/// out here: on the real server they give back the units less what drained during the round
/// trip, which the stand-in's exact time covers.
#[test]
#[allow(
    clippy::too_many_lines,
    reason = "one trace loop: the operations side by side, both ways of calling"
)]
fn standin_runs_the_traces_like_a_real_server() {
    let server = RedisServer::start();
    let rt = runtime();
    // An engine without Functions runs every trace through the scripts.
    let functions = !redis_server::skip_without_functions(
        "standin_runs_the_traces_like_a_real_server (its traces through the library: all run as scripts)",
    );
    rt.block_on(async {
        let mut conn = server.connection().await;
        let day = 86_400_000;
        for t in 0..12_u64 {
            let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.expect("FLUSHALL");
            let mut rng = Rng::new(0x4EA1 + t);
            let start = server_time_us(&mut conn).await;
            // Even traces through the library's functions, odd ones through the scripts.
            let mode = if t % 2 == 0 && functions { Mode::Functions } else { Mode::Scripts };
            let lua = LuaStore::with_mode(start, mode);
            if functions {
                let _: () = redis::cmd("FUNCTION")
                    .arg("LOAD")
                    .arg("REPLACE")
                    .arg(&lua.scripts().library)
                    .query_async(&mut conn)
                    .await
                    .expect("FUNCTION LOAD");
            }
            let n = usize::try_from(rng.between(1, 3)).unwrap_or(1);
            let mut limits: Vec<Limit> = (0..n)
                .map(|i| {
                    let a = if t < 8 { Algorithm::ALL[usize::try_from(t % 4).unwrap_or(0)] } else { *rng.pick(&Algorithm::ALL) };
                    let (num, burst) = *rng.pick(&[(4, 9), (1000, 1000), (3, 3), (50, 20)]);
                    Limit {
                        key: format!("r{t}:{i}:{}", a.as_str()),
                        policy: Policy::from_parts(a, num, day, burst, 1).expect("valid"),
                    }
                })
                .collect();
            if t % 3 == 0 {
                limits.push(limits[0].clone());
            }
            let refundable = limits
                .iter()
                .all(|l| matches!(l.policy.algorithm(), Algorithm::Fixed | Algorithm::Sliding));
            let mut taken: Vec<(String, Vec<Policy>)> = Vec::new();
            let mut slowest = 0;
            for step in 0..120_u64 {
                let policies: Vec<Policy> = limits
                    .iter()
                    .map(|l| l.policy.with_cost(trace::cost(&mut rng, &l.policy)).expect("cost"))
                    .collect();
                let op = rng.below(100);
                let (what, policies, script, (keys, argv)) = if op < 60 || !refundable {
                    let id = op.is_multiple_of(2).then(|| format!("{t:x}{step:x}"));
                    let checks: Vec<Check<'_>> = limits.iter().zip(&policies).map(|(l, p)| Check::new(&l.key, p)).collect();
                    let call = driver_call(&checks, id.as_deref());
                    if let Some(id) = id {
                        taken.push((id, policies.clone()));
                    }
                    let (function, script) = lua.scripts().for_checks(&checks);
                    let entry = match mode {
                        Mode::Functions => Entry::Function(function.to_owned()),
                        Mode::Scripts => Entry::Script(script.to_owned()),
                    };
                    ("take", policies, entry, call)
                } else if op < 85 && !taken.is_empty() {
                    let (id, policies) = taken.remove(usize::try_from(rng.below(taken.len() as u64)).unwrap_or(0));
                    let checks: Vec<Check<'_>> = limits.iter().zip(&policies).map(|(l, p)| Check::new(&l.key, p)).collect();
                    let call = compensate_call(&checks, Some(&id));
                    ("refund", policies, companion(&lua, mode), call)
                } else {
                    let checks: Vec<Check<'_>> = limits.iter().zip(&policies).map(|(l, p)| Check::new(&l.key, p)).collect();
                    let call = compensate_call(&checks, None);
                    ("peek", policies, companion(&lua, mode), call)
                };
                let checks: Vec<Check<'_>> = limits.iter().zip(&policies).map(|(l, p)| Check::new(&l.key, p)).collect();
                // The stand-in follows the real clock, read just before the real call.
                let before = server_time_us(&mut conn).await;
                lua.lua().set_time_us(before);
                let (real, standin) = match &script {
                    Entry::Function(name) => (
                        fcall_real(&mut conn, name, &keys, &argv).await,
                        lua.lua().fcall(name, &keys, &argv),
                    ),
                    Entry::Script(text) => (
                        eval_real(&mut conn, text, &keys, &argv).await,
                        lua.lua().eval(text, &keys, &argv),
                    ),
                };
                let real = lua_store::parse(&real, &checks)
                    .unwrap_or_else(|e| panic!("trace {t} step {step} ({mode:?}): the real server answered {e}"));
                let standin = lua_store::parse(&standin, &checks)
                    .unwrap_or_else(|e| panic!("trace {t} step {step}: the stand-in answered {e}"));
                // The stand-in stamps state at `before`, the server a little later: any stamp
                // (this call's or an earlier one's) may be off by the longest call so far.
                slowest = slowest.max(server_time_us(&mut conn).await - before);
                let elapsed = 2 * slowest;
                for (i, (r, s)) in real.decisions().iter().zip(standin.decisions()).enumerate() {
                    let close = |a: Duration, b: Duration| {
                        let (a, b) = (a.as_micros(), b.as_micros());
                        a.abs_diff(b) <= u128::from(elapsed) + 1000
                    };
                    let same = r.admitted == s.admitted
                        && r.limit == s.limit
                        && r.remaining == s.remaining
                        && close(r.reset_after, s.reset_after)
                        && close(
                            r.retry_after.unwrap_or_default(),
                            s.retry_after.unwrap_or_default(),
                        );
                    assert!(
                        same,
                        "trace {t} step {step} ({what}) limit {i} {}: real {r:?}, stand-in {s:?} (calls took up to {slowest} µs)",
                        describe(&checks[i..=i])
                    );
                }
            }
            assert_eq!(
                real_shapes(&mut conn).await,
                standin_shapes(&lua),
                "trace {t}: the two servers hold different keys"
            );
        }
    });
}

/// Every script the stores send, and the library, touches only keys its call declares in
/// KEYS (the limits' keys, their block markers, working copies and receipts, as the stores
/// pass them): no `redis.call` names a key built in Lua (`declared::undeclared_keys`). The
/// stand-in checks the same at run time on every trace of this file.
#[test]
fn scripts_touch_only_the_keys_their_call_declares() {
    let sources = scripts::sources();
    let texts = sources.single.iter().chain([
        &sources.combined,
        &sources.compensate,
        &sources.fixed_only,
        &sources.library,
    ]);
    let mut found = Vec::new();
    for text in texts {
        for undeclared in declared::undeclared_keys(text) {
            if !found.contains(&undeclared) {
                found.push(undeclared);
            }
        }
    }
    assert!(
        found.is_empty(),
        "keys built in Lua instead of declared in KEYS:\n{}",
        found.join("\n")
    );
}

/// The script texts here are the ones a `RedisStore` loads. A server with Functions gets the
/// library only (`FUNCTION LIST … WITHCODE` shows this text; no script is in its cache). A
/// server that refuses Functions (an engine without them, or an ACL user refused `FUNCTION`
/// and `FCALL`) gets the scripts: their SHA1s are in its script cache after
/// `RedisStore::connect`, every driver and fast path, not the companion (loaded by its first
/// call).
#[test]
fn script_texts_are_the_ones_the_store_loads() {
    let server = RedisServer::start();
    let rt = runtime();
    rt.block_on(async {
        let mut conn = server.connection().await;
        let sources = scripts::sources();
        let mut exists = redis::cmd("SCRIPT");
        exists.arg("EXISTS");
        for text in sources
            .single
            .iter()
            .chain([&sources.combined, &sources.fixed_only])
        {
            exists.arg(redis::Script::new(text).get_hash());
        }
        exists.arg(redis::Script::new(&sources.compensate).get_hash());
        let functions = redis_server::engine().has_functions();
        let _store = server.store().await;
        let found: Vec<u8> = exists.query_async(&mut conn).await.expect("SCRIPT EXISTS");
        let drivers = sources.single.len() + 2;
        let loaded = u8::from(!functions);
        let mut expected = vec![loaded; drivers];
        expected.push(0);
        assert_eq!(found, expected, "Functions: {functions}");
        if functions {
            let _: () = redis::cmd("ACL")
                .arg(&["SETUSER", "nofn", "on", ">pw", "~*", "&*", "+@all"])
                .arg(&["-fcall", "-fcall_ro", "-function"])
                .query_async(&mut conn)
                .await
                .expect("ACL SETUSER");
            let url = format!("redis://nofn:pw@127.0.0.1:{}", server.port());
            let _scripts_only = RedisStore::connect(&url).await.expect("connect");
            let found: Vec<u8> = exists.query_async(&mut conn).await.expect("SCRIPT EXISTS");
            let mut expected = vec![1; drivers];
            expected.push(0);
            assert_eq!(found, expected, "a user refused Functions");
        }
        if redis_server::skip_without_functions(
            "script_texts_are_the_ones_the_store_loads (its library part)",
        ) {
            return;
        }
        // And the library, with exactly this code.
        let listed: redis::Value = redis::cmd("FUNCTION")
            .arg("LIST")
            .arg("LIBRARYNAME")
            .arg(ratelimit_runtime::store::redis::script_sources().library_name)
            .arg("WITHCODE")
            .query_async(&mut conn)
            .await
            .expect("FUNCTION LIST");
        let redis::Value::Array(libraries) = &listed else {
            panic!("FUNCTION LIST: {listed:?}");
        };
        assert_eq!(libraries.len(), 1, "{listed:?}");
        let fields: Vec<Reply> = match &libraries[0] {
            redis::Value::Array(f) => f.iter().map(Reply::from_redis).collect(),
            other => panic!("a library: {other:?}"),
        };
        let field = |name: &str| {
            let i = fields
                .iter()
                .position(|f| *f == Reply::Bulk(name.as_bytes().to_vec()))
                .unwrap_or_else(|| panic!("no {name} in {fields:?}"));
            fields[i + 1].clone()
        };
        assert_eq!(
            field("library_code"),
            Reply::Bulk(sources.library.clone().into_bytes())
        );
        let functions = field("functions");
        let Reply::Array(functions) = &functions else {
            panic!("functions: {functions:?}");
        };
        // Each function is [name, <name>, description, …]: its second field.
        let names: Vec<Reply> = functions
            .iter()
            .filter_map(|f| match f {
                Reply::Array(fields) => fields.get(1).cloned(),
                _ => None,
            })
            .collect();
        for name in [
            &sources.check_function,
            &sources.compensate_function,
            &sources.fixed_only_function,
        ] {
            assert!(
                names.contains(&Reply::Bulk(name.as_bytes().to_vec())),
                "{name} in {names:?}"
            );
        }
    });
}

/// Blocks (`Store::block`: the driver's `<key>:b` marker, one `EXISTS` per call; and
/// `Store::extend_block`, which never shortens one), resets
/// (`Store::reset`) and peeks (`Store::peek`: the companion's read-only mode) decide alike in
/// Rust and Lua, field by field, mixed into random traces of calls: a blocked limit rejects
/// until the millisecond after its block's end whatever its state, the other limits of the
/// call report their state and nothing is taken; a reset starts from a full quota; a peek
/// answers what a call would get and changes nothing.
#[test]
fn blocks_resets_and_peeks_decide_alike() {
    let mut counts = Counts::default();
    let mut ops = Ops::default();
    for t in 0..36_u64 {
        let seed = 0xB10C_0000 + t;
        let mut rng = Rng::new(seed ^ 0x5EED);
        let stacked = t % 3 == 0;
        let algorithms: Vec<Algorithm> = if stacked {
            (0..2).map(|_| *rng.pick(&Algorithm::ALL)).collect()
        } else {
            vec![Algorithm::ALL[usize::try_from(t).unwrap_or(0) % Algorithm::ALL.len()]; 2]
        };
        let limits = limits_of(&mut rng, &algorithms, 1000 + t);
        let mut pair = Pair::new();
        let (period, unit) = scales(&limits);
        let mut retry = 0;
        let mut history: Vec<String> = Vec::new();
        for step in 0..160 {
            let now = pair.now + trace::step(&mut rng, pair.now, period, unit, retry);
            pair.set(now);
            let chosen: Vec<&Limit> = if stacked {
                limits.iter().collect()
            } else {
                vec![rng.pick(&limits)]
            };
            let policies: Vec<Policy> = chosen
                .iter()
                .map(|l| {
                    let cost = trace::cost(&mut rng, &l.policy);
                    l.policy.with_cost(cost).expect("cost within capacity")
                })
                .collect();
            let checks: Vec<Check<'_>> = chosen
                .iter()
                .zip(&policies)
                .map(|(l, p)| Check::new(&l.key, p))
                .collect();
            let (what, m, l) = admin_or_check(&pair, &mut rng, &checks, period, &mut ops);
            let line = format!(
                "step {step} at {now} µs: {what} {}\n  memory: {m:?}\n  lua:    {l:?}",
                describe(&checks)
            );
            match (&m, &l) {
                (None, None) => {}
                (Some(Ok(a)), Some(Ok(b))) if a == b => {}
                _ => {
                    let before = history[history.len().saturating_sub(12)..].join("\n");
                    panic!(
                        "trace seed {seed:#x}: Rust and Lua differ\n{line}\nsteps before:\n{before}"
                    );
                }
            }
            let left = pair.lua.lua().db().immortal_keys();
            assert!(
                left.is_empty(),
                "keys without a TTL: {left:?} after\n{line}"
            );
            retry = m.and_then(Result::ok).map_or(0, |v| retry_of(&v));
            history.push(line);
        }
    }
    counts.add_all(&ops.checked);
    println!("{ops:?}; checks {:?}", counts.0);
    assert!(
        ops.blocks > 100
            && ops.extends > 100
            && ops.resets > 100
            && ops.peeks > 300
            && ops.blocked_calls > 100,
        "too few operations: {ops:?}"
    );
}

/// What [`blocks_resets_and_peeks_decide_alike`] did.
#[derive(Debug, Default)]
struct Ops {
    blocks: u64,
    extends: u64,
    blocked_calls: u64,
    resets: u64,
    peeks: u64,
    checked: Vec<Algorithm>,
}

type Answers = Option<Result<Verdict, StoreError>>;

/// One step of that trace on both sides: a block of the call's first key (8%), a reset of its
/// keys (5%), a peek (17%: it must change nothing on either side) or the call itself.
fn admin_or_check(
    pair: &Pair,
    rng: &mut Rng,
    checks: &[Check<'_>],
    period: u64,
    ops: &mut Ops,
) -> (String, Answers, Answers) {
    let keys: Vec<&str> = checks.iter().map(|c| c.key).collect();
    let memory: &dyn Store = &pair.memory;
    let lua: &dyn Store = &pair.lua;
    let scripts: &dyn Store = &pair.lua_scripts;
    // The scripts answer as the library's functions do, at every step.
    let same = |l: &Result<Verdict, StoreError>, s: &Result<Verdict, StoreError>| {
        assert_eq!(
            l.as_ref().ok(),
            s.as_ref().ok(),
            "the library and the scripts differ: {l:?} / {s:?}"
        );
    };
    let roll = rng.below(100);
    if roll < 8 {
        // Whole milliseconds, from 1 ms to two periods; half of them blocks that never
        // shorten a block already there.
        let ms = Duration::from_millis(rng.between(1, (2 * period / 1000).max(2)));
        let one = &keys[..1];
        let extend = roll % 2 == 1;
        pair.runtime.block_on(async {
            for store in [memory, lua, scripts] {
                if extend {
                    store.extend_block(one, ms).await.unwrap();
                } else {
                    store.block(one, ms).await.unwrap();
                }
            }
        });
        if extend {
            ops.extends += 1;
            return (format!("extend_block {ms:?}"), None, None);
        }
        ops.blocks += 1;
        return (format!("block {ms:?}"), None, None);
    }
    if roll < 13 {
        ops.resets += 1;
        pair.runtime.block_on(async {
            memory.reset(&keys).await.unwrap();
            lua.reset(&keys).await.unwrap();
            scripts.reset(&keys).await.unwrap();
        });
        return ("reset".to_owned(), None, None);
    }
    if roll < 30 {
        ops.peeks += 1;
        let before = pair.lua.lua().db().shapes();
        let (m, l, s) = pair.runtime.block_on(async {
            (
                memory.peek(checks).await,
                lua.peek(checks).await,
                scripts.peek(checks).await,
            )
        });
        same(&l, &s);
        let again = pair.runtime.block_on(memory.peek(checks));
        assert_eq!(
            m.as_ref().ok(),
            again.as_ref().ok(),
            "a memory peek changed the state"
        );
        assert_eq!(before, pair.lua.lua().db().shapes(), "a Lua peek wrote");
        return ("peek".to_owned(), Some(m), Some(l));
    }
    let (m, l, s) = pair.check(checks);
    same(&l, &s);
    if m.as_ref().is_ok_and(|v| !v.is_admitted()) {
        ops.blocked_calls += 1;
    }
    ops.checked
        .extend(checks.iter().map(|c| c.policy.algorithm()));
    ("check".to_owned(), Some(m), Some(l))
}

/// A blocked key rejects every call, whatever its state, with the block's own wait, and a
/// call that names it with another limit takes nothing from that limit; the block ends at the
/// millisecond after its TTL (on both sides).
#[test]
#[allow(
    clippy::duration_suboptimal_units,
    reason = "Duration::from_hours is newer than the workspace's rust-version"
)]
fn a_block_rejects_until_its_end_and_takes_nothing() {
    let pair = Pair::new();
    let p = Policy::new(Algorithm::Token, 100, Duration::from_secs(1)).unwrap();
    let checks = [Check::new("a", &p), Check::new("b", &p)];
    let memory: &dyn Store = &pair.memory;
    let lua: &dyn Store = &pair.lua;
    for store in [memory, lua] {
        pair.runtime.block_on(async {
            store
                .block(&["a"], Duration::from_secs(3600))
                .await
                .unwrap();
            let v = store.check(&checks).await.unwrap();
            assert!(!v.is_admitted(), "{}", store.name());
            let [a, b] = v.decisions() else { panic!() };
            assert_eq!(a.retry_after, Some(Duration::from_millis(3_600_001)));
            assert_eq!((a.remaining, b.remaining), (0, 100), "{}", store.name());
            // b was not taken.
            let b_alone = store.check(&checks[1..]).await.unwrap();
            assert_eq!(b_alone.decisions()[0].remaining, 99, "{}", store.name());
        });
    }
}
