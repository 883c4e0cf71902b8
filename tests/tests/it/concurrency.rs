//! Concurrency limits (`algo = "concurrency"`): at most `num` calls in
//! flight per key, the slot released when the call ends in any way, and on Redis a lease that
//! gives a killed process's slots back.
//!
//! Every scenario runs on the memory store and on a private `redis-server`; the stacking one
//! on a Redis Cluster too, with its two limits in different slots. The in-flight count is
//! measured inside the bodies (an atomic counter and its maximum).
#![allow(
    clippy::duration_suboptimal_units,
    reason = "Duration::from_mins is newer than the workspace's rust-version"
)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use ratelimit_runtime::{
    Algorithm, Limit, Policy, RateLimitError, RateLimiter, Store, Target, rate_limit, store::Check,
};
use ratelimit_tests::redis_cluster::RedisCluster;
use ratelimit_tests::redis_server::RedisServer;
use tokio::sync::Notify;

/// Calls in flight inside the bodies, and the most seen at once.
#[derive(Debug, Default)]
pub struct Gauge {
    now: AtomicUsize,
    most: AtomicUsize,
    ran: AtomicUsize,
}

impl Gauge {
    async fn hold(&self, body: Duration) {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(n, Ordering::SeqCst);
        self.ran.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(body).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

const BODY: Duration = Duration::from_millis(50);

#[rate_limit(
    algo = "concurrency",
    num = 5,
    time = 60,
    scope = "conc_five",
    export = "FIVE"
)]
async fn five(gauge: Arc<Gauge>) -> Result<(), RateLimitError> {
    gauge.hold(BODY).await;
    Ok(())
}

#[rate_limit(
    algo = "concurrency",
    num = 5,
    time = 60,
    scope = "conc_five",
    wait = "60s"
)]
async fn five_waiting(gauge: Arc<Gauge>) -> Result<(), RateLimitError> {
    gauge.hold(BODY).await;
    Ok(())
}

/// A body that runs until told (or forever), or panics.
#[rate_limit(algo = "concurrency", num = 5, time = 60, scope = "conc_five")]
async fn five_until(gate: Arc<Notify>, panic: bool) -> Result<(), RateLimitError> {
    assert!(!panic, "the body panics while it holds its slot");
    gate.notified().await;
    Ok(())
}

async fn memory() -> RateLimiter {
    RateLimiter::builder()
        .store(ratelimit_runtime::MemoryStore::new())
        .build()
        .await
        .unwrap()
}

async fn redis(server: &RedisServer) -> RateLimiter {
    RateLimiter::builder()
        .store(server.store().await)
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap()
}

async fn free_slots(limiter: &RateLimiter, limits: &[Limit]) -> u64 {
    limiter
        .peek(limits, &Target::global())
        .await
        .unwrap()
        .decisions()[0]
        .remaining
}

/// Polls until the slots of `limits` are all free (a dropped call releases in a task of its
/// own), within `bound`; the free slots at the end.
async fn settle_to_free(limiter: &RateLimiter, limits: &[Limit], bound: Duration) -> u64 {
    let start = Instant::now();
    loop {
        let free = free_slots(limiter, limits).await;
        if free == 5 || start.elapsed() > bound {
            return free;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// 100 concurrent calls against 5 slots: never more than 5 bodies at once; with `wait` all
/// 100 run, without it exactly the admitted ones do and the others get `Limited`. Every slot
/// is free afterwards.
async fn hundred_calls(limiter: &RateLimiter, wait: bool) -> (usize, usize) {
    let gauge = Arc::new(Gauge::default());
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..100 {
        let gauge = Arc::clone(&gauge);
        let limiter = limiter.clone();
        tasks.spawn(async move {
            if wait {
                limiter.scope(five_waiting(gauge)).await
            } else {
                limiter.scope(five(gauge)).await
            }
        });
    }
    let (mut admitted, mut refused) = (0, 0);
    while let Some(result) = tasks.join_next().await {
        match result.unwrap() {
            Ok(()) => admitted += 1,
            Err(RateLimitError::Limited { limit, .. }) => {
                assert_eq!(limit, 5);
                refused += 1;
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }
    let most = gauge.most.load(Ordering::SeqCst);
    let ran = gauge.ran.load(Ordering::SeqCst);
    println!(
        "concurrency: wait={wait}: admitted {admitted}, refused {refused}, ran {ran}, most in flight {most}"
    );
    assert!(most <= 5, "{most} calls in flight");
    assert_eq!(ran, admitted, "exactly the admitted calls ran");
    assert_eq!(admitted + refused, 100);
    if wait {
        assert_eq!(admitted, 100, "every waiting call ran");
        assert_eq!(most, 5, "the slots were used");
    } else {
        assert!(admitted >= 5, "the first five fit");
    }
    // The plain calls released before they returned.
    assert_eq!(free_slots(limiter, FIVE).await, 5);
    (admitted, most)
}

/// Cancelled calls (their future dropped mid-body) and panicking ones (in a spawned task)
/// give their slot back; then 5 more calls are admitted at once.
async fn cancelled_and_panicking_calls_release(limiter: &RateLimiter) {
    let gate = Arc::new(Notify::new());
    // Three cancelled: held until the timeout drops them.
    let mut cancelled = tokio::task::JoinSet::new();
    for _ in 0..3 {
        let (limiter, gate) = (limiter.clone(), Arc::clone(&gate));
        cancelled.spawn(async move {
            tokio::time::timeout(
                Duration::from_millis(200),
                limiter.scope(five_until(gate, false)),
            )
            .await
        });
    }
    // Two that panic inside their body, in tasks of their own.
    let mut panicking = Vec::new();
    for _ in 0..2 {
        let limiter = limiter.clone();
        let gate = Arc::clone(&gate);
        panicking.push(tokio::spawn(async move {
            limiter.scope(five_until(gate, true)).await
        }));
    }
    for t in panicking {
        assert!(t.await.unwrap_err().is_panic());
    }
    while let Some(result) = cancelled.join_next().await {
        assert!(result.unwrap().is_err(), "timed out, so dropped mid-body");
    }
    let free = settle_to_free(limiter, FIVE, Duration::from_secs(10)).await;
    assert_eq!(free, 5, "every slot released (the lease is 60 s)");
    // Five more at once are all admitted (and hold their slots until told).
    let gate = Arc::new(Notify::new());
    let mut more = tokio::task::JoinSet::new();
    for _ in 0..5 {
        let (limiter, gate) = (limiter.clone(), Arc::clone(&gate));
        more.spawn(async move { limiter.scope(five_until(gate, false)).await });
    }
    // All five hold a slot: none left.
    let start = Instant::now();
    while free_slots(limiter, FIVE).await > 0 {
        assert!(start.elapsed() < Duration::from_secs(10), "five admitted");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let refused = limiter
        .clone()
        .scope(five_until(Arc::clone(&gate), false))
        .await;
    assert!(matches!(
        refused,
        Err(RateLimitError::Limited { remaining: 0, .. })
    ));
    for _ in 0..5 {
        gate.notify_one();
    }
    while let Some(result) = more.join_next().await {
        result.unwrap().unwrap();
    }
    assert_eq!(free_slots(limiter, FIVE).await, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hundred_calls_never_exceed_five_in_flight_memory() {
    let limiter = memory().await;
    hundred_calls(&limiter, false).await;
    hundred_calls(&limiter, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hundred_calls_never_exceed_five_in_flight_redis() {
    let server = RedisServer::start();
    let limiter = redis(&server).await;
    hundred_calls(&limiter, false).await;
    hundred_calls(&limiter, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelled_and_panicking_calls_release_their_slot_memory() {
    cancelled_and_panicking_calls_release(&memory().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelled_and_panicking_calls_release_their_slot_redis() {
    let server = RedisServer::start();
    cancelled_and_panicking_calls_release(&redis(&server).await).await;
}

// ---------------------------------------------------------------- stacked with a rate limit

/// One call at a time, and 3 a minute: both checked as one call, all or nothing.
#[rate_limit(
    algo = "concurrency",
    num = 1,
    time = 60,
    scope = "conc_stack_slot",
    export = "STACK"
)]
#[rate_limit(num = 3, time = 60, scope = "conc_stack_rate")]
async fn stacked(gate: Arc<Notify>) -> Result<(), RateLimitError> {
    gate.notified().await;
    Ok(())
}

async fn remaining(limiter: &RateLimiter, limits: &[Limit]) -> (u64, u64) {
    let v = limiter.peek(limits, &Target::global()).await.unwrap();
    (v.decisions()[0].remaining, v.decisions()[1].remaining)
}

/// A call refused for lack of a slot takes nothing of the rate limit; a call refused by the
/// rate limit holds no slot.
async fn stacks_all_or_nothing(limiter: &RateLimiter) {
    // The export of a stacked function names all of its limits, in the order written.
    assert_eq!(STACK[0].policy.algorithm(), Algorithm::Concurrency);
    assert_eq!(STACK[1].policy.algorithm(), Algorithm::Fixed);
    let pair = [STACK[0], STACK[1]];
    let gate = Arc::new(Notify::new());
    let holder = {
        let (limiter, gate) = (limiter.clone(), Arc::clone(&gate));
        tokio::spawn(async move { limiter.scope(stacked(gate)).await })
    };
    let start = Instant::now();
    while remaining(limiter, &pair).await != (0, 2) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the first call holds its slot"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // No slot: refused, and the rate limit keeps its 2.
    for _ in 0..3 {
        let refused = limiter.clone().scope(stacked(Arc::clone(&gate))).await;
        assert!(matches!(refused, Err(RateLimitError::Limited { .. })));
    }
    assert_eq!(remaining(limiter, &pair).await, (0, 2));
    gate.notify_one();
    holder.await.unwrap().unwrap();
    assert_eq!(remaining(limiter, &pair).await, (1, 2));
    // Two more, one at a time: the rate limit is spent.
    for _ in 0..2 {
        gate.notify_one();
        limiter
            .clone()
            .scope(stacked(Arc::clone(&gate)))
            .await
            .unwrap();
    }
    assert_eq!(remaining(limiter, &pair).await, (1, 0));
    // Refused by the rate limit: no slot held.
    let refused = limiter.clone().scope(stacked(Arc::clone(&gate))).await;
    assert!(matches!(refused, Err(RateLimitError::Limited { .. })));
    assert_eq!(remaining(limiter, &pair).await, (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stacked_with_a_rate_limit_all_or_nothing_memory() {
    stacks_all_or_nothing(&memory().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stacked_with_a_rate_limit_all_or_nothing_redis() {
    let server = RedisServer::start();
    stacks_all_or_nothing(&redis(&server).await).await;
}

/// On a cluster the two limits' keys fall in different slots (their scopes are their hash
/// tags): the call is taken one slot at a time, and still all or nothing; the release finds
/// the slot's lease by the call's id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stacked_with_a_rate_limit_all_or_nothing_cluster() {
    let cluster = RedisCluster::start().await;
    assert_ne!(
        cluster.keyslot("{conc_stack_slot}").await,
        cluster.keyslot("{conc_stack_rate}").await,
        "two slots"
    );
    let store = ratelimit_runtime::RedisClusterStore::connect(cluster.urls())
        .await
        .unwrap();
    let limiter = RateLimiter::builder()
        .store(store)
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    stacks_all_or_nothing(&limiter).await;
    // And 100 calls on 5 slots there too (one slot's key).
    hundred_calls(&limiter, true).await;
}

// ---------------------------------------------------------------- a killed process

/// Set in a child process: the Redis URL where it takes its slots.
const CHILD_ENV: &str = "RATELIMIT_TEST_CONCURRENCY_KILL_URL";
const KEY: &str = "ratelimit:{conc_kill}:slots";
const LEASE: Duration = Duration::from_secs(2);
const READY: &str = "concurrency-slots-held";

fn kill_policy() -> Policy {
    Policy::new(Algorithm::Concurrency, 3, LEASE).unwrap()
}

/// The child: takes the 3 slots under call ids of its own, says so, and sleeps until killed.
#[test]
fn child_holding_slots() {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = ratelimit_runtime::RedisStore::connect(&url).await.unwrap();
        let policy = kill_policy();
        let checks = [Check::new(KEY, &policy)];
        for id in [
            "c0ffee00000000001",
            "c0ffee00000000002",
            "c0ffee00000000003",
        ] {
            assert!(store.take(&checks, id).await.unwrap().is_admitted());
        }
        println!("{READY}");
        std::io::stdout().flush().unwrap();
        tokio::time::sleep(Duration::from_secs(3600)).await;
    });
}

/// A process killed (SIGKILL) while it holds every slot: a new call is refused while the
/// leases run, and admitted once they end (the next check drops the ended leases).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_processes_slots_come_back_within_the_lease_redis() {
    let server = RedisServer::start();
    let exe = std::env::current_exe().unwrap();
    let module = module_path!();
    let module = module.split_once("::").map_or(module, |(_, m)| m);
    let mut child = Command::new(exe)
        .args([
            &format!("{module}::child_holding_slots"),
            "--exact",
            "--nocapture",
        ])
        .env(CHILD_ENV, server.url())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let taken = loop {
        let line = lines.next().expect("the child's report").unwrap();
        if line.contains(READY) {
            break Instant::now();
        }
    };
    child.kill().unwrap(); // SIGKILL: nothing released
    child.wait().unwrap();
    let store = server.store().await;
    let policy = kill_policy();
    let checks = [Check::new(KEY, &policy)];
    let refused = store.take(&checks, "abcdef0123456789a").await.unwrap();
    let d = refused.decisions()[0];
    assert!(
        !refused.is_admitted(),
        "the dead process's slots are still leased"
    );
    assert_eq!(d.remaining, 0);
    assert!(d.retry_after.is_some_and(|r| r > Duration::ZERO));
    // Within the lease (and a little): admitted again, and every slot back. The child took
    // its three slots one after the other (milliseconds apart on a loaded machine), so they
    // come back one after the other: the same call is taken again (its own lease is not
    // counted) until none of the child's is left.
    let tries = AtomicU64::new(0);
    loop {
        tries.fetch_add(1, Ordering::Relaxed);
        let v = store.take(&checks, "abcdef0123456789b").await.unwrap();
        if v.is_admitted() && v.decisions()[0].remaining == 2 {
            break; // all three leases ended
        }
        assert!(
            taken.elapsed() < LEASE * 10,
            "the leases never ended: {:?}",
            v.decisions()[0]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "concurrency: a killed process's 3 slots came back {:?} after its report (lease {LEASE:?}, {} checks)",
        taken.elapsed(),
        tries.load(Ordering::Relaxed)
    );
}

// ---------------------------------------------------------------- hostile keys

/// A key minted per call (an attacker's) leaves nothing behind once the calls end: each
/// release removes its lease, and the memory store's map sheds idle keys.
#[tokio::test]
async fn a_key_per_call_leaves_no_holders_behind_memory() {
    let store = ratelimit_runtime::MemoryStore::new().with_max_keys(64);
    let policy = Policy::new(Algorithm::Concurrency, 2, Duration::from_secs(60)).unwrap();
    for i in 0..10_000_u32 {
        let key = format!("ratelimit:{{conc_hostile}}:{i}");
        let id = format!("{:017x}", u64::from(i) + 1);
        let checks = [Check::new(&key, &policy)];
        assert!(
            store.take_now(&checks, &id).unwrap().is_admitted(),
            "call {i}"
        );
        store.forget(&checks, &id).await.unwrap();
    }
    // 10,000 keys through a store of 64: every released key was idle and made room.
    assert!(store.len() <= 64, "{} keys held", store.len());
    assert_eq!(store.receipts_held(), 0);
}

/// One call at a time, held until told (or panicking while it holds its slot).
#[rate_limit(
    algo = "concurrency",
    num = 1,
    time = 60,
    scope = "conc_retry",
    export = "ONE"
)]
async fn one_until(gate: Arc<Notify>, panic: bool) -> Result<(), RateLimitError> {
    assert!(!panic, "the body panics while it holds its slot");
    gate.notified().await;
    Ok(())
}

/// On the memory store a slot is free again before a cancelled call's drop returns, and before
/// a panicking call's task is joined: a call retried at once (no await in between that would
/// let a background release run; one thread) is admitted.
#[tokio::test(flavor = "current_thread")]
async fn a_call_retried_at_once_after_a_cancelled_or_panicking_one_is_admitted_memory() {
    let limiter = memory().await;
    let gate = Arc::new(Notify::new());
    // A call that holds the only slot, cancelled mid-body (its future dropped).
    let mut held = Box::pin(limiter.clone().scope(one_until(Arc::clone(&gate), false)));
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(held.as_mut().poll(cx))).await;
    assert!(first.is_pending(), "the first call holds its slot");
    let refused = limiter.clone().scope(one_until(Arc::clone(&gate), false));
    assert!(refused.await.unwrap_err().is_limited(), "one slot, taken");
    drop(held);
    let mut retried = Box::pin(limiter.clone().scope(one_until(Arc::clone(&gate), false)));
    let polled = std::future::poll_fn(|cx| std::task::Poll::Ready(retried.as_mut().poll(cx))).await;
    assert!(
        polled.is_pending(),
        "the retry is admitted and runs: {polled:?}"
    );
    drop(retried);

    // A call that panics while it holds the slot, in a task of its own.
    let panicked = tokio::spawn(limiter.clone().scope(one_until(Arc::clone(&gate), true)));
    assert!(panicked.await.unwrap_err().is_panic());
    let mut retried = Box::pin(limiter.clone().scope(one_until(Arc::clone(&gate), false)));
    let polled = std::future::poll_fn(|cx| std::task::Poll::Ready(retried.as_mut().poll(cx))).await;
    assert!(
        polled.is_pending(),
        "the retry is admitted and runs: {polled:?}"
    );
    gate.notify_one();
    retried.await.expect("admitted, and let through");
}

/// [`one_until`]'s limit (the same scope and policy: the same slot), on a body that says when
/// it runs.
#[rate_limit(algo = "concurrency", num = 1, time = 60, scope = "conc_retry")]
async fn one_running(running: Arc<Notify>, gate: Arc<Notify>) -> Result<(), RateLimitError> {
    running.notify_one();
    gate.notified().await;
    Ok(())
}

/// On Redis a cancelled call's slot goes back in a task of its own; `shutdown` returns only
/// once that release is done: the slot reads free right after, every time. (The call is
/// cancelled in its body; [`a_call_cancelled_mid_take_leaves_no_slot_taken_redis`] cancels it
/// during its take.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_a_cancelled_call_s_release_redis() {
    let server = RedisServer::start();
    let limiter = redis(&server).await;
    let gate = Arc::new(Notify::new());
    for round in 0..20 {
        let running = Arc::new(Notify::new());
        let call = tokio::spawn(
            limiter
                .clone()
                .scope(one_running(Arc::clone(&running), Arc::clone(&gate))),
        );
        running.notified().await;
        assert_eq!(
            free_slots(&limiter, ONE).await,
            0,
            "the call holds its slot"
        );
        call.abort();
        assert!(call.await.unwrap_err().is_cancelled(), "dropped mid-body");
        limiter
            .shutdown(Duration::from_secs(10))
            .await
            .expect("the release finishes within 10 s");
        assert_eq!(free_slots(&limiter, ONE).await, 1, "round {round}");
    }
}

/// [`one_until`]'s limit (the same scope and policy: the same slot), on a body that holds the
/// slot until the call is dropped.
#[rate_limit(algo = "concurrency", num = 1, time = 60, scope = "conc_retry")]
async fn one_forever() -> Result<(), RateLimitError> {
    std::future::pending::<()>().await;
    Ok(())
}

/// A call dropped at any point of its take (after its first poll, the take sent but its answer
/// not read; or after a timeout of a few microseconds, anywhere in the round trip) never keeps
/// its slot: once `shutdown` has drained the limiter's background calls, the slot reads free and
/// a fresh call is admitted at once. Otherwise a client that hangs up at the right moment holds
/// the slots of a concurrency limit for its whole lease, locking innocent callers out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_cancelled_mid_take_leaves_no_slot_taken_redis() {
    let server = RedisServer::start();
    let limiter = redis(&server).await;
    for round in 0_u64..300 {
        let mut call = Box::pin(limiter.clone().scope(one_forever()));
        if round % 2 == 0 {
            // One poll: the take is on its way to Redis, the call dropped before its answer.
            let polled = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
            assert!(polled.is_pending(), "round {round}: {polled:?}");
            drop(call);
        } else {
            // Dropped after a few microseconds: before, during or after the round trip.
            let within = Duration::from_micros(round * 37 % 1500);
            let timed = tokio::time::timeout(within, call).await;
            assert!(timed.is_err(), "round {round}: the body never ends");
        }
        limiter
            .shutdown(Duration::from_secs(10))
            .await
            .expect("the background calls finish within 10 s");
        assert_eq!(
            free_slots(&limiter, ONE).await,
            1,
            "round {round}: the cancelled call's slot is free"
        );
    }
    let gate = Arc::new(Notify::new());
    gate.notify_one();
    limiter
        .clone()
        .scope(one_until(gate, false))
        .await
        .expect("a fresh call is admitted at once");
}
