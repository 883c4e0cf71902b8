//! The benchmark suite: `cargo run --release --manifest-path tests/bench/Cargo.toml`.
//!
//! Starts its own `redis-server` (free port, no persistence, temp dir), measures the tables
//! of BENCHMARKS.md (and table 8, leases on one hot key) and prints them in Markdown on stdout (progress goes to stderr).
//! Every figure that has a target is a ratio of two contenders measured side by side in this
//! one run, in interleaved rounds (A B A B …), and the median of the per-round ratios is
//! reported: absolute numbers on a shared 2-core machine are noise, ratios much less so.
//!
//! Arguments: `--quick` (short runs, for trying the harness), `--only 1,3` (some tables).
//! `serve <memory|redis-url>` is the HTTP server child of table 4; `count <hot|many> <algo> <n>`
//! is the child that table 3 runs under callgrind; `profile <what> [seconds]` runs one
//! contender alone for `perf record -p`; `lease <row> <url> <prefix> <ms>` is one of table 8's
//! processes; `connect <url>` is one of table 9's fresh processes.

mod cold_bench;
mod http_bench;
mod lease_bench;
mod memory_bench;
mod redis_bench;
mod report;
mod server;
mod server_cost;

use std::process::Command;
use std::time::{Duration, Instant};

/// Run lengths.
#[derive(Debug, Clone)]
pub struct Config {
    /// Interleaved rounds per comparison.
    pub rounds: usize,
    /// One timed Redis run.
    pub run: Duration,
    /// One timed memory-store run.
    pub mem_run: Duration,
    /// One `wrk` run.
    pub http_run: Duration,
    /// A warm-up run before each comparison.
    pub warmup: Duration,
    /// Samples per latency row.
    pub latency_samples: usize,
    /// Callers in the memory-per-key table.
    pub memory_keys: usize,
    /// One timed run of the lease table's processes.
    pub lease_run: Duration,
}

impl Config {
    fn full() -> Self {
        Self {
            rounds: 4,
            run: Duration::from_secs(2),
            mem_run: Duration::from_millis(500),
            http_run: Duration::from_secs(2),
            warmup: Duration::from_secs(1),
            latency_samples: 20_000,
            memory_keys: 100_000,
            lease_run: Duration::from_secs(3),
        }
    }

    fn quick() -> Self {
        Self {
            rounds: 2,
            run: Duration::from_millis(500),
            mem_run: Duration::from_millis(200),
            http_run: Duration::from_secs(1),
            warmup: Duration::from_millis(200),
            latency_samples: 2_000,
            memory_keys: 100_000,
            lease_run: Duration::from_secs(1),
        }
    }
}

/// A tiny deterministic PRNG for picking callers (no dependency, no shared state).
#[derive(Debug)]
pub struct XorShift(u64);

impl XorShift {
    /// A generator from a non-zero seed.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        #[allow(clippy::cast_possible_truncation)]
        let i = (x % n as u64) as usize;
        i
    }
}

fn sh(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd).args(args).output().map_or_else(
        |e| format!("({cmd}: {e})"),
        |o| String::from_utf8_lossy(&o.stdout).trim().to_owned(),
    )
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map_or("unknown", |v| v.trim_start_matches([' ', '\t', ':']));
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .map_or("unknown".to_owned(), |v| {
            let kb: f64 = v
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .unwrap_or(0.0);
            format!("{:.1} GiB", kb / 1024.0 / 1024.0)
        });
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZeroUsize::get);
    format!(
        "- date: {}\n- machine: {cores} cores (nproc), {model}, {mem} RAM, {}\n- {}; {}; {}\n",
        sh("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        sh("uname", &["-sr"]),
        sh("redis-server", &["--version"]),
        sh("rustc", &["--version"]),
        sh("wrk", &["--version"])
            .lines()
            .next()
            .unwrap_or("wrk: not installed"),
    )
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("serve") {
        let store = args.get(1).map_or("memory", String::as_str);
        if let Err(e) = http_bench::serve(store) {
            eprintln!("server: {e}");
            std::process::exit(1);
        }
        return;
    }
    if args.first().map(String::as_str) == Some("count") {
        if let Err(e) = memory_bench::count(&args[1..]) {
            eprintln!("count: {e}");
            std::process::exit(1);
        }
        return;
    }
    if args.first().map(String::as_str) == Some("lease") {
        if let Err(e) = lease_bench::child(&args[1..]) {
            eprintln!("lease: {e}");
            std::process::exit(1);
        }
        return;
    }
    if args.first().map(String::as_str) == Some("connect") {
        if let Err(e) = cold_bench::child(&args[1..]) {
            eprintln!("connect: {e}");
            std::process::exit(1);
        }
        return;
    }
    if args.first().map(String::as_str) == Some("profile") {
        if let Err(e) = profile(&args[1..]) {
            eprintln!("profile: {e}");
            std::process::exit(1);
        }
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let cfg = if quick {
        Config::quick()
    } else {
        Config::full()
    };
    let only: Option<Vec<u8>> = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(|list| {
            list.split(',')
                .filter_map(|n| n.trim().parse().ok())
                .collect()
        });
    let wanted = |n: u8| only.as_ref().is_none_or(|o| o.contains(&n));
    if let Err(e) = run(&cfg, quick, &wanted) {
        eprintln!("benchmark failed: {e}");
        std::process::exit(1);
    }
}

/// `profile <what> [seconds]`: one contender alone, long enough to attach `perf record -p`
/// (see BENCHMARKS.md for the commands).
fn profile(args: &[String]) -> Result<(), String> {
    let what = args.first().ok_or("profile what?")?;
    let secs: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(10);
    let dur = Duration::from_secs(secs);
    eprintln!("pid {}", std::process::id());
    if what.starts_with("memory-") {
        return memory_bench::profile(what, dur);
    }
    let server = server::RedisServer::start()?;
    eprintln!("redis-server pid {}", server.pid());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    redis_bench::profile(&rt, &server, what, dur)
}

/// A table: its number, its title, and what measures it.
type Section<'a> = (u8, &'a str, &'a dyn Fn() -> Result<String, String>);

fn run(cfg: &Config, quick: bool, wanted: &dyn Fn(u8) -> bool) -> Result<(), String> {
    let started = Instant::now();
    let server = server::RedisServer::start()?;
    eprintln!(
        "redis-server on port {} (pid {})",
        server.port(),
        server.pid()
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    println!("## Machine and run\n");
    print!("{}", machine());
    println!(
        "- {} rounds per comparison, interleaved; Redis runs {:?}, memory runs {:?}, wrk runs {:?}, lease runs {:?}{}\n",
        cfg.rounds,
        cfg.run,
        cfg.mem_run,
        cfg.http_run,
        cfg.lease_run,
        if quick {
            " (--quick: NOT the published figures)"
        } else {
            ""
        },
    );
    let sections: [Section<'_>; 9] = [
        (
            1,
            "1. Redis store vs `redis-benchmark` sending the same call (FCALL of the library, EVALSHA without Functions)",
            &|| redis_bench::table_store_vs_redis_benchmark(&rt, &server, cfg),
        ),
        (2, "2. Redis store vs the Rust Redis peers", &|| {
            redis_bench::table_peers(&rt, &server, cfg)
        }),
        (
            3,
            "3. Memory store vs governor's keyed limiter (2 threads)",
            &|| Ok(memory_bench::table(cfg)),
        ),
        (
            4,
            "4. The macro's overhead on an Axum handler (wrk, loopback)",
            &|| http_bench::table(&server, cfg),
        ),
        (5, "5. Latency of one Redis-backed check vs PING", &|| {
            redis_bench::table_latency(&rt, &server, cfg)
        }),
        (
            6,
            "6. Redis memory per active key (100,000 callers, one call each)",
            &|| redis_bench::table_memory_per_key(&rt, &server, cfg),
        ),
        (
            7,
            "7. What one check costs redis-server (callgrind; `INFO commandstats`)",
            &|| server_cost::table(&rt, &server, cfg),
        ),
        (
            8,
            "8. Leases on one hot key (4 processes × 16 tasks, 100,000 a minute and a quota no run reaches)",
            &|| lease_bench::table(&server, cfg),
        ),
        (
            9,
            "9. A cold start: a fresh process's first connection",
            &|| cold_bench::table(&server, cfg),
        ),
    ];
    // A table that cannot be measured (say, wrk is not installed) says so in its place and
    // the others still run; the exit status reports it.
    let mut failed = Vec::new();
    for (n, title, f) in sections {
        if !wanted(n) {
            continue;
        }
        eprintln!("table {n} …");
        let t = Instant::now();
        match f() {
            Ok(body) => println!("### {title}\n\n{body}"),
            Err(e) => {
                println!("### {title}\n\n**Not measured:** {e}\n");
                failed.push(n);
            }
        }
        eprintln!("table {n}: {:.0} s", t.elapsed().as_secs_f64());
    }
    println!(
        "Measured in {:.0} s (after the build).",
        started.elapsed().as_secs_f64()
    );
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("tables not measured: {failed:?}"))
    }
}
