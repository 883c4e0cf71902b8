//! `wait = "…"`: a limited plain call waits for its slot instead of failing.
//!
//! * The fleet: 3 processes (children of this test binary) share 10 calls a second on one
//!   private Redis, 300 calls each with `wait`: all 900 complete, no 1-second window of the
//!   store's admissions holds more than 10, and every call's wait is bounded.
//! * In one process, on the memory store: first come first served, a budget that runs out
//!   answers `Limited` as without `wait`, cancelled waiters take nothing, and a flood of
//!   distinct keys waiting at once all complete (the lines' bound is a unit test of
//!   `call::wait`).
#![allow(
    clippy::cast_precision_loss,
    reason = "figures printed for the report: microseconds as f64 milliseconds"
)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ratelimit_runtime::store::{Store, StoreFuture};
use ratelimit_runtime::{RateLimitError, RateLimiter, RedisStore, rate_limit, store::Check};
use ratelimit_tests::env::Env;
use ratelimit_tests::redis_server::RedisServer;

// ---------------------------------------------------------------- the fleet

/// Set in a child process of the fleet test: the Redis URL it shares.
const CHILD_ENV: &str = "RATELIMIT_TEST_WAIT_FLEET_REDIS";
/// The wall-clock instant (µs since the epoch) at which every child starts calling.
const START_ENV: &str = "RATELIMIT_TEST_WAIT_FLEET_START_US";
const PROCESSES: usize = 3;
const CALLS: usize = 300;
/// Concurrent callers in each process (each makes `CALLS / WORKERS` calls, one after another).
const WORKERS: usize = 4;
const FLEET_WAIT: Duration = Duration::from_secs(10);

/// The partner's quota: 10 a second, one every 100 ms. A GCRA with no burst is "never more
/// than 10 in any second" in every window: a fixed window admits 20 across a boundary, and a
/// bucket with a burst of 10 admits a full bucket plus a refill of 9 within one second. (The
/// sliding log holds too, but frees its 10 slots at once each second, so the fleet would
/// crowd in bursts.)
#[rate_limit(
    algo = "gcra",
    num = 10,
    time = 1,
    burst = 1,
    scope = "wait_fleet",
    wait = "10s"
)]
async fn partner_call() -> Result<(), RateLimitError> {
    Ok(())
}

fn unix_us(t: SystemTime) -> u64 {
    u64::try_from(t.duration_since(UNIX_EPOCH).unwrap().as_micros()).unwrap()
}

/// The Redis store, recording for every admitted check when it was sent and when its answer
/// came: the store admitted the call at one instant in between (by the machine's clock, which
/// the children share).
#[derive(Debug)]
struct Timed {
    inner: RedisStore,
    admitted: Arc<Mutex<Vec<(u64, u64)>>>,
}

impl Store for Timed {
    fn check<'a>(&'a self, checks: &'a [Check<'a>]) -> StoreFuture<'a> {
        Box::pin(async move {
            let sent = unix_us(SystemTime::now());
            let verdict = self.inner.check(checks).await;
            let answered = unix_us(SystemTime::now());
            if verdict
                .as_ref()
                .is_ok_and(ratelimit_runtime::Verdict::is_admitted)
            {
                self.admitted.lock().unwrap().push((sent, answered));
            }
            verdict
        })
    }

    fn name(&self) -> &'static str {
        "redis"
    }
}

/// One process of the fleet: `WORKERS` callers, `CALLS` calls in all, each printed with how
/// long it waited; then every admission's interval.
fn fleet_child(url: &str) {
    let start_us: u64 = std::env::var(START_ENV).unwrap().parse().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let admitted = Arc::new(Mutex::new(Vec::new()));
        let store = Timed {
            inner: RedisStore::connect(url).await.unwrap(),
            admitted: Arc::clone(&admitted),
        };
        // A generous timeout: a check that timed out would be answered by the failure policy,
        // not by the shared quota.
        let limiter = RateLimiter::builder()
            .store(store)
            .timeout(Duration::from_secs(2))
            .build()
            .await
            .unwrap();
        limiter.install().unwrap();
        let now = unix_us(SystemTime::now());
        tokio::time::sleep(Duration::from_micros(start_us.saturating_sub(now))).await;
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..WORKERS {
            workers.spawn(async {
                let mut waits = Vec::new();
                for _ in 0..CALLS / WORKERS {
                    let started = Instant::now();
                    partner_call().await.expect("admitted within its wait");
                    waits.push(started.elapsed());
                }
                waits
            });
        }
        while let Some(waits) = workers.join_next().await {
            for w in waits.unwrap() {
                println!("WAIT-FLEET-CALL {}", w.as_micros());
            }
        }
        for (sent, answered) in admitted.lock().unwrap().iter() {
            println!("WAIT-FLEET-ADMIT {sent} {answered}");
        }
    });
}

/// The most admissions whose store instants surely lie within one window shorter than
/// `window`: for each admission sent at `s`, the `n` admissions sent at `s` or later that
/// were answered first; they all lie in `[s, nth answer]`. Sound: a count above the quota
/// here is a real violation, whatever the round trips were.
fn surely_within(admits: &[(u64, u64)], window: u64, n: usize) -> bool {
    let mut by_sent = admits.to_vec();
    by_sent.sort_unstable();
    (0..by_sent.len()).any(|i| {
        let mut answers: Vec<u64> = by_sent[i..].iter().map(|a| a.1).collect();
        if answers.len() < n {
            return false;
        }
        answers.select_nth_unstable(n - 1);
        answers[n - 1] - by_sent[i].0 < window
    })
}

/// The most admissions in any window of `window` µs, counting each at the midpoint of its
/// round trip.
fn most_in_window(admits: &[(u64, u64)], window: u64) -> usize {
    let mut at: Vec<u64> = admits.iter().map(|(s, a)| s.midpoint(*a)).collect();
    at.sort_unstable();
    let mut most = 0;
    let mut j = 0;
    for i in 0..at.len() {
        while at[i] - at[j] >= window {
            j += 1;
        }
        most = most.max(i - j + 1);
    }
    most
}

#[test]
fn three_processes_sharing_ten_a_second_all_complete_never_above_ten_in_any_second() {
    if let Ok(url) = std::env::var(CHILD_ENV) {
        fleet_child(&url);
        return;
    }
    let server = RedisServer::start();
    let module = module_path!();
    let module = module.split_once("::").map_or(module, |(_, m)| m);
    let test = format!(
        "{module}::three_processes_sharing_ten_a_second_all_complete_never_above_ten_in_any_second"
    );
    let start = SystemTime::now() + Duration::from_millis(1500);
    let started = Instant::now();
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args([test.as_str(), "--exact", "--nocapture", "--test-threads=1"])
                .env(CHILD_ENV, server.url())
                .env(START_ENV, unix_us(start).to_string())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut admits: Vec<(u64, u64)> = Vec::new();
    let mut waits: Vec<u64> = Vec::new();
    let mut finished = Vec::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "a child of the fleet:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut calls = 0;
        for line in stdout.lines() {
            // The first record follows libtest's `test … ... ` on its line.
            let Some(at) = line.find("WAIT-FLEET-") else {
                continue;
            };
            let mut words = line[at..].split_whitespace();
            match words.next() {
                Some("WAIT-FLEET-CALL") => {
                    waits.push(words.next().unwrap().parse().unwrap());
                    calls += 1;
                }
                Some("WAIT-FLEET-ADMIT") => {
                    let sent = words.next().unwrap().parse().unwrap();
                    admits.push((sent, words.next().unwrap().parse().unwrap()));
                }
                _ => {}
            }
        }
        assert_eq!(calls, CALLS, "every call of every child completed");
        finished.push(started.elapsed());
    }
    let total = started.elapsed();
    assert_eq!(admits.len(), PROCESSES * CALLS, "one admission per call");
    // Never more than 10 in any second, by the store's instants (each known to within its
    // round trip): no 11 admissions surely inside one second.
    assert!(
        !surely_within(&admits, 1_000_000, 11),
        "11 admissions within one second"
    );
    let most = most_in_window(&admits, 1_000_000);
    let widest = admits.iter().map(|(s, a)| a - s).max().unwrap();
    waits.sort_unstable();
    let max_wait = *waits.last().unwrap();
    let p99 = waits[waits.len() * 99 / 100];
    let median = waits[waits.len() / 2];
    // No caller starves: every call was admitted within its wait (it would have failed
    // otherwise), and the longest wait is a few seconds of a queue of 12 callers sharing 10 a
    // second, far from the budget.
    assert!(Duration::from_micros(max_wait) < FLEET_WAIT);
    println!(
        "wait fleet: {} calls in {:.1} s; most admissions in a 1 s window (round-trip midpoints) {most}; widest round trip {:.1} ms; wait median {:.0} ms, p99 {:.0} ms, max {:.0} ms; children finished at {finished:?}",
        admits.len(),
        total.as_secs_f64(),
        widest as f64 / 1000.0,
        median as f64 / 1000.0,
        p99 as f64 / 1000.0,
        max_wait as f64 / 1000.0,
    );
    // `most` counts each admission at its round trip's midpoint, an estimate: a reply delayed
    // on a loaded machine moves it, so only `surely_within` above is asserted.
}

// ---------------------------------------------------------------- in one process

/// One call every 50 ms, waited for up to 2 s.
#[rate_limit(
    algo = "gcra",
    num = 1,
    time = "50ms",
    burst = 1,
    scope = "wait_fifo",
    wait = "2s"
)]
async fn fifo_call() -> Result<(), RateLimitError> {
    Ok(())
}

// Tokio's paused clock, for the store and the waits alike: time moves only when every task is
// idle, so each caller is in the line before the next comes, however slow the machine (on real
// time a loaded machine let a caller arrive late).
#[tokio::test(start_paused = true)]
async fn waiting_callers_are_admitted_in_the_order_they_came() {
    let limiter = RateLimiter::builder()
        .store(ratelimit_runtime::MemoryStore::with_clock(
            ratelimit_runtime::store::TokioClock::default(),
        ))
        .build()
        .await
        .unwrap();
    limiter.clone().scope(fifo_call()).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..10 {
        let order = Arc::clone(&order);
        tasks.push(tokio::spawn(limiter.clone().scope(async move {
            fifo_call().await.unwrap();
            order.lock().unwrap().push(i);
        })));
        // Each is waiting before the next comes.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..10).collect::<Vec<_>>());
}

#[rate_limit(
    algo = "gcra",
    num = 1,
    time = 1,
    burst = 1,
    scope = "wait_budget",
    wait = "300ms"
)]
async fn short_wait() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(
    algo = "gcra",
    num = 1,
    time = 1,
    burst = 1,
    scope = "wait_budget",
    wait = "1500ms"
)]
async fn long_wait() -> Result<(), RateLimitError> {
    Ok(())
}

#[tokio::test]
async fn a_slot_beyond_the_wait_fails_as_limited_and_one_within_it_is_waited_for() {
    let (limiter, env) = Env::memory().await;
    limiter
        .clone()
        .scope(async {
            short_wait().await.unwrap();
            // The next slot is 1 s away by the store's clock, beyond 300 ms: at once, as
            // without `wait`.
            let started = Instant::now();
            let e = short_wait().await.unwrap_err();
            assert!(started.elapsed() < Duration::from_millis(100));
            let RateLimitError::Limited {
                retry_after, limit, ..
            } = e
            else {
                panic!("{e}")
            };
            assert_eq!((retry_after, limit), (Duration::from_secs(1), 1));
            // Within 1.5 s: the call sleeps until the slot; the store's clock (manual here)
            // gets there meanwhile.
            let started = Instant::now();
            let (admitted, ()) = tokio::join!(long_wait(), async {
                tokio::time::sleep(Duration::from_millis(200)).await;
                env.wait(Duration::from_secs(1)).await;
            });
            admitted.unwrap();
            let waited = started.elapsed();
            assert!(waited >= Duration::from_secs(1), "{waited:?}");
            // The clock stops: the next waits its 1.5 s budget at most, then fails.
            let started = Instant::now();
            assert!(long_wait().await.unwrap_err().is_limited());
            assert!(started.elapsed() <= Duration::from_millis(1600));
        })
        .await;
}

#[rate_limit(
    algo = "sliding",
    num = 5,
    time = 1,
    scope = "wait_cancel",
    wait = "5s"
)]
async fn cancellable() -> Result<(), RateLimitError> {
    Ok(())
}

/// The same limit and bucket, without waiting.
#[rate_limit(algo = "sliding", num = 5, time = 1, scope = "wait_cancel")]
async fn probe() -> Result<(), RateLimitError> {
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiters_leave_the_whole_quota_to_the_next_caller() {
    let (limiter, env) = Env::memory().await;
    let spent = limiter.clone().scope(async {
        let mut ok = 0;
        for _ in 0..5 {
            ok += usize::from(probe().await.is_ok());
        }
        ok
    });
    assert_eq!(spent.await, 5);
    // 20 waiters for the slots of the next second: 10 dropped by a timeout, 10 aborted.
    let mut aborted = Vec::new();
    let mut timed_out = Vec::new();
    for i in 0..20 {
        if i % 2 == 0 {
            aborted.push(tokio::spawn(limiter.clone().scope(cancellable())));
        } else {
            let waiting = limiter.clone().scope(cancellable());
            timed_out.push(tokio::spawn(tokio::time::timeout(
                Duration::from_millis(300),
                waiting,
            )));
        }
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    for t in &aborted {
        t.abort();
    }
    for t in timed_out {
        assert!(t.await.unwrap().is_err(), "dropped while waiting");
    }
    for t in aborted {
        assert!(t.await.unwrap_err().is_cancelled());
    }
    // The spent slots are free a second later (the log's entries of one instant are a
    // microsecond apart: a millisecond more frees them all).
    env.wait(Duration::from_millis(1001)).await;
    let next = limiter.scope(async {
        let mut ok = 0;
        for _ in 0..8 {
            ok += usize::from(probe().await.is_ok());
        }
        ok
    });
    assert_eq!(
        next.await,
        5,
        "exactly the full quota: the waiters took nothing"
    );
}

#[rate_limit(
    algo = "gcra",
    num = 1,
    time = "100ms",
    burst = 1,
    key = "{user}",
    scope = "wait_flood",
    wait = "2s"
)]
async fn per_user(user: u32) -> Result<(), RateLimitError> {
    let _ = user;
    Ok(())
}

/// 2,000 distinct keys (a client choosing the argument) waiting at once: each waits in its own
/// line for its own slot, and all complete in about one slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_distinct_keys_waiting_at_once_all_complete() {
    let limiter = RateLimiter::builder()
        .store(ratelimit_runtime::MemoryStore::new())
        .build()
        .await
        .unwrap();
    let users = 2000;
    for user in 0..users {
        limiter.clone().scope(per_user(user)).await.unwrap();
    }
    let started = Instant::now();
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for user in 0..users {
        let done = Arc::clone(&done);
        tasks.spawn(limiter.clone().scope(async move {
            per_user(user).await.unwrap();
            done.fetch_add(1, Ordering::Relaxed);
        }));
    }
    while let Some(t) = tasks.join_next().await {
        t.unwrap();
    }
    assert_eq!(done.load(Ordering::Relaxed), 2000);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}
