//! Settled costs (`settle = …`, `RateLimiter::settle`, `Reservation`): calls charged an
//! estimate of 1,000 before their body and settled to what they used (100 to 3,000) after it,
//! against 10,000 a minute, on the memory store, a private Redis and a Redis Cluster (keys in
//! one slot, and a stack whose keys span slots).
//!
//! Calls in flight at once each pass the quota by their own excess; stacked with a concurrency
//! limit of 1 whose callers wait, 20 concurrent callers pass it by one call's excess.
//!
//! Exactness is read from a meter: a second limit of the same call (2^40 a minute, settled to
//! the same units) whose remaining units say exactly what was charged, debts included (the
//! quota's own `remaining` stops at 0).
#![allow(
    clippy::duration_suboptimal_units,
    reason = "Duration::from_mins is newer than the workspace's rust-version"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ratelimit_runtime::{
    Algorithm, MemoryStore, Policy, RateLimitError, RateLimiter, RedisClusterStore, Target,
    rate_limit, settle::Reservation, store::Check,
};
use ratelimit_tests::redis_cluster::RedisCluster;
use ratelimit_tests::redis_server::RedisServer;

const QUOTA: u64 = 10_000;
const ESTIMATE: u64 = 1_000;
const METER: u64 = 1 << 40;

/// What the calls of a test used, in order: 100 to 3,000 units, from a fixed seed.
fn usage(seed: u64, n: usize) -> Vec<u64> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            // splitmix64
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            100 + (z ^ (z >> 31)) % 2_901
        })
        .collect()
}

fn policies() -> (Policy, Policy) {
    let minute = Duration::from_secs(60);
    let quota = Policy::new(Algorithm::Fixed, QUOTA, minute)
        .and_then(|p| p.with_cost(ESTIMATE))
        .expect("quota");
    let meter = Policy::new(Algorithm::Fixed, METER, minute)
        .and_then(|p| p.with_cost(ESTIMATE))
        .expect("meter");
    (quota, meter)
}

/// Units the meter under `key` counts now.
async fn metered(limiter: &RateLimiter, key: &str) -> u64 {
    let meter = Policy::new(Algorithm::Fixed, METER, Duration::from_secs(60)).expect("meter");
    let verdict = limiter
        .store()
        .peek(&[Check::new(key, &meter)])
        .await
        .expect("peek");
    METER - verdict.decisions()[0].remaining
}

/// 20 tasks call until refused; each admitted call holds its estimate while it runs (a yield),
/// then settles to its usage. Returns the admitted calls' usage.
async fn twenty_tasks(limiter: &RateLimiter, quota_key: &str, meter_key: &str) -> Vec<u64> {
    let (quota, meter) = policies();
    let admitted = Arc::new(std::sync::Mutex::new(Vec::new()));
    let next = Arc::new(AtomicU64::new(0));
    let uses = Arc::new(usage(0x005E_771E, 400));
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let (limiter, admitted, next, uses) = (
            limiter.clone(),
            Arc::clone(&admitted),
            Arc::clone(&next),
            Arc::clone(&uses),
        );
        let (quota_key, meter_key) = (quota_key.to_owned(), meter_key.to_owned());
        tasks.push(tokio::spawn(async move {
            let checks = [
                Check::new(&quota_key, &quota),
                Check::new(&meter_key, &meter),
            ];
            loop {
                let (verdict, id) = limiter.take(&checks).await.expect("take");
                if !verdict.is_admitted() {
                    return;
                }
                tokio::task::yield_now().await;
                let i = usize::try_from(next.fetch_add(1, Ordering::SeqCst)).unwrap_or(0);
                let units = uses[i % uses.len()];
                limiter.settle(&checks, &id, &[units, units]).await;
                admitted.lock().unwrap().push(units);
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    Arc::try_unwrap(admitted).unwrap().into_inner().unwrap()
}

/// The bound and the exactness of one run: every unit used was charged (the meter), and the
/// quota was passed by no more than the excesses of the calls in flight when it was reached
/// (at most `QUOTA / ESTIMATE` of them: each held its estimate).
async fn concurrent_scenario(limiter: &RateLimiter, quota_key: &str, meter_key: &str) {
    let admitted = twenty_tasks(limiter, quota_key, meter_key).await;
    let used: u64 = admitted.iter().sum();
    assert_eq!(
        metered(limiter, meter_key).await,
        used,
        "refunds and excess charges are exact: the meter counts what the admitted calls used"
    );
    let mut excess: Vec<u64> = admitted
        .iter()
        .map(|u| u.saturating_sub(ESTIMATE))
        .collect();
    excess.sort_unstable_by(|a, b| b.cmp(a));
    let in_flight = usize::try_from(QUOTA / ESTIMATE).unwrap_or(10);
    let bound = QUOTA + excess.iter().take(in_flight).sum::<u64>();
    assert!(
        used <= bound,
        "used {used} > {bound}: over the quota by more than the in-flight calls' excess"
    );
    assert!(
        used > QUOTA - ESTIMATE,
        "used {used}: refused while an estimate still fitted"
    );
    eprintln!(
        "{} calls admitted, {used} units used of {QUOTA} (bound {bound})",
        admitted.len()
    );
}

/// One caller, one call at a time: the quota is passed by at most the last call's excess.
async fn sequential_scenario(limiter: &RateLimiter, quota_key: &str, meter_key: &str) {
    let (quota, meter) = policies();
    let checks = [Check::new(quota_key, &quota), Check::new(meter_key, &meter)];
    let mut used = 0;
    let mut last = 0;
    for u in usage(0xA11CE, 1_000) {
        let (verdict, id) = limiter.take(&checks).await.expect("take");
        if !verdict.is_admitted() {
            break;
        }
        limiter.settle(&checks, &id, &[u, u]).await;
        used += u;
        last = u;
    }
    assert_eq!(metered(limiter, meter_key).await, used);
    assert!(
        used <= QUOTA + last.saturating_sub(ESTIMATE),
        "used {used}: more than one call's excess ({last} - {ESTIMATE}) over {QUOTA}"
    );
    assert!(used > QUOTA - ESTIMATE, "used {used}");
}

async fn memory_limiter() -> RateLimiter {
    RateLimiter::builder()
        .store(MemoryStore::new())
        .build()
        .await
        .expect("limiter")
}

async fn redis_limiter(server: &RedisServer) -> RateLimiter {
    RateLimiter::builder()
        .redis_url(server.url())
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .expect("limiter")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_calls_settle_exactly_memory() {
    let limiter = memory_limiter().await;
    concurrent_scenario(&limiter, "{llm:a}:quota", "{llm:a}:meter").await;
    sequential_scenario(&limiter, "{llm:b}:quota", "{llm:b}:meter").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_calls_settle_exactly_redis() {
    let server = RedisServer::start();
    let limiter = redis_limiter(&server).await;
    concurrent_scenario(&limiter, "{llm:a}:quota", "{llm:a}:meter").await;
    sequential_scenario(&limiter, "{llm:b}:quota", "{llm:b}:meter").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_calls_settle_exactly_cluster_in_one_slot_and_across_slots() {
    let cluster = RedisCluster::start().await;
    let store = RedisClusterStore::connect(cluster.urls())
        .await
        .expect("cluster store");
    let limiter = RateLimiter::builder()
        .store(store)
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .expect("limiter");
    // One slot: settled by receipt.
    concurrent_scenario(&limiter, "{llm:a}:quota", "{llm:a}:meter").await;
    one_at_a_time_scenario(&limiter, "dee").await;
    // Keys in two slots: taken slot by slot without receipts, so nothing is given back, but
    // every excess is charged on both (the meter reads at least what was used).
    assert_ne!(
        cluster.keyslot("{llm:c}:quota").await,
        cluster.keyslot("{llm:d}:meter").await
    );
    let (quota, meter) = policies();
    let checks = [
        Check::new("{llm:c}:quota", &quota),
        Check::new("{llm:d}:meter", &meter),
    ];
    let (verdict, id) = limiter.take(&checks).await.expect("take");
    assert!(verdict.is_admitted());
    limiter.settle(&checks, &id, &[2_500, 2_500]).await;
    assert_eq!(metered(&limiter, "{llm:d}:meter").await, 2_500);
    let (verdict, id) = limiter.take(&checks).await.expect("take");
    assert!(verdict.is_admitted());
    limiter.settle(&checks, &id, &[300, 300]).await;
    assert_eq!(
        metered(&limiter, "{llm:d}:meter").await,
        2_500 + ESTIMATE,
        "across slots a call that used less stays counted at its estimate (fails closed)"
    );
}

/// A settle that comes after the call's receipt expired (a stalled store, a call that outlived
/// the receipt's 10 seconds) gives nothing back: the estimate stays counted. Its excess is
/// still charged.
#[tokio::test]
async fn a_settle_after_the_receipt_is_gone_keeps_the_estimate_memory() {
    let clock = ratelimit_runtime::store::ManualClock::new();
    let limiter = RateLimiter::builder()
        .store(MemoryStore::with_clock(clock.clone()))
        .build()
        .await
        .expect("limiter");
    let (quota, meter) = policies();
    let checks = [Check::new("{s}:q", &quota), Check::new("{s}:m", &meter)];
    let (_, id) = limiter.take(&checks).await.expect("take");
    clock.advance(Duration::from_secs(11));
    limiter.settle(&checks, &id, &[100, 100]).await;
    assert_eq!(metered(&limiter, "{s}:m").await, ESTIMATE);
    let (_, id) = limiter.take(&checks).await.expect("take");
    clock.advance(Duration::from_secs(11));
    limiter.settle(&checks, &id, &[1_700, 1_700]).await;
    assert_eq!(metered(&limiter, "{s}:m").await, ESTIMATE + 1_700);
}

/// Redis stalled during the settle (`CLIENT PAUSE` longer than the limiter's timeout and the
/// receipt's life): the settle fails, and the estimate stays counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_failure_during_settle_leaves_the_estimate_counted_redis() {
    let server = RedisServer::start();
    let limiter = RateLimiter::builder()
        .redis_url(server.url())
        .timeout(Duration::from_millis(500))
        .build()
        .await
        .expect("limiter");
    let (quota, meter) = policies();
    let checks = [Check::new("{f}:q", &quota), Check::new("{f}:m", &meter)];
    let (verdict, id) = limiter.take(&checks).await.expect("take");
    assert!(verdict.is_admitted());
    server.pause(Duration::from_secs(11)).await;
    let started = std::time::Instant::now();
    limiter.settle(&checks, &id, &[100, 100]).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "bounded by the timeout"
    );
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(
        metered(&limiter, "{f}:m").await,
        ESTIMATE,
        "the failed settle gave nothing back"
    );
}

// ---------------------------------------------------------------- the attribute

static USED: AtomicU64 = AtomicU64::new(0);

/// A completion charged its `max_tokens` and settled to what its reply says it used.
#[rate_limit(num = 10_000, time = 60, key = "{user}", cost = max_tokens, settle = |reply| reply.as_ref().map_or(0, |r: &Reply| r.total_tokens))]
async fn complete(user: &str, max_tokens: u64, used: u64) -> Result<Reply, RateLimitError> {
    let _ = user;
    USED.fetch_add(used, Ordering::SeqCst);
    Ok(Reply { total_tokens: used })
}

#[derive(Debug)]
struct Reply {
    total_tokens: u64,
}

/// The same, where the body learns the cost late and settles its reservation itself.
#[rate_limit(num = 10_000, time = 60, key = "{user}", cost = max_tokens, settle = "later", scope = "settle::streamed")]
async fn streamed(user: &str, max_tokens: u64, used: u64) -> Result<(), RateLimitError> {
    let _ = (user, max_tokens);
    let reservation = Reservation::take().expect("a reservation");
    // The body ends; the stream it started settles later, in another task.
    tokio::spawn(async move {
        tokio::task::yield_now().await;
        reservation.settle(used).await;
    })
    .await
    .expect("stream");
    Ok(())
}

#[tokio::test]
async fn the_attribute_settles_by_the_output_and_by_a_reservation() {
    let limiter = memory_limiter().await;
    limiter
        .clone()
        .scope(async move {
            // 9 calls of 1,000 that used 1,100 each: 9,900 used.
            for _ in 0..9 {
                complete("ann", 1_000, 1_100).await.expect("admitted");
            }
            let err = complete("ann", 1_000, 1).await.expect_err("refused");
            assert!(
                matches!(err, RateLimitError::Limited { remaining: 100, .. }),
                "{err:?}"
            );
            // Used less: 37 calls charged 1,000 settle to 250 each (9,250 used), and the
            // estimate of the next no longer fits.
            for _ in 0..37 {
                complete("bob", 1_000, 250).await.expect("admitted");
            }
            let err = complete("bob", 1_000, 1).await.expect_err("refused");
            assert!(
                matches!(err, RateLimitError::Limited { remaining: 750, .. }),
                "{err:?}"
            );
            // `later`: settled from another task after the body.
            for _ in 0..76 {
                streamed("cy", 1_000, 120).await.expect("admitted");
            }
            let err = streamed("cy", 1_000, 1).await.expect_err("refused");
            assert!(
                matches!(err, RateLimitError::Limited { remaining: 880, .. }),
                "{err:?}"
            );
            // No reservation outside a call.
            assert!(Reservation::take().is_none());
        })
        .await;
}

// ---------------------------------------------------------------- one call at a time

/// The calls in flight when the quota is reached each pass it by their own excess, so 20 at
/// once may pass it by up to ten calls' excess (`concurrent_scenario`). Stacked with a
/// concurrency limit of 1 whose callers wait for the slot, the same 20 concurrent callers run
/// one call at a time: the quota is passed by at most the last call's excess. The slot goes
/// back only after the settle (the settle, then the release), so the next call sees the debt.
#[rate_limit(
    algo = "concurrency",
    num = 1,
    time = 60,
    key = "{user}",
    scope = "settle::one_at_a_time",
    wait = "30s"
)]
#[rate_limit(
    num = 10_000,
    time = 60,
    key = "{user}",
    cost = max_tokens,
    scope = "settle::one_at_a_time",
    settle = |reply| reply.as_ref().map_or(0, |r: &Reply| r.total_tokens),
    export = "ONE_AT_A_TIME"
)]
async fn one_at_a_time(
    user: &str,
    max_tokens: u64,
    in_flight: &InFlight,
) -> Result<Reply, RateLimitError> {
    let _ = max_tokens;
    // What the quota holds now, read from the store: every call before this one settled, and
    // this one's estimate taken.
    let now = RateLimiter::current()
        .peek(ONE_AT_A_TIME, &Target::global().key(user))
        .await
        .expect("peek");
    let remaining = now
        .decisions()
        .iter()
        .find(|d| d.limit == QUOTA)
        .expect("the quota's decision")
        .remaining;
    let used = in_flight.enter(remaining);
    tokio::task::yield_now().await;
    in_flight.leave();
    Ok(Reply { total_tokens: used })
}

/// Calls inside a body now, the most seen at once, and what each body used, in the order the
/// bodies ran: the `n`th body to run uses `uses[n]`, so the calls' usage in the order they ran
/// is the same in every run (with one call at a time).
#[derive(Debug)]
struct InFlight {
    now: AtomicU64,
    most: AtomicU64,
    uses: Vec<u64>,
    ran: std::sync::Mutex<Vec<u64>>,
}

impl InFlight {
    fn new(uses: Vec<u64>) -> Self {
        Self {
            now: AtomicU64::new(0),
            most: AtomicU64::new(0),
            uses,
            ran: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Enters a body that read `remaining` units left in the quota; returns what it uses.
    /// The quota holds exactly what the bodies before it used and this call's estimate: each
    /// settle (refund or excess) landed before the next call was admitted.
    fn enter(&self, remaining: u64) -> u64 {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        let mut ran = self.ran.lock().unwrap();
        let before: u64 = ran.iter().sum();
        assert_eq!(
            remaining,
            QUOTA.saturating_sub(before + ESTIMATE),
            "call {}: the quota does not hold what the calls before it used",
            ran.len()
        );
        let used = self.uses[ran.len() % self.uses.len()];
        ran.push(used);
        used
    }

    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// 20 tasks call `one_at_a_time` for `user` until refused; returns the admitted calls' usage
/// in the order their bodies ran, and the most calls seen in flight at once.
async fn twenty_waiting_tasks(limiter: &RateLimiter, user: &str) -> (Vec<u64>, u64) {
    let returned = Arc::new(AtomicU64::new(0));
    // In this order (with one call at a time), 6 calls use 11,476: the sixth, of 2,967, passes
    // the quota by 1,476 (its excess: 1,967).
    let in_flight = Arc::new(InFlight::new(usage(0xD, 400)));
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let (returned, in_flight) = (Arc::clone(&returned), Arc::clone(&in_flight));
        let user = user.to_owned();
        tasks.push(tokio::spawn(limiter.clone().scope(async move {
            loop {
                match one_at_a_time(&user, ESTIMATE, &in_flight).await {
                    Ok(_) => {
                        returned.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(RateLimitError::Limited { .. }) => return,
                    Err(other) => panic!("{other:?}"),
                }
            }
        })));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let ran = std::mem::take(&mut *in_flight.ran.lock().unwrap());
    assert_eq!(
        ran.len(),
        usize::try_from(returned.load(Ordering::SeqCst)).unwrap_or(0),
        "every body that ran returned Ok"
    );
    (ran, in_flight.most.load(Ordering::SeqCst))
}

/// `user`'s calls. Both limits have one scope, so their keys share a hash tag: on a Redis
/// Cluster, one slot, where the settle gives back by receipt (across slots the estimate would
/// stay counted: fails closed).
async fn one_at_a_time_scenario(limiter: &RateLimiter, caller: &str) {
    let (admitted, most) = twenty_waiting_tasks(limiter, caller).await;
    assert_eq!(
        most, 1,
        "the concurrency limit let {most} calls run at once"
    );
    let used: u64 = admitted.iter().sum();
    let last = admitted.last().copied().unwrap_or(0);
    assert!(
        used <= QUOTA + last.saturating_sub(ESTIMATE),
        "used {used}: more than one call's excess ({last} - {ESTIMATE}) over {QUOTA}"
    );
    assert!(
        used > QUOTA - ESTIMATE,
        "used {used}: refused while an estimate still fitted"
    );
    eprintln!(
        "{} calls admitted one at a time, {used} units used of {QUOTA} (bound {})",
        admitted.len(),
        QUOTA + last.saturating_sub(ESTIMATE)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_callers_one_call_at_a_time_pass_by_one_excess_memory() {
    one_at_a_time_scenario(&memory_limiter().await, "dee").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_callers_one_call_at_a_time_pass_by_one_excess_redis() {
    let server = RedisServer::start();
    one_at_a_time_scenario(&redis_limiter(&server).await, "dee").await;
}

// ---------------------------------------------------------------- an Axum endpoint

mod llm {
    use axum::routing::post;
    use axum::{Extension, Json, Router};
    use ratelimit_runtime::{RateLimiter, rate_limit};
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Deserialize)]
    pub(crate) struct Prompt {
        pub(crate) max_tokens: u32,
        /// What the model will use (the test's stand-in for the model).
        pub(crate) uses: u32,
    }

    #[derive(Debug, Serialize)]
    pub(crate) struct Usage {
        pub(crate) total_tokens: u32,
    }

    #[derive(Debug, Serialize)]
    pub(crate) struct Completion {
        pub(crate) usage: Usage,
    }

    /// 10,000 tokens a minute per user: `max_tokens` charged up front, settled to what the
    /// completion used.
    #[rate_limit(
        num = 10_000,
        time = 60,
        by = "header:x-user",
        cost = prompt.max_tokens,
        settle = |done| done.usage.total_tokens,
        framework = "axum"
    )]
    async fn complete(Json(prompt): Json<Prompt>) -> Json<Completion> {
        Json(Completion {
            usage: Usage {
                total_tokens: prompt.uses,
            },
        })
    }

    pub(crate) async fn start(limiter: RateLimiter) -> String {
        let app = Router::new()
            .route("/v1/completions", post(complete))
            .layer(Extension(limiter));
        let addr = crate::http_support::serve_axum(app, "127.0.0.1").await;
        format!("http://{addr}")
    }
}

async fn axum_scenario(backend: &crate::http_support::Backend) {
    let limiter = backend.limiter(&[]).await;
    let base = llm::start(limiter).await;
    let client = crate::http_support::client();
    let ask = |user: &'static str, max_tokens: u32, uses: u32| {
        let client = client.clone();
        let url = format!("{base}/v1/completions");
        async move {
            client
                .post(url)
                .header("x-user", user)
                .json(&serde_json::json!({ "max_tokens": max_tokens, "uses": uses }))
                .send()
                .await
                .expect("request")
        }
    };
    // Ann's completions use more than they asked for: 9 × 1,100 = 9,900 tokens.
    for _ in 0..9 {
        assert_eq!(ask("ann", 1_000, 1_100).await.status(), 200);
    }
    let refused = ask("ann", 1_000, 1).await;
    assert_eq!(refused.status(), 429);
    // A smaller estimate still fits in the 100 left.
    assert_eq!(ask("ann", 100, 100).await.status(), 200);
    assert_eq!(ask("ann", 1, 1).await.status(), 429);
    // Bob's use less: 37 × 250 = 9,250, then 1,000 no longer fits but 750 does.
    for _ in 0..37 {
        assert_eq!(ask("bob", 1_000, 250).await.status(), 200);
    }
    assert_eq!(ask("bob", 1_000, 1).await.status(), 429);
    let last = ask("bob", 750, 750).await;
    assert_eq!(last.status(), 200);
    let fields = last
        .headers()
        .get("ratelimit")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(fields.contains("r=0"), "{fields}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_axum_endpoint_charges_max_tokens_and_settles_to_the_usage_memory() {
    axum_scenario(&crate::http_support::Backend::memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_axum_endpoint_charges_max_tokens_and_settles_to_the_usage_redis() {
    axum_scenario(&crate::http_support::Backend::redis()).await;
}

// ---------------------------------------------------------------- merged limits

/// Two stacked limits of one scope, one settled and one at a fixed cost of 5.
#[rate_limit(num = 100, time = 60, scope = "settle_merge", cost = estimate, settle = |r| *r.as_ref().unwrap_or(&0))]
#[rate_limit(num = 50, time = 60, scope = "settle_merge", cost = 5)]
async fn merged(estimate: u64, used: u64) -> Result<u64, RateLimitError> {
    let _ = estimate;
    Ok(used)
}

/// An override that gives both the same quota makes them one bucket, charged once per call:
/// it settles to what the call used, never below the fixed part's 5.
#[tokio::test]
async fn a_settled_limit_merged_with_a_fixed_cost_settles_no_lower_than_it() {
    let limiter = memory_limiter().await;
    limiter
        .set_quota(
            "settle_merge",
            ratelimit_runtime::Quota::per_minute(1_000).unwrap(),
        )
        .expect("override");
    let admitted = |estimate: u64, used: u64| {
        let limiter = limiter.clone();
        async move {
            limiter
                .scope(async move {
                    let mut n = 0;
                    while merged(estimate, used).await.is_ok() {
                        n += 1;
                        assert!(n <= 1_000, "unbounded");
                    }
                    n
                })
                .await
        }
    };
    // Used 1, estimated 5: each call counts the fixed 5, so 1,000 / 5 calls.
    assert_eq!(admitted(5, 1).await, 200);
    limiter
        .set_quota(
            "settle_merge",
            ratelimit_runtime::Quota::per_minute(1_001).unwrap(),
        )
        .expect("override");
    // Used 20, estimated 1 (another bucket: another quota): charged 5, the larger cost, and
    // settled to 20; a call fits while 20 × k + 5 ≤ 1,001: 50 calls.
    assert_eq!(admitted(1, 20).await, 50);
}

/// A settled amount the caller can push high (2^52, the most the scripts take, 2^53 or
/// `u64::MAX` through the manual API) is charged one capacity at most, on every algorithm and
/// every store alike: the limit is one period in debt, never wiped (a level beyond 2^63 once
/// read as an empty bucket on Redis), never left at the estimate (a settle the scripts refuse)
/// and never locked for good.
async fn huge_settle_scenario(limiter: &RateLimiter) {
    for (used, name) in [(1 << 52, "2^52"), (1 << 53, "2^53"), (u64::MAX, "u64::MAX")] {
        for algorithm in Algorithm::ALL {
            let minute = Duration::from_secs(60);
            let policy = Policy::new(algorithm, QUOTA, minute).expect("policy");
            let estimated = policy.with_cost(ESTIMATE).expect("estimate");
            let key = format!("{{huge}}:{algorithm}:{name}");
            let checks = [Check::new(&key, &estimated)];
            let (verdict, id) = limiter.take(&checks).await.expect("take");
            assert!(verdict.is_admitted(), "{algorithm}");
            limiter.settle(&checks, &id, &[used]).await;
            let mut admitted = 0;
            for _ in 0..10 {
                admitted += u32::from(limiter.check(&checks).await.expect("check").is_admitted());
            }
            assert_eq!(
                admitted, 0,
                "{algorithm}, settled to {name}: takes of {ESTIMATE} admitted after it"
            );
            let unit = policy.with_cost(1).expect("unit");
            let read = limiter
                .store()
                .peek(&[Check::new(&key, &unit)])
                .await
                .expect("peek");
            let d = read.decisions()[0];
            // A debt, not a fresh limit (10,000 left): the buckets and GCRA drip a unit back
            // every 6 ms of the test's own time, so a loaded machine reads a few; fewer than
            // one estimate unless the test stalls for 6 s.
            assert!(
                d.remaining < ESTIMATE,
                "{algorithm}: a debt, not a fresh limit: {d:?}"
            );
            assert!(
                d.reset_after <= 2 * minute + Duration::from_secs(1),
                "{algorithm}: the debt lasts about a period, not {:?}",
                d.reset_after
            );
        }
    }
}

#[tokio::test]
async fn a_huge_settle_is_one_capacity_of_debt_memory() {
    huge_settle_scenario(&memory_limiter().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_settle_is_one_capacity_of_debt_redis() {
    let server = RedisServer::start();
    huge_settle_scenario(&redis_limiter(&server).await).await;
}

// ---------------------------------------------------------------- receipts bound what comes back

/// Units left under `key` for calls of `policy`'s limit at cost 1 (a peek).
async fn left(limiter: &RateLimiter, key: &str, policy: &Policy) -> u64 {
    let unit = policy.with_cost(1).expect("unit");
    let read = limiter
        .store()
        .peek(&[Check::new(key, &unit)])
        .await
        .expect("peek");
    read.decisions()[0].remaining
}

/// Refunds the call `id` with `checks` (`refund`), or settles it to 0 with them.
async fn give_back(limiter: &RateLimiter, checks: &[Check<'_>], id: &str, refund: bool) {
    if refund {
        limiter.refund(checks, id).await;
    } else {
        limiter.settle(checks, id, &[0]).await;
    }
}

/// A settle or a refund gives back only what the call took, of the key it took it from,
/// whatever check the caller hands in: a call of key `ka` settled to 0 (or refunded) against
/// the spent key `kb` gives `kb` nothing back, and a 1-unit call settled to 0 (or refunded)
/// with a check whose estimate says 100 gives back 1 unit, not 100.
async fn receipts_bound_what_comes_back(limiter: &RateLimiter) {
    let (quota, _) = policies();
    for refund in [false, true] {
        let (ka, kb) = (format!("{{rb}}:ka:{refund}"), format!("{{rb}}:kb:{refund}"));
        for _ in 0..QUOTA / ESTIMATE {
            let (v, id) = limiter
                .take(&[Check::new(&kb, &quota)])
                .await
                .expect("take");
            assert!(v.is_admitted());
            limiter.forget(&[Check::new(&kb, &quota)], &id).await;
        }
        let (v, id) = limiter
            .take(&[Check::new(&ka, &quota)])
            .await
            .expect("take");
        assert!(v.is_admitted());
        give_back(limiter, &[Check::new(&kb, &quota)], &id, refund).await;
        assert_eq!(
            left(limiter, &kb, &quota).await,
            0,
            "another key's call gave back to kb (refund: {refund})"
        );
        assert_eq!(left(limiter, &ka, &quota).await, QUOTA - ESTIMATE);

        let minute = Duration::from_secs(60);
        let small = Policy::new(Algorithm::Fixed, 100, minute).expect("policy");
        let claimed = small.with_cost(100).expect("claimed");
        let key = format!("{{rb}}:one:{refund}");
        let (v, id) = limiter
            .take(&[Check::new(&key, &small)])
            .await
            .expect("take");
        assert!(v.is_admitted());
        for _ in 0..99 {
            assert!(
                limiter
                    .check(&[Check::new(&key, &small)])
                    .await
                    .expect("check")
                    .is_admitted()
            );
        }
        give_back(limiter, &[Check::new(&key, &claimed)], &id, refund).await;
        assert_eq!(
            left(limiter, &key, &small).await,
            1,
            "a 1-unit call gave back more than 1 (refund: {refund})"
        );
    }
}

#[tokio::test]
async fn receipts_bound_what_a_settle_or_refund_gives_back_memory() {
    receipts_bound_what_comes_back(&memory_limiter().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipts_bound_what_a_settle_or_refund_gives_back_redis() {
    let server = RedisServer::start();
    receipts_bound_what_comes_back(&redis_limiter(&server).await).await;
}

mod never_more_than_taken {
    //! No sequence of takes, settles and refunds, with any checks (another key, another
    //! estimate), any amounts, repeated or for unknown calls, gives back more than the calls
    //! took: at one instant (a manual clock), what each key counts never falls below what its
    //! calls still hold.

    use std::time::Duration;

    use proptest::prelude::*;
    use ratelimit_runtime::store::ManualClock;
    use ratelimit_runtime::{Algorithm, MemoryStore, Policy, store::Check};

    const QUOTA: u64 = 1_000_000;
    const KEYS: [&str; 2] = ["ka", "kb"];

    #[derive(Debug, Clone)]
    enum Op {
        /// A take of `cost` under key `key`.
        Take { key: usize, cost: u64 },
        /// A settle of call `call` (an index into the takes; past them, an unknown call) with a
        /// check of `key` at `cost`, to `used`.
        Settle {
            call: usize,
            key: usize,
            cost: u64,
            used: u64,
        },
        /// A refund of call `call` with a check of `key` at `cost`.
        Refund { call: usize, key: usize, cost: u64 },
    }

    fn op() -> impl Strategy<Value = Op> {
        let cost = 1u64..=2_000;
        prop_oneof![
            (0..2usize, cost.clone()).prop_map(|(key, cost)| Op::Take { key, cost }),
            (
                0..12usize,
                0..2usize,
                cost.clone(),
                prop_oneof![0u64..=3_000, any::<u64>()]
            )
                .prop_map(|(call, key, cost, used)| Op::Settle {
                    call,
                    key,
                    cost,
                    used
                }),
            (0..12usize, 0..2usize, cost).prop_map(|(call, key, cost)| Op::Refund {
                call,
                key,
                cost
            }),
        ]
    }

    /// Runs `ops` on `algorithm`: `Err` when a key counts less than its calls hold.
    fn run(algorithm: Algorithm, ops: &[Op]) -> Result<(), TestCaseError> {
        let store = MemoryStore::with_clock(ManualClock::new());
        let base = Policy::new(algorithm, QUOTA, Duration::from_secs(3600)).expect("policy");
        // Per take: its key and what it still holds (None: not admitted).
        let mut calls: Vec<Option<(usize, u64)>> = Vec::new();
        for op in ops {
            match *op {
                Op::Take { key, cost } => {
                    let p = base.with_cost(cost).expect("cost");
                    let id = format!("{:x}", calls.len() + 1);
                    let v = store
                        .take_now(&[Check::new(KEYS[key], &p)], &id)
                        .expect("take");
                    calls.push(v.is_admitted().then_some((key, cost)));
                }
                Op::Settle {
                    call,
                    key,
                    cost,
                    used,
                } => {
                    let p = base.with_cost(cost).expect("cost");
                    let id = format!("{:x}", call + 1);
                    let _ = store.settle_now(&[Check::new(KEYS[key], &p)], &id, &[used]);
                    // What the call holds after it: at least what it used of what it took.
                    if let Some(Some((k, held))) = calls.get_mut(call)
                        && *k == key
                    {
                        *held = (*held).min(used);
                    }
                    // A settle against another key may charge that key: it never lowers it.
                }
                Op::Refund { call, key, cost } => {
                    let p = base.with_cost(cost).expect("cost");
                    let id = format!("{:x}", call + 1);
                    store.refund_now(&[Check::new(KEYS[key], &p)], &id);
                    if let Some(Some((k, held))) = calls.get_mut(call)
                        && *k == key
                    {
                        *held = 0;
                    }
                }
            }
            for (i, key) in KEYS.iter().enumerate() {
                let unit = base.with_cost(1).expect("unit");
                let counted =
                    QUOTA - store.peek_now(&[Check::new(key, &unit)]).decisions()[0].remaining;
                let held: u64 = calls
                    .iter()
                    .flatten()
                    .filter(|(k, _)| *k == i)
                    .map(|(_, h)| h)
                    .sum();
                prop_assert!(
                    counted >= held.min(QUOTA),
                    "{algorithm}: {key} counts {counted}, its calls hold {held}, after {op:?}"
                );
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn no_settle_or_refund_gives_back_more_than_was_taken(
            ops in proptest::collection::vec(op(), 1..40)
        ) {
            for algorithm in [Algorithm::Fixed, Algorithm::Token, Algorithm::Leaky, Algorithm::Gcra, Algorithm::SlidingCounter] {
                run(algorithm, &ops)?;
            }
        }
    }
}
