//! GCRA's fast path (`scripts/gcra_only.lua`: a call of one GCRA limit without a call id) held
//! to the rule it is a second home of, and the test that they are: every mutant of the fast
//! path's text in [`MUTANTS`] is caught by the same checks that the real text passes.
//!
//! The checks: random traces of takes (with a call id, which the driver answers, and without,
//! which the fast path decides at the start of the clock's millisecond: `gcra::redis_decides_at`),
//! refunds, settles and peeks against the Rust rule ([`Model`]), the clock set back now and
//! then; blocks and resets against the memory store; and, from planted states and arguments
//! (a backlog, a tat far ahead, a value without a TTL, values that are no number, another
//! type, a block, a marker without a TTL, a call id, a wrong marker or code, a cost past the
//! burst, a limit the driver refuses), the fast path against the driver on the same state at a
//! whole millisecond, where the two decide at the same instant: the same reply and the same
//! keys after.

use ratelimit_runtime::algorithm::{Params, gcra};
use ratelimit_runtime::{Algorithm, Policy, StoreError, Verdict, store::Check};

use super::fast_paths::{
    assert_rule_kept_and_mutants_caught, block_trace, compare_step, mutated_in, planted_run, words,
};
use super::lua_store::{LuaStore, Mode};
use super::model::Model;
use super::scripts::Sources;
use super::trace::{self, Rng};
use super::{EPOCH_US, START_US, next_time, note_whole, retry_of};

/// The fast path's text, as the runtime embeds it.
const GCRA_ONLY: &str = include_str!("../../../../ratelimit-runtime/src/scripts/gcra_only.lua");

/// Mutants of `gcra_only.lua`: (what it breaks, the text, its replacement). Each must be
/// caught by [`differs`].
const MUTANTS: &[(&str, &str, &str)] = &[
    (
        "admits one unit past the tolerance",
        "if after > tau then",
        "if after > tau + t then",
    ),
    (
        "rejects a call that fits exactly",
        "if after > tau then",
        "if after >= tau then",
    ),
    (
        "an admitted call writes nothing",
        "  redis.call('SET', key, int(math.fmod(after, 1000)), 'PX', int(floor_div(after, 1000) + 1))\n",
        "",
    ),
    (
        "the new tat a millisecond early",
        "int(floor_div(after, 1000) + 1))",
        "int(floor_div(after, 1000)))",
    ),
    (
        "the new tat without its microseconds",
        "int(math.fmod(after, 1000)), 'PX'",
        "0, 'PX'",
    ),
    (
        "the backlog read a millisecond short",
        "backlog = (pttl - 1) * 1000 + us",
        "backlog = (pttl - 2) * 1000 + us",
    ),
    (
        "the backlog read without its microseconds",
        "backlog = (pttl - 1) * 1000 + us",
        "backlog = (pttl - 1) * 1000",
    ),
    (
        "decides a backlog past the tolerance itself",
        "      if backlog > tau then\n        return check(KEYS, ARGV)\n",
        "      if false then\n        return check(KEYS, ARGV)\n",
    ),
    (
        "brings a backlog past the tolerance back to it",
        "      if backlog > tau then\n        return check(KEYS, ARGV)\n",
        "      if backlog > tau then\n        backlog = tau\n        redis.call('SET', key, int(math.fmod(tau, 1000)), 'PX', int(floor_div(tau, 1000) + 1))\n",
    ),
    (
        "a tat behind the clock counts as a backlog",
        "      elseif not (backlog > 0) then\n        backlog = 0\n",
        "      elseif false then\n        backlog = 0\n",
    ),
    ("skips a block", "  if blocked then\n", "  if false then\n"),
    (
        "a block ends a millisecond early",
        "local left = pttl * 1000 + 1000",
        "local left = pttl * 1000",
    ),
    (
        "a rejection reports the remaining after the call",
        "clamp(p.burst - ceil_div(backlog, t), p.burst)",
        "clamp(p.burst - ceil_div(after, t), p.burst)",
    ),
    (
        "a retry a unit early",
        "backlog, after - tau }",
        "backlog, after - tau - t }",
    ),
    (
        "one more remaining after a take",
        "return { 1, clamp(p.burst - ceil_div(after, t), p.burst), after, 0 }",
        "return { 1, clamp(p.burst - ceil_div(after, t) + 1, p.burst), after, 0 }",
    ),
    (
        "takes with a wrong block marker",
        " or KEYS[2] ~= key .. ':b'",
        "",
    ),
    (
        "takes under a call id without its receipt",
        "if #ARGV ~= 5 or #KEYS ~= 2 or",
        "if #KEYS > 3 or",
    ),
];

/// The store's sources with `gcra_only.lua`'s `from` replaced by `to`.
fn mutated(from: &str, to: &str) -> Sources {
    mutated_in(GCRA_ONLY, |s| &mut s.gcra_only, from, to)
}

/// Whether the code in `sources` differs from the rule anywhere in the checks (the first
/// difference, described).
fn differs(sources: &Sources) -> Result<(), String> {
    for t in 0..24 {
        model_trace(sources, 0x6C4A_0000 + t)?;
    }
    for t in 0..8 {
        block_trace(sources, 0xB10C_6C4A + t, gcra_limit)?;
    }
    exact_instant_backlog_is_kept(sources)?;
    planted_states(sources)
}

/// A backlog that calls decided at their exact instant left late in a millisecond is more
/// than the tolerance from the millisecond's start: a call of the fast path in that
/// millisecond must not take it for a clock ahead and cut it back, which would let the calls
/// after it in — again each millisecond. At 10,000 a second with a burst of 10 (T = 100 µs, a
/// tolerance of 1 ms): ten takes under call ids at 900 µs into a millisecond fill the bucket,
/// and nothing more fits in that millisecond, whatever the path.
fn exact_instant_backlog_is_kept(sources: &Sources) -> Result<(), String> {
    let lua = LuaStore::with_sources(EPOCH_US + START_US, Mode::Functions, sources.clone());
    let mut model = Model::default();
    let policy = Policy::new(Algorithm::Gcra, 10_000, std::time::Duration::from_secs(1))
        .and_then(|p| p.with_burst(10))
        .map_err(|e| e.to_string())?;
    let checks = [Check::new("g:{exact}", &policy)];
    let mut admitted = 0;
    let steps = (0..10)
        .map(|i| (900, Some(format!("a{i}"))))
        .chain([(910, None), (920, Some("b1".to_owned())), (950, None)])
        .chain([(960, Some("b2".to_owned())), (999, None)]);
    for (at, id) in steps {
        model.now = START_US + at;
        lua.lua().set_time_us(EPOCH_US + START_US + at);
        let rust = model.take(&checks, id.as_deref());
        let script = lua.take(&checks, id.as_deref());
        compare_step(
            &lua,
            &format!("at {at} µs: take {id:?}"),
            &checks,
            &rust,
            &script,
        )?;
        admitted += usize::from(rust.is_admitted());
    }
    if admitted != 10 {
        return Err(format!(
            "{admitted} calls admitted in one millisecond, the burst is 10"
        ));
    }
    Ok(())
}

/// The real fast path passes every check, and each mutant fails one.
#[test]
fn the_gcra_fast_path_decides_as_the_rule_and_its_mutants_do_not() {
    assert_rule_kept_and_mutants_caught(MUTANTS, mutated, differs);
}

/// A GCRA limit of the traces, and the time one unit takes to come back, µs.
fn gcra_limit(rng: &mut Rng) -> (String, Policy, u64) {
    let policy = trace::policy(rng, Algorithm::Gcra);
    let unit = gcra::emission_interval(&Params::of(&policy));
    ("g:{tag}".to_owned(), policy, unit)
}

/// Takes (without a call id: the fast path; with one: the driver), refunds, settles and peeks
/// on one GCRA limit, against [`Model`].
fn model_trace(sources: &Sources, seed: u64) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let (key, policy, unit) = gcra_limit(&mut rng);
    let lua = LuaStore::with_sources(EPOCH_US + START_US, Mode::Functions, sources.clone());
    let mut model = Model::default();
    model.now = START_US;
    let period = policy.period_ms() * 1000;
    let mut taken: Vec<(String, Policy)> = Vec::new();
    let mut whole_at = std::collections::BTreeMap::new();
    let mut retry = 0;
    for step in 0..150_u64 {
        let now = next_time(&mut rng, model.now, (period, unit, retry), 4, &whole_at);
        model.now = now;
        lua.lua().set_time_us(EPOCH_US + now);
        let op = rng.below(100);
        let fresh = policy
            .with_cost(trace::cost(&mut rng, &policy))
            .expect("cost");
        let (what, p, id) = if op < 55 || taken.is_empty() {
            ("take", fresh, None)
        } else if op < 75 {
            let id = format!("{seed:x}{step:x}");
            taken.push((id.clone(), fresh));
            ("take", fresh, Some(id))
        } else {
            let (id, p) =
                taken[usize::try_from(rng.below(taken.len() as u64)).unwrap_or(0)].clone();
            match op {
                75..=87 => ("refund", p, Some(id)),
                88..=93 => ("settle", p, Some(id)),
                _ => ("peek", p, None),
            }
        };
        let checks = [Check::new(&key, &p)];
        let from = if what == "take" {
            model.decided_at(&checks, id.as_deref())
        } else {
            now
        };
        let (rust, script): (Verdict, Result<Verdict, StoreError>) = match what {
            "take" => (
                model.take(&checks, id.as_deref()),
                lua.take(&checks, id.as_deref()),
            ),
            "refund" => (
                model.compensate(&checks, id.as_deref()),
                lua.compensate(&checks, id.as_deref()),
            ),
            "settle" => {
                let actual = [rng.between(0, 2 * p.cost())];
                let id = id.as_deref().unwrap_or_default();
                (
                    model.settle(&checks, id, &actual),
                    lua.settle(&checks, id, &actual),
                )
            }
            _ => (
                model.compensate(&checks, None),
                lua.compensate(&checks, None),
            ),
        };
        let at = format!("seed {seed:#x} step {step} at {now} µs: {what} {id:?}");
        compare_step(&lua, &at, &checks, &rust, &script)?;
        note_whole(&mut whole_at, &checks, &rust, from);
        retry = retry_of(&rust);
    }
    Ok(())
}

/// From each planted state, with the usual arguments and with ones the fast path hands to
/// the driver: at a whole millisecond, the fast path's reply and the keys after it are the
/// driver's.
fn planted_states(sources: &Sources) -> Result<(), String> {
    // 5 per 10 s, a burst of 5: T = 2 s, a tolerance of 10 s.
    let states: [(&str, &[&str]); 15] = [
        ("absent", &[]),
        ("a backlog", &["SET k 500 PX 3000"]),
        ("a backlog in its last millisecond", &["SET k 999 PX 1"]),
        ("a full backlog", &["SET k 0 PX 10001"]),
        ("a tat far ahead", &["SET k 250 PX 100000000"]),
        ("a value without a TTL", &["SET k 5"]),
        ("not a number", &["SET k abc PX 4000"]),
        ("a negative value", &["SET k -7000 PX 4000"]),
        ("nan", &["SET k nan PX 4000"]),
        ("inf", &["SET k inf PX 4000"]),
        ("a fraction", &["SET k 1.5 PX 4000"]),
        ("a sorted set", &["ZADD k 1 m", "PEXPIRE k 4000"]),
        ("blocked", &["SET k:b 1 PX 4000"]),
        (
            "blocked with a backlog",
            &["SET k:b 1 PX 4000", "SET k 10 PX 7000"],
        ),
        ("a marker without a TTL", &["SET k:b 1", "SET k 10 PX 3000"]),
    ];
    let calls: [(&str, &str, &str); 10] = [
        ("cost 1", "k k:b", "5 5 10000000 5 1"),
        ("cost 3", "k k:b", "5 5 10000000 5 3"),
        ("the whole burst", "k k:b", "5 5 10000000 5 5"),
        ("a cost past the burst", "k k:b", "5 5 10000000 5 6"),
        ("an interval of 1 µs", "k k:b", "5 1000 1000 1000 7"),
        ("a wrong marker", "k j:b", "5 5 10000000 5 1"),
        ("a call id", "k k:b k:r:ab:1", "5 5 10000000 5 1 ab"),
        ("a bad call id", "k k:b k:r:AB:1", "5 5 10000000 5 1 AB"),
        ("another algorithm's code", "k k:b", "1 5 10000000 5 1"),
        ("a limit of 0", "k k:b", "5 0 10000000 5 1"),
    ];
    for (state, commands) in states {
        for (call, keys, argv) in calls {
            let (keys, argv) = (words(keys), words(argv));
            // At a whole millisecond: the driver decides at the fast path's instant.
            let run =
                |function: &str| planted_run(sources, commands, 7000, function, (&keys, &argv));
            let fast = run(&sources.gcra_only_function);
            let driver = run(&sources.check_function);
            if fast != driver {
                return Err(format!(
                    "from {state}, {call}:\n  fast:   {fast:?}\n  driver: {driver:?}"
                ));
            }
        }
    }
    Ok(())
}
