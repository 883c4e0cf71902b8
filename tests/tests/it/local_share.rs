//! An outage that keeps the global quota: with
//! `Builder::local_share(N)`, `FailurePolicy::Local` checks each limit against one process's
//! share of it while Redis is down, so that N processes admit at most the quota between them
//! (`N × max(1, ⌊num / N⌋) ≤ max(num, N)` per window), not N times it.
//!
//! The acceptance runs in 4 processes (children of this test binary, as `cold_start` does): each
//! connects to a private Redis, the parent kills it, and each then calls 200 times against
//! 100 a minute with a share of 4, for every algorithm. The parent sums what they admitted.

#![allow(
    clippy::duration_suboptimal_units,
    reason = "Duration::from_mins is newer than the workspace's rust-version"
)]

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ratelimit_runtime::{Algorithm, ConfigError, FailurePolicy, Policy, RateLimiter, store::Check};
use ratelimit_tests::redis_server::{RedisServer, say};

/// Set in a child process: the URL of the Redis it connects to before the parent kills it.
const CHILD_ENV: &str = "RATELIMIT_TEST_LOCAL_SHARE_URL";

/// The processes of the fleet, and the share each is built with.
const PROCESSES: u32 = 4;

/// The limit: 100 a minute.
const NUM: u64 = 100;

/// Calls each process makes on each algorithm's limit during the outage.
const CALLS: usize = 200;

/// Longest wait for Redis on one check (generous: a busy machine must not turn the healthy
/// check before the kill into a failure).
const TIMEOUT: Duration = Duration::from_millis(500);

/// What a child prints once connected, and waits after for a line on its stdin.
const READY: &str = "local-share-ready";

/// The harness's name of this module's test `name` (`local_share::name`, without the crate).
fn test_path(name: &str) -> String {
    let module = module_path!();
    let module = module.split_once("::").map_or(module, |(_, m)| m);
    format!("{module}::{name}")
}

fn minute(algorithm: Algorithm) -> Policy {
    Policy::new(algorithm, NUM, Duration::from_secs(60)).expect("100 a minute")
}

fn key(algorithm: Algorithm) -> String {
    format!("ratelimit:{{local-share}}:{}", algorithm.as_str())
}

// ---------------------------------------------------------------- the child

/// The child's side: nothing unless [`CHILD_ENV`] is set (a normal run of this binary).
///
/// With it set: connects a limiter (`Local`, share [`PROCESSES`]) to that Redis, checks once
/// there (Redis answers), prints [`READY`], waits for a line on stdin (the parent kills Redis
/// in between), then makes [`CALLS`] calls on each algorithm's limit and prints one line each:
/// `local-share-report algo=<algo> admitted=<n> rejected=<n> failed=<n> elapsed_ms=<ms>`.
#[test]
fn child_process() {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    runtime.block_on(child(url));
}

async fn child(url: String) {
    let limiter = RateLimiter::builder()
        .redis_url(url)
        .failure_policy(FailurePolicy::Local)
        .local_share(PROCESSES)
        .timeout(TIMEOUT)
        .build()
        .await
        .expect("connect to the test's Redis");
    let healthy = minute(Algorithm::Fixed);
    let before = limiter
        .check(&[Check::new("ratelimit:{local-share}:before", &healthy)])
        .await
        .expect("Redis answers before the kill");
    // Redis's own answer: the whole quota, not the share.
    assert_eq!(before.decisions()[0].limit, NUM);
    println!("{READY}");
    std::io::stdout().flush().expect("flush stdout");
    tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin()
            .read_line(&mut line)
            .expect("the parent's go");
    })
    .await
    .expect("read stdin");
    for algorithm in Algorithm::ALL {
        let policy = minute(algorithm);
        let key = key(algorithm);
        let check = Check::new(&key, &policy).with_scope("local-share");
        let (mut admitted, mut rejected, mut failed) = (0, 0, 0);
        let start = Instant::now();
        for _ in 0..CALLS {
            match limiter.check(&[check]).await {
                Ok(v) if v.is_admitted() => admitted += 1,
                Ok(_) => rejected += 1,
                Err(_) => failed += 1,
            }
        }
        println!(
            "local-share-report algo={} admitted={admitted} rejected={rejected} failed={failed} elapsed_ms={}",
            algorithm.as_str(),
            start.elapsed().as_millis()
        );
    }
}

// ---------------------------------------------------------------- the parent

/// One child's line for one algorithm.
#[derive(Debug)]
struct Report {
    algo: String,
    admitted: u64,
    rejected: u64,
    failed: u64,
    elapsed_ms: u64,
}

fn parse(line: &str) -> Option<Report> {
    let rest = line.strip_prefix("local-share-report ")?;
    let field = |name: &str| {
        rest.split(' ')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .map(str::to_owned)
    };
    let number = |name: &str| field(name)?.parse().ok();
    Some(Report {
        algo: field("algo")?,
        admitted: number("admitted")?,
        rejected: number("rejected")?,
        failed: number("failed")?,
        elapsed_ms: number("elapsed_ms")?,
    })
}

/// The acceptance: Redis killed, 4 processes with a share of 1/4 of 100 a minute, 200 calls
/// each: 25 admitted in each process and exactly 100 in all, on every algorithm (the buckets
/// scale `burst` too; none refills a unit in the few milliseconds the calls take, 2.4 s at 25 a
/// minute).
#[test]
fn redis_killed_4_processes_sharing_100_a_minute_admit_100_in_all() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let mut server = RedisServer::start();
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            Command::new(&exe)
                .args([
                    test_path("child_process").as_str(),
                    "--exact",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_ENV, server.url())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start a child process")
        })
        .collect();
    // Every child connected and heard from Redis before the kill.
    let mut outputs: Vec<_> = children
        .iter_mut()
        .map(|child| {
            let mut out = BufReader::new(child.stdout.take().expect("piped stdout"));
            let mut seen = String::new();
            loop {
                let mut line = String::new();
                let n = out.read_line(&mut line).expect("read a child's stdout");
                assert!(n > 0, "a child ended before it was ready:\n{seen}");
                // With `--nocapture` the harness writes `test … ... ` first, on the same line.
                if line.trim_end().ends_with(READY) {
                    break;
                }
                seen.push_str(&line);
            }
            out
        })
        .collect();
    server.kill();
    for child in &mut children {
        writeln!(child.stdin.take().expect("piped stdin"), "go").expect("tell a child to go");
    }
    let mut reports = Vec::new();
    for (child, out) in children.iter_mut().zip(&mut outputs) {
        let mut stdout = String::new();
        out.read_to_string(&mut stdout).expect("a child's stdout");
        let mut stderr = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut stderr);
        }
        let status = child.wait().expect("wait for a child");
        assert!(
            status.success() && stdout.contains("1 passed"),
            "a child failed:\n{stdout}\n{stderr}"
        );
        let mine: Vec<Report> = stdout.lines().filter_map(parse).collect();
        assert_eq!(mine.len(), Algorithm::ALL.len(), "{stdout}");
        reports.push(mine);
    }
    let share = NUM / u64::from(PROCESSES);
    for algorithm in Algorithm::ALL {
        let of_algo: Vec<&Report> = reports
            .iter()
            .flatten()
            .filter(|r| r.algo == algorithm.as_str())
            .collect();
        let total: u64 = of_algo.iter().map(|r| r.admitted).sum();
        say(&format!(
            "local share, {algorithm}: admitted {:?} = {total} of {NUM} in all ({} calls each, slowest {} ms)",
            of_algo.iter().map(|r| r.admitted).collect::<Vec<_>>(),
            CALLS,
            of_algo.iter().map(|r| r.elapsed_ms).max().unwrap_or(0),
        ));
        for r in &of_algo {
            assert_eq!(r.failed, 0, "{algorithm}: {r:?}");
            assert_eq!(r.admitted + r.rejected, CALLS as u64, "{algorithm}: {r:?}");
            assert_eq!(
                r.admitted, share,
                "{algorithm}: each process its share: {r:?}"
            );
        }
        assert!(total <= NUM, "{algorithm}: never more than the quota");
        assert_eq!(total, NUM, "{algorithm}");
    }
}

// ---------------------------------------------------------------- in process

/// A limiter connected to `server` with the `Local` policy and `share`.
async fn connected(server: &RedisServer, share: u32) -> RateLimiter {
    RateLimiter::builder()
        .redis_url(server.url())
        .failure_policy(FailurePolicy::Local)
        .local_share(share)
        .timeout(TIMEOUT)
        .build()
        .await
        .expect("connect to the test's Redis")
}

/// Calls admitted out of `calls` on `policy` under `key`; every call answered (no error).
async fn admitted(limiter: &RateLimiter, key: &str, policy: &Policy, calls: usize) -> u64 {
    let mut admitted = 0;
    for _ in 0..calls {
        let verdict = limiter
            .check(&[Check::new(key, policy).with_scope("local-share")])
            .await
            .expect("the local share answers");
        admitted += u64::from(verdict.is_admitted());
    }
    admitted
}

/// In one process, on a killed Redis: the share is `⌊num / N⌋` (3 of 10 over 3), at least one
/// (1 of 10 over 20: the fleet of 20 may admit 20, `max(num, N)`), the whole quota with one
/// share (today's behaviour), and the buckets scale `burst` too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_leaves_each_limit_scaled_to_the_share() {
    let mut server = RedisServer::start();
    let thirds = connected(&server, 3).await;
    let twentieths = connected(&server, 20).await;
    let whole = connected(&server, 1).await;
    let quarters = connected(&server, 4).await;
    let healthy = Policy::new(Algorithm::Fixed, 10, Duration::from_secs(60)).unwrap();
    // Redis answers with the whole quota: the remote path is untouched by the share.
    assert_eq!(
        admitted(&thirds, "ratelimit:{ls}:healthy", &healthy, 12).await,
        10
    );
    tokio::task::block_in_place(|| server.kill());

    let ten = Policy::new(Algorithm::Fixed, 10, Duration::from_secs(60)).unwrap();
    assert_eq!(admitted(&thirds, "ratelimit:{ls}:ten", &ten, 50).await, 3);
    assert_eq!(
        admitted(&twentieths, "ratelimit:{ls}:ten", &ten, 50).await,
        1
    );
    assert_eq!(admitted(&whole, "ratelimit:{ls}:ten", &ten, 50).await, 10);
    let sliding = Policy::new(Algorithm::Sliding, 10, Duration::from_secs(60)).unwrap();
    assert_eq!(
        admitted(&thirds, "ratelimit:{ls}:sliding", &sliding, 50).await,
        3
    );
    for algorithm in [Algorithm::Token, Algorithm::Gcra, Algorithm::Leaky] {
        // 10 a minute with a burst of 40: a quarter is 2 a minute with a burst of 10.
        let bucket = Policy::new(algorithm, 10, Duration::from_secs(60))
            .unwrap()
            .with_burst(40)
            .unwrap();
        let key = format!("ratelimit:{{ls}}:{}", algorithm.as_str());
        assert_eq!(
            admitted(&quarters, &key, &bucket, 60).await,
            10,
            "{algorithm}"
        );
        assert_eq!(admitted(&whole, &key, &bucket, 60).await, 40, "{algorithm}");
        let verdict = quarters.check(&[Check::new(&key, &bucket)]).await.unwrap();
        assert_eq!(
            verdict.decisions()[0].limit,
            10,
            "{algorithm}: the share's capacity"
        );
    }
    // A call costing more than its share is refused, as under `deny`; one that fits passes.
    let costly = ten.with_cost(4).unwrap();
    assert!(
        thirds
            .check(&[Check::new("ratelimit:{ls}:costly", &costly)])
            .await
            .is_err()
    );
    assert!(
        twentieths
            .check(&[Check::new("ratelimit:{ls}:costly", &ten)])
            .await
            .unwrap()
            .is_admitted()
    );
}

#[test]
fn a_local_share_of_zero_fails_the_build() {
    let error = RateLimiter::builder()
        .failure_policy(FailurePolicy::Local)
        .local_share(0)
        .build_lazy()
        .expect_err("0 processes");
    assert!(
        matches!(&error, ConfigError::Invalid(m) if m.contains("local_share")),
        "{error}"
    );
    let lazy_redis = RateLimiter::builder()
        .redis_url("redis://127.0.0.1:1")
        .local_share(0)
        .build_lazy();
    assert!(lazy_redis.is_err());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let built = runtime.block_on(RateLimiter::builder().local_share(0).build());
    assert!(matches!(built, Err(ConfigError::Invalid(_))));
}
