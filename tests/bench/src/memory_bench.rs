//! Table 3: the memory store against governor's keyed limiter, 2 threads, one hot key and
//! 100,000 keys.

use std::num::NonZeroU32;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter as Governor};
use ratelimit_runtime::{Algorithm, Check, MemoryStore, Policy};

use crate::report::{Table, median, paired_ratio, rate, ratio, verdict};
use crate::{Config, XorShift};

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

fn ours(algorithm: Algorithm, limit: u64) -> CheckFn {
    let policy =
        Policy::new(algorithm, limit, Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}"));
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

/// Table 3.
pub fn table(cfg: &Config) -> String {
    let key = |i: usize| {
        let ip = format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255);
        format!("ratelimit:{{app::login:ip={ip}}}:fixed:100:60000")
    };
    let hot = Arc::new(vec![key(0)]);
    let many = Arc::new((0..MANY).map(key).collect::<Vec<_>>());
    let never = 1_000_000_000_000;
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
            .map(|a| {
                // A sliding log keeps one entry per admission: its limit is one a hot key
                // reaches, so its log stays bounded (most of its hot-key checks are rejections).
                // GCRA: at most one unit per µs (60,000,000 a minute); the sliding counter:
                // num × period_ms ≤ 2^52. Neither is reached in a run.
                let limit = match a {
                    Algorithm::Sliding => 1000,
                    Algorithm::Gcra => 60_000_000,
                    Algorithm::SlidingCounter => ratelimit_runtime::MAX_BUCKET_SCALE / 60_000,
                    _ => never,
                };
                (a, ours(a, limit))
            })
            .collect();
        run(&gov, keys, cfg.warmup);
        for (_, c) in &mine {
            run(c, keys, cfg.warmup);
        }
        // Each round: governor, the four algorithms, governor again; the round's governor
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
    let keys = Arc::new(
        (0..n)
            .map(|i| {
                format!(
                    "ratelimit:{{app::login:ip=10.0.{}.{}}}:x:100:60000",
                    i >> 8,
                    i & 255
                )
            })
            .collect::<Vec<_>>(),
    );
    let check = if name == "governor" {
        governor()
    } else {
        let a: Algorithm = name.parse().map_err(|e| format!("{name}: {e}"))?;
        ours(a, 1_000_000_000_000)
    };
    let out = run(&check, &keys, dur);
    eprintln!("{what}: {} checks/s", rate(out.per_sec));
    Ok(())
}
