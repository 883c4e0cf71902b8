//! A cold start does not fail open (SPEC §8): checks that arrive while the
//! store is still connecting wait for that connection within their own timeout instead of
//! being answered by the failure policy.
//!
//! Each test starts a private `redis-server` (or a Redis Cluster), then three fresh OS processes
//! at once (this test binary run again, with [`CHILD_ENV`] set, executing only
//! [`child_process`]). Each child makes [`CALLS`] concurrent calls against one limit of
//! [`LIMIT`] per hour (nothing refills while the test runs), all released together by a barrier
//! before the store has connected, and prints its counts. The parent sums them: together the three processes must admit exactly [`LIMIT`]
//! calls and reject the rest, and no call may have been answered by the failure policy. Once
//! per algorithm (fixed, sliding, leaky, token), each time with three new processes.
//!
//! The limiter is configured the two ways an application that starts without connecting gets
//! one: from the environment (`RATELIMIT_REDIS_URL` or `RATELIMIT_REDIS_CLUSTER_NODES`,
//! [`RateLimiter::current`] with nothing installed, its timeout from `RATELIMIT_TIMEOUT_MS`) and
//! with [`Builder::build_lazy`]. Both get a 2 s timeout, so that the test does not depend on the
//! machine's speed: what it shows is that the first checks wait for the connection instead of
//! being answered by the failure policy.
//!
//! Each child also reports its slowest call: how close the checks came to their timeout (a
//! check still waiting for the connection at its timeout is answered by the failure policy, as
//! SPEC §8 says).
//!
//! [`Builder::build_lazy`]: ratelimit_runtime::limiter::Builder::build_lazy

use std::fmt::Write as _;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ratelimit_runtime::{Algorithm, Policy, RateLimiter, store::Check};
use ratelimit_tests::redis_cluster::RedisCluster;
use ratelimit_tests::redis_server::RedisServer;

/// Set (to a [`Mode`] name) in a child's environment: the child runs [`child_process`].
const CHILD_ENV: &str = "RATELIMIT_COLD_START_CHILD";

/// The algorithm a child's calls are limited by.
const ALGO_ENV: &str = "RATELIMIT_COLD_START_ALGO";

/// The Redis URL (or comma-separated cluster seed nodes) a `lazy` child builds its limiter with.
const URL_ENV: &str = "RATELIMIT_COLD_START_URL";

/// The fresh processes started at once.
const PROCESSES: usize = 3;

/// Concurrent calls per algorithm in each process.
const CALLS: usize = 100;

/// The quota of each limit (per hour: nothing refills while the test runs).
const LIMIT: u64 = 50;

/// The period of each limit.
#[allow(
    clippy::duration_suboptimal_units,
    reason = "Duration::from_hours is newer than the workspace's rust-version"
)]
const PERIOD: Duration = Duration::from_secs(3600);

/// The timeout of both limiters (`build_lazy`'s, and `RATELIMIT_TIMEOUT_MS` for the one from
/// the environment): generous, so the test does not depend on the machine's speed.
const LAZY_TIMEOUT: Duration = Duration::from_secs(2);

/// How a child's report lines start.
const REPORT: &str = "cold-start-report";

/// The tests run one at a time: two sets of three processes at once on a small machine would
/// only eat into the limiters' timeout.
static SERIAL: Mutex<()> = Mutex::new(());

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `RATELIMIT_REDIS_URL` and [`RateLimiter::current`], nothing installed.
    Env,
    /// `RateLimiter::builder().redis_url(..).timeout(LAZY_TIMEOUT).build_lazy()`.
    Lazy,
    /// `RATELIMIT_REDIS_CLUSTER_NODES` and [`RateLimiter::current`], nothing installed.
    EnvCluster,
    /// `RateLimiter::builder().redis_cluster(..).timeout(LAZY_TIMEOUT).build_lazy()`.
    LazyCluster,
}

impl Mode {
    const ALL: [Self; 4] = [Self::Env, Self::Lazy, Self::EnvCluster, Self::LazyCluster];

    fn name(self) -> &'static str {
        match self {
            Self::Env => "env",
            Self::Lazy => "lazy",
            Self::EnvCluster => "env-cluster",
            Self::LazyCluster => "lazy-cluster",
        }
    }

    fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The store the child's limiter must use.
    fn store(self) -> &'static str {
        match self {
            Self::Env | Self::Lazy => "redis",
            Self::EnvCluster | Self::LazyCluster => "redis-cluster",
        }
    }

    /// The variable the parent hands the Redis URL (or the cluster's comma-separated seed
    /// nodes) in.
    fn url_env(self) -> &'static str {
        match self {
            Self::Env => "RATELIMIT_REDIS_URL",
            Self::EnvCluster => "RATELIMIT_REDIS_CLUSTER_NODES",
            Self::Lazy | Self::LazyCluster => URL_ENV,
        }
    }
}

/// What the calls of one algorithm got, in one process or summed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Counts {
    /// Admitted by the store.
    admitted: u64,
    /// Rejected (by the store or the blocked-caller cache).
    limited: u64,
    /// Answered by the failure policy (allow: admitted without the store deciding).
    failure: u64,
}

impl Counts {
    fn add(&mut self, other: Self) {
        self.admitted += other.admitted;
        self.limited += other.limited;
        self.failure += other.failure;
    }
}

/// One hash tag per mode and algorithm: on a cluster the limits spread over the masters.
fn key(mode: Mode, algorithm: Algorithm) -> String {
    format!(
        "ratelimit:{{cold-start-{}-{}}}:limit",
        mode.name(),
        algorithm.as_str()
    )
}

// ---------------------------------------------------------------- the child

/// The child's side: does nothing unless [`CHILD_ENV`] is set (a normal run of this binary).
///
/// With it set, builds the limiter the way the mode says, releases [`CALLS`] calls of the
/// algorithm [`ALGO_ENV`] names at once (before anything has connected) and prints one line:
/// `cold-start-report store=<name> algo=<algo> admitted=<n> limited=<n> failure=<n>
/// slowest_us=<µs>` (the slowest call: how close it came to the timeout, shown in the output).
#[test]
fn child_process() {
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mode = Mode::parse(&mode).unwrap_or_else(|| panic!("unknown {CHILD_ENV}={mode}"));
    let algo = std::env::var(ALGO_ENV).unwrap_or_default();
    let algorithm = Algorithm::ALL
        .into_iter()
        .find(|a| a.as_str() == algo)
        .unwrap_or_else(|| panic!("unknown {ALGO_ENV}={algo}"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    runtime.block_on(child(mode, algorithm));
}

async fn child(mode: Mode, algorithm: Algorithm) {
    let limiter = match mode {
        Mode::Env | Mode::EnvCluster => RateLimiter::current(),
        Mode::Lazy | Mode::LazyCluster => {
            let url = std::env::var(URL_ENV).unwrap_or_else(|_| panic!("{URL_ENV} is not set"));
            let builder = if mode == Mode::Lazy {
                RateLimiter::builder().redis_url(url)
            } else {
                RateLimiter::builder().redis_cluster(url.split(','))
            };
            builder
                .timeout(LAZY_TIMEOUT)
                .build_lazy()
                .expect("a lazy limiter")
        }
    };
    let policy = Arc::new(Policy::new(algorithm, LIMIT, PERIOD).expect("a valid policy"));
    let barrier = Arc::new(tokio::sync::Barrier::new(CALLS));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CALLS {
        let limiter = limiter.clone();
        let barrier = Arc::clone(&barrier);
        let policy = Arc::clone(&policy);
        tasks.spawn(async move {
            let key = key(mode, algorithm);
            let check = Check::new(&key, &policy).with_scope("cold-start");
            barrier.wait().await;
            let start = Instant::now();
            let verdict = limiter.check(&[check]).await;
            let took = start.elapsed();
            let mut counts = Counts::default();
            match verdict {
                // The allow policy's answer: everything left, nothing taken. A call the store
                // admitted has taken one unit. (The default `local` policy's answer looks like
                // the store's: an admission from this process's own quota makes the three
                // processes admit more than LIMIT, which the parent's exact sum refuses.)
                Ok(v) if v.is_admitted() && v.decisions()[0].remaining == LIMIT => {
                    counts.failure = 1;
                }
                Ok(v) if v.is_admitted() => counts.admitted = 1,
                Ok(_) => counts.limited = 1,
                Err(_) => counts.failure = 1,
            }
            (counts, took)
        });
    }
    let mut counts = Counts::default();
    let mut slowest = Duration::ZERO;
    while let Some(joined) = tasks.join_next().await {
        let (c, took) = joined.expect("a call task");
        counts.add(c);
        slowest = slowest.max(took);
    }
    println!(
        "{REPORT} store={} algo={} admitted={} limited={} failure={} slowest_us={}",
        limiter.store().name(),
        algorithm.as_str(),
        counts.admitted,
        counts.limited,
        counts.failure,
        slowest.as_micros()
    );
}

// ---------------------------------------------------------------- the parent

/// One child's report.
#[derive(Debug)]
struct Report {
    store: String,
    algo: String,
    counts: Counts,
    slowest: Duration,
}

/// Parses a report line. (The test harness prints `test cold_start::child_process ... ` without
/// a newline before the child's line.)
fn parse_report(line: &str) -> Option<Report> {
    let rest = &line[line.find(REPORT)? + REPORT.len()..];
    let mut store = None;
    let mut algo = None;
    let mut counts = Counts::default();
    let mut slowest = Duration::ZERO;
    for field in rest.split_whitespace() {
        let (name, value) = field.split_once('=')?;
        match name {
            "store" => store = Some(value.to_owned()),
            "algo" => algo = Some(value.to_owned()),
            "admitted" => counts.admitted = value.parse().ok()?,
            "limited" => counts.limited = value.parse().ok()?,
            "failure" => counts.failure = value.parse().ok()?,
            "slowest_us" => slowest = Duration::from_micros(value.parse().ok()?),
            _ => return None,
        }
    }
    Some(Report {
        store: store?,
        algo: algo?,
        counts,
        slowest,
    })
}

/// The harness's name of this module's test `name` in the one test binary
/// (`cold_start::name`, without the crate): what a child runs, `--exact`.
fn test_path(name: &str) -> String {
    let module = module_path!();
    let module = module.split_once("::").map_or(module, |(_, m)| m);
    format!("{module}::{name}")
}

/// Starts [`PROCESSES`] fresh children of `mode` on `algorithm` against the Redis at `urls` (one
/// server, or a cluster's seed nodes) at once, waits for them, and returns their reports.
fn run_children(urls: &[String], mode: Mode, algorithm: Algorithm) -> Vec<Report> {
    let exe = std::env::current_exe().expect("the test binary's path");
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            let mut cmd = Command::new(&exe);
            cmd.args([
                test_path("child_process").as_str(),
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, mode.name())
            .env(ALGO_ENV, algorithm.as_str())
            // Only the variable this mode names: no cluster, no fallback URL.
            .env_remove("RATELIMIT_REDIS_CLUSTER_NODES")
            .env_remove("RATELIMIT_REDIS_URL")
            .env_remove("REDIS_URL")
            .env_remove(URL_ENV)
            // The environment limiter's timeout: as generous as the lazy one's, so that the
            // test does not depend on the machine's speed (a cluster's cold start, every master
            // connected and loaded, took over 50 ms on a busy 2-core machine).
            .env("RATELIMIT_TIMEOUT_MS", LAZY_TIMEOUT.as_millis().to_string())
            .env(mode.url_env(), urls.join(","))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
            cmd.spawn().expect("start a child process")
        })
        .collect();
    let mut reports = Vec::new();
    for child in children {
        let output = child.wait_with_output().expect("a child's output");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "child failed ({}):\n{stdout}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        let mut lines = stdout.lines().filter_map(parse_report);
        let report = lines
            .next()
            .unwrap_or_else(|| panic!("no report from the child:\n{stdout}"));
        assert!(lines.next().is_none(), "one report per child:\n{stdout}");
        assert_eq!(report.store, mode.store(), "the child's limiter uses Redis");
        assert_eq!(report.algo, algorithm.as_str());
        reports.push(report);
    }
    reports
}

/// Runs the children of `mode` against `urls` for each algorithm and asserts that together they
/// admitted exactly [`LIMIT`] and rejected the rest, with no failure-policy answer.
fn assert_exactly_the_limit(urls: &[String], mode: Mode) {
    let total = PROCESSES as u64 * CALLS as u64;
    let expected = Counts {
        admitted: LIMIT,
        limited: total - LIMIT,
        failure: 0,
    };
    let mut sums = Vec::new();
    let mut details = String::new();
    for algorithm in Algorithm::ALL {
        let mut sum = Counts::default();
        for report in run_children(urls, mode, algorithm) {
            sum.add(report.counts);
            let _ = writeln!(
                details,
                "  {}: {:?}, slowest call {:?}",
                report.algo, report.counts, report.slowest
            );
        }
        sums.push((algorithm.as_str(), sum));
    }
    eprintln!("{} limiter, per child:\n{details}", mode.name());
    let want: Vec<_> = Algorithm::ALL
        .iter()
        .map(|a| (a.as_str(), expected))
        .collect();
    assert_eq!(
        sums,
        want,
        "{PROCESSES} fresh processes × {CALLS} concurrent calls against one limit of {LIMIT} \
         ({} limiter; each child's counts are in the output above)",
        mode.name()
    );
}

/// The limiter `#[rate_limit]` gets with nothing installed: `RATELIMIT_REDIS_URL` (and
/// `RATELIMIT_TIMEOUT_MS`).
#[test]
fn cold_start_from_the_environment_admits_exactly_the_limit_across_three_processes() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let server = RedisServer::start();
    assert_exactly_the_limit(&[server.url()], Mode::Env);
}

/// `RateLimiter::builder().redis_url(..).build_lazy()`, with a 2 s timeout.
#[test]
fn cold_start_with_build_lazy_admits_exactly_the_limit_across_three_processes() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let server = RedisServer::start();
    assert_exactly_the_limit(&[server.url()], Mode::Lazy);
}

/// The same on a Redis Cluster (3 masters, 3 replicas; one cluster for both ways of
/// configuring the limiter, each on keys of its own): with
/// `RateLimiter::builder().redis_cluster(..).build_lazy()`, and from
/// `RATELIMIT_REDIS_CLUSTER_NODES`.
#[test]
fn cold_start_on_a_cluster_admits_exactly_the_limit_across_three_processes() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let runtime = tokio::runtime::Runtime::new().expect("a Tokio runtime");
    let cluster = runtime.block_on(RedisCluster::start());
    assert_exactly_the_limit(&cluster.urls(), Mode::LazyCluster);
    assert_exactly_the_limit(&cluster.urls(), Mode::EnvCluster);
}

/// Runs this binary's test `name` in a child process with `marker` set, none of the limiter's
/// variables but `vars`: its standard output.
fn env_child(name: &str, marker: &str, vars: &[(&str, std::ffi::OsString)]) -> String {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([test_path(name).as_str(), "--exact", "--nocapture"])
        .env(marker, "1")
        .env_remove("RATELIMIT_REDIS_CLUSTER_NODES")
        .env_remove("RATELIMIT_REDIS_URL")
        .env_remove("REDIS_URL")
        .env_remove("RATELIMIT_TIMEOUT_MS");
    for (k, v) in vars {
        cmd.env(k, v);
    }
    String::from_utf8_lossy(&cmd.output().unwrap().stdout).into_owned()
}

/// Set in the child of [`the_builder_reads_the_environment_like_the_default_limiter`].
const BUILDER_CHILD_ENV: &str = "RATELIMIT_TEST_BUILDER_CHILD";

/// `Builder::from_env()`: the store and the timeout from the same
/// variables, in the same order, as the default limiter, with the rest of the chain the
/// application's; a malformed timeout fails the build. Run in child processes: the
/// environment is the process's.
#[test]
fn the_builder_reads_the_environment_like_the_default_limiter() {
    if std::env::var_os(BUILDER_CHILD_ENV).is_some() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            match ratelimit_runtime::limiter::Builder::from_env()
                .prefix("from-env")
                .build()
                .await
            {
                Ok(limiter) => println!(
                    "BUILT store={} timeout_ms={} prefix={}",
                    limiter.store().name(),
                    limiter.settings().timeout.as_millis(),
                    limiter.settings().prefix
                ),
                Err(e) => println!("FAILED {e}"),
            }
        });
        return;
    }
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let server = RedisServer::start();
    let run = |vars: &[(&str, &str)]| -> String {
        let vars: Vec<(&str, std::ffi::OsString)> =
            vars.iter().map(|(k, v)| (*k, (*v).into())).collect();
        let stdout = env_child(
            "the_builder_reads_the_environment_like_the_default_limiter",
            BUILDER_CHILD_ENV,
            &vars,
        );
        stdout
            .lines()
            .find(|l| l.starts_with("BUILT") || l.starts_with("FAILED"))
            .unwrap_or_else(|| panic!("no report: {stdout}"))
            .to_owned()
    };
    let url = server.url();
    assert_eq!(run(&[]), "BUILT store=memory timeout_ms=50 prefix=from-env");
    assert_eq!(
        run(&[("REDIS_URL", &url), ("RATELIMIT_TIMEOUT_MS", "1234")]),
        "BUILT store=redis timeout_ms=1234 prefix=from-env"
    );
    // RATELIMIT_REDIS_URL first: REDIS_URL names a server that is not there.
    assert_eq!(
        run(&[
            ("RATELIMIT_REDIS_URL", &url),
            ("REDIS_URL", "redis://127.0.0.1:1")
        ]),
        "BUILT store=redis timeout_ms=50 prefix=from-env"
    );
    assert!(run(&[("RATELIMIT_TIMEOUT_MS", "soon")]).starts_with("FAILED"));
    assert!(run(&[("REDIS_URL", "not a url")]).starts_with("FAILED"));
}

/// Set in the child of [`unreadable_environment_values_are_errors_naming_the_variable`].
const UNREADABLE_CHILD_ENV: &str = "RATELIMIT_TEST_UNREADABLE_ENV_CHILD";

/// A variable that is set but not UTF-8 is not unset: `Builder::from_env()` fails naming it
/// (never the memory store, nor the next variable in line, nor the default timeout), and the
/// default limiter logs an error naming it, as for a malformed value. Run in child processes:
/// the environment is the process's.
#[test]
fn unreadable_environment_values_are_errors_naming_the_variable() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt as _;

    if std::env::var_os(UNREADABLE_CHILD_ENV).is_some() {
        ratelimit_tests::logs::capture();
        match ratelimit_runtime::limiter::Builder::from_env().build_lazy() {
            Ok(limiter) => println!(
                "BUILT store={} timeout_ms={}",
                limiter.store().name(),
                limiter.settings().timeout.as_millis()
            ),
            Err(e) => println!("FAILED {e}"),
        }
        let default = RateLimiter::current();
        let errors: Vec<String> = ratelimit_tests::logs::events()
            .iter()
            .filter(|e| e.level == tracing::Level::ERROR)
            .filter_map(|e| e.field("source").map(str::to_owned))
            .collect();
        println!(
            "DEFAULT store={} errors={}",
            default.store().name(),
            errors.join(",")
        );
        return;
    }
    if std::env::var_os(CHILD_ENV).is_some() || std::env::var_os(BUILDER_CHILD_ENV).is_some() {
        return;
    }
    let server = RedisServer::start();
    let run = |vars: &[(&str, OsString)]| -> (String, String) {
        let stdout = env_child(
            "unreadable_environment_values_are_errors_naming_the_variable",
            UNREADABLE_CHILD_ENV,
            vars,
        );
        let line = |prefixes: &[&str]| {
            stdout
                .lines()
                .find(|l| prefixes.iter().any(|p| l.starts_with(p)))
                .unwrap_or_else(|| panic!("no report: {stdout}"))
                .to_owned()
        };
        (line(&["BUILT", "FAILED"]), line(&["DEFAULT"]))
    };
    let bytes = |text: &[u8]| {
        let mut v = text.to_vec();
        v.push(0xff);
        OsString::from_vec(v)
    };
    let url = server.url();
    for (var, value) in [
        ("RATELIMIT_REDIS_URL", bytes(url.as_bytes())),
        ("REDIS_URL", bytes(url.as_bytes())),
        ("RATELIMIT_REDIS_CLUSTER_NODES", bytes(b"127.0.0.1:7000")),
        ("RATELIMIT_TIMEOUT_MS", bytes(b"12")),
    ] {
        let (built, default) = run(&[(var, value)]);
        assert!(
            built.starts_with("FAILED") && built.contains(var) && built.contains("UTF-8"),
            "{var}: {built}"
        );
        assert!(
            default.ends_with(&format!("errors={var}")),
            "{var}: {default}"
        );
    }
    // Set but unreadable is not unset: the next variable in line is not read instead.
    let (built, default) = run(&[
        ("RATELIMIT_REDIS_URL", bytes(url.as_bytes())),
        ("REDIS_URL", OsString::from(&url)),
    ]);
    assert!(built.contains("RATELIMIT_REDIS_URL"), "{built}");
    assert!(default.ends_with("errors=RATELIMIT_REDIS_URL"), "{default}");
}
