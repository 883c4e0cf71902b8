//! Leases for hot keys: a process takes several units of a limit in one take and
//! serves the next calls from them, never over the quota.
//!
//! * 4 processes × 16 tasks hammer one global key of 100,000 a minute on one Redis, from a
//!   cold start: at most 100,000 admitted, at least 100,000 − 4 × `k_max`, and what Redis
//!   counted lies between the two.
//! * A quiet key is decided as without leases: no lease is taken, and its twin without
//!   `lease` gets the same answers, call by call, on every algorithm that leases.
//! * A lease that cannot be taken (Redis down) is answered by the failure policy, and no lease
//!   is held.

#![allow(
    clippy::duration_suboptimal_units,
    reason = "Duration::from_mins is newer than the workspace's rust-version"
)]

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ratelimit_runtime::{Limit, RateLimitError, RateLimiter, Target, rate_limit};
use ratelimit_tests::env::Env;
use ratelimit_tests::redis_server::{RedisServer, say};

/// Set in a child process: the URL of the Redis the fleet shares.
const CHILD_ENV: &str = "RATELIMIT_TEST_LEASE_URL";

const PROCESSES: u64 = 4;
const TASKS: u64 = 16;
/// The hot key's quota: 100,000 a minute.
const QUOTA: u64 = 100_000;
/// The most units one lease takes (the attribute's `lease_max`, the default).
const K_MAX: u64 = 1000;
/// Each task stops after this many rejections (the quota is spent by then) or after
/// [`DEADLINE`], well inside the minute.
const REJECTIONS_PER_TASK: u64 = 500;
const DEADLINE: Duration = Duration::from_secs(40);

#[rate_limit(
    num = 100000,
    time = 60,
    scope = "lease-hot",
    lease = "100ms",
    export = "HOT"
)]
async fn hot() -> Result<(), RateLimitError> {
    Ok(())
}

/// The harness's name of this module's test `name`.
fn test_path(name: &str) -> String {
    let module = module_path!();
    let module = module.split_once("::").map_or(module, |(_, m)| m);
    format!("{module}::{name}")
}

// ---------------------------------------------------------------- the child

/// The child's side: nothing unless [`CHILD_ENV`] is set. With it: installs a limiter on that
/// Redis, runs [`TASKS`] tasks calling [`hot`] until each has seen its rejections, then waits
/// for its leases to end and prints
/// `lease-report admitted=<n> rejected=<n> failed=<n> held=<n> elapsed_ms=<ms>`.
#[test]
fn child_process() {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    runtime.block_on(async move {
        let limiter = RateLimiter::builder()
            .redis_url(url)
            .timeout(Duration::from_secs(2))
            .build()
            .await
            .expect("connect to the test's Redis");
        limiter.install().expect("install the limiter");
        let (admitted, rejected, failed) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
        );
        let start = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..TASKS {
            let (admitted, rejected, failed) = (admitted.clone(), rejected.clone(), failed.clone());
            tasks.spawn(async move {
                let mut mine = 0;
                while mine < REJECTIONS_PER_TASK && start.elapsed() < DEADLINE {
                    match hot().await {
                        Ok(()) => admitted.fetch_add(1, Ordering::Relaxed),
                        Err(e) if e.is_limited() => {
                            mine += 1;
                            rejected.fetch_add(1, Ordering::Relaxed)
                        }
                        Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
            });
        }
        while tasks.join_next().await.is_some() {}
        let elapsed = start.elapsed();
        // Every lease ends within its 100 ms and gives back what it did not use.
        tokio::time::sleep(Duration::from_millis(400)).await;
        println!(
            "lease-report admitted={} rejected={} failed={} held={} elapsed_ms={}",
            admitted.load(Ordering::Relaxed),
            rejected.load(Ordering::Relaxed),
            failed.load(Ordering::Relaxed),
            RateLimiter::current().lease_units_held(),
            elapsed.as_millis()
        );
    });
}

// ---------------------------------------------------------------- the parent

#[derive(Debug, Default)]
struct Report {
    admitted: u64,
    rejected: u64,
    failed: u64,
    held: u64,
    elapsed_ms: u64,
}

fn parse(line: &str) -> Option<Report> {
    let rest = line.split("lease-report ").nth(1)?;
    let number = |name: &str| -> Option<u64> {
        rest.split(' ')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))?
            .trim()
            .parse()
            .ok()
    };
    Some(Report {
        admitted: number("admitted")?,
        rejected: number("rejected")?,
        failed: number("failed")?,
        held: number("held")?,
        elapsed_ms: number("elapsed_ms")?,
    })
}

/// The acceptance: 4 processes × 16 tasks on one global key of 100,000 a minute, every process
/// starting cold at once: admitted ≤ 100,000 and ≥ 100,000 − 4 × `k_max`; Redis's count
/// (after every lease gave back its unused units) lies between what was admitted and the
/// quota; no lease is left held; and the fleet made far fewer store calls than calls.
#[test]
fn four_processes_on_one_hot_key_never_admit_more_than_the_quota() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let _saturating = ratelimit_tests::SATURATING.blocking_lock();
    let server = RedisServer::start();
    let reports = run_children(&server);
    let admitted: u64 = reports.iter().map(|r| r.admitted).sum();
    let calls: u64 = reports.iter().map(|r| r.admitted + r.rejected).sum();

    // What Redis holds for the key, read the way a check reads it (peek takes nothing).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    let (counted, store_calls) = runtime.block_on(async {
        let limiter = RateLimiter::builder()
            .redis_url(server.url())
            .build()
            .await
            .expect("connect");
        let peeked = limiter
            .peek(HOT, &Target::global())
            .await
            .expect("peek the hot key");
        let mut conn = server.connection().await;
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .expect("INFO commandstats");
        (
            QUOTA - peeked.decisions()[0].remaining,
            script_calls(&stats),
        )
    });
    say(&format!(
        "leases: {PROCESSES} processes x {TASKS} tasks: admitted {admitted} of {QUOTA} ({:?}), Redis counted {counted}, {calls} calls, {store_calls} script calls (one per {} calls), slowest process {} ms",
        reports.iter().map(|r| r.admitted).collect::<Vec<_>>(),
        calls / store_calls.max(1),
        reports.iter().map(|r| r.elapsed_ms).max().unwrap_or(0),
    ));
    for r in &reports {
        assert_eq!(r.failed, 0, "{r:?}");
        assert_eq!(r.held, 0, "a lease outlived its life: {r:?}");
    }
    assert!(admitted <= QUOTA, "over the quota: {admitted}");
    assert!(
        admitted >= QUOTA - PROCESSES * K_MAX,
        "under-admitted past k_max × processes: {admitted}"
    );
    assert!(
        admitted <= counted && counted <= QUOTA,
        "admitted {admitted}, counted {counted}"
    );
    assert!(
        store_calls * 10 < calls,
        "leases saved few round trips: {store_calls} script calls for {calls} calls"
    );
}

/// Starts [`PROCESSES`] children of this binary on `server` at once and reads each one's report.
fn run_children(server: &RedisServer) -> Vec<Report> {
    let exe = std::env::current_exe().expect("the test binary's path");
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            Command::new(&exe)
                .args([
                    test_path("child_process").as_str(),
                    "--exact",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_ENV, server.url())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start a child process")
        })
        .collect();
    let mut reports = Vec::new();
    for mut child in children {
        let mut stdout = String::new();
        child
            .stdout
            .take()
            .expect("piped stdout")
            .read_to_string(&mut stdout)
            .expect("a child's stdout");
        let mut stderr = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut stderr);
        }
        let status = child.wait().expect("wait for a child");
        assert!(
            status.success() && stdout.contains("1 passed"),
            "a child failed:\n{stdout}\n{stderr}"
        );
        reports.push(
            stdout
                .lines()
                .find_map(parse)
                .unwrap_or_else(|| panic!("no report:\n{stdout}")),
        );
    }
    reports
}

/// The script calls (`FCALL`, `EVALSHA`, `EVAL`) `INFO commandstats` reports.
pub(crate) fn script_calls(stats: &str) -> u64 {
    stats
        .lines()
        .filter(|l| {
            ["cmdstat_fcall:", "cmdstat_evalsha:", "cmdstat_eval:"]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .filter_map(|l| {
            l.split([':', ','])
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

// ---------------------------------------------------------------- a quiet key

/// Each algorithm that leases, twice: without `lease` and with it, the same limit under two
/// scopes.
macro_rules! twins {
    ($($algo:tt => $plain:ident $plain_scope:tt $plain_limits:tt, $leased:ident $leased_scope:tt $leased_limits:tt;)*) => {$(
        #[rate_limit(algo = $algo, num = 5, time = "20s", scope = $plain_scope, export = $plain_limits)]
        async fn $plain() -> Result<(), RateLimitError> {
            Ok(())
        }

        #[rate_limit(algo = $algo, num = 5, time = "20s", scope = $leased_scope, lease = "100ms", export = $leased_limits)]
        async fn $leased() -> Result<(), RateLimitError> {
            Ok(())
        }
    )*};
}

twins! {
    "fixed" => plain_fixed "quiet-plain-fixed" "PLAIN_FIXED", leased_fixed "quiet-leased-fixed" "LEASED_FIXED";
    "sliding_counter" => plain_sc "quiet-plain-sc" "PLAIN_SC", leased_sc "quiet-leased-sc" "LEASED_SC";
    "token" => plain_token "quiet-plain-token" "PLAIN_TOKEN", leased_token "quiet-leased-token" "LEASED_TOKEN";
    "leaky" => plain_leaky "quiet-plain-leaky" "PLAIN_LEAKY", leased_leaky "quiet-leased-leaky" "LEASED_LEAKY";
    "gcra" => plain_gcra "quiet-plain-gcra" "PLAIN_GCRA", leased_gcra "quiet-leased-gcra" "LEASED_GCRA";
}

/// One call's answer, as compared between the twins: admitted, or the rejection's fields
/// (`retry_after` in tenths of a second, which the twins' few microseconds apart never cross
/// but at a boundary; the comparison allows one tenth).
fn answer(r: &Result<(), RateLimitError>) -> Option<(u64, u64, u128)> {
    match r {
        Ok(()) => None,
        Err(RateLimitError::Limited {
            limit,
            remaining,
            retry_after,
            ..
        }) => Some((*limit, *remaining, retry_after.as_millis() / 100)),
        Err(e) => panic!("the store failed: {e}"),
    }
}

/// A key called a few times a second: `k` stays 1, so no lease is ever taken and every call is
/// the ordinary check. Each leased function and its twin without `lease` (the same limit under
/// another scope) are called at once, 8 times 250 ms apart, on every algorithm that leases:
/// the same answers call by call, the same state in Redis after each (peeked), and no unit
/// ever held in a lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_key_is_decided_exactly_as_without_leases() {
    let (limiter, _env) = Env::redis().await;
    limiter
        .clone()
        .scope(async {
            type Twin = (
                &'static str,
                fn() -> std::pin::Pin<
                    Box<dyn std::future::Future<Output = Result<(), RateLimitError>> + Send>,
                >,
                fn() -> std::pin::Pin<
                    Box<dyn std::future::Future<Output = Result<(), RateLimitError>> + Send>,
                >,
                &'static [ratelimit_runtime::Limit],
                &'static [ratelimit_runtime::Limit],
            );
            let twins: [Twin; 5] = [
                (
                    "fixed",
                    || Box::pin(plain_fixed()),
                    || Box::pin(leased_fixed()),
                    PLAIN_FIXED,
                    LEASED_FIXED,
                ),
                (
                    "sliding_counter",
                    || Box::pin(plain_sc()),
                    || Box::pin(leased_sc()),
                    PLAIN_SC,
                    LEASED_SC,
                ),
                (
                    "token",
                    || Box::pin(plain_token()),
                    || Box::pin(leased_token()),
                    PLAIN_TOKEN,
                    LEASED_TOKEN,
                ),
                (
                    "leaky",
                    || Box::pin(plain_leaky()),
                    || Box::pin(leased_leaky()),
                    PLAIN_LEAKY,
                    LEASED_LEAKY,
                ),
                (
                    "gcra",
                    || Box::pin(plain_gcra()),
                    || Box::pin(leased_gcra()),
                    PLAIN_GCRA,
                    LEASED_GCRA,
                ),
            ];
            let mut admitted = [0_u32; 5];
            for step in 0..8 {
                for (i, (algo, plain, leased, plain_limits, leased_limits)) in
                    twins.iter().enumerate()
                {
                    let (p, l) = tokio::join!(plain(), leased());
                    admitted[i] += u32::from(p.is_ok());
                    assert_eq!(p.is_ok(), l.is_ok(), "{algo}, call {step}: {p:?} / {l:?}");
                    if let (Some(a), Some(b)) = (answer(&p), answer(&l)) {
                        assert_eq!((a.0, a.1), (b.0, b.1), "{algo}, call {step}");
                        assert!(a.2.abs_diff(b.2) <= 1, "{algo}, call {step}: {a:?} / {b:?}");
                    }
                    let global = Target::global();
                    let (sp, sl) = (
                        RateLimiter::current()
                            .peek(plain_limits, &global)
                            .await
                            .expect("peek"),
                        RateLimiter::current()
                            .peek(leased_limits, &global)
                            .await
                            .expect("peek"),
                    );
                    assert_eq!(
                        sp.decisions()[0].remaining,
                        sl.decisions()[0].remaining,
                        "{algo}, after call {step}"
                    );
                    assert_eq!(
                        RateLimiter::current().lease_units_held(),
                        0,
                        "{algo}: a lease was taken"
                    );
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            // The quota was spent and refused alike (5 a 20 s: no bucket refills a unit in 2 s).
            assert_eq!(admitted, [5; 5]);
        })
        .await;
}

/// Redis down: a leased limit's call is answered by its failure policy (`deny`: refused,
/// `allow`: admitted), and no lease is built from the policy's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_cannot_be_taken_follows_the_failure_policy() {
    #[rate_limit(
        num = 100000,
        time = 60,
        scope = "lease-down-deny",
        lease = "100ms",
        on_store_error = "deny"
    )]
    async fn deny() -> Result<(), RateLimitError> {
        Ok(())
    }
    #[rate_limit(
        num = 100000,
        time = 60,
        scope = "lease-down-allow",
        lease = "100ms",
        on_store_error = "allow"
    )]
    async fn allow() -> Result<(), RateLimitError> {
        Ok(())
    }
    let mut server = RedisServer::start();
    let limiter = RateLimiter::builder()
        .redis_url(server.url())
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .expect("connect");
    limiter
        .clone()
        .scope(async {
            // Warm: these keys are hot, so their next takes are leases.
            let mut calls = 0;
            while RateLimiter::current().lease_units_held() == 0 {
                deny().await.expect("Redis answers");
                allow().await.expect("Redis answers");
                calls += 1;
                assert!(calls < 2000, "no lease was taken");
            }
            server.kill();
            // Let the leases end (their unused units cannot go back: they stay counted).
            tokio::time::sleep(Duration::from_millis(300)).await;
            ratelimit_tests::settle(Duration::from_secs(5), || {
                RateLimiter::current().lease_units_held() == 0
            })
            .await;
            let (mut refused, mut admitted) = (0, 0);
            for _ in 0..200 {
                match deny().await {
                    Err(RateLimitError::StoreUnavailable(_)) => refused += 1,
                    other => panic!("deny: {other:?}"),
                }
                admitted += u32::from(allow().await.is_ok());
            }
            assert_eq!((refused, admitted), (200, 200));
            assert_eq!(RateLimiter::current().lease_units_held(), 0);
        })
        .await;
}

// ---------------------------------------------------------------- a failover

const FAILOVER_QUOTA: u64 = 50_000;

#[rate_limit(
    num = 50000,
    time = 60,
    scope = "lease-failover",
    lease = "100ms",
    on_store_error = "deny",
    export = "FAILOVER"
)]
async fn failover_hot() -> Result<(), RateLimitError> {
    Ok(())
}

/// The acceptance on a Cluster: leases on a hot key of a 3-master cluster (each with a
/// replica), its master killed mid-run. A lease is kept only once a replica has its take
/// (`WAIT 1`), so the promoted replica knows every unit a process serves from a lease: from a
/// throttled start, through the failover, to the quota spent, never more than the quota is
/// admitted in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leases_through_a_cluster_failover_never_admit_more_than_the_quota() {
    use ratelimit_runtime::{RedisClusterStore, key};
    use ratelimit_tests::redis_cluster::RedisCluster;

    let _saturating = ratelimit_tests::SATURATING.lock().await;
    let mut cluster = RedisCluster::start().await;
    let store = RedisClusterStore::connect(cluster.urls())
        .await
        .expect("connect to the cluster");
    let limiter = RateLimiter::builder()
        .store(store)
        .timeout(Duration::from_millis(300))
        .build()
        .await
        .expect("a limiter");
    let hot_key = key::build("ratelimit", FAILOVER[0].scope, &[], &FAILOVER[0].policy);
    let victim = cluster
        .master_of_slot(cluster.keyslot(&hot_key).await)
        .await
        .port;

    // 0: throttled (a call a millisecond per task), 1: flat out, 2: stop.
    let phase = Arc::new(AtomicU64::new(0));
    let (admitted, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let leased = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..TASKS {
        let (phase, admitted, failed, leased) = (
            phase.clone(),
            admitted.clone(),
            failed.clone(),
            leased.clone(),
        );
        tasks.spawn(limiter.clone().scope(async move {
            let mut rejected = 0;
            loop {
                let now = phase.load(Ordering::Relaxed);
                if now == 2 || (now == 1 && rejected >= REJECTIONS_PER_TASK) {
                    break;
                }
                match failover_hot().await {
                    Ok(()) => {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) if e.is_limited() => rejected += 1,
                    Err(_) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                leased.fetch_max(RateLimiter::current().lease_units_held(), Ordering::Relaxed);
                if now == 0 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        }));
    }
    let wait_for = |what: &str, done: &dyn Fn() -> bool| {
        let start = Instant::now();
        while !done() {
            assert!(start.elapsed() < Duration::from_secs(30), "{what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let before_kill = {
        let admitted = admitted.clone();
        tokio::task::spawn_blocking(move || {
            wait_for("no calls admitted before the kill", &|| {
                admitted.load(Ordering::Relaxed) >= 3000
            });
            admitted.load(Ordering::Relaxed)
        })
        .await
        .expect("wait")
    };
    assert!(
        leased.load(Ordering::Relaxed) > 0,
        "the hot key was not leased"
    );
    let promoted = cluster.kill_master_and_wait_failover(victim).await;
    let at_failover = admitted.load(Ordering::Relaxed);
    phase.store(1, Ordering::Relaxed);
    let end = Instant::now();
    while !tasks.is_empty() {
        if end.elapsed() > Duration::from_secs(40) {
            phase.store(2, Ordering::Relaxed);
        }
        let _ = tasks.join_next().await;
    }
    let admitted = admitted.load(Ordering::Relaxed);
    say(&format!(
        "leases through a failover: master {victim} killed, {promoted} promoted; admitted {before_kill} before the kill, {at_failover} when the cluster was healthy again, {admitted} of {FAILOVER_QUOTA} in all ({} calls failed while the master was down)",
        failed.load(Ordering::Relaxed)
    ));
    assert!(admitted <= FAILOVER_QUOTA, "over the quota: {admitted}");
    // What the dead master held in leases (and a take cut short by the kill) is lost, not
    // admitted twice.
    assert!(
        admitted >= FAILOVER_QUOTA - 3 * K_MAX,
        "under-admitted past the leases' bound: {admitted}"
    );
}

// ---------------------------------------------------------------- callers that hang up

const CUT_QUOTA: u64 = 1_000_000;

#[rate_limit(
    num = 1000000,
    time = 60,
    scope = "lease-cut",
    lease = "100ms",
    export = "CUT"
)]
async fn cut_hot() -> Result<(), RateLimitError> {
    Ok(())
}

/// Callers that hang up mid-call (their future dropped, as a server drops a request whose
/// client went away) never cost the quota more than their own calls. 16 tasks call a hot key
/// for a second, each call given 20 ms; twice the server pauses its clients for 100 ms, so the
/// calls in flight then (a take of a lease among them) are cut short. The call that takes a
/// lease does it on a task of its own, so a cut there leaves the lease to the next calls: what
/// Redis counts once every lease ended exceeds what was admitted by at most the calls cut
/// short (each may hold its unit, as an ordinary check does), not by a lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_hang_up_never_waste_a_lease() {
    let _saturating = ratelimit_tests::SATURATING.lock().await;
    let (limiter, env) = Env::redis().await;
    let Env::Redis(server) = &env else {
        unreachable!("Env::redis is on Redis")
    };
    let (admitted, cut) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..TASKS {
        let (admitted, cut) = (admitted.clone(), cut.clone());
        tasks.spawn(limiter.clone().scope(async move {
            while start.elapsed() < Duration::from_secs(1) {
                match tokio::time::timeout(Duration::from_millis(20), cut_hot()).await {
                    Ok(Ok(())) => admitted.fetch_add(1, Ordering::Relaxed),
                    Ok(Err(e)) => panic!("{e}"),
                    Err(_) => cut.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    let mut conn = server.connection().await;
    for at in [300, 650] {
        tokio::time::sleep_until((start + Duration::from_millis(at)).into()).await;
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(100)
            .query_async(&mut conn)
            .await
            .expect("CLIENT PAUSE");
    }
    while tasks.join_next().await.is_some() {}
    tokio::time::sleep(Duration::from_millis(500)).await;
    ratelimit_tests::settle(Duration::from_secs(5), || limiter.lease_units_held() == 0).await;
    assert_eq!(limiter.lease_units_held(), 0);
    let peeked = limiter.peek(CUT, &Target::global()).await.expect("peek");
    let counted = CUT_QUOTA - peeked.decisions()[0].remaining;
    let (admitted, cut) = (
        admitted.load(Ordering::Relaxed),
        cut.load(Ordering::Relaxed),
    );
    say(&format!(
        "leases, callers hanging up: admitted {admitted}, cut short {cut}, Redis counted {counted}"
    ));
    assert!(cut > 0, "no call was cut short");
    assert!(
        admitted <= counted && counted <= admitted + cut,
        "admitted {admitted}, cut {cut}, counted {counted}"
    );
}

// ---------------------------------------------------------------- shutdown

/// The quota of the shutdown test's key: far above what its calls take, so that every call is
/// admitted and only the leases' unused units could make Redis count more.
const ROOMY: u64 = 1_000_000;

#[rate_limit(
    num = 1000000,
    time = 60,
    scope = "lease-shutdown",
    lease = "1s",
    export = "ROOMY_HOT"
)]
async fn roomy_hot() -> Result<(), RateLimitError> {
    Ok(())
}

/// A limiter of its own (a process of the fleet) on `server`, with a generous timeout.
async fn limiter_on(server: &RedisServer) -> RateLimiter {
    RateLimiter::builder()
        .redis_url(server.url())
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .expect("connect to the test's Redis")
}

/// What Redis counts for `limits` (a quota of [`ROOMY`]) and `target`, peeked through a limiter
/// of its own.
async fn roomy_counted(server: &RedisServer, limits: &[Limit], target: &Target) -> u64 {
    let peeked = limiter_on(server)
        .await
        .peek(limits, target)
        .await
        .expect("peek");
    ROOMY - peeked.decisions()[0].remaining
}

/// Four limiters on their own connections (four processes of a fleet) each make 8 × 600 leased
/// calls on one hot key, then shut down: the units they held in leases go back, so Redis counts
/// exactly what they admitted (without shutdown, up to a lease's units more per process until
/// the leases end). A call after shutdown still goes to Redis, one unit, no lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_that_shut_down_leave_exactly_what_they_admitted_counted() {
    let _saturating = ratelimit_tests::SATURATING.lock().await;
    let server = RedisServer::start();
    let mut limiters = Vec::new();
    for _ in 0..PROCESSES {
        limiters.push(limiter_on(&server).await);
    }
    let admitted = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for limiter in &limiters {
        for _ in 0..8 {
            let admitted = Arc::clone(&admitted);
            tasks.spawn(limiter.clone().scope(async move {
                for _ in 0..600 {
                    let answer = roomy_hot().await;
                    assert!(answer.is_ok(), "{answer:?}");
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }
    while let Some(task) = tasks.join_next().await {
        task.expect("a calling task");
    }
    let admitted = admitted.load(Ordering::Relaxed);
    let held: Vec<u64> = limiters.iter().map(RateLimiter::lease_units_held).collect();
    let before = roomy_counted(&server, ROOMY_HOT, &Target::global()).await;
    for limiter in &limiters {
        limiter
            .shutdown(Duration::from_secs(10))
            .await
            .expect("shut down within 10 s");
        assert_eq!(limiter.lease_units_held(), 0);
    }
    let counted = roomy_counted(&server, ROOMY_HOT, &Target::global()).await;
    say(&format!(
        "shutdown: {PROCESSES} processes admitted {admitted}; Redis counted {before} before shutdown (units held in leases {held:?}), {counted} after"
    ));
    assert!(held.iter().any(|&h| h > 0), "no lease was held: {held:?}");
    assert_eq!(counted, admitted, "Redis counts exactly what was admitted");

    // After shutdown: answered at the store, one unit, never from a lease; shutting down
    // again is a no-op.
    let late = limiters[0].clone().scope(roomy_hot()).await;
    assert!(late.is_ok(), "{late:?}");
    assert_eq!(limiters[0].lease_units_held(), 0);
    assert_eq!(
        roomy_counted(&server, ROOMY_HOT, &Target::global()).await,
        admitted + 1
    );
    limiters[0]
        .shutdown(Duration::from_secs(1))
        .await
        .expect("a second shutdown");
}

#[rate_limit(
    num = 1000000,
    time = 60,
    key = "{user}",
    scope = "lease-shutdown-race",
    lease = "1s",
    export = "RACE_HOT"
)]
async fn race_hot(user: &str) -> Result<(), RateLimitError> {
    let _ = user;
    Ok(())
}

/// Shutdown racing calls in flight: 16 tasks call 8 leased hot keys flat out on one limiter,
/// and shutdown comes while they run (takes in flight, their leases reaching their slots while
/// shutdown gives the leases back). The calls go on to their end (after shutdown each is
/// checked at Redis, one unit); once they end and shutdown is called again (it waits for the
/// background calls), no unit is held in a lease and Redis counts, key by key, exactly the
/// calls admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_racing_calls_in_flight_leaves_exactly_what_was_admitted_counted() {
    const KEYS: usize = 8;
    let _saturating = ratelimit_tests::SATURATING.lock().await;
    let server = RedisServer::start();
    let limiter = limiter_on(&server).await;
    let admitted: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..TASKS {
        let admitted = Arc::clone(&admitted);
        tasks.spawn(limiter.clone().scope(async move {
            for i in 0..600 {
                let k = (usize::try_from(task).expect("a task number") + i) % KEYS;
                let answer = race_hot(&format!("user-{k}")).await;
                assert!(answer.is_ok(), "{answer:?}");
                admitted[k].fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let start = Instant::now();
    while limiter.lease_units_held() == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no lease was held"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let held = limiter.lease_units_held();
    limiter
        .shutdown(Duration::from_secs(10))
        .await
        .expect("shut down within 10 s");
    while let Some(task) = tasks.join_next().await {
        task.expect("a calling task");
    }
    limiter
        .shutdown(Duration::from_secs(10))
        .await
        .expect("the background calls finish");
    let mut counted = Vec::new();
    for k in 0..KEYS {
        let target = Target::global().key(format!("user-{k}"));
        counted.push(roomy_counted(&server, RACE_HOT, &target).await);
    }
    let admitted: Vec<u64> = admitted.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    say(&format!(
        "shutdown racing calls: {held} units leased at shutdown; admitted {admitted:?}, Redis counted {counted:?}"
    ));
    assert_eq!(limiter.lease_units_held(), 0, "a lease outlived shutdown");
    assert_eq!(counted, admitted, "Redis counts exactly what was admitted");
}

#[rate_limit(
    num = 1000000,
    time = 60,
    by = "url",
    scope = "lease-shutdown-http",
    lease = "1s",
    export = "HTTP_HOT"
)]
async fn http_hot() -> &'static str {
    "ok"
}

/// The example servers' shutdown path, in process: an Axum server on a leased handler serves
/// 4 clients × 150 requests, stops on its signal through `with_graceful_shutdown` (draining the
/// requests in flight), then its limiter shuts down: Redis counts exactly the requests the
/// server answered 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_stopped_on_its_signal_leaves_exactly_what_it_admitted_counted() {
    use std::net::SocketAddr;

    let _saturating = ratelimit_tests::SATURATING.lock().await;
    let server = RedisServer::start();
    let limiter = limiter_on(&server).await;
    let app = axum::Router::new()
        .route("/hot", axum::routing::get(http_hot))
        .layer(axum::Extension(limiter.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let addr = listener.local_addr().expect("its address");
    let (signal, stop) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async {
            let _ = stop.await;
        })
        .await
    });
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let url = format!("http://{addr}/hot");
        clients.spawn(async move {
            let client = reqwest::Client::new();
            let mut ok = 0_u64;
            for _ in 0..150 {
                let answer = client.get(&url).send().await.expect("an answer");
                assert_eq!(answer.status(), 200);
                ok += 1;
            }
            ok
        });
    }
    let mut admitted = 0;
    while let Some(ok) = clients.join_next().await {
        admitted += ok.expect("a client");
    }
    let held = limiter.lease_units_held();
    signal.send(()).expect("the server listens for its signal");
    serving
        .await
        .expect("the server task")
        .expect("a graceful stop");
    limiter
        .shutdown(Duration::from_secs(10))
        .await
        .expect("shut down within 10 s");
    let counted = roomy_counted(&server, HTTP_HOT, &Target::path("/hot")).await;
    say(&format!(
        "graceful stop: {admitted} requests answered 200, {held} units held in leases before, Redis counted {counted} after"
    ));
    assert!(held > 0, "no lease was held");
    assert_eq!(counted, admitted);
}

// ---------------------------------------------------------------- admin calls

const ADMIN_QUOTA: u64 = 1_000;

#[rate_limit(
    num = 1000,
    time = 60,
    scope = "lease-admin",
    lease = "100ms",
    export = "ADMIN"
)]
async fn admin_hot() -> Result<(), RateLimitError> {
    Ok(())
}

/// Calls [`admin_hot`] `n` times in a row under `limiter`: how many were admitted.
async fn admitted_of(limiter: &RateLimiter, n: u64) -> u64 {
    limiter
        .clone()
        .scope(async move {
            let mut admitted = 0;
            for _ in 0..n {
                match admin_hot().await {
                    Ok(()) => admitted += 1,
                    Err(e) if e.is_limited() => {}
                    Err(e) => panic!("the store failed: {e}"),
                }
            }
            admitted
        })
        .await
}

/// Calls [`admin_hot`] under `limiter` 300 times, then on until it holds a lease (at most 600
/// calls in all, well inside the quota): how many were admitted.
async fn until_a_lease_is_held(limiter: &RateLimiter) -> u64 {
    let mut admitted = admitted_of(limiter, 300).await;
    for _ in 0..300 {
        if limiter.lease_units_held() > 0 {
            break;
        }
        admitted += admitted_of(limiter, 1).await;
    }
    assert!(
        limiter.lease_units_held() > 0,
        "no lease held after {admitted} calls"
    );
    admitted
}

/// A block and a reset reach the leases of the process that makes them at once. 1,000 a
/// minute with `lease = "100ms"`: after 300 calls (a lease held), `block(60 s)` admits none of
/// the next 200 calls; with a lease held again, after `reset` no more than the fresh quota of
/// 1,000 is admitted (the units leased before the reset are neither served on top of it nor
/// given back into it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_and_a_reset_reach_this_processs_leases_at_once() {
    let (limiter, _env) = Env::redis().await;
    let global = Target::global();
    let before = until_a_lease_is_held(&limiter).await;
    let held = limiter.lease_units_held();
    limiter
        .block(ADMIN, &global, Duration::from_secs(60))
        .await
        .expect("block");
    let blocked = admitted_of(&limiter, 200).await;
    say(&format!(
        "this process's block: {before} admitted first ({held} units leased), {blocked} of 200 \
         admitted while blocked"
    ));

    limiter.reset(ADMIN, &global).await.expect("reset");
    until_a_lease_is_held(&limiter).await;
    let held = limiter.lease_units_held();
    limiter.reset(ADMIN, &global).await.expect("reset");
    let after_reset = admitted_of(&limiter, 1_300).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let peeked = limiter.peek(ADMIN, &global).await.expect("peek");
    let counted = ADMIN_QUOTA - peeked.decisions()[0].remaining;
    say(&format!(
        "this process's reset: {after_reset} admitted after it ({held} units leased at it), \
         Redis counts {counted}"
    ));
    assert_eq!(blocked, 0, "calls admitted from a lease while blocked");
    assert!(
        after_reset <= ADMIN_QUOTA,
        "{after_reset} admitted after the reset against a quota of {ADMIN_QUOTA}"
    );
    assert!(
        after_reset + 100 >= ADMIN_QUOTA,
        "{after_reset} admitted after the reset: the fresh quota was spent by something else"
    );
    assert_eq!(limiter.lease_units_held(), 0);
    assert!(counted >= after_reset, "Redis counts {counted}");
}

/// A reset naming one leased key twice, and two resets naming keys in opposite orders, finish:
/// each waits for a key's lease returns once, in one order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_naming_a_leased_key_twice_finishes() {
    let (limiter, _env) = Env::redis().await;
    let global = Target::global();
    until_a_lease_is_held(&limiter).await;
    let twice = [ADMIN[0], ADMIN[0]];
    let reset = tokio::time::timeout(Duration::from_secs(10), limiter.reset(&twice, &global));
    reset
        .await
        .expect("a reset naming one key twice waited on itself")
        .expect("reset");
    until_a_lease_is_held(&limiter).await;
    assert!(limiter.lease_units_held() > 0, "leases come back after it");
}

/// A reset or a block made by another process (a second limiter with its own connection to the
/// same Redis) reaches this process's leases within one lease's life: after a reset this
/// process admits at most the fresh quota and the one lease it held; under a block, while the
/// lease lives, at most the units it held, and once the lease's 100 ms are over, nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_processs_block_and_reset_reach_the_leases_within_one_lease() {
    let (admin, env) = Env::redis().await;
    let Env::Redis(server) = &env else {
        unreachable!("Env::redis is on Redis")
    };
    // Each phase's process is a new one: a process keeps the rejections it saw in its
    // blocked-caller cache, which another's reset does not reach (see `RateLimiter::reset`).
    let process = || async {
        RateLimiter::builder()
            .redis_url(server.url())
            .timeout(Duration::from_secs(2))
            .build()
            .await
            .expect("a process's limiter")
    };
    let global = Target::global();

    let a = process().await;
    until_a_lease_is_held(&a).await;
    let held = a.lease_units_held();
    admin.reset(ADMIN, &global).await.expect("reset");
    let after_reset = admitted_of(&a, 1_300).await;
    say(&format!(
        "another process's reset: {after_reset} admitted after it, with {held} units leased"
    ));
    assert!(
        after_reset <= ADMIN_QUOTA + held,
        "{after_reset} admitted after a reset, {held} units leased at it"
    );

    tokio::time::sleep(Duration::from_millis(150)).await;
    admin.reset(ADMIN, &global).await.expect("reset");
    let a = process().await;
    until_a_lease_is_held(&a).await;
    let held = a.lease_units_held();
    admin
        .block(ADMIN, &global, Duration::from_secs(60))
        .await
        .expect("block");
    let within = admitted_of(&a, 2 * held + 10).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let after = admitted_of(&a, 200).await;
    say(&format!(
        "another process's block: {within} admitted from a lease of {held} units, {after} of 200 \
         once the lease's life was over"
    ));
    assert!(within <= held, "{within} admitted from a lease of {held}");
    assert_eq!(after, 0, "admitted after the lease's life under a block");
}
