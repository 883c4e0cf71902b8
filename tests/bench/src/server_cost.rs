//! Table 7: what one check costs redis-server, the figure the client's speed and the machine's
//! load do not move.
//!
//! * **Instructions per check**: a second `redis-server` runs under
//!   `valgrind --tool=callgrind --instr-atstart=no`; around each contender's run (the same 800
//!   tasks as tables 1 and 2, over 100,000 callers, the limit never reached) the bench turns
//!   instrumentation on and off with `callgrind_control`, dumps, and divides the dump's total by
//!   the checks answered. Everything the server did in that time counts: the protocol, the
//!   command (`FCALL` or `EVALSHA`, or the peer's commands) and the cron (a few ticks).
//! * **µs per check in commands** (`INFO commandstats`, on the plain server): `CONFIG RESETSTAT`,
//!   one run, then the `usec` of every command over the checks answered, and how many commands
//!   each check made.
//!
//! The same binary gives the same instruction count to within a few tenths of a percent (the
//! keys are random, the cron's share depends on the run's length); the commandstats figure is
//! timed and moves with the machine.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Command;
use std::rc::Rc;
use std::time::Duration;

use actix_extensible_rate_limit::backend::redis::RedisBackend;
use ratelimit_runtime::{Algorithm, store::Check, RedisStore, Store};

use crate::Config;
use crate::redis_bench::{Outcome, TASKS, aerl_check, keys, load, throughput_policy};
use crate::report::{Table, rate};
use crate::server::{CommandStat, RedisServer};

/// A contender: one check of caller `i` (an index into the table's picks) against the server
/// it was built for.
type CheckFn = Rc<dyn Fn(usize) -> Pin<Box<dyn Future<Output = Result<bool, String>>>>>;

/// Distinct callers of this table: few enough that every one holds state before the measured
/// run (each is checked once first), so every measured check takes the same path (an existing
/// key, admitted, written): the count then depends on the code, not on how many new keys a run
/// of some length happened to meet.
const CALLERS: usize = 1_000;

/// The tables' 100,000 random picks, mapped onto [`CALLERS`] callers.
fn table_keys(policy: &ratelimit_runtime::Policy, scope: &str) -> Rc<Vec<String>> {
    let all = keys(policy, scope);
    Rc::new((0..all.len()).map(|i| all[i % CALLERS].clone()).collect())
}

/// The contenders of this table on `server`: the store for each algorithm, then the peer.
fn contenders(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
) -> Result<Vec<(String, CheckFn)>, String> {
    let url = server.url();
    let store = Rc::new(
        rt.block_on(RedisStore::connect(&url))
            .map_err(|e| e.to_string())?,
    );
    let mut out: Vec<(String, CheckFn)> = Vec::new();
    for algorithm in Algorithm::ALL {
        let policy = throughput_policy(algorithm);
        let keys = table_keys(&policy, "bench");
        let store = store.clone();
        out.push((
            format!("ratelimit `RedisStore::check`, {algorithm}"),
            Rc::new(move |i| {
                let (store, keys) = (store.clone(), keys.clone());
                Box::pin(async move {
                    store
                        .check(&[Check::new(&keys[i], &policy)])
                        .await
                        .map(|v| v.is_admitted())
                        .map_err(|e| e.to_string())
                })
            }),
        ));
    }
    // Two limits of one algorithm stacked in one call (distinct keys), and the fixed window
    // taken under a call id (`Store::take`, as the attribute's `count = …` filters send it: the
    // call leaves a receipt).
    for algorithm in [Algorithm::Fixed, Algorithm::Gcra] {
        let policy = throughput_policy(algorithm);
        let keys = table_keys(&policy, "bench2");
        let store = store.clone();
        out.push((
            format!("ratelimit `RedisStore::check`, {algorithm}, two limits stacked"),
            Rc::new(move |i| {
                let (store, keys) = (store.clone(), keys.clone());
                Box::pin(async move {
                    let second = format!("{}:2", keys[i]);
                    store
                        .check(&[Check::new(&keys[i], &policy), Check::new(&second, &policy)])
                        .await
                        .map(|v| v.is_admitted())
                        .map_err(|e| e.to_string())
                })
            }),
        ));
    }
    // A limit taken under a call id, a new id per call as the limiter draws one: as
    // `Store::take` (the attribute's `count = …` filters), and as `RateLimiter` sends every
    // check under the failure policies `local` (the default) and `deny`, a take whose receipts
    // serve only the refund of a timeout (`Store::take_briefly`, `keep` given), of a fixed
    // window (its own function) and of a gcra limit (the driver).
    for (name, scope, keep, algorithm) in [
        (
            "ratelimit `RedisStore::take` (a call id: a receipt), fixed",
            "benchid",
            None,
            Algorithm::Fixed,
        ),
        (
            "ratelimit `RedisStore::take_briefly` (`RateLimiter`'s default), fixed",
            "benchbrief",
            Some(Duration::from_secs(2)),
            Algorithm::Fixed,
        ),
        (
            "ratelimit `RedisStore::take_briefly` (`RateLimiter`'s default), gcra",
            "benchbriefg",
            Some(Duration::from_secs(2)),
            Algorithm::Gcra,
        ),
    ] {
        let policy = throughput_policy(algorithm);
        let keys = table_keys(&policy, scope);
        let store = store.clone();
        let ids = Rc::new(std::cell::Cell::new(0_u64));
        out.push((
            name.to_owned(),
            Rc::new(move |i| {
                let (store, keys) = (store.clone(), keys.clone());
                ids.set(ids.get() + 1);
                let id = format!("{:x}", ids.get());
                Box::pin(async move {
                    let checks = [Check::new(&keys[i], &policy)];
                    match keep {
                        None => store.take(&checks, &id).await,
                        Some(keep) => store.take_briefly(&checks, &id, keep).await,
                    }
                    .map(|v| v.is_admitted())
                    .map_err(|e| e.to_string())
                })
            }),
        ));
    }
    let aerl = {
        let client = redis026::Client::open(url.as_str()).map_err(|e| e.to_string())?;
        let manager = rt
            .block_on(redis026::aio::ConnectionManager::new(client))
            .map_err(|e| e.to_string())?;
        Rc::new(RedisBackend::builder(manager).build())
    };
    let keys_e = table_keys(&throughput_policy(Algorithm::Fixed), "baerl");
    out.push((
        "actix-extensible-rate-limit 0.4 (fixed window)".to_owned(),
        Rc::new(move |i| {
            let (aerl, keys) = (aerl.clone(), keys_e.clone());
            Box::pin(async move { aerl_check(&aerl, keys[i].clone()).await })
        }),
    ));
    Ok(out)
}

/// `check` from the bench's 800 tasks for `dur`.
fn run(rt: &tokio::runtime::Runtime, check: &CheckFn, dur: Duration) -> Outcome {
    let check = check.clone();
    rt.block_on(load(TASKS, dur, move |i| check(i)))
}

/// Every caller checked once, one after the other: each then holds state.
fn prefill(rt: &tokio::runtime::Runtime, check: &CheckFn) -> Result<(), String> {
    rt.block_on(async {
        for i in 0..CALLERS {
            check(i).await?;
        }
        Ok(())
    })
}

/// `callgrind_control <args> <pid>`.
fn control(pid: u32, args: &[&str]) -> Result<(), String> {
    let out = Command::new("callgrind_control")
        .args(args)
        .arg(pid.to_string())
        .output()
        .map_err(|e| format!("callgrind_control (is valgrind installed?): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "callgrind_control {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The newest dump callgrind wrote to `dir` (`cg.out.<n>`, the highest n).
fn newest_dump(dir: &Path) -> Result<PathBuf, String> {
    std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let n: u64 = name.strip_prefix("cg.out.")?.parse().ok()?;
            Some((n, e.path()))
        })
        .max_by_key(|(n, _)| *n)
        .map(|(_, p)| p)
        .ok_or_else(|| format!("no callgrind dump in {}", dir.display()))
}

/// The instructions of a dump (its `totals:` line).
fn dump_total(path: &Path) -> Result<f64, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .find_map(|l| l.strip_prefix("totals:"))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .ok_or_else(|| format!("no totals in {}", path.display()))
}

/// Runs `run` for `dur` with the server's instrumentation on; instructions per answered check.
fn instructions_per_check(
    pid: u32,
    dir: &Path,
    rt: &tokio::runtime::Runtime,
    check: &CheckFn,
    dur: Duration,
) -> Result<f64, String> {
    control(pid, &["--zero"])?;
    control(pid, &["--instr=on"])?;
    let o = run(rt, check, dur);
    control(pid, &["--instr=off"])?;
    control(pid, &["--dump"])?;
    if o.errors > 0 || o.calls < 1.0 {
        return Err(format!(
            "{} errors, {} checks answered under callgrind",
            o.errors, o.calls
        ));
    }
    Ok(dump_total(&newest_dump(dir)?)? / o.calls)
}

/// `INFO commandstats` (all but `INFO` and `CONFIG`) as (commands run, µs of the commands the
/// client sent). A script's `redis.call`s and a transaction's commands are counted as commands
/// run, and their time is inside the `FCALL`'s, `EVALSHA`'s or `EXEC`'s: so the µs are those of
/// the outer commands (`FCALL`, `EVALSHA`, `MULTI`, `EXEC`) when there are any, else of all.
fn commandstats(server: &RedisServer) -> Result<(f64, f64), String> {
    const OUTER: [&str; 6] = ["fcall", "fcall_ro", "evalsha", "eval", "multi", "exec"];
    let stats = server.command_stats()?;
    #[allow(clippy::cast_precision_loss)] // a bench's call counts
    let calls: f64 = stats.iter().map(|s| s.calls as f64).sum();
    let outer: Vec<&CommandStat> = stats
        .iter()
        .filter(|s| OUTER.contains(&s.command.as_str()))
        .collect();
    let usec = if outer.is_empty() {
        stats.iter().map(|s| s.usec).sum()
    } else {
        outer.iter().map(|s| s.usec).sum()
    };
    Ok((calls, usec))
}

/// Table 7 (see the module's documentation).
pub fn table(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
    cfg: &Config,
) -> Result<String, String> {
    // `BENCH_CALLGRIND_DIR=<dir>` keeps the dumps there (one per contender, in the table's
    // order) for `callgrind_annotate`; by default they go to a temp dir.
    let temp = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let kept = std::env::var_os("BENCH_CALLGRIND_DIR").map(PathBuf::from);
    let dumps: &Path = kept.as_deref().unwrap_or(temp.path());
    let wrapper: Vec<String> = vec![
        "valgrind".to_owned(),
        "--tool=callgrind".to_owned(),
        "--instr-atstart=no".to_owned(),
        format!("--callgrind-out-file={}", dumps.join("cg.out").display()),
    ];
    let traced = RedisServer::start_under(&wrapper, Duration::from_secs(60))?;
    let traced_runs = contenders(rt, &traced)?;
    let plain_runs = contenders(rt, server)?;
    // Under valgrind the server answers ~50 times slower: a longer run for enough checks.
    let traced_run = cfg.run * 2;
    let mut table = Table::new(&[
        "client",
        "redis-server instructions per check (callgrind)",
        "commands run per check (a script's `redis.call`s included)",
        "server µs per check in commands (`INFO commandstats`)",
        "checks/s (plain server, this run)",
    ]);
    for ((name, traced_check), (_, plain_check)) in traced_runs.iter().zip(&plain_runs) {
        // Every caller holds state on both servers, then a warm-up (the library loaded, the
        // parsed-limits cache filled). A contender this server refuses (the peer's `EXPIRE … NX`
        // on Redis 6.2) is a row saying so.
        if let Err(e) = prefill(rt, traced_check).and_then(|()| prefill(rt, plain_check)) {
            let refused = format!("not measured: {e}");
            table.row(vec![name.clone(), refused, "—".into(), "—".into(), "—".into()]);
            continue;
        }
        run(rt, traced_check, cfg.warmup);
        run(rt, plain_check, cfg.warmup);
        let instructions =
            match instructions_per_check(traced.pid(), dumps, rt, traced_check, traced_run) {
                Ok(n) => n,
                Err(e) => {
                    let refused = format!("not measured: {e}");
                    table.row(vec![name.clone(), refused, "—".into(), "—".into(), "—".into()]);
                    continue;
                }
            };
        server.cli(&["CONFIG", "RESETSTAT"])?;
        let o = run(rt, plain_check, cfg.run);
        let (commands, usec) = commandstats(server)?;
        let checks = o.calls.max(1.0);
        table.row(vec![
            name.clone(),
            rate(instructions),
            format!("{:.2}", commands / checks),
            format!("{:.2}", usec / checks),
            rate(o.per_sec),
        ]);
        eprintln!("  table 7: {name} done");
    }
    Ok(table.markdown())
}
