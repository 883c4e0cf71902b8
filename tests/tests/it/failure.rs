//! When Redis fails (SPEC §8), against `redis-server` processes these tests start,
//! kill, restart and pause: every call returns within the timeout (+ 50 ms of scheduling slack)
//! with the failure policy's answer, the limiter goes back to Redis by itself within 2 s of
//! Redis answering again, a flushed script cache costs nothing, and the blocked-caller cache
//! saves round trips without ever admitting a call Redis would reject.
//!
//! Timing assertions are upper bounds the issue requires (a call's latency, the recovery
//! delay), measured with `Instant`; nothing asserts that the machine is fast.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ratelimit_runtime::{
    Algorithm, FailurePolicy, Policy, RateLimitError, RateLimiter, RedisStore, limiter::Settings,
    store::Check,
};
use ratelimit_tests::redis_server::{self, RedisServer};
use tokio::task::JoinSet;

/// The callers that hammer the limiter at once.
const TASKS: usize = 8;

/// Slack over the timeout a call may take (scheduling on a loaded machine).
const SLACK: Duration = Duration::from_millis(50);

/// How soon after Redis answers again checks must use it again.
const RECOVERY: Duration = Duration::from_secs(2);

/// The tests of this file run one at a time: each measures every call's latency, and eight
/// callers of another test on the same two cores would only add noise to that.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long `CLIENT PAUSE` holds Redis.
const PAUSE: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Admitted,
    Rejected,
    Unavailable,
}

#[derive(Debug, Clone, Copy)]
struct Call {
    start: Instant,
    end: Instant,
    outcome: Outcome,
}

impl Call {
    fn took(&self) -> Duration {
        self.end - self.start
    }
}

async fn call(limiter: &RateLimiter, key: &str, policy: &Policy) -> Call {
    let start = Instant::now();
    let result = limiter
        .check(&[Check::new(key, policy).with_scope("failure-test")])
        .await;
    let end = Instant::now();
    let outcome = match result {
        Ok(v) if v.is_admitted() => Outcome::Admitted,
        Ok(_) => Outcome::Rejected,
        Err(_) => Outcome::Unavailable,
    };
    Call {
        start,
        end,
        outcome,
    }
}

/// `TASKS` tasks calling `limiter` on `key` continuously until told to stop.
struct Hammer {
    stop: Arc<AtomicBool>,
    tasks: JoinSet<Vec<Call>>,
}

impl Hammer {
    fn start(limiter: &RateLimiter, key: &str, policy: Policy) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = JoinSet::new();
        for _ in 0..TASKS {
            let (limiter, key, stop) = (limiter.clone(), key.to_owned(), stop.clone());
            tasks.spawn(async move {
                let mut calls = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    calls.push(call(&limiter, &key, &policy).await);
                    // Continuous, but leaving the two cores some room for Redis itself.
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                calls
            });
        }
        Self { stop, tasks }
    }

    /// Stops the callers; a panic in any of them fails the test.
    async fn finish(mut self) -> Vec<Call> {
        self.stop.store(true, Ordering::Relaxed);
        let mut calls = Vec::new();
        while let Some(joined) = self.tasks.join_next().await {
            match joined {
                Ok(c) => calls.extend(c),
                Err(e) => panic!("a calling task failed: {e}"),
            }
        }
        calls.sort_by_key(|c| c.start);
        calls
    }
}

fn assert_all_within(calls: &[Call], bound: Duration) {
    let slowest = calls.iter().map(Call::took).max().unwrap_or_default();
    assert!(
        slowest <= bound,
        "a call took {slowest:?}, more than {bound:?} ({} calls)",
        calls.len()
    );
}

fn between(calls: &[Call], from: Instant, to: Instant) -> Vec<Call> {
    calls
        .iter()
        .filter(|c| c.start >= from && c.end <= to)
        .copied()
        .collect()
}

async fn limiter(server: &RedisServer, policy: FailurePolicy) -> RateLimiter {
    let store = RedisStore::connect(&server.url())
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"));
    RateLimiter::builder()
        .store(store)
        .failure_policy(policy)
        // The outage tests exhaust the quota first; cached rejections would hide the policy.
        .blocked_cache(0)
        .build()
        .await
        .unwrap_or_else(|e| panic!("build: {e}"))
}

/// One quota of 5 per 90 s: spent in the first milliseconds, so Redis rejects from then on
/// and a freshly restarted (empty) Redis admits again.
fn quota() -> Policy {
    Policy::new(Algorithm::Fixed, 5, Duration::from_secs(90)).unwrap_or_else(|e| panic!("{e}"))
}

/// Calls until one is admitted: each answers within the timeout (+ slack), and the store is
/// back within [`RECOVERY`] of `event`.
async fn call_until_admitted(limiter: &RateLimiter, key: &str, policy: &Policy, event: &str) {
    let since = Instant::now();
    loop {
        let c = call(limiter, key, policy).await;
        assert!(
            c.took() <= Settings::default().timeout + SLACK,
            "{:?}",
            c.took()
        );
        if c.outcome == Outcome::Admitted {
            return;
        }
        assert!(
            since.elapsed() <= RECOVERY,
            "no admission from Redis within {RECOVERY:?} of {event}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The fixed-window counter Redis holds under `key`.
async fn counter(server: &RedisServer, key: &str) -> u64 {
    let mut conn = server.connection().await;
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// What happened around one kill and restart of Redis under `TASKS` continuous callers.
struct Outage {
    calls: Vec<Call>,
    /// Just before the kill.
    killing: Instant,
    /// The process is gone.
    killed: Instant,
    /// Just before the restart.
    restarting: Instant,
    /// The new process answers `PING`.
    restarted: Instant,
}

impl Outage {
    async fn run(policy: FailurePolicy) -> Self {
        let server = RedisServer::start();
        let limiter = limiter(&server, policy).await;
        let hammer = Hammer::start(
            &limiter,
            "ratelimit:{failure:outage}:fixed:5:90000",
            quota(),
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        let killing = Instant::now();
        let (mut server, killed) = tokio::task::spawn_blocking(move || {
            let mut server = server;
            server.kill();
            (server, Instant::now())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        tokio::time::sleep(Duration::from_secs(1)).await;
        let restarting = Instant::now();
        let (server, restarted) = tokio::task::spawn_blocking(move || {
            server.restart();
            (server, Instant::now())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        tokio::time::sleep(RECOVERY + Duration::from_millis(500)).await;
        let calls = hammer.finish().await;
        drop(server);
        Self {
            calls,
            killing,
            killed,
            restarting,
            restarted,
        }
    }

    /// The calls made while Redis was down.
    /// The calls made while Redis was down, after checking what holds for every outage: each
    /// call answered within the timeout (+ slack), and every task called while it was down.
    fn down(&self) -> Vec<Call> {
        assert_all_within(&self.calls, Settings::default().timeout + SLACK);
        let down = between(&self.calls, self.killed, self.restarting);
        assert!(
            down.len() >= TASKS,
            "too few calls while down: {}",
            down.len()
        );
        down
    }

    /// How long after Redis answered again the first call with `outcome` (which only Redis
    /// gives at this point) ended; fails when there was none.
    fn recovery(&self, outcome: Outcome) -> Duration {
        let first = self
            .calls
            .iter()
            .filter(|c| c.end > self.restarting && c.outcome == outcome)
            .map(|c| c.end)
            .min()
            .unwrap_or_else(|| {
                panic!(
                    "no {outcome:?} call after the restart: Redis was never used again ({} calls)",
                    self.calls.len()
                )
            });
        let recovery = first.saturating_duration_since(self.restarted);
        assert!(
            recovery <= RECOVERY,
            "checks went back to Redis {recovery:?} after it restarted, more than {RECOVERY:?}"
        );
        recovery
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_under_8_callers_allow_admits_within_the_timeout_and_recovers() {
    let _serial = SERIAL.lock().await;
    let outage = Outage::run(FailurePolicy::Allow).await;
    let down = outage.down();
    assert!(
        down.iter().all(|c| c.outcome == Outcome::Admitted),
        "fail open admits every call while Redis is down"
    );
    // Redis rejected before the kill (quota spent) and, once restarted and empty, spends the
    // quota again at once: the first rejection after the restart is Redis answering.
    let before = between(&outage.calls, outage.calls[0].start, outage.killing);
    assert!(before.iter().any(|c| c.outcome == Outcome::Rejected));
    let recovery = outage.recovery(Outcome::Rejected);
    eprintln!(
        "allow: {} calls, {} while down, slowest {:?}, back on Redis {recovery:?} after restart",
        outage.calls.len(),
        down.len(),
        outage
            .calls
            .iter()
            .map(Call::took)
            .max()
            .unwrap_or_default()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_under_8_callers_deny_rejects_within_the_timeout_and_recovers() {
    let _serial = SERIAL.lock().await;
    let outage = Outage::run(FailurePolicy::Deny).await;
    let down = outage.down();
    assert!(
        down.iter().all(|c| c.outcome == Outcome::Unavailable),
        "fail closed answers every call with the store error while Redis is down"
    );
    let recovery = outage.recovery(Outcome::Admitted);
    eprintln!(
        "deny: {} calls, {} while down, back on Redis {recovery:?} after restart",
        outage.calls.len(),
        down.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_under_8_callers_local_keeps_the_quota_per_process_and_recovers() {
    let _serial = SERIAL.lock().await;
    let outage = Outage::run(FailurePolicy::Local).await;
    let down = outage.down();
    assert!(down.iter().all(|c| c.outcome != Outcome::Unavailable));
    // Redis's quota was spent before the kill, so every admission that ended after the kill
    // began and before the restart came from the local fallback: at most the quota, and the
    // fallback does admit (it is not a silent deny).
    let local_admitted = outage
        .calls
        .iter()
        .filter(|c| {
            c.end > outage.killing && c.end < outage.restarting && c.outcome == Outcome::Admitted
        })
        .count();
    assert!(
        (1..=5).contains(&local_admitted),
        "the local fallback admitted {local_admitted} calls for a quota of 5"
    );
    // The local quota is spent for a minute; only the restarted (empty) Redis admits again.
    let recovery = outage.recovery(Outcome::Admitted);
    eprintln!(
        "local: {} calls, {} while down, {local_admitted} admitted locally, back on Redis {recovery:?} after restart",
        outage.calls.len(),
        down.len()
    );
}

/// The default failure policy keeps limiting: a limiter built with no `failure_policy`, its
/// Redis killed, checks the same limit in this process. 2 calls of a quota of 5 counted in
/// Redis before the kill; then 40 calls: the process admits at most its own quota of 5 and
/// refuses the rest as limited (never as unavailable, never all admitted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_limiter_with_its_redis_killed_still_refuses_past_the_quota() {
    let _serial = SERIAL.lock().await;
    let mut server = RedisServer::start();
    let limiter = RateLimiter::builder()
        .redis_url(server.url())
        .blocked_cache(0)
        .build()
        .await
        .unwrap_or_else(|e| panic!("build: {e}"));
    assert_eq!(limiter.settings().failure_policy, FailurePolicy::Local);
    let (key, policy) = ("default-policy-killed", quota());
    for _ in 0..2 {
        assert_eq!(
            call(&limiter, key, &policy).await.outcome,
            Outcome::Admitted
        );
    }
    assert_eq!(counter(&server, key).await, 2, "counted in Redis");
    server.kill();
    let mut outcomes = Vec::new();
    for _ in 0..40 {
        outcomes.push(call(&limiter, key, &policy).await.outcome);
    }
    let admitted = outcomes.iter().filter(|o| **o == Outcome::Admitted).count();
    let rejected = outcomes.iter().filter(|o| **o == Outcome::Rejected).count();
    assert!(
        (1..=5).contains(&admitted) && admitted + rejected == 40,
        "with Redis killed the default policy admitted {admitted} of 40 for a quota of 5 \
         ({outcomes:?})"
    );
    assert!(limiter.store_failing());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_gives_plain_callers_the_store_unavailable_error() {
    let _serial = SERIAL.lock().await;
    let mut server = RedisServer::start();
    let limiter = limiter(&server, FailurePolicy::Deny).await;
    let policy = quota();
    let checks = [Check::new(
        "ratelimit:{failure:deny}:fixed:5:90000",
        &policy,
    )];
    assert!(limiter.acquire(&checks).await.is_ok());
    tokio::task::block_in_place(|| server.kill());
    for _ in 0..3 {
        let start = Instant::now();
        let err = limiter.acquire(&checks).await.unwrap_err();
        assert!(start.elapsed() <= Settings::default().timeout + SLACK);
        assert!(err.is_store_unavailable(), "{err}");
        assert!(matches!(err, RateLimitError::StoreUnavailable(_)));
        assert!(err.to_string().starts_with("rate-limit store unavailable"));
    }
}

static BODY_RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

#[ratelimit_runtime::rate_limit(algo = "fixed", num = 5, time = 90, key = "send")]
async fn send_code() -> Result<u32, RateLimitError> {
    BODY_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(7)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_makes_a_rate_limited_plain_function_return_store_unavailable() {
    let _serial = SERIAL.lock().await;
    let mut server = RedisServer::start();
    let limiter = limiter(&server, FailurePolicy::Deny).await;
    assert_eq!(limiter.clone().scope(send_code()).await.unwrap(), 7);
    tokio::task::block_in_place(|| server.kill());
    let start = Instant::now();
    let err = limiter.clone().scope(send_code()).await.unwrap_err();
    assert!(start.elapsed() <= Settings::default().timeout + SLACK);
    assert!(err.is_store_unavailable(), "{err}");
    assert_eq!(err.retry_after(), None);
    assert_eq!(BODY_RUNS.load(Ordering::SeqCst), 1, "the body did not run");
}

/// `SCRIPT FLUSH` and `FUNCTION FLUSH` between calls: the next call reloads what it runs (the
/// library, or the script on a server without Functions) and is counted by Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_between_two_calls_the_second_succeeds() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    // Deny: a failed second call would be an error, not a silently admitted call.
    let limiter = limiter(&server, FailurePolicy::Deny).await;
    let policy = quota();
    let key = "ratelimit:{failure:flush}:fixed:5:90000";
    let checks = [Check::new(key, &policy)];
    let first = limiter.check(&checks).await.unwrap();
    assert_eq!(first.decisions()[0].remaining, 4);
    let mut conn = server.connection().await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    let second = limiter.check(&checks).await.unwrap();
    assert!(second.is_admitted());
    // Counted by Redis: this is its answer, not a fallback.
    assert_eq!(second.decisions()[0].remaining, 3);
    assert_eq!(counter(&server, key).await, 2);
    if redis_server::skip_without_functions(
        "script_flush_between_two_calls_the_second_succeeds (its FUNCTION FLUSH part)",
    ) {
        assert!(!limiter.store_failing());
        return;
    }
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    let third = limiter.check(&checks).await.unwrap();
    assert!(third.is_admitted());
    assert_eq!(third.decisions()[0].remaining, 2);
    assert_eq!(counter(&server, key).await, 3);
    assert!(!limiter.store_failing());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_connections_reconnect_by_themselves() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    let limiter = limiter(&server, FailurePolicy::Deny).await;
    let policy = Policy::new(Algorithm::Fixed, 1000, Duration::from_secs(90)).unwrap();
    let key = "ratelimit:{failure:dropped}:fixed:1000:90000";
    let mut admitted = 0u64;
    for _ in 0..3 {
        assert_eq!(
            call(&limiter, key, &policy).await.outcome,
            Outcome::Admitted
        );
        admitted += 1;
        // Every connection but this one is closed by the server (the limiter's included).
        let mut conn = server.connection().await;
        let killed = ratelimit_tests::redis_server::kill_other_clients(&mut conn)
            .await
            .unwrap();
        assert!(killed >= 1);
        call_until_admitted(&limiter, key, &policy, "the connection dropping").await;
        admitted += 1;
    }
    // The same server kept counting: the answers after each drop were Redis's.
    assert_eq!(counter(&server, key).await, admitted);
}

/// `CLIENT PAUSE 2000`: Redis holds every command; calls must come back within the timeout with
/// the policy's answer, and go back to Redis once the pause ends.
async fn client_pause(policy: FailurePolicy, expected: Outcome) {
    let server = RedisServer::start();
    let limiter = limiter(&server, policy).await;
    // A quota of 1, spent: Redis rejects, so any other answer is the policy's.
    let one = Policy::new(Algorithm::Fixed, 1, Duration::from_secs(90)).unwrap();
    let key = "ratelimit:{failure:pause}:fixed:1:90000";
    assert_eq!(call(&limiter, key, &one).await.outcome, Outcome::Admitted);
    assert_eq!(call(&limiter, key, &one).await.outcome, Outcome::Rejected);
    let hammer = Hammer::start(&limiter, key, one);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let pausing = Instant::now();
    server.pause(PAUSE).await;
    let paused = Instant::now();
    tokio::time::sleep(PAUSE + RECOVERY).await;
    let calls = hammer.finish().await;
    assert_all_within(&calls, Settings::default().timeout + SLACK);
    // Calls that started after the pause took effect and ended before it could have ended.
    let during = between(&calls, paused, pausing + PAUSE);
    assert!(during.len() >= TASKS, "too few calls during the pause");
    assert!(
        during.iter().all(|c| c.outcome == expected),
        "every call during the pause gets the policy's answer {expected:?}"
    );
    let pause_end = paused + PAUSE;
    let back = calls
        .iter()
        .filter(|c| c.start > pause_end && c.outcome == Outcome::Rejected)
        .map(|c| c.end)
        .min()
        .unwrap_or_else(|| panic!("Redis was not used again after the pause"));
    let recovery = back.saturating_duration_since(pause_end);
    assert!(
        recovery <= RECOVERY,
        "back on Redis {recovery:?} after the pause"
    );
    eprintln!(
        "pause ({policy:?}): {} calls, {} during the pause, slowest {:?}, back on Redis {recovery:?} after it",
        calls.len(),
        during.len(),
        calls.iter().map(Call::took).max().unwrap_or_default()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_pause_allow_admits_within_the_timeout() {
    let _serial = SERIAL.lock().await;
    client_pause(FailurePolicy::Allow, Outcome::Admitted).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_pause_deny_rejects_within_the_timeout() {
    let _serial = SERIAL.lock().await;
    client_pause(FailurePolicy::Deny, Outcome::Unavailable).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lazy_store_connects_once_redis_is_up_without_a_new_limiter() {
    let _serial = SERIAL.lock().await;
    let mut server = RedisServer::start();
    tokio::task::block_in_place(|| server.kill());
    let limiter = RateLimiter::builder()
        .redis_url(server.url())
        .failure_policy(FailurePolicy::Deny)
        .build_lazy()
        .unwrap();
    let policy = quota();
    let key = "ratelimit:{failure:lazy}:fixed:5:90000";
    for _ in 0..5 {
        let c = call(&limiter, key, &policy).await;
        assert_eq!(c.outcome, Outcome::Unavailable);
        assert!(
            c.took() <= Settings::default().timeout + SLACK,
            "{:?}",
            c.took()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let server = tokio::task::block_in_place(move || {
        server.restart();
        server
    });
    call_until_admitted(&limiter, key, &policy, "Redis starting").await;
    assert_eq!(
        counter(&server, key).await,
        1,
        "the admission was counted by Redis"
    );
}

/// A check that times out while a lazy store makes its first connection is answered by the
/// policy but opens no breaker (SPEC §8: a check arriving during a cold start waits for that
/// connection): the next check waits for the same connection, and Redis answers it and counts
/// it alone (the first sent nothing). `CLIENT PAUSE … WRITE` holds the library's load (or, on
/// a server without Functions, the scripts'); the pause ends between the first check's timeout
/// and the second's, a second from each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_during_the_first_connection_leaves_the_next_check_to_redis() {
    const TIMEOUT: Duration = Duration::from_secs(2);
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    server.pause_writes(Duration::from_secs(3)).await;
    let limiter = RateLimiter::builder()
        .redis_url(server.url())
        .timeout(TIMEOUT)
        .failure_policy(FailurePolicy::Deny)
        .blocked_cache(0)
        .build_lazy()
        .unwrap();
    let one = Policy::new(Algorithm::Fixed, 1, Duration::from_secs(90)).unwrap();
    let key = "ratelimit:{failure:cold}:fixed:1:90000";
    let first = call(&limiter, key, &one).await;
    assert_eq!(first.outcome, Outcome::Unavailable, "{:?}", first.took());
    assert!(
        !limiter.store_failing(),
        "a timeout while connecting opened the breaker"
    );
    let second = call(&limiter, key, &one).await;
    assert_eq!(
        second.outcome,
        Outcome::Admitted,
        "Redis answered the second check ({:?})",
        second.took()
    );
    assert_eq!(call(&limiter, key, &one).await.outcome, Outcome::Rejected);
    assert_eq!(
        counter(&server, key).await,
        1,
        "Redis counted the second only"
    );
}

/// `calls=` of `cmdstat_evalsha` in `INFO commandstats`.
/// The store's script calls the server counted: `FCALL` (the library) and `EVALSHA` (servers
/// without Functions).
async fn evalsha_calls(server: &RedisServer) -> u64 {
    let mut conn = server.connection().await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    ["cmdstat_evalsha:calls=", "cmdstat_fcall:calls="]
        .iter()
        .map(|prefix| {
            info.lines()
                .find_map(|l| l.strip_prefix(prefix))
                .and_then(|rest| rest.split(',').next())
                .map_or(0, |n| n.parse::<u64>().unwrap())
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_cache_spares_redis_and_never_admits_what_redis_rejects() {
    const NUM: u64 = 3;
    const PERIOD: Duration = Duration::from_secs(1);
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let limiter = RateLimiter::builder().store(store).build().await.unwrap();
    let policy = Policy::new(Algorithm::Fixed, NUM, PERIOD).unwrap();
    let key = "ratelimit:{failure:blocked}:fixed:3:1000";
    let mut conn = server.connection().await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    let start = Instant::now();
    // One caller hammering (a few tasks sending its requests) for about two and a half windows.
    let hammer = Hammer::start(&limiter, key, policy);
    tokio::time::sleep(PERIOD * 5 / 2).await;
    let calls = hammer.finish().await;
    let elapsed = start.elapsed();
    let redis_calls = evalsha_calls(&server).await;
    // Fixed windows start at an admitted call and last PERIOD: at most this many windows
    // overlap the run.
    let windows = u64::try_from(elapsed.as_millis() / PERIOD.as_millis()).unwrap() + 1;
    let admitted = calls
        .iter()
        .filter(|c| c.outcome == Outcome::Admitted)
        .count();
    let admitted = u64::try_from(admitted).unwrap();
    assert!(
        admitted <= NUM * windows,
        "admitted {admitted} in {windows} windows of {NUM}"
    );
    assert!(admitted >= NUM, "the limit admits its quota");
    // Per window: the admissions, the rejections in flight before the first one was cached,
    // and a couple near the window's end (the cache expires a round trip early).
    let per_window = NUM + u64::try_from(TASKS).unwrap() + 4;
    assert!(
        redis_calls <= per_window * windows,
        "{redis_calls} EVALSHA for {} calls over {windows} windows",
        calls.len()
    );
    assert!(calls.len() > usize::try_from(redis_calls).unwrap() * 4);
    assert!(calls.iter().all(|c| c.outcome != Outcome::Unavailable));
    eprintln!(
        "blocked cache: {} calls, {admitted} admitted, {redis_calls} EVALSHA over {elapsed:?}",
        calls.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_cache_rejects_without_a_round_trip_and_never_outlives_redis() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    let limiter = RateLimiter::builder()
        .store(RedisStore::connect(&server.url()).await.unwrap())
        .build()
        .await
        .unwrap();
    // A second store to ask Redis itself; a rejected check changes nothing there.
    let direct = RedisStore::connect(&server.url()).await.unwrap();
    for algorithm in [
        Algorithm::Fixed,
        Algorithm::Sliding,
        Algorithm::Token,
        Algorithm::Leaky,
    ] {
        let policy = Policy::new(algorithm, 2, Duration::from_secs(5)).unwrap();
        let key = format!("ratelimit:{{failure:outlive}}:{algorithm}:2:5000");
        let checks = [Check::new(&key, &policy)];
        for _ in 0..2 {
            assert!(limiter.check(&checks).await.unwrap().is_admitted());
        }
        let by_redis = limiter.check(&checks).await.unwrap();
        assert!(!by_redis.is_admitted());
        let before = evalsha_calls(&server).await;
        let t1 = Instant::now();
        let cached = limiter.check(&checks).await.unwrap();
        let asked = Instant::now();
        let from_redis = ratelimit_runtime::Store::check(&direct, &checks)
            .await
            .unwrap();
        let t2 = Instant::now();
        // The cached rejection cost no round trip (the direct check is the one EVALSHA).
        assert_eq!(evalsha_calls(&server).await, before + 1, "{algorithm}");
        assert!(!cached.is_admitted() && !from_redis.is_admitted());
        let cached_wait = cached.retry_after().unwrap();
        let redis_wait = from_redis.retry_after().unwrap();
        // Redis's wait, read up to (t2 - t1) later, plus its microsecond rounding, bounds the
        // cache's: the cache never holds a caller longer than Redis would.
        assert!(
            cached_wait <= redis_wait + (t2 - t1) + Duration::from_millis(1),
            "{algorithm}: cache {cached_wait:?} > Redis {redis_wait:?} + {:?}",
            t2 - t1
        );
        assert!(cached_wait > Duration::ZERO && asked >= t1);
    }
}

// ---------------------------------------------------------------------------------------------
// A limit's own failure policy (`on_store_error`), under an `allow` limiter.

#[ratelimit_runtime::rate_limit(
    num = 3,
    time = 90,
    key = "{user}",
    scope = "failure_login",
    on_store_error = "deny"
)]
async fn login_fails_closed(user: &str) -> Result<(), RateLimitError> {
    let _ = user;
    Ok(())
}

#[ratelimit_runtime::rate_limit(num = 3, time = 90, key = "{user}", scope = "failure_search")]
async fn search_fails_open(user: &str) -> Result<(), RateLimitError> {
    let _ = user;
    Ok(())
}

#[ratelimit_runtime::rate_limit(num = 100, time = 90, key = "{user}", scope = "failure_open")]
#[ratelimit_runtime::rate_limit(
    num = 100,
    time = 90,
    key = "{user}",
    scope = "failure_closed",
    on_store_error = "deny"
)]
async fn stacked_open_and_closed(user: &str) -> Result<(), RateLimitError> {
    let _ = user;
    Ok(())
}

#[ratelimit_runtime::rate_limit(
    num = 3,
    time = 90,
    key = "{user}",
    scope = "failure_local",
    on_store_error = "local"
)]
async fn checked_locally(user: &str) -> Result<(), RateLimitError> {
    let _ = user;
    Ok(())
}

/// The case: 20 concurrent logins against a quota of 3 while Redis stalls past the
/// timeout, under the default `allow`. The login (`on_store_error = "deny"`) refuses every
/// one of them, and admits exactly the quota over the whole run; the search (no argument) is
/// admitted past its quota; a call stacking both is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_refuses_only_the_limits_that_say_deny() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    let limiter = limiter(&server, FailurePolicy::Allow).await;
    limiter
        .clone()
        .scope(login_fails_closed("alice"))
        .await
        .unwrap();
    server.pause(PAUSE).await;
    let paused = Instant::now();
    let mut logins = JoinSet::new();
    for _ in 0..20 {
        let limiter = limiter.clone();
        logins.spawn(async move {
            let start = Instant::now();
            let result = limiter.scope(login_fails_closed("alice")).await;
            (start.elapsed(), result)
        });
    }
    let mut refused = 0;
    while let Some(joined) = logins.join_next().await {
        let (took, result) = joined.unwrap();
        assert!(took <= Settings::default().timeout + SLACK, "{took:?}");
        let err = result.unwrap_err();
        assert!(
            matches!(err, RateLimitError::StoreUnavailable(_)),
            "{err:?}"
        );
        refused += 1;
    }
    assert_eq!(refused, 20);
    for _ in 0..5 {
        limiter
            .clone()
            .scope(search_fails_open("alice"))
            .await
            .unwrap();
    }
    let err = limiter
        .clone()
        .scope(stacked_open_and_closed("alice"))
        .await
        .unwrap_err();
    assert!(err.is_store_unavailable(), "{err:?}");
    assert!(
        paused.elapsed() < PAUSE,
        "the calls above ran during the pause"
    );
    // Redis back: the logins refused during the stall were not counted (their takes are given
    // back), so alice has exactly the 2 logins left of her quota of 3.
    tokio::time::sleep(PAUSE.saturating_sub(paused.elapsed()) + Duration::from_millis(300)).await;
    let mut admitted = 0;
    let since = Instant::now();
    while admitted < 2 {
        match limiter.clone().scope(login_fails_closed("alice")).await {
            Ok(()) => admitted += 1,
            Err(e) if e.is_store_unavailable() && since.elapsed() <= RECOVERY => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("login {} after the pause: {e:?}", admitted + 2),
        }
    }
    let err = limiter
        .clone()
        .scope(login_fails_closed("alice"))
        .await
        .unwrap_err();
    assert!(err.is_limited(), "{err:?}");
    let policy = Policy::new(Algorithm::Fixed, 3, Duration::from_secs(90)).unwrap();
    let key = ratelimit_runtime::key::build(
        "ratelimit",
        "failure_login",
        &[ratelimit_runtime::key::Part::new(
            ratelimit_runtime::key::Source::Key,
            b"alice",
        )],
        &policy,
    );
    assert_eq!(
        counter(&server, &key).await,
        3,
        "Redis counted exactly the quota"
    );
}

/// A limit with `on_store_error = "local"` under an `allow` limiter: while Redis stalls, its
/// calls are checked in this process's memory, exactly to the quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_limit_under_an_allow_limiter_keeps_its_quota_in_memory_while_redis_stalls() {
    let _serial = SERIAL.lock().await;
    let server = RedisServer::start();
    let limiter = limiter(&server, FailurePolicy::Allow).await;
    // Redis answers: one of bob's 3 is spent there (the local store starts from its own count).
    limiter.clone().scope(checked_locally("bob")).await.unwrap();
    server.pause(PAUSE).await;
    let paused = Instant::now();
    let mut results = Vec::new();
    for _ in 0..10 {
        results.push(limiter.clone().scope(checked_locally("bob")).await);
    }
    assert!(paused.elapsed() < PAUSE, "the calls ran during the pause");
    let admitted = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(admitted, 3, "{results:?}");
    for r in &results[3..] {
        let err = r.as_ref().unwrap_err();
        assert!(err.is_limited(), "{err:?}");
        // The local window's wait: at most its period (and the millisecond it started in).
        let most = Duration::from_secs(90) + Duration::from_millis(1);
        assert_eq!(err.retry_after().map(|d| d <= most), Some(true), "{err:?}");
    }
    assert!(results[..3].iter().all(Result::is_ok), "{results:?}");
}
