//! The memory store against an oracle it shares no code with: Python's `limits` (the PyPI
//! package users compare this crate with), deciding the same calls at the same instants. Its
//! `FixedWindowRateLimiter` and `MovingWindowRateLimiter` on a `MemoryStorage` keep the rules
//! of our `fixed` (a window opened by the first call, its count set to expire one period later)
//! and `sliding` (at most `num` units in the trailing period); its other strategies are not
//! ours (no buckets, no GCRA; its sliding-window counter rounds the weighted count down, ours
//! does not). `tests/oracle/limits_oracle.py` runs the traces through it; the conformance test
//! shows the Redis scripts decide as the memory store does, so this holds for every store.
//!
//! Traces are seeded and random: calls in whole milliseconds, in bursts at one instant, steps
//! of a few milliseconds, about one call's share of the period, about one period, and long
//! pauses; the sliding log's calls cost 1 to 5 units. One instant is left out by design, where
//! the two libraries' boundaries differ by a millisecond and no trace calls: **exactly one
//! period after an earlier call**. `limits` counts a call exactly one period old as still in the
//! trailing period (`[t − P, t]`) and ends a fixed window exactly one period after it opened;
//! ours counts `(t − P, t]` and ends the window when its Redis key is gone, the millisecond
//! after its expiry (see `algorithm_properties`).
//!
//! The Python comes from `RATELIMIT_TEST_PYTHON`, else from the virtualenv `.ci/run` makes
//! (`target/engines`), where `limits` is installed; without either the test says so and skips.

use std::collections::HashSet;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use ratelimit_runtime::store::ManualClock;
use ratelimit_runtime::{Algorithm, MemoryStore, Policy, store::Check};
use ratelimit_tests::redis_server::say;

use crate::conformance::trace::Rng;

/// Traces per algorithm.
const TRACES: u64 = 300;

/// One caller's calls: `(at_ms, cost)`, in time order.
struct Trace {
    algorithm: Algorithm,
    num: u64,
    period_s: u64,
    calls: Vec<(u64, u64)>,
}

impl Trace {
    fn random(rng: &mut Rng, algorithm: Algorithm) -> Self {
        let num = *rng.pick(&[1, 2, 3, 5, 10, 20, 50]);
        let period_s = *rng.pick(&[1, 2, 3, 10]);
        let period = period_s * 1000; // ms
        let mut at = rng.between(0, 5000);
        let mut seen = HashSet::new();
        let mut calls = Vec::new();
        for _ in 0..rng.between(20, 200) {
            at += match rng.below(100) {
                0..=34 => 0,
                35..=59 => rng.between(1, 5),
                60..=79 => rng.between(1, 2 * period / num),
                80..=91 => period - 5 + rng.between(0, 10),
                _ => rng.between(period, 3 * period),
            };
            // Never exactly one period after an earlier call (see the module docs).
            while at >= period && seen.contains(&(at - period)) {
                at += 1;
            }
            seen.insert(at);
            let cost = if algorithm == Algorithm::Sliding && rng.chance(30) {
                rng.between(1, num.min(5))
            } else {
                1
            };
            calls.push((at, cost));
        }
        Self {
            algorithm,
            num,
            period_s,
            calls,
        }
    }

    fn json(&self) -> String {
        serde_json::json!({
            "algo": self.algorithm.as_str(),
            "num": self.num,
            "period_s": self.period_s,
            "calls": self.calls,
        })
        .to_string()
    }

    /// Whether our memory store admits each call.
    fn ours(&self) -> Vec<u8> {
        let clock = ManualClock::new();
        let store = MemoryStore::with_clock(clock.clone());
        let policy = Policy::new(self.algorithm, self.num, Duration::from_secs(self.period_s))
            .expect("a valid policy");
        let mut now_ms = 0;
        self.calls
            .iter()
            .map(|&(at_ms, cost)| {
                clock.advance(Duration::from_millis(at_ms - now_ms));
                now_ms = at_ms;
                let policy = policy.with_cost(cost).expect("a cost within the capacity");
                let verdict = store
                    .check_now(&[Check::new("caller", &policy)])
                    .expect("the memory store answers");
                u8::from(verdict.is_admitted())
            })
            .collect()
    }
}

/// The Python to run the oracle with, or why there is none.
fn python() -> Result<PathBuf, String> {
    if let Some(python) = std::env::var_os("RATELIMIT_TEST_PYTHON") {
        return Ok(python.into());
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/engines/bin/python");
    if venv.exists() {
        return Ok(venv);
    }
    Err(format!(
        "no RATELIMIT_TEST_PYTHON and no {} (bash .ci/run makes it, with Python's limits)",
        venv.display()
    ))
}

/// `limits`' answers for `traces`, one list per trace, from one Python process.
fn theirs(python: &Path, traces: &[Trace]) -> Vec<Vec<u8>> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("oracle/limits_oracle.py");
    let mut child = Command::new(python)
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", python.display()));
    let input: String = traces.iter().map(|t| t.json() + "\n").collect();
    let mut stdin = child.stdin.take().expect("the oracle's stdin");
    // Written from a thread of its own: the oracle answers while it reads, and a full pipe
    // each way would stop both.
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let stdout = BufReader::new(child.stdout.take().expect("the oracle's stdout"));
    let answers: Vec<Vec<u8>> = stdout
        .lines()
        .map(|line| serde_json::from_str(&line.expect("a line")).expect("a JSON list of 0/1"))
        .collect();
    writer
        .join()
        .expect("the writer")
        .expect("the traces written");
    let status = child.wait().expect("the oracle ends");
    assert!(status.success(), "the oracle failed: {status}");
    assert_eq!(answers.len(), traces.len(), "an answer per trace");
    answers
}

#[test]
fn fixed_and_sliding_decide_every_call_as_pythons_limits_does() {
    let python = match python() {
        Ok(python) => python,
        Err(why) => {
            say(&format!("oracle: skipped: {why}"));
            return;
        }
    };
    let mut traces = Vec::new();
    for (a, algorithm) in [(0, Algorithm::Fixed), (1, Algorithm::Sliding)] {
        for t in 0..TRACES {
            let mut rng = Rng::new(0x0AC1_E000 + 1000 * t + a);
            traces.push(Trace::random(&mut rng, algorithm));
        }
    }
    let answers = theirs(&python, &traces);
    let (mut calls, mut admitted) = (0, 0);
    for (n, (trace, theirs)) in traces.iter().zip(&answers).enumerate() {
        let ours = trace.ours();
        if let Some(i) = ours.iter().zip(theirs).position(|(a, b)| a != b) {
            let (at, cost) = trace.calls[i];
            panic!(
                "trace {n} ({} {} per {} s): call {i} at {at} ms costing {cost}: ours {}, \
                 limits {}\ncalls before it: {:?}",
                trace.algorithm,
                trace.num,
                trace.period_s,
                ours[i],
                theirs[i],
                &trace.calls[..i]
            );
        }
        assert_eq!(ours.len(), theirs.len(), "trace {n}: an answer per call");
        calls += ours.len();
        admitted += ours.iter().map(|&a| usize::from(a)).sum::<usize>();
    }
    // Both answers are exercised: the traces spend their quotas and wait them out.
    assert!(
        admitted > calls / 5 && admitted < calls * 4 / 5,
        "{admitted} of {calls} admitted"
    );
    say(&format!(
        "oracle: {} traces, {calls} calls, {admitted} admitted, alike in both",
        traces.len()
    ));
}
