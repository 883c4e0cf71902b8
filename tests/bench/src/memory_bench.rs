//! Table 3: the memory store against governor's keyed limiter, 2 threads, one hot key and
//! 100,000 keys; then the instructions each spends per check, counted by callgrind (one
//! thread), a figure that does not move with the machine's load.

use std::num::NonZeroU32;
use std::process::Command;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter as Governor};
use ratelimit_runtime::{Algorithm, store::Check, MemoryStore, Policy};

use crate::report::{Table, median, paired_ratio, rate, ratio, verdict};
use crate::{Config, XorShift};

/// The runtime's largest bucket scale (2^52, `PolicyError::BucketTooFine`).
const MAX_BUCKET_SCALE: u64 = 1 << 52;
const THREADS: usize = 2;
const MANY: usize = 100_000;

/// One contender: checks key `i`, answers whether it was admitted.
type CheckFn = Arc<dyn Fn(&String) -> bool + Send + Sync>;

#[derive(Clone, Copy)]
struct Outcome {
    per_sec: f64,
    admitted: f64,
}

/// `THREADS` threads call `check` back to back for `dur` over `keys` (random order; one key
/// is the hot-key case).
fn run(check: &CheckFn, keys: &Arc<Vec<String>>, dur: Duration) -> Outcome {
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (check, keys, barrier) = (check.clone(), keys.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut rng = XorShift::new(t as u64 + 11);
                barrier.wait();
                let start = Instant::now();
                let (mut n, mut admitted) = (0u64, 0u64);
                loop {
                    for _ in 0..256 {
                        let key = &keys[rng.below(keys.len())];
                        admitted += u64::from(check(key));
                    }
                    n += 256;
                    if start.elapsed() >= dur {
                        break;
                    }
                }
                (n, admitted, start.elapsed().as_secs_f64())
            })
        })
        .collect();
    let (mut per_sec, mut n, mut admitted) = (0.0, 0u64, 0u64);
    for h in handles {
        let (count, adm, secs) = h.join().unwrap_or((0, 0, 1.0));
        per_sec += count as f64 / secs;
        n += count;
        admitted += adm;
    }
    Outcome {
        per_sec,
        admitted: admitted as f64 / n.max(1) as f64,
    }
}

fn ours(policy: Policy) -> CheckFn {
    let store = MemoryStore::new();
    Arc::new(move |key: &String| {
        store
            .check_now(&[Check::new(key, &policy)])
            .is_ok_and(|v| v.is_admitted())
    })
}

fn governor() -> CheckFn {
    // A quota no run reaches (10^9 per second, burst u32::MAX), as for ours.
    let quota = Quota::with_period(Duration::from_nanos(1))
        .unwrap_or_else(|| unreachable!("1 ns is a valid period"))
        .allow_burst(NonZeroU32::MAX);
    let limiter: DefaultKeyedRateLimiter<String> = Governor::keyed(quota);
    Arc::new(move |key: &String| limiter.check_key(key).is_ok())
}

/// The key of caller `i`, as the `by = "ip"` path builds it.
fn key(i: usize) -> String {
    let ip = format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255);
    format!("ratelimit:{{app::login:ip={ip}}}:fixed:100:60000")
}

/// The policy of our contender for `a`: a limit no run reaches (but for the sliding log's),
/// under which every key's state stays live from one of its checks to the next, as under the
/// limits applications set (a caller's window or bucket outlives the gap between its calls),
/// so that the 100,000 keys measure checks of held state, as governor's do, and not the
/// removal and re-creation of idle entries (which governor never removes).
///
/// * The sliding log: 1,000 a minute, so that its log stays bounded (most of its hot-key
///   checks are rejections).
/// * A fixed window: 10^12 a minute; the sliding counter: the most `num × period_ms ≤ 2^52`
///   allows. Both windows live a minute.
/// * The buckets and GCRA: one a second with the largest burst the bounds allow (burst ×
///   10^6 µs ≤ 2^52: 4.5 × 10^9 calls, far above a run's), so a key's state drains one call a
///   second and is live at its next check. (At 10^9 a second, their state went idle within a
///   microsecond of each check: at 100,000 keys every check then found its entry swept and
///   made it again.)
fn policy_of(a: Algorithm) -> Policy {
    let minute = Duration::from_secs(60);
    let policy = match a {
        Algorithm::Sliding => Policy::new(a, 1000, minute),
        Algorithm::Fixed => Policy::new(a, 1_000_000_000_000, minute),
        Algorithm::SlidingCounter => {
            Policy::new(a, MAX_BUCKET_SCALE / 60_000, minute)
        }
        _ => Policy::new(a, 1, Duration::from_secs(1))
            .and_then(|p| p.with_burst(MAX_BUCKET_SCALE / 1_000_000)),
    };
    policy.unwrap_or_else(|e| panic!("{a}: {e}"))
}

/// The policy of `a` in the counted runs: [`policy_of`]'s, but the buckets and GCRA drain in an
/// hour instead of a second. Under valgrind the prefill of 100,000 keys takes longer than a
/// second, so at one a second the counted checks found a varying share of their keys idle
/// (swept and made again, by the wall clock's progress), and the rows moved by hundreds of
/// instructions between runs. The same arithmetic on the same state either way.
fn counted_policy_of(a: Algorithm) -> Policy {
    match a {
        Algorithm::Leaky | Algorithm::Token | Algorithm::Gcra => {
            // The largest burst the bounds allow at one an hour (burst × period in µs).
            Policy::new(a, 1, Duration::from_secs(3600))
                .and_then(|p| p.with_burst(crate::redis_bench::MAX_BUCKET_SCALE / 3_600_000_000))
                .unwrap_or_else(|e| panic!("{a}: {e}"))
        }
        _ => policy_of(a),
    }
}

/// Table 3.
pub fn table(cfg: &Config) -> String {
    let hot = Arc::new(vec![key(0)]);
    let many = Arc::new((0..MANY).map(key).collect::<Vec<_>>());
    let mut table = Table::new(&[
        "workload",
        "algorithm",
        "MemoryStore checks/s",
        "governor keyed checks/s",
        "ratio (median of rounds)",
        "admitted",
        "target ≥ 1.0",
    ]);
    for (workload, keys) in [("1 hot key", &hot), ("100,000 keys", &many)] {
        let gov = governor();
        let mine: Vec<(Algorithm, CheckFn)> = Algorithm::ALL
            .into_iter()
            .map(|a| (a, ours(policy_of(a))))
            .collect();
        // The warm-up makes each contender's entries, one contender after the other; the
        // sliding log's last. It is the one whose runs keep allocating and freeing (its log
        // grows and is trimmed), and entries made after it came from the holes it left,
        // spread over more pages: made right after it, the leaky bucket's entries ran 11–32%
        // slower at 100,000 keys than the token bucket's, made next by the same code, and as
        // fast once both were made before it (BENCHMARKS.md, "Table 3's warm-up order").
        run(&gov, keys, cfg.warmup);
        let sliding_last = mine
            .iter()
            .filter(|(a, _)| *a != Algorithm::Sliding)
            .chain(mine.iter().filter(|(a, _)| *a == Algorithm::Sliding));
        for (_, c) in sliding_last {
            run(c, keys, cfg.warmup);
        }
        // Each round: governor, the six algorithms, governor again; the round's governor
        // figure is the mean of its two runs, which bracket ours.
        let mut gr = Vec::new();
        let mut o: Vec<Vec<Outcome>> = vec![Vec::new(); mine.len()];
        for _ in 0..cfg.rounds {
            let before = run(&gov, keys, cfg.mem_run).per_sec;
            for (i, (_, c)) in mine.iter().enumerate() {
                o[i].push(run(c, keys, cfg.mem_run));
            }
            let after = run(&gov, keys, cfg.mem_run).per_sec;
            gr.push(f64::midpoint(before, after));
        }
        for (i, (a, _)) in mine.iter().enumerate() {
            let r: Vec<f64> = o[i].iter().map(|x| x.per_sec).collect();
            let q = paired_ratio(&r, &gr);
            let target = *a != Algorithm::Sliding;
            table.row(vec![
                workload.to_owned(),
                a.to_string(),
                rate(median(&r)),
                rate(median(&gr)),
                ratio(q),
                format!(
                    "{:.0}%",
                    100.0 * median(&o[i].iter().map(|x| x.admitted).collect::<Vec<_>>())
                ),
                if target {
                    verdict(q >= 1.0).to_owned()
                } else {
                    "— (no target)".to_owned()
                },
            ]);
        }
        eprintln!("  table 3: {workload} done");
    }
    let mut out = table.markdown();
    out.push('\n');
    out.push_str(&instructions_table());
    out
}

/// Checks counted in the shorter and the longer callgrind run: their difference is what
/// `LONG - SHORT` checks cost, without the first checks' one-time costs (callgrind counts only
/// inside [`counted_checks`]).
const SHORT: usize = 2_000;
const LONG: usize = 22_000;

/// `count <hot|many> <algorithm|governor> <n>`: the child that callgrind runs. One thread:
/// for 100,000 keys, one check of every key first (so the counted checks find their key),
/// then `n` checks in the same random order as the timed runs.
pub fn count(args: &[String]) -> Result<(), String> {
    let [workload, name, n] = args else {
        return Err("expected count <hot|many> <algorithm|governor> <n>".to_owned());
    };
    let n: usize = n.parse().map_err(|e| format!("{n}: {e}"))?;
    let keys: Vec<String> = if workload == "hot" {
        vec![key(0)]
    } else {
        (0..MANY).map(key).collect()
    };
    let check = if name == "governor" {
        governor()
    } else {
        let a: Algorithm = name.parse().map_err(|e| format!("{name}: {e}"))?;
        ours(counted_policy_of(a))
    };
    let mut admitted = 0u64;
    if keys.len() > 1 {
        for k in &keys {
            admitted += u64::from(check(k));
        }
    }
    admitted += counted_checks(&check, &keys, n);
    // Printed so that no check can be optimised away.
    println!("{admitted}");
    Ok(())
}

/// The `n` counted checks: callgrind collects inside this function only (`--toggle-collect`),
/// so that what runs before them — the process's start, the key list, the prefill, and
/// governor's clock calibration (quanta's, a loop that runs until the TSC agrees with the OS
/// clock: a different number of rounds each run) — is not counted. Without it governor's
/// figure moved by hundreds of instructions per check between two runs of one binary.
#[inline(never)]
fn counted_checks(check: &CheckFn, keys: &[String], n: usize) -> u64 {
    let mut rng = XorShift::new(11);
    let mut admitted = 0;
    for _ in 0..n {
        admitted += u64::from(check(&keys[rng.below(keys.len())]));
    }
    admitted
}

/// What one run of `count … n` executed, from callgrind's summary: instructions and the
/// simulated cache's misses (`--cache-sim=yes`: cachegrind's simulator of the machine's L1 and
/// last-level caches, one thread), by event name (`Ir`, `D1mr`, `DLmw`, …).
fn events(workload: &str, name: &str, n: usize) -> Result<Vec<(String, u64)>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let out = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg("--cache-sim=yes")
        .arg("--toggle-collect=*counted_checks*")
        .arg(format!(
            "--callgrind-out-file={}",
            dir.path().join("out").display()
        ))
        .arg(exe)
        .args(["count", workload, name, &n.to_string()])
        .output()
        .map_err(|e| format!("valgrind (is it installed?): {e}"))?;
    let text = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!("callgrind failed: {text}"));
    }
    let field = |label: &str| {
        text.lines()
            .find_map(|l| l.split_once(label).map(|(_, rest)| rest.trim().to_owned()))
    };
    let (Some(names), Some(counts)) = (field("Events    :"), field("Collected :")) else {
        return Err(format!("no event counts in callgrind's output: {text}"));
    };
    names
        .split_whitespace()
        .zip(counts.split_whitespace())
        .map(|(e, n)| {
            n.parse()
                .map(|n| (e.to_owned(), n))
                .map_err(|err| format!("{e} = {n}: {err}"))
        })
        .collect()
}

/// Per check: instructions, L1 data misses (reads and writes) and last-level data misses.
#[derive(Clone, Copy)]
struct Cost {
    instructions: f64,
    d1_misses: f64,
    ll_misses: f64,
}

/// [`Cost`]: (long run − short run) ÷ (LONG − SHORT), per event.
fn per_check(workload: &str, name: &str) -> Result<Cost, String> {
    let short = events(workload, name, SHORT)?;
    let long = events(workload, name, LONG)?;
    let per = |names: &[&str]| {
        let sum = |run: &[(String, u64)]| -> u64 {
            run.iter()
                .filter(|(e, _)| names.contains(&e.as_str()))
                .map(|(_, n)| n)
                .sum()
        };
        sum(&long).saturating_sub(sum(&short)) as f64 / (LONG - SHORT) as f64
    };
    Ok(Cost {
        instructions: per(&["Ir"]),
        d1_misses: per(&["D1mr", "D1mw"]),
        ll_misses: per(&["DLmr", "DLmw"]),
    })
}

/// The callgrind table: instructions and simulated data-cache misses per check, ours and
/// governor's, one thread. Misses are what a check's memory traffic costs beyond its
/// instructions: one thread shares no line with another here, so they are the misses of the
/// data's size (100,000 keys against the caches), not of contention.
fn instructions_table() -> String {
    let mut table = Table::new(&[
        "workload (callgrind, 1 thread)",
        "algorithm",
        "MemoryStore instructions/check",
        "governor instructions/check",
        "governor ÷ ours",
        "target ≥ 1.0",
        "D1 misses/check (ours / governor)",
        "LL misses/check (ours / governor)",
    ]);
    for (workload, label) in [("hot", "1 hot key"), ("many", "100,000 keys")] {
        let gov = match per_check(workload, "governor") {
            Ok(g) => g,
            Err(e) => return format!("**Instructions not counted:** {e}\n"),
        };
        for a in Algorithm::ALL {
            let cells = match per_check(workload, a.as_str()) {
                Ok(ours) => {
                    let q = gov.instructions / ours.instructions;
                    let target = a != Algorithm::Sliding;
                    vec![
                        format!("{:.0}", ours.instructions),
                        format!("{:.0}", gov.instructions),
                        ratio(q),
                        if target {
                            verdict(q >= 1.0).to_owned()
                        } else {
                            "— (no target)".to_owned()
                        },
                        format!("{:.2} / {:.2}", ours.d1_misses, gov.d1_misses),
                        format!("{:.2} / {:.2}", ours.ll_misses, gov.ll_misses),
                    ]
                }
                Err(e) => vec![
                    format!("not counted: {e}"),
                    format!("{:.0}", gov.instructions),
                    "—".to_owned(),
                    "—".to_owned(),
                    "—".to_owned(),
                    "—".to_owned(),
                ],
            };
            let mut row = vec![label.to_owned(), a.to_string()];
            row.extend(cells);
            table.row(row);
        }
        eprintln!("  table 3: instructions and cache misses, {label} done");
    }
    table.markdown()
}

/// `profile memory-<hot|many>-<algorithm|governor> <seconds>`: one contender alone, for
/// `perf record -p`.
pub fn profile(what: &str, dur: Duration) -> Result<(), String> {
    let rest = what
        .strip_prefix("memory-")
        .ok_or("expected memory-<hot|many>-<algo>")?;
    let (workload, name) = rest
        .split_once('-')
        .ok_or("expected memory-<hot|many>-<algo>")?;
    let n = if workload == "hot" { 1 } else { MANY };
    let keys = Arc::new((0..n).map(key).collect::<Vec<_>>());
    let check = if name == "governor" {
        governor()
    } else {
        let a: Algorithm = name.parse().map_err(|e| format!("{name}: {e}"))?;
        ours(policy_of(a))
    };
    let out = run(&check, &keys, dur);
    eprintln!("{what}: {} checks/s", rate(out.per_sec));
    Ok(())
}
