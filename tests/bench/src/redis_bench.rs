//! Tables 1, 2, 5 and 6: the Redis store against `redis-benchmark`, against the Rust Redis
//! peers, its latency against `PING`, and Redis memory per active key.
//!
//! Every Rust client runs on one current-thread Tokio runtime (one core, as `redis-benchmark`
//! runs on one thread); `redis-server` has the other core.

use std::cell::Cell;
use std::future::Future;
use std::process::Command;
use std::rc::Rc;
use std::time::{Duration, Instant};

use actix_extensible_rate_limit::backend::redis::RedisBackend;
use actix_extensible_rate_limit::backend::{Backend, SimpleInput};
use ratelimit_runtime::{Algorithm, store::Check, Policy, RateLimiter, RedisStore, Store};
use redis::aio::ConnectionManager;

use crate::report::{Table, median, paired_ratio, quantile, rate, ratio, verdict};
use crate::server::RedisServer;
use crate::{Config, XorShift};

/// Distinct callers the throughput runs spread over (redis-benchmark's `-r`).
/// The runtime's bounds: the largest sliding log (`PolicyError::SlidingLogTooLarge`) and bucket
/// scale (2^52, `PolicyError::BucketTooFine`).
const MAX_SLIDING_LOG: u64 = 10_000;
pub(crate) const MAX_BUCKET_SCALE: u64 = 1 << 52;
const KEYSPACE: usize = 100_000;
/// redis-benchmark's load: 50 connections, 16 commands in flight on each.
const RB_CLIENTS: usize = 50;
const RB_PIPELINE: usize = 16;
/// The Rust clients keep as many checks in flight on their one connection.
pub(crate) const TASKS: usize = RB_CLIENTS * RB_PIPELINE;
/// A limit no run reaches, so every measured check is an admitted one (the path that writes).
pub(crate) const NEVER: u64 = 1_000_000_000;
pub(crate) const PERIOD: Duration = Duration::from_secs(60);
/// Table 6's limit is 100 calls a day: after one call every key lives for minutes at least
/// (a bucket's TTL is the time until it is full or empty again), so all of them are counted.
const PERIOD_MEMORY: Duration = Duration::from_secs(86_400);

/// The script text the store sends for a call with one limit of `algorithm`: the prelude, that
/// algorithm and the driver, exactly as `RedisStore` concatenates them.
/// The function and the script text the store sends a check of one limit of `algorithm` to
/// (a one-limit fast path, or the driver).
fn store_entry(algorithm: Algorithm) -> (&'static str, &'static str) {
    let policy = throughput_policy(algorithm);
    ratelimit_runtime::store::redis::script_sources()
        .for_checks(&[ratelimit_runtime::store::Check::new("k", &policy)])
}

fn script_text(algorithm: Algorithm) -> String {
    store_entry(algorithm).1.to_owned()
}

pub(crate) fn throughput_policy(algorithm: Algorithm) -> Policy {
    // A sliding log is bounded to 10,000 entries; over 100,000 random keys it still admits
    // nearly every call.
    // GCRA counts at most one unit per µs, the sliding counter's num × period_ms is bounded by
    // 2^52: their "never" is the largest they accept (no run reaches either).
    let num = match algorithm {
        Algorithm::Sliding => MAX_SLIDING_LOG,
        Algorithm::Gcra => u64::try_from(PERIOD.as_micros()).unwrap_or(NEVER),
        Algorithm::SlidingCounter => {
            MAX_BUCKET_SCALE / u64::try_from(PERIOD.as_millis()).unwrap_or(1)
        }
        _ => NEVER,
    };
    Policy::new(algorithm, num, PERIOD).unwrap_or_else(|e| panic!("policy: {e}"))
}

/// The store key of caller `i` in `scope` (12 digits, as redis-benchmark writes
/// `__rand_int__`). Each contender has its own scope: the peers' values are not the store's.
fn caller_key(policy: &Policy, scope: &str, i: usize) -> String {
    ratelimit_runtime::key::build(
        "ratelimit",
        scope,
        &[ratelimit_runtime::key::Part::new(
            ratelimit_runtime::key::Source::Key,
            format!("{i:012}").as_bytes(),
        )],
        policy,
    )
}

pub(crate) fn keys(policy: &Policy, scope: &str) -> Rc<Vec<String>> {
    Rc::new(
        (0..KEYSPACE)
            .map(|i| caller_key(policy, scope, i))
            .collect(),
    )
}

/// What one timed run measured.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Outcome {
    pub(crate) per_sec: f64,
    admitted: f64,
    pub(crate) errors: u64,
    /// Answered calls.
    pub(crate) calls: f64,
    /// redis-server CPU time per answered call, µs.
    server_us: f64,
    /// Client CPU time per answered call, µs (NaN when unknown).
    client_us: f64,
}

/// redis-server's CPU time so far (`INFO cpu`: user + system), seconds.
fn server_cpu(server: &RedisServer) -> f64 {
    let info = server.cli(&["INFO", "cpu"]).unwrap_or_default();
    ["used_cpu_sys:", "used_cpu_user:"]
        .iter()
        .filter_map(|k| info.lines().find_map(|l| l.strip_prefix(k)))
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

/// This process's CPU time so far (user + system), seconds, from `/proc/self/stat`.
fn own_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses): utime is the 12th, stime the 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// Runs `f` (in this process) and adds the server's and this process's CPU time per call.
fn timed(server: &RedisServer, f: impl FnOnce() -> Outcome) -> Outcome {
    let (s0, c0) = (server_cpu(server), own_cpu());
    let mut o = f();
    let (s1, c1) = (server_cpu(server), own_cpu());
    o.server_us = (s1 - s0) * 1e6 / o.calls.max(1.0);
    o.client_us = (c1 - c0) * 1e6 / o.calls.max(1.0);
    o
}

/// The median of a per-call CPU column, formatted.
fn cpu_us(v: &[Outcome], pick: fn(&Outcome) -> f64) -> String {
    let m = median(&v.iter().map(pick).collect::<Vec<_>>());
    if m.is_finite() && m > 0.0 {
        format!("{m:.1}")
    } else {
        "n/a".to_owned()
    }
}

/// Runs `tasks` concurrent loops for `dur`, each calling `f(caller index)` back to back over
/// random callers; `f` answers whether the call was admitted, or an error. Only answered
/// calls count towards the rate.
pub(crate) async fn load<F, Fut>(tasks: usize, dur: Duration, f: F) -> Outcome
where
    F: Fn(usize) -> Fut + 'static,
    Fut: Future<Output = Result<bool, String>> + 'static,
{
    let f = Rc::new(f);
    let done = Rc::new(Cell::new(0u64));
    let admitted = Rc::new(Cell::new(0u64));
    let errors = Rc::new(Cell::new(0u64));
    let first_error: Rc<Cell<Option<String>>> = Rc::new(Cell::new(None));
    let start = Instant::now();
    let deadline = start + dur;
    let local = tokio::task::LocalSet::new();
    for t in 0..tasks {
        let (f, done, admitted, errors, first_error) = (
            f.clone(),
            done.clone(),
            admitted.clone(),
            errors.clone(),
            first_error.clone(),
        );
        local.spawn_local(async move {
            let mut rng = XorShift::new(t as u64 + 1);
            while Instant::now() < deadline {
                match f(rng.below(KEYSPACE)).await {
                    Ok(a) => {
                        admitted.set(admitted.get() + u64::from(a));
                        done.set(done.get() + 1);
                    }
                    Err(e) => {
                        errors.set(errors.get() + 1);
                        let prev = first_error.take();
                        first_error.set(prev.or(Some(e)));
                    }
                }
            }
        });
    }
    local.await;
    let elapsed = start.elapsed().as_secs_f64();
    if let Some(e) = first_error.take() {
        eprintln!("  ! {} errors, first: {e}", errors.get());
    }
    let n = done.get() as f64;
    Outcome {
        per_sec: n / elapsed,
        calls: n,
        admitted: if n > 0.0 {
            admitted.get() as f64 / n
        } else {
            0.0
        },
        errors: errors.get(),
        ..Outcome::default()
    }
}

/// `redis-benchmark -c 50 -P 16 -r 100000 -n <n> EVALSHA <sha> 1 <key> <args…>`, under
/// `/usr/bin/time` when it is installed (for the client's CPU time).
fn redis_benchmark(server: &RedisServer, n: u64, command: &[String]) -> Result<Outcome, String> {
    let gnu_time = std::path::Path::new("/usr/bin/time").exists();
    let mut cmd = if gnu_time {
        let mut c = Command::new("/usr/bin/time");
        c.args(["-f", "CPU %U %S", "redis-benchmark"]);
        c
    } else {
        Command::new("redis-benchmark")
    };
    let s0 = server_cpu(server);
    let out = cmd
        .args(["-h", "127.0.0.1", "-p", &server.port().to_string()])
        .args([
            "-c",
            &RB_CLIENTS.to_string(),
            "-P",
            &RB_PIPELINE.to_string(),
        ])
        .args(["-r", &KEYSPACE.to_string(), "-n", &n.to_string(), "--csv"])
        .args(command)
        .output()
        .map_err(|e| format!("redis-benchmark: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let head = format!("\"{}", command.first().map_or("", String::as_str));
    let line = text
        .lines()
        .rfind(|l| l.starts_with(&head))
        .ok_or_else(|| format!("redis-benchmark printed no result: {text}"))?;
    let rps = line
        .split(',')
        .nth(1)
        .map(|f| f.trim_matches('"'))
        .and_then(|f| f.parse::<f64>().ok())
        .ok_or_else(|| format!("cannot read redis-benchmark's line: {line}"))?;
    let calls = n as f64;
    let client_us = String::from_utf8_lossy(&out.stderr)
        .lines()
        .find_map(|l| l.strip_prefix("CPU "))
        .map_or(f64::NAN, |t| {
            t.split_whitespace()
                .filter_map(|v| v.parse::<f64>().ok())
                .sum::<f64>()
                * 1e6
                / calls
        });
    Ok(Outcome {
        per_sec: rps,
        admitted: f64::NAN,
        errors: 0,
        calls,
        server_us: (server_cpu(server) - s0) * 1e6 / calls,
        client_us,
    })
}

/// The redis-benchmark command that runs the store's code exactly as the store calls it:
/// `FCALL <function>` of the library on a server with Redis Functions, else `EVALSHA <sha>`
/// of the script (`head`: those two words), then the same keys and arguments: the caller's
/// key and its block marker (`<key>:b`, which the scripts check is the key's), then the
/// limit's one argument (its five numbers joined by `:`). One caller: redis-benchmark draws
/// every `__rand_int__` of a command on its own, so a random key and its marker would not
/// match; the store's side of table 1 checks the same one caller.
fn store_command(head: [&str; 2], policy: &Policy) -> Vec<String> {
    let key = caller_key(policy, "bench", 0);
    vec![
        head[0].to_owned(),
        head[1].to_owned(),
        "2".to_owned(),
        key.clone(),
        format!("{key}:b"),
        format!(
            "{}:{}:{}:{}:{}",
            algorithm_code(policy.algorithm()),
            policy.limit(),
            policy.period_ms() * 1000,
            policy.burst(),
            policy.cost()
        ),
    ]
}

/// The code the scripts know each algorithm by (`Algorithm::code`, which is crate-private):
/// its place in `Algorithm::ALL`, from 1.
fn algorithm_code(a: Algorithm) -> usize {
    Algorithm::ALL
        .iter()
        .position(|&x| x == a)
        .map_or(0, |i| i + 1)
}

async fn ours(
    store: Rc<RedisStore>,
    policy: Policy,
    keys: Rc<Vec<String>>,
    dur: Duration,
) -> Outcome {
    load(TASKS, dur, move |i| {
        let (store, keys) = (store.clone(), keys.clone());
        async move {
            let checks = [Check::new(&keys[i], &policy)];
            store
                .check(&checks)
                .await
                .map(|v| v.is_admitted())
                .map_err(|e| e.to_string())
        }
    })
    .await
}

/// One check of actix-extensible-rate-limit's Redis backend: its fixed window of [`NEVER`] a
/// [`PERIOD`] for `key`; whether it was allowed.
pub(crate) async fn aerl_check(aerl: &RedisBackend, key: String) -> Result<bool, String> {
    let input = SimpleInput {
        interval: PERIOD,
        max_requests: NEVER,
        key,
    };
    aerl.request(input)
        .await
        .map(|(d, _, _)| d.is_allowed())
        .map_err(|e| e.to_string())
}

/// The median per-second rate over rounds of a run.
fn rates(v: &[Outcome]) -> Vec<f64> {
    v.iter().map(|o| o.per_sec).collect()
}

fn admitted(v: &[Outcome]) -> String {
    let errors: u64 = v.iter().map(|o| o.errors).sum();
    let a = median(&v.iter().map(|o| o.admitted).collect::<Vec<_>>());
    if errors > 0 {
        format!("{:.0}% ({errors} errors)", a * 100.0)
    } else {
        format!("{:.0}%", a * 100.0)
    }
}

/// What the store sends for a check on this server: `FCALL` of the library's check function
/// when the store loaded the library (listed by `FUNCTION LIST`, with exactly the store's
/// text), else `EVALSHA` of the script, which the store then loaded (`SCRIPT EXISTS`: the
/// same SHA1 proves the same text).
fn store_call(server: &RedisServer, algorithm: Algorithm) -> Result<[String; 2], String> {
    let sources = ratelimit_runtime::store::redis::script_sources();
    let listed = server
        .cli(&[
            "FUNCTION",
            "LIST",
            "LIBRARYNAME",
            sources.library_name,
            "WITHCODE",
        ])
        .unwrap_or_default();
    let (function, _) = store_entry(algorithm);
    if listed.contains(function) {
        if !listed.contains(sources.library.trim_end()) {
            return Err(format!(
                "the library {} on the server is not the store's text",
                sources.library_name
            ));
        }
        return Ok(["FCALL".to_owned(), function.to_owned()]);
    }
    let sha = redis::Script::new(&script_text(algorithm))
        .get_hash()
        .to_owned();
    let exists = server.cli(&["SCRIPT", "EXISTS", &sha])?;
    if exists.trim() != "1" {
        return Err(format!(
            "the store did not load a script with SHA {sha}: the benchmark's copy of the script text differs from the store's"
        ));
    }
    Ok(["EVALSHA".to_owned(), sha])
}

/// Table 1: the store's checks/s against redis-benchmark sending the very call the store
/// sends (`FCALL` of the library's function, or `EVALSHA` of the script on a server without
/// Functions).
pub fn table_store_vs_redis_benchmark(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
    cfg: &Config,
) -> Result<String, String> {
    let store = Rc::new(
        rt.block_on(RedisStore::connect(&server.url()))
            .map_err(|e| e.to_string())?,
    );
    let mut table = Table::new(&[
        "algorithm",
        "RedisStore checks/s",
        "redis-benchmark, same call/s",
        "ratio (median of rounds)",
        "server CPU µs/call (store / r-b)",
        "client CPU µs/call (store / r-b)",
        "admitted",
        "target ≥ 0.8",
    ]);
    for algorithm in Algorithm::ALL {
        let policy = throughput_policy(algorithm);
        // The store loaded its code at connect: the same text, called the same way.
        let [verb, target] = store_call(server, algorithm)?;
        let command = store_command([&verb, &target], &policy);
        // The one caller redis-benchmark checks (see store_command), for the store too.
        let keys = Rc::new(vec![caller_key(&policy, "bench", 0); KEYSPACE]);
        // Warm up both, and size redis-benchmark's -n to last about one run.
        rt.block_on(ours(store.clone(), policy, keys.clone(), cfg.warmup));
        let probe = redis_benchmark(server, 20_000, &command)?.per_sec;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let n = (probe * cfg.run.as_secs_f64()) as u64;
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..cfg.rounds {
            a.push(timed(server, || {
                rt.block_on(ours(store.clone(), policy, keys.clone(), cfg.run))
            }));
            b.push(redis_benchmark(server, n.max(10_000), &command)?);
        }
        let r = paired_ratio(&rates(&a), &rates(&b));
        table.row(vec![
            algorithm.to_string(),
            rate(median(&rates(&a))),
            rate(median(&rates(&b))),
            ratio(r),
            format!(
                "{} / {}",
                cpu_us(&a, |o| o.server_us),
                cpu_us(&b, |o| o.server_us)
            ),
            format!(
                "{} / {}",
                cpu_us(&a, |o| o.client_us),
                cpu_us(&b, |o| o.client_us)
            ),
            admitted(&a),
            verdict(r >= 0.8).to_owned(),
        ]);
        eprintln!("  table 1: {algorithm} done");
    }
    Ok(table.markdown())
}

/// Table 2: the store against actix-limitation and actix-extensible-rate-limit, all fixed
/// windows, same server, keys and concurrency.
#[allow(clippy::too_many_lines)] // one table: four contenders set up, run and reported
pub fn table_peers(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
    cfg: &Config,
) -> Result<String, String> {
    let url = server.url();
    let policy = throughput_policy(Algorithm::Fixed);
    // GCRA: the second contender against the peers (one integer of state).
    let gcra = throughput_policy(Algorithm::Gcra);
    let keys_g = keys(&gcra, "bgcra");
    let (keys_o, keys_l, keys_a, keys_e) = (
        keys(&policy, "bench"),
        keys(&policy, "blimr"),
        keys(&policy, "bactl"),
        keys(&policy, "baerl"),
    );
    let store = Rc::new(
        rt.block_on(RedisStore::connect(&url))
            .map_err(|e| e.to_string())?,
    );
    // A timeout far above any queueing delay of this load: a timed-out check would be
    // answered by the failure policy without Redis, and counted here as an error instead.
    let limiter = Rc::new(
        rt.block_on(
            RateLimiter::builder()
                .store(
                    rt.block_on(RedisStore::connect(&url))
                        .map_err(|e| e.to_string())?,
                )
                .timeout(Duration::from_secs(5))
                .build(),
        )
        .map_err(|e| e.to_string())?,
    );
    let al = Rc::new(
        actix_limitation::Limiter::builder(url.clone())
            .limit(usize::try_from(NEVER).unwrap_or(usize::MAX))
            .period(PERIOD)
            .build()
            .map_err(|e| e.to_string())?,
    );
    let aerl = {
        let client = redis026::Client::open(url.as_str()).map_err(|e| e.to_string())?;
        let manager = rt
            .block_on(redis026::aio::ConnectionManager::new(client))
            .map_err(|e| e.to_string())?;
        Rc::new(RedisBackend::builder(manager).build())
    };
    let run_ours = |dur| rt.block_on(ours(store.clone(), policy, keys_o.clone(), dur));
    let run_gcra = |dur| rt.block_on(ours(store.clone(), gcra, keys_g.clone(), dur));
    let run_limiter = |dur| {
        let (shared, keys) = (limiter.clone(), keys_l.clone());
        let mut outcome = rt.block_on(load(TASKS, dur, move |i| {
            let (limiter, keys) = (shared.clone(), keys.clone());
            async move {
                let checks = [Check::new(&keys[i], &policy)];
                limiter
                    .check(&checks)
                    .await
                    .map(|v| v.is_admitted())
                    .map_err(|e| e.to_string())
            }
        }));
        if limiter.store_failing() {
            eprintln!("  ! the limiter's breaker is open: its answers did not all come from Redis");
            outcome.errors += 1;
        }
        outcome
    };
    let run_al = |dur| {
        let (al, keys) = (al.clone(), keys_a.clone());
        rt.block_on(load(TASKS, dur, move |i| {
            let (al, keys) = (al.clone(), keys.clone());
            async move {
                match al.count(keys[i].clone()).await {
                    Ok(_) => Ok(true),
                    Err(actix_limitation::Error::LimitExceeded(_)) => Ok(false),
                    Err(e) => Err(e.to_string()),
                }
            }
        }))
    };
    let run_aerl = |dur| {
        let (aerl, keys) = (aerl.clone(), keys_e.clone());
        rt.block_on(load(TASKS, dur, move |i| {
            let (aerl, keys) = (aerl.clone(), keys.clone());
            async move { aerl_check(&aerl, keys[i].clone()).await }
        }))
    };
    run_ours(cfg.warmup);
    run_gcra(cfg.warmup);
    run_limiter(cfg.warmup);
    run_al(cfg.warmup);
    run_aerl(cfg.warmup);
    let (mut o, mut g, mut lim, mut al_runs, mut aerl_runs) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..cfg.rounds {
        o.push(timed(server, || run_ours(cfg.run)));
        g.push(timed(server, || run_gcra(cfg.run)));
        lim.push(timed(server, || run_limiter(cfg.run)));
        al_runs.push(timed(server, || run_al(cfg.run)));
        aerl_runs.push(timed(server, || run_aerl(cfg.run)));
    }
    let mut table = Table::new(&[
        "client",
        "checks/s",
        "ratelimit fixed ÷ this (median of rounds)",
        "ratelimit gcra ÷ this",
        "server CPU µs/call",
        "client CPU µs/call",
        "admitted",
        "target",
    ]);
    let row = |table: &mut Table, name: &str, v: &[Outcome], target: String| {
        table.row(vec![
            name.to_owned(),
            rate(median(&rates(v))),
            ratio(paired_ratio(&rates(&o), &rates(v))),
            ratio(paired_ratio(&rates(&g), &rates(v))),
            cpu_us(v, |o| o.server_us),
            cpu_us(v, |o| o.client_us),
            admitted(v),
            target,
        ]);
    };
    row(
        &mut table,
        "ratelimit `RedisStore::check`, fixed window",
        &o,
        "—".to_owned(),
    );
    row(
        &mut table,
        "ratelimit `RedisStore::check`, gcra",
        &g,
        "—".to_owned(),
    );
    row(
        &mut table,
        "ratelimit `RateLimiter::check` (timeout, breaker), fixed window",
        &lim,
        "—".to_owned(),
    );
    let to_al = paired_ratio(&rates(&o), &rates(&al_runs));
    row(
        &mut table,
        "actix-limitation 0.6 `Limiter::count` (fixed window)",
        &al_runs,
        format!("fixed ≥ 1.5: {}", verdict(to_al >= 1.5)),
    );
    let (fixed_to_aerl, gcra_to_aerl) = (
        paired_ratio(&rates(&o), &rates(&aerl_runs)),
        paired_ratio(&rates(&g), &rates(&aerl_runs)),
    );
    row(
        &mut table,
        "actix-extensible-rate-limit 0.4 `RedisBackend::request` (fixed window)",
        &aerl_runs,
        format!(
            "fixed ≥ 1.0: {}; gcra ≥ 1.5: {}",
            verdict(fixed_to_aerl >= 1.0),
            verdict(gcra_to_aerl >= 1.5)
        ),
    );
    eprintln!("  table 2 done");
    Ok(table.markdown())
}

/// Table 5: one check at a time on one connection, interleaved with `PING` on that connection.
pub fn table_latency(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
    cfg: &Config,
) -> Result<String, String> {
    let client = redis::Client::open(server.url()).map_err(|e| e.to_string())?;
    let mut manager = rt
        .block_on(ConnectionManager::new(client))
        .map_err(|e| e.to_string())?;
    let store = RedisStore::from_connection_manager(manager.clone());
    let mut table = Table::new(&[
        "call (one at a time)",
        "p50 µs",
        "p99 µs",
        "p50 ÷ PING p50",
        "p99 ÷ PING p99",
    ]);
    let mut rows = Vec::new();
    let mut pings_all = Vec::new();
    for algorithm in Algorithm::ALL {
        let policy = throughput_policy(algorithm);
        let keys = keys(&policy, "blate");
        let (checks_us, pings_us) = rt.block_on(async {
            let mut rng = XorShift::new(7);
            let (mut c, mut p) = (Vec::new(), Vec::new());
            for i in 0..(cfg.latency_samples + cfg.latency_samples / 10) {
                let key = &keys[rng.below(KEYSPACE)];
                let t = Instant::now();
                store
                    .check(&[Check::new(key, &policy)])
                    .await
                    .map_err(|e| e.to_string())?;
                let check = t.elapsed();
                let t = Instant::now();
                redis::cmd("PING")
                    .query_async::<String>(&mut manager)
                    .await
                    .map_err(|e| e.to_string())?;
                let ping = t.elapsed();
                if i >= cfg.latency_samples / 10 {
                    c.push(check.as_secs_f64() * 1e6);
                    p.push(ping.as_secs_f64() * 1e6);
                }
            }
            Ok::<_, String>((c, p))
        })?;
        rows.push((algorithm, checks_us));
        pings_all.extend(pings_us);
    }
    pings_all.sort_by(f64::total_cmp);
    let (p50, p99) = (quantile(&pings_all, 0.5), quantile(&pings_all, 0.99));
    for (algorithm, mut c) in rows {
        c.sort_by(f64::total_cmp);
        let (c50, c99) = (quantile(&c, 0.5), quantile(&c, 0.99));
        table.row(vec![
            format!("`RedisStore::check`, {algorithm}"),
            format!("{c50:.0}"),
            format!("{c99:.0}"),
            ratio(c50 / p50),
            ratio(c99 / p99),
        ]);
    }
    table.row(vec![
        "`PING` (same connection, interleaved)".to_owned(),
        format!("{p50:.0}"),
        format!("{p99:.0}"),
        "1.00×".to_owned(),
        "1.00×".to_owned(),
    ]);
    eprintln!("  table 5 done");
    Ok(table.markdown())
}

/// One call of one caller, for table 6.
type Caller = Rc<dyn Fn(usize) -> std::pin::Pin<Box<dyn Future<Output = Result<bool, String>>>>>;

/// A realistic key: caller `i` as an IPv4 address, scope `app::login`.
fn ip_key(policy: &Policy, i: usize) -> String {
    let ip = format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255);
    ratelimit_runtime::key::build(
        "ratelimit",
        "app::login",
        &[ratelimit_runtime::key::Part::new(
            ratelimit_runtime::key::Source::Ip,
            ip.as_bytes(),
        )],
        policy,
    )
}

async fn used_memory(conn: &mut ConnectionManager) -> Result<(i64, i64), String> {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(conn)
        .await
        .map_err(|e| e.to_string())?;
    let used = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or("no used_memory in INFO memory")?;
    let keys: i64 = redis::cmd("DBSIZE")
        .query_async(conn)
        .await
        .map_err(|e| e.to_string())?;
    Ok((used, keys))
}

/// Table 6: `INFO memory` `used_memory` before and after 100,000 callers made one call each.
#[allow(clippy::too_many_lines)] // one table: six contenders set up, run and reported
pub fn table_memory_per_key(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
    cfg: &Config,
) -> Result<String, String> {
    let url = server.url();
    let callers = cfg.memory_keys;
    let client = redis::Client::open(url.as_str()).map_err(|e| e.to_string())?;
    let mut conn = rt
        .block_on(ConnectionManager::new(client))
        .map_err(|e| e.to_string())?;
    let store = Rc::new(
        rt.block_on(RedisStore::connect(&url))
            .map_err(|e| e.to_string())?,
    );
    let mut table = Table::new(&[
        "state (100 calls a day per caller)",
        "key length (bytes)",
        "bytes per active key",
        "keys",
        "target ≤ 100",
    ]);
    let mut measure =
        |name: String, key_len: usize, target: Option<f64>, call: Caller| -> Result<(), String> {
            rt.block_on(async {
                redis::cmd("FLUSHALL")
                    .arg("SYNC")
                    .query_async::<()>(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                let (before, _) = used_memory(&mut conn).await?;
                let next = Rc::new(Cell::new(0usize));
                let local = tokio::task::LocalSet::new();
                for _ in 0..200 {
                    let (next, call) = (next.clone(), call.clone());
                    local.spawn_local(async move {
                        loop {
                            let i = next.get();
                            if i >= callers {
                                break;
                            }
                            next.set(i + 1);
                            if let Err(e) = call(i).await {
                                eprintln!("  ! {e}");
                                break;
                            }
                        }
                    });
                }
                local.await;
                let (after, keys) = used_memory(&mut conn).await?;
                let per_key = (after - before) as f64 / callers as f64;
                table.row(vec![
                    name,
                    key_len.to_string(),
                    format!("{per_key:.0}"),
                    rate(keys as f64),
                    target.map_or("—".to_owned(), |t| verdict(per_key <= t).to_owned()),
                ]);
                Ok(())
            })
        };
    let policy_of =
        |a| Policy::new(a, 100, PERIOD_MEMORY).unwrap_or_else(|e| panic!("policy: {e}"));
    for algorithm in Algorithm::ALL {
        let policy = policy_of(algorithm);
        let store = store.clone();
        let target = (algorithm != Algorithm::Sliding).then_some(100.0);
        measure(
            format!("ratelimit {algorithm} (one call)"),
            ip_key(&policy, 0).len(),
            target,
            Rc::new(move |i| {
                let store = store.clone();
                let key = ip_key(&policy, i);
                Box::pin(async move {
                    store
                        .check(&[Check::new(&key, &policy)])
                        .await
                        .map(|v| v.is_admitted())
                        .map_err(|e| e.to_string())
                })
            }),
        )?;
    }
    // The least any Redis limiter pays per caller with this key text: one small integer with
    // a TTL (what a fixed window is), written with a plain SET.
    let policy = policy_of(Algorithm::Fixed);
    let client = redis::Client::open(url.as_str()).map_err(|e| e.to_string())?;
    let raw = rt
        .block_on(ConnectionManager::new(client))
        .map_err(|e| e.to_string())?;
    measure(
        "floor: `SET <key> 1 PX <period>` (no limiter)".to_owned(),
        ip_key(&policy, 0).len(),
        None,
        Rc::new(move |i| {
            let mut raw = raw.clone();
            let key = ip_key(&policy, i);
            Box::pin(async move {
                redis::cmd("SET")
                    .arg(&key)
                    .arg(1)
                    .arg("PX")
                    .arg(PERIOD_MEMORY.as_millis().to_string())
                    .query_async::<()>(&mut raw)
                    .await
                    .map(|()| true)
                    .map_err(|e| e.to_string())
            })
        }),
    )?;
    // A peer, with the same key text.
    let aerl = {
        let client = redis026::Client::open(url.as_str()).map_err(|e| e.to_string())?;
        let manager = rt
            .block_on(redis026::aio::ConnectionManager::new(client))
            .map_err(|e| e.to_string())?;
        Rc::new(RedisBackend::builder(manager).build())
    };
    measure(
        "actix-extensible-rate-limit (BITFIELD + EXPIRE)".to_owned(),
        ip_key(&policy, 0).len(),
        None,
        Rc::new(move |i| {
            let aerl = aerl.clone();
            let key = ip_key(&policy, i);
            Box::pin(async move {
                let input = SimpleInput {
                    interval: PERIOD_MEMORY,
                    max_requests: 100,
                    key,
                };
                aerl.request(input)
                    .await
                    .map(|(d, _, _)| d.is_allowed())
                    .map_err(|e| e.to_string())
            })
        }),
    )?;
    eprintln!("  table 6 done");
    Ok(table.markdown())
}

/// `profile <what> <seconds>`: one contender alone under table 1's load, for `perf record -p`.
/// `what`: `store-<algorithm>` or `aerl`.
pub fn profile(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
    what: &str,
    dur: Duration,
) -> Result<(), String> {
    let out = if let Some(name) = what.strip_prefix("store-") {
        let algorithm: Algorithm = name.parse().map_err(|e| format!("{name}: {e}"))?;
        let policy = throughput_policy(algorithm);
        let store = Rc::new(
            rt.block_on(RedisStore::connect(&server.url()))
                .map_err(|e| e.to_string())?,
        );
        let keys = keys(&policy, "bench");
        timed(server, || rt.block_on(ours(store, policy, keys, dur)))
    } else if what == "aerl" {
        let client = redis026::Client::open(server.url()).map_err(|e| e.to_string())?;
        let manager = rt
            .block_on(redis026::aio::ConnectionManager::new(client))
            .map_err(|e| e.to_string())?;
        let aerl = Rc::new(RedisBackend::builder(manager).build());
        let keys = keys(&throughput_policy(Algorithm::Fixed), "baerl");
        timed(server, || {
            rt.block_on(load(TASKS, dur, move |i| {
                let (aerl, keys) = (aerl.clone(), keys.clone());
                async move { aerl_check(&aerl, keys[i].clone()).await }
            }))
        })
    } else {
        return Err(format!("unknown profile target {what}"));
    };
    eprintln!(
        "{what}: {} calls/s, server {:.1} µs/call, client {:.1} µs/call",
        rate(out.per_sec),
        out.server_us,
        out.client_us
    );
    Ok(())
}
