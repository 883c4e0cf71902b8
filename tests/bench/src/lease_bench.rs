//! Table 8: leases on one hot key. 4 processes (children of this binary, `lease <row> <url>
//! <prefix> <ms>`) × 16 tasks call one `#[rate_limit]` function on one global key, on the
//! bench's redis-server, for a fixed time: once with the attribute as it is (one round trip
//! per call) and once with `lease = "100ms"` (a process takes k units in one take and serves
//! the next calls from memory). Each row has a key of its own (a key prefix per row and run).
//!
//! Around the timed run (all children connected, then started together on a line on their
//! stdin) the parent reads `INFO cpu` and `INFO commandstats`: redis-server's CPU seconds per
//! wall second, and the commands it ran per call (a script's `redis.call`s included; the
//! leases' returns after the run counted too, `INFO`, `CONFIG` and `COMMAND` left out).

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ratelimit_runtime::{RateLimitError, RateLimiter, rate_limit};

use crate::Config;
use crate::report::{Table, rate, ratio, verdict};
use crate::server::RedisServer;

/// Processes sharing the key, and the tasks in each.
const PROCESSES: usize = 4;
const TASKS: usize = 16;
/// The quota of the rows that spend it: 100,000 a minute.
const QUOTA: u64 = 100_000;
/// The quotas no run reaches: every call is admitted, so the rows compare serving from a
/// lease with a round trip per call. GCRA admits at most one unit per µs (60,000,000 a
/// minute).
const HUGE: u64 = 100_000_000;
const HUGE_GCRA: u64 = 60_000_000;
/// How long a child waits after its run for its leases to end and give back their units.
const SETTLE: Duration = Duration::from_millis(400);

#[rate_limit(num = 100000, time = 60, scope = "bench-hot")]
async fn fixed_one() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(num = 100000, time = 60, scope = "bench-hot", lease = "100ms")]
async fn fixed_lease() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(num = 100000000, time = 60, scope = "bench-hot")]
async fn fixed_huge_one() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(num = 100000000, time = 60, scope = "bench-hot", lease = "100ms")]
async fn fixed_huge_lease() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(algo = "gcra", num = 100000, time = 60, scope = "bench-hot")]
async fn gcra_one() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(
    algo = "gcra",
    num = 100000,
    time = 60,
    scope = "bench-hot",
    lease = "100ms"
)]
async fn gcra_lease() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(algo = "gcra", num = 60000000, time = 60, scope = "bench-hot")]
async fn gcra_huge_one() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(
    algo = "gcra",
    num = 60000000,
    time = 60,
    scope = "bench-hot",
    lease = "100ms"
)]
async fn gcra_huge_lease() -> Result<(), RateLimitError> {
    Ok(())
}

/// One row: its child's name, the algorithm, the quota, and whether it leases.
struct Row {
    name: &'static str,
    algorithm: &'static str,
    quota: u64,
    lease: bool,
}

const fn row(name: &'static str, algorithm: &'static str, quota: u64, lease: bool) -> Row {
    Row {
        name,
        algorithm,
        quota,
        lease,
    }
}

/// The rows, in pairs (one round trip, then lease) and in the table's order.
const ROWS: [Row; 8] = [
    row("fixed-huge-one", "fixed", HUGE, false),
    row("fixed-huge-lease", "fixed", HUGE, true),
    row("fixed-one", "fixed", QUOTA, false),
    row("fixed-lease", "fixed", QUOTA, true),
    row("gcra-huge-one", "gcra", HUGE_GCRA, false),
    row("gcra-huge-lease", "gcra", HUGE_GCRA, true),
    row("gcra-one", "gcra", QUOTA, false),
    row("gcra-lease", "gcra", QUOTA, true),
];

// ---------------------------------------------------------------- the child

/// What one child counted.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    admitted: u64,
    limited: u64,
    failed: u64,
}

/// `lease <row> <url> <prefix> <ms>`: installs a limiter on that Redis with that key prefix,
/// prints `READY`, waits for a line on stdin, runs [`TASKS`] tasks calling the row's function
/// for `ms`, prints `DONE`, waits [`SETTLE`] for its leases to end and prints
/// `lease-report admitted=… limited=… failed=… secs=… held_max=… held_end=… failing=…`.
pub fn child(args: &[String]) -> Result<(), String> {
    let [row, url, prefix, ms] = args else {
        return Err("expected lease <row> <url> <prefix> <ms>".to_owned());
    };
    let dur = Duration::from_millis(ms.parse().map_err(|e| format!("{ms}: {e}"))?);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let limiter = rt.block_on(async {
        // A timeout far above any queueing delay of this load: a call the store did not answer
        // in time would be admitted by the failure policy without Redis.
        RateLimiter::builder()
            .redis_url(url.as_str())
            .prefix(prefix.as_str())
            .timeout(Duration::from_secs(5))
            .build()
            .await
            .map_err(|e| e.to_string())
    })?;
    limiter.install().map_err(|e| e.to_string())?;
    println!("READY");
    let mut go = String::new();
    std::io::stdin()
        .read_line(&mut go)
        .map_err(|e| e.to_string())?;
    let (counts, secs, held_max) = match row.as_str() {
        "fixed-one" => rt.block_on(hammer(fixed_one, dur)),
        "fixed-lease" => rt.block_on(hammer(fixed_lease, dur)),
        "fixed-huge-one" => rt.block_on(hammer(fixed_huge_one, dur)),
        "fixed-huge-lease" => rt.block_on(hammer(fixed_huge_lease, dur)),
        "gcra-one" => rt.block_on(hammer(gcra_one, dur)),
        "gcra-lease" => rt.block_on(hammer(gcra_lease, dur)),
        "gcra-huge-one" => rt.block_on(hammer(gcra_huge_one, dur)),
        "gcra-huge-lease" => rt.block_on(hammer(gcra_huge_lease, dur)),
        other => return Err(format!("no row {other}")),
    };
    println!("DONE");
    rt.block_on(async { tokio::time::sleep(SETTLE).await });
    println!(
        "lease-report admitted={} limited={} failed={} secs={secs:.6} held_max={held_max} held_end={} failing={}",
        counts.admitted,
        counts.limited,
        counts.failed,
        limiter.lease_units_held(),
        u8::from(limiter.store_failing()),
    );
    Ok(())
}

/// [`TASKS`] tasks calling `f` back to back for `dur`: what they counted, the seconds they
/// took, and the most units held in leases at once (sampled every 2 ms).
async fn hammer<F, Fut>(f: F, dur: Duration) -> (Counts, f64, u64)
where
    F: Fn() -> Fut + Copy + Send + 'static,
    Fut: Future<Output = Result<(), RateLimitError>> + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let held_max = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (stop, held_max) = (stop.clone(), held_max.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                held_max.fetch_max(RateLimiter::current().lease_units_held(), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let start = Instant::now();
    let deadline = start + dur;
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            tokio::spawn(async move {
                let mut c = Counts::default();
                while Instant::now() < deadline {
                    for _ in 0..16 {
                        match f().await {
                            Ok(()) => c.admitted += 1,
                            Err(e) if e.is_limited() => c.limited += 1,
                            Err(_) => c.failed += 1,
                        }
                    }
                }
                c
            })
        })
        .collect();
    let mut all = Counts::default();
    for t in tasks {
        let c = t.await.unwrap_or(Counts {
            failed: 1,
            ..Counts::default()
        });
        all.admitted += c.admitted;
        all.limited += c.limited;
        all.failed += c.failed;
    }
    let secs = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.await;
    (all, secs, held_max.load(Ordering::Relaxed))
}

// ---------------------------------------------------------------- the parent

/// One child of a row.
struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Proc {
    fn spawn(row: &str, url: &str, prefix: &str, dur: Duration) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut child = Command::new(exe)
            .args(["lease", row, url, prefix, &dur.as_millis().to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| e.to_string())?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        Ok(Self {
            child,
            stdin,
            stdout,
        })
    }

    /// Reads lines until one starts with `prefix`; that line.
    fn expect(&mut self, prefix: &str) -> Result<String, String> {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self
                .stdout
                .read_line(&mut line)
                .map_err(|e| e.to_string())?;
            if n == 0 {
                return Err(format!("a child ended before {prefix:?}"));
            }
            if line.starts_with(prefix) {
                return Ok(line.trim().to_owned());
            }
        }
    }

    fn go(&mut self) -> Result<(), String> {
        let mut stdin = self.stdin.take().ok_or("no stdin")?;
        stdin.write_all(b"go\n").map_err(|e| e.to_string())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// A child's `lease-report` line.
#[derive(Debug, Default, Clone, Copy)]
struct Report {
    counts: Counts,
    secs: f64,
    held_max: u64,
    held_end: u64,
    failing: bool,
}

fn parse(line: &str) -> Result<Report, String> {
    let field = |name: &str| -> Result<&str, String> {
        line.split(' ')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .ok_or_else(|| format!("no {name} in {line:?}"))
    };
    let int = |name: &str| -> Result<u64, String> {
        field(name)?.parse().map_err(|e| format!("{name}: {e}"))
    };
    Ok(Report {
        counts: Counts {
            admitted: int("admitted")?,
            limited: int("limited")?,
            failed: int("failed")?,
        },
        secs: field("secs")?.parse().map_err(|e| format!("secs: {e}"))?,
        held_max: int("held_max")?,
        held_end: int("held_end")?,
        failing: int("failing")? != 0,
    })
}

/// `INFO commandstats` summed over every command but those the bench sends itself (`INFO`,
/// `CONFIG`, `COMMAND`): (commands run, script calls: `FCALL`, `EVALSHA`, `EVAL`).
fn commands(server: &RedisServer) -> Result<(u64, u64), String> {
    const SCRIPTS: [&str; 4] = ["fcall", "fcall_ro", "evalsha", "eval"];
    let stats = server.command_stats()?;
    let all = stats.iter().map(|s| s.calls).sum();
    let scripts = stats
        .iter()
        .filter(|s| SCRIPTS.contains(&s.command.as_str()))
        .map(|s| s.calls)
        .sum();
    Ok((all, scripts))
}

/// redis-server's CPU time so far (`INFO cpu`: user + system), seconds.
fn server_cpu(server: &RedisServer) -> Result<f64, String> {
    let info = server.cli(&["INFO", "cpu"])?;
    Ok(["used_cpu_sys:", "used_cpu_user:"]
        .iter()
        .filter_map(|k| info.lines().find_map(|l| l.strip_prefix(k)))
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum())
}

/// What one row measured.
#[derive(Debug, Default, Clone, Copy)]
struct Measured {
    per_sec: f64,
    calls: u64,
    admitted: u64,
    failed: u64,
    commands: u64,
    scripts: u64,
    cores: f64,
    /// The run's wall time (from the start to the last child's end), seconds.
    wall: f64,
    held_max: u64,
    held_end: u64,
    failing: bool,
}

/// One row: [`PROCESSES`] children on a key of their own, started together.
fn measure(
    server: &RedisServer,
    row: &Row,
    prefix: &str,
    dur: Duration,
) -> Result<Measured, String> {
    let url = server.url();
    let mut procs = (0..PROCESSES)
        .map(|_| Proc::spawn(row.name, &url, prefix, dur))
        .collect::<Result<Vec<_>, _>>()?;
    for p in &mut procs {
        p.expect("READY")?;
    }
    let (commands_before, scripts_before) = commands(server)?;
    let cpu_before = server_cpu(server)?;
    let start = Instant::now();
    for p in &mut procs {
        p.go()?;
    }
    for p in &mut procs {
        p.expect("DONE")?;
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu = server_cpu(server)? - cpu_before;
    let reports = procs
        .iter_mut()
        .map(|p| p.expect("lease-report").and_then(|l| parse(&l)))
        .collect::<Result<Vec<_>, _>>()?;
    drop(procs); // every child has ended: its leases' returns are in the stats
    let (commands_after, scripts_after) = commands(server)?;
    let mut m = Measured {
        cores: cpu / wall,
        wall,
        commands: commands_after - commands_before,
        scripts: scripts_after - scripts_before,
        ..Measured::default()
    };
    for r in &reports {
        let calls = r.counts.admitted + r.counts.limited;
        m.per_sec += calls as f64 / r.secs.max(1e-9);
        m.calls += calls;
        m.admitted += r.counts.admitted;
        m.failed += r.counts.failed;
        m.held_max = m.held_max.max(r.held_max);
        m.held_end += r.held_end;
        m.failing |= r.failing;
    }
    Ok(m)
}

/// The most a row may admit in a run of `wall` seconds: its quota for a fixed window (one
/// window, which starts at the first admitted call); for GCRA, the burst (the quota) and what
/// drips back during the run (the quota per minute).
fn most_admitted(row: &Row, wall: f64) -> u64 {
    if row.algorithm == "gcra" {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let dripped = (row.quota as f64 * wall / 60.0).ceil() as u64;
        row.quota + dripped
    } else {
        row.quota
    }
}

/// What the bench checks of a row beyond its figures: loud notes, not panics.
fn sanity(row: &Row, m: &Measured) -> Vec<String> {
    let mut notes = Vec::new();
    let bound = most_admitted(row, m.wall);
    if row.quota == QUOTA && m.admitted > bound {
        notes.push(format!(
            "**OVER THE QUOTA: `{}` admitted {}, at most {} allowed.**",
            row.name,
            rate(m.admitted as f64),
            rate(bound as f64)
        ));
    }
    if m.failed > 0 || m.failing {
        notes.push(format!(
            "**`{}`: {} calls failed, breaker open: {}** (answers not all from Redis).",
            row.name, m.failed, m.failing
        ));
    }
    if m.held_end > 0 {
        notes.push(format!(
            "**`{}`: {} units still held {SETTLE:?} after the run.**",
            row.name, m.held_end
        ));
    }
    if row.quota != QUOTA && m.admitted < m.calls {
        notes.push(format!(
            "**`{}`: {} calls rejected under a quota no run should reach.**",
            row.name,
            m.calls - m.admitted
        ));
    }
    notes
}

/// Table 8 (see the module's documentation).
pub fn table(server: &RedisServer, cfg: &Config) -> Result<String, String> {
    let dur = cfg.lease_run;
    let run_id = std::process::id();
    let mut table = Table::new(&[
        "algorithm",
        "mode",
        "quota (per minute)",
        "calls/s (4 processes, admitted + rejected)",
        "lease ÷ one round trip",
        "admitted in the run",
        "Redis commands per call (script calls per call)",
        "redis-server CPU (cores)",
        "most units held in one process's leases",
    ]);
    let mut notes = Vec::new();
    let mut pairs = Vec::new();
    let mut one_trip: Option<Measured> = None;
    for (i, row) in ROWS.iter().enumerate() {
        let prefix = format!("bench8-{run_id}-{i}-{}", row.name);
        let m = measure(server, row, &prefix, dur)?;
        eprintln!("  table 8: {} done ({} calls/s)", row.name, rate(m.per_sec));
        notes.extend(sanity(row, &m));
        let calls = m.calls.max(1) as f64;
        let speedup = match (row.lease, one_trip) {
            (true, Some(base)) => {
                let r = m.per_sec / base.per_sec;
                pairs.push((row, r, m, base));
                ratio(r)
            }
            _ => "—".to_owned(),
        };
        table.row(vec![
            row.algorithm.to_owned(),
            if row.lease {
                "lease 100ms".to_owned()
            } else {
                "one round trip".to_owned()
            },
            rate(row.quota as f64),
            rate(m.per_sec),
            speedup,
            rate(m.admitted as f64),
            format!(
                "{:.4} ({:.4})",
                m.commands as f64 / calls,
                m.scripts as f64 / calls
            ),
            format!("{:.2}", m.cores),
            if row.lease {
                rate(m.held_max as f64)
            } else {
                "—".to_owned()
            },
        ]);
        one_trip = (!row.lease).then_some(m);
    }
    let mut out = table.markdown();
    out.push('\n');
    let summary: Vec<String> = pairs
        .iter()
        .map(|(row, r, m, base)| {
            let target = row.quota != QUOTA;
            let cores = m.cores;
            let share = |x: &Measured| 100.0 * x.admitted as f64 / x.calls.max(1) as f64;
            format!(
                "{} at {}/min: {} the calls/s of one round trip per call, redis-server at {cores:.2} cores{}",
                row.algorithm,
                rate(row.quota as f64),
                ratio(*r),
                if target {
                    format!(" (target ≥ 10× and < 1 core: {})", verdict(*r >= 10.0 && cores < 1.0))
                } else {
                    format!(
                        " (no target: {:.0}% of the lease row's calls and {:.0}% of the other's were admitted)",
                        share(m),
                        share(base)
                    )
                }
            )
        })
        .collect();
    let _ = writeln!(
        out,
        "Each row: {PROCESSES} processes × {TASKS} tasks (a 2-thread runtime each) call one `#[rate_limit]` function on one global key for {dur:?}, from a cold start, on the bench's redis-server; a key of its own per row. *One round trip* is the attribute as it is; *lease 100ms* adds `lease = \"100ms\"` (default `lease_max`, 1,000 units). Calls/s counts every answered call (admitted and rejected), summed over the processes. Commands per call: `INFO commandstats` before and after (every command, a script's `redis.call`s included, the leases' returns after the run too), over the calls made; script calls are `FCALL`/`EVALSHA` alone. CPU: redis-server's `used_cpu_sys + used_cpu_user` over the run's wall time. The huge quotas are never reached: every call is admitted, so those rows compare serving from a lease with a round trip per call (the issue's target: ≥ 10× the calls/s with redis-server under one core). At 100,000 a minute a lease row spends the quota early in the run, and one round trip per call spends it if the run lasts long enough (100,000 ÷ its calls/s); after that a call is answered mostly from the blocked-caller cache, so those calls/s are mostly those of rejections (no target), and *admitted* must stay ≤ 100,000 (GCRA: ≤ 100,000 and the ~1,667 a second that drip back during the run; its short waits also keep the blocked-caller cache from answering for long, and a process leases no more than the store said was left, so once the burst is spent its calls are ordinary checks). This run: {}.",
        summary.join("; ")
    );
    for note in notes {
        out.push('\n');
        out.push_str(&note);
        out.push('\n');
    }
    Ok(out)
}
