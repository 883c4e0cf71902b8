//! Limits that follow the caller, on plain async functions and methods, on the memory store
//! (a manual clock) and on a private Redis: a quota from an argument (per-plan quotas, an
//! upgrade mid-window, an unlimited plan, a missing quota), `const` quotas, a quota overridden
//! through the limiter at run time, a cost from an argument, and counting only failures (50
//! concurrent mixed calls admit exactly the quota of counted failures).
#![allow(
    clippy::duration_suboptimal_units,
    reason = "Duration::from_mins is newer than the workspace's rust-version"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ratelimit_runtime::{Quota, RateLimitError, RateLimiter, rate_limit};
use ratelimit_tests::env::Env;

// ---------------------------------------------------------------- per-plan quotas

/// The caller's plan, as an auth layer would resolve it.
#[derive(Debug, Clone, Copy)]
enum Plan {
    Free,
    Pro,
    Enterprise,
}

impl Plan {
    fn quota(self) -> Quota {
        match self {
            Self::Free => Quota::per_minute(3).unwrap(),
            Self::Pro => Quota::per_minute(10).unwrap(),
            Self::Enterprise => Quota::unlimited(),
        }
    }
}

#[rate_limit(quota = "{plan}", key = "{user}")]
async fn search(user: &str, plan: &Quota) -> Result<(), RateLimitError> {
    let _ = (user, plan);
    Ok(())
}

#[rate_limit(algo = "sliding", quota = "{quota}", key = "{user}")]
async fn export(user: &str, quota: Option<Quota>) -> Result<(), RateLimitError> {
    let _ = (user, quota);
    Ok(())
}

async fn admitted(n: usize, user: &str, plan: Plan) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        match search(user, &plan.quota()).await {
            Ok(()) => ok += 1,
            Err(e) => assert!(e.is_limited(), "{e}"),
        }
    }
    ok
}

async fn plans_scenario(limiter: RateLimiter) {
    assert_eq!(admitted(5, "alice", Plan::Free).await, 3);
    assert_eq!(
        admitted(12, "bob", Plan::Pro).await,
        10,
        "bob's plan, bob's quota"
    );
    assert_eq!(
        admitted(5, "carol", Plan::Free).await,
        3,
        "alice's calls never spent carol's quota"
    );
    // An upgrade takes effect on the next call: a fresh window under the new quota (the
    // quota's numbers are part of the key), never more than it.
    assert_eq!(admitted(12, "alice", Plan::Pro).await, 10);
    // Going back finds the old window where it was: switching plans never resets a window.
    assert_eq!(admitted(2, "alice", Plan::Free).await, 0);
    // Unlimited: every call, and no store call at all.
    let before = limiter.store_failing();
    assert_eq!(admitted(1000, "dave", Plan::Enterprise).await, 1000);
    assert_eq!(before, limiter.store_failing());
    // A missing quota is a typed error, not a panic, and takes nothing.
    let err = export("erin", None).await.unwrap_err();
    assert!(matches!(err, RateLimitError::MissingQuota), "{err}");
    assert!(err.to_string().contains("no quota"), "{err}");
    let two = Quota::per_minute(2).unwrap();
    assert!(export("erin", Some(two)).await.is_ok());
    assert!(export("erin", Some(two)).await.is_ok());
    assert!(export("erin", Some(two)).await.unwrap_err().is_limited());
    // A quota the algorithm cannot keep (a sliding log of more than 10,000) is a typed error.
    let huge = Quota::per_minute(20_000).unwrap();
    let err = export("frank", Some(huge)).await.unwrap_err();
    assert!(matches!(err, RateLimitError::InvalidQuota(_)), "{err}");
}

#[tokio::test]
async fn per_plan_quotas_from_an_argument_memory() {
    let (limiter, _env) = Env::memory().await;
    limiter.clone().scope(plans_scenario(limiter)).await;
}

#[tokio::test]
async fn per_plan_quotas_from_an_argument_redis() {
    let (limiter, _env) = Env::redis().await;
    limiter.clone().scope(plans_scenario(limiter)).await;
}

// ---------------------------------------------------------------- const quotas, overrides

const LOGIN_ATTEMPTS: u64 = 3;
const LOGIN_WINDOW: Duration = Duration::from_secs(60);

#[rate_limit(num = LOGIN_ATTEMPTS, time = LOGIN_WINDOW, scope = "dyn_plain::const_login")]
async fn const_login() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(algo = "token", num = 2, time = 60, scope = "dyn_plain::overridden")]
async fn overridden() -> Result<(), RateLimitError> {
    Ok(())
}

async fn count_admitted<F, Fut>(n: usize, f: F) -> usize
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(), RateLimitError>>,
{
    let mut ok = 0;
    for _ in 0..n {
        if f().await.is_ok() {
            ok += 1;
        }
    }
    ok
}

async fn const_and_override_scenario(limiter: RateLimiter, env: &Env) {
    assert_eq!(
        count_admitted(5, const_login).await,
        3,
        "num = LOGIN_ATTEMPTS"
    );
    let wait = const_login().await.unwrap_err().retry_after().unwrap();
    assert!(
        wait > Duration::from_secs(50) && wait <= LOGIN_WINDOW + Duration::from_millis(1),
        "{wait:?}"
    );

    assert_eq!(
        count_admitted(4, overridden).await,
        2,
        "the attribute's quota"
    );
    // From configuration, at run time: the next call follows the new quota.
    limiter
        .set_quota("dyn_plain::overridden", Quota::per_minute(5).unwrap())
        .unwrap();
    assert_eq!(count_admitted(8, overridden).await, 5, "the override");
    limiter
        .set_quota("dyn_plain::overridden", Quota::unlimited())
        .unwrap();
    assert_eq!(count_admitted(50, overridden).await, 50, "switched off");
    limiter.clear_quota("dyn_plain::overridden");
    assert_eq!(
        count_admitted(2, overridden).await,
        0,
        "the old bucket, as it was"
    );
    // An override the algorithm cannot keep is a typed error, not a panic.
    limiter
        .set_quota(
            "dyn_plain::overridden",
            Quota::new(1, Duration::from_secs(1))
                .unwrap()
                .with_burst(1 << 49)
                .unwrap(),
        )
        .unwrap();
    let err = overridden().await.unwrap_err();
    assert!(matches!(err, RateLimitError::InvalidQuota(_)), "{err}");
    limiter.clear_quota("dyn_plain::overridden");
    assert!(
        limiter.set_quota("bad{scope}", Quota::unlimited()).is_err(),
        "an invalid scope is a typed error"
    );
    let _ = env;
}

#[tokio::test]
async fn const_quotas_and_run_time_overrides_memory() {
    let (limiter, env) = Env::memory().await;
    limiter
        .clone()
        .scope(const_and_override_scenario(limiter, &env))
        .await;
}

#[tokio::test]
async fn const_quotas_and_run_time_overrides_redis() {
    let (limiter, env) = Env::redis().await;
    limiter
        .clone()
        .scope(const_and_override_scenario(limiter, &env))
        .await;
}

#[tokio::test]
async fn an_override_set_at_build_applies_from_the_first_call() {
    let limiter = RateLimiter::builder()
        .override_quota("dyn_plain::overridden", Quota::per_minute(4).unwrap())
        .build()
        .await
        .unwrap();
    let n = limiter.scope(count_admitted(10, overridden)).await;
    assert_eq!(n, 4);
}

// ---------------------------------------------------------------- cost from an argument

struct Batcher;

impl Batcher {
    #[rate_limit(algo = "token", num = 10, time = 60, cost = items.len())]
    async fn send(&self, items: &[u32]) -> Result<usize, RateLimitError> {
        Ok(items.len())
    }
}

async fn cost_scenario() {
    let b = Batcher;
    assert_eq!(b.send(&[1, 2, 3, 4]).await.unwrap(), 4);
    assert_eq!(b.send(&[1, 2, 3, 4]).await.unwrap(), 4);
    // Two units left: a batch of four waits, a batch of two fits.
    let err = b.send(&[1, 2, 3, 4]).await.unwrap_err();
    assert!(err.is_limited(), "{err}");
    assert_eq!(b.send(&[1, 2]).await.unwrap(), 2);
    // A batch that can never fit is refused at once with a clear error, not retried.
    let big: Vec<u32> = (0..11).collect();
    let err = b.send(&big).await.unwrap_err();
    assert!(
        matches!(
            err,
            RateLimitError::CostExceedsCapacity {
                cost: 11,
                capacity: 10
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("can never be admitted"), "{err}");
    assert!(err.retry_after().is_none());
    // An empty batch still takes a unit: no call is free.
    assert!(b.send(&[]).await.unwrap_err().is_limited());
}

#[tokio::test]
async fn cost_from_an_argument_memory() {
    let (limiter, _env) = Env::memory().await;
    limiter.scope(cost_scenario()).await;
}

#[tokio::test]
async fn cost_from_an_argument_redis() {
    let (limiter, _env) = Env::redis().await;
    limiter.scope(cost_scenario()).await;
}

// ---------------------------------------------------------------- counting only failures

#[derive(Debug)]
enum LoginError {
    WrongPassword,
    Limited(RateLimitError),
}

impl From<RateLimitError> for LoginError {
    fn from(e: RateLimitError) -> Self {
        Self::Limited(e)
    }
}

/// Five failed attempts per 15 minutes per user; successful logins do not count.
#[rate_limit(num = 5, time = "15m", key = "{user}", count = "err")]
async fn login(user: &str, password: &str) -> Result<(), LoginError> {
    let _ = user;
    // Admitted calls stay in flight a moment, holding their units, while others arrive.
    tokio::time::sleep(Duration::from_millis(2)).await;
    if password == "right" {
        Ok(())
    } else {
        Err(LoginError::WrongPassword)
    }
}

#[rate_limit(algo = "sliding", num = 3, time = "15m", key = "{user}", count = "err")]
async fn sliding_login(user: &str, ok: bool) -> Result<(), LoginError> {
    let _ = user;
    if ok {
        Ok(())
    } else {
        Err(LoginError::WrongPassword)
    }
}

async fn failures_scenario(env: Option<&Env>) {
    // The sliding log's scores start at the store's time: not at the manual clock's origin.
    if let Some(env) = env {
        env.wait(Duration::from_millis(1)).await;
    }
    // Successes never count.
    for _ in 0..20 {
        login("ann", "right").await.unwrap();
    }
    // 50 concurrent calls, every other one a failure.
    let failed = Arc::new(AtomicUsize::new(0));
    let succeeded = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..50 {
        let (failed, succeeded, refused) = (failed.clone(), succeeded.clone(), refused.clone());
        let limiter = RateLimiter::current();
        tasks.push(tokio::spawn(limiter.scope(async move {
            let password = if i % 2 == 0 { "wrong" } else { "right" };
            match login("bob", password).await {
                Ok(()) => succeeded.fetch_add(1, Ordering::SeqCst),
                Err(LoginError::WrongPassword) => failed.fetch_add(1, Ordering::SeqCst),
                Err(LoginError::Limited(e)) => {
                    assert!(e.is_limited(), "{e:?}");
                    refused.fetch_add(1, Ordering::SeqCst)
                }
            }
        })));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let concurrent_failures = failed.load(Ordering::SeqCst);
    assert!(
        concurrent_failures <= 5,
        "{concurrent_failures} failures admitted"
    );
    assert_eq!(
        concurrent_failures + succeeded.load(Ordering::SeqCst) + refused.load(Ordering::SeqCst),
        50
    );
    // Every success gave its unit back: the failures still allowed are exactly the quota
    // minus the failures counted.
    let mut later_failures = 0;
    loop {
        match login("bob", "wrong").await {
            Err(LoginError::WrongPassword) => later_failures += 1,
            Err(LoginError::Limited(e)) => {
                assert!(e.is_limited());
                break;
            }
            Ok(()) => unreachable!(),
        }
        assert!(later_failures <= 5, "more failures than the quota");
    }
    assert_eq!(concurrent_failures + later_failures, 5);
    // Spent: a right password is not even tried (the call is taken before the body).
    assert!(matches!(
        login("bob", "right").await,
        Err(LoginError::Limited(_))
    ));
    // Another user is untouched.
    assert!(matches!(
        login("cid", "wrong").await,
        Err(LoginError::WrongPassword)
    ));

    // The sliding log gives back exactly the call's own entry.
    for _ in 0..10 {
        sliding_login("dan", true).await.unwrap();
    }
    for _ in 0..3 {
        assert!(matches!(
            sliding_login("dan", false).await,
            Err(LoginError::WrongPassword)
        ));
    }
    assert!(matches!(
        sliding_login("dan", true).await,
        Err(LoginError::Limited(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_failures_count_memory() {
    let (limiter, env) = Env::memory().await;
    limiter.scope(failures_scenario(Some(&env))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_failures_count_redis() {
    let (limiter, env) = Env::redis().await;
    limiter.scope(failures_scenario(Some(&env))).await;
}

/// Redis Cluster: the limits of one scope share a slot, so the take leaves receipts and the
/// refund finds them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_failures_count_redis_cluster() {
    let cluster = ratelimit_tests::redis_cluster::RedisCluster::start().await;
    let limiter = RateLimiter::builder()
        .redis_cluster(cluster.urls())
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    limiter.clone().scope(failures_scenario(None)).await;
    limiter.scope(plans_scenario_cluster()).await;
}

async fn plans_scenario_cluster() {
    assert_eq!(admitted(5, "zoe", Plan::Free).await, 3);
    assert_eq!(admitted(12, "zoe", Plan::Pro).await, 10);
}

/// `count = "ok"`: only successes count (an expensive export that may fail cheaply).
#[rate_limit(num = 2, time = 60, count = "ok")]
async fn export_ok(ok: bool) -> Result<(), LoginError> {
    if ok {
        Ok(())
    } else {
        Err(LoginError::WrongPassword)
    }
}

#[tokio::test]
async fn only_successes_count_memory() {
    let (limiter, _env) = Env::memory().await;
    limiter
        .scope(async {
            for _ in 0..10 {
                assert!(matches!(
                    export_ok(false).await,
                    Err(LoginError::WrongPassword)
                ));
            }
            assert!(export_ok(true).await.is_ok());
            assert!(export_ok(true).await.is_ok());
            assert!(matches!(export_ok(true).await, Err(LoginError::Limited(_))));
        })
        .await;
}

// ---------------------------------------------------------------- failing closed

/// A store of one's own that counts its checks and implements neither `take` nor `refund`.
#[derive(Debug, Default)]
struct CountingStore {
    memory: ratelimit_runtime::MemoryStore,
    checks: AtomicUsize,
}

impl ratelimit_runtime::Store for CountingStore {
    fn check<'a>(
        &'a self,
        checks: &'a [ratelimit_runtime::store::Check<'a>],
    ) -> ratelimit_runtime::store::StoreFuture<'a> {
        self.checks.fetch_add(1, Ordering::SeqCst);
        self.memory.check(checks)
    }

    fn name(&self) -> &'static str {
        "counting"
    }
}

#[tokio::test]
async fn an_unlimited_quota_never_asks_the_store_and_a_store_without_refunds_keeps_calls_counted() {
    let store = Arc::new(CountingStore::default());
    let limiter = RateLimiter::builder()
        .store(store.clone())
        .build()
        .await
        .unwrap();
    limiter
        .scope(async {
            for _ in 0..100 {
                search("ulla", &Quota::unlimited()).await.unwrap();
            }
            assert_eq!(store.checks.load(Ordering::SeqCst), 0, "no store call");
            search("ulla", &Plan::Free.quota()).await.unwrap();
            assert_eq!(store.checks.load(Ordering::SeqCst), 1);
            // Without `take`/`refund`, a success is not given back: fails closed.
            assert!(export_ok(false).await.is_err());
            assert!(matches!(
                export_ok(false).await,
                Err(LoginError::WrongPassword)
            ));
            assert!(matches!(
                export_ok(false).await,
                Err(LoginError::Limited(_))
            ));
        })
        .await;
}

/// A body that runs longer than its receipt lives (10 s at most): the call stays counted.
#[rate_limit(num = 1, time = "15m", count = "err")]
async fn slow_success(clock: &ratelimit_runtime::store::ManualClock) -> Result<(), LoginError> {
    clock.advance(Duration::from_secs(11));
    Ok(())
}

#[tokio::test]
async fn a_body_longer_than_its_receipt_stays_counted() {
    let (limiter, env) = Env::memory().await;
    let Env::Memory(clock) = &env else {
        unreachable!()
    };
    limiter
        .scope(async {
            assert!(slow_success(clock).await.is_ok());
            assert!(matches!(
                slow_success(clock).await,
                Err(LoginError::Limited(_))
            ));
        })
        .await;
}

// ---------------------------------------------------------------- hostile callers

/// Five failed logins a minute per user; successful ones do not count.
#[rate_limit(
    num = 5,
    time = 60,
    key = "{user}",
    count = "err",
    scope = "dyn_plain::guarded_login"
)]
async fn guarded_login(user: &str, ok: bool) -> Result<(), LoginError> {
    let _ = user;
    if ok {
        Ok(())
    } else {
        Err(LoginError::WrongPassword)
    }
}

/// The same limit on a login whose body never ends (a client that hangs up mid-call).
#[rate_limit(
    num = 5,
    time = 60,
    key = "{user}",
    count = "err",
    scope = "dyn_plain::guarded_login"
)]
async fn hanging_login(user: &str) -> Result<(), LoginError> {
    let _ = user;
    std::future::pending::<()>().await;
    Ok(())
}

/// A memory store the test can read the receipts of, under a limiter on its frozen clock.
async fn memory_with_receipts() -> (RateLimiter, Arc<ratelimit_runtime::MemoryStore>) {
    let clock = ratelimit_runtime::store::ManualClock::new();
    let store = Arc::new(ratelimit_runtime::MemoryStore::with_clock(clock));
    let limiter = RateLimiter::builder()
        .store(store.clone())
        .build()
        .await
        .unwrap();
    (limiter, store)
}

/// 20 correct logins of a victim: how many were admitted.
async fn victim_logins() -> usize {
    let mut admitted = 0;
    for _ in 0..20 {
        match guarded_login("victim", true).await {
            Ok(()) => admitted += 1,
            Err(LoginError::Limited(e)) => assert!(e.is_limited(), "{e}"),
            Err(LoginError::WrongPassword) => unreachable!(),
        }
    }
    admitted
}

/// The attack: 70,000 failed logins under fresh user names (all counted) filled the
/// memory store's receipt table (65,536), after which a victim's correct logins got no
/// receipt and counted: 5 of 20 admitted on the code before. A settled call drops its
/// receipts whatever its outcome, so the table holds only calls in flight.
#[tokio::test(flavor = "current_thread")]
async fn a_flood_of_counted_failures_never_turns_a_victims_refunds_into_counts() {
    let (limiter, store) = memory_with_receipts().await;
    limiter
        .scope(async {
            for i in 0..70_000 {
                let user = format!("attacker-{i}");
                assert!(matches!(
                    guarded_login(&user, false).await,
                    Err(LoginError::WrongPassword)
                ));
            }
            assert_eq!(store.receipts_held(), 0, "counted calls keep no receipt");
            assert_eq!(
                victim_logins().await,
                20,
                "the victim's correct logins never count"
            );
        })
        .await;
}

/// The same with calls that never finish: 70,000 logins taken, then dropped mid-body (their
/// clients hung up). A dropped call counts and its receipts go; the victim is unaffected.
#[tokio::test(flavor = "current_thread")]
async fn a_flood_of_cancelled_calls_leaves_no_receipts() {
    let (limiter, store) = memory_with_receipts().await;
    limiter
        .scope(async {
            for i in 0..70_000 {
                let user = format!("hangs-up-{i}");
                let mut call = Box::pin(hanging_login(&user));
                // Poll once: the take happens, then the body waits for ever; then drop it.
                tokio::select! {
                    biased;
                    _ = &mut call => unreachable!("the body never ends"),
                    () = std::future::ready(()) => {}
                }
            }
            // The dropped calls' receipts are forgotten by tasks of their own.
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while store.receipts_held() > 0 && std::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            assert_eq!(store.receipts_held(), 0, "a dropped call keeps no receipt");
            assert_eq!(victim_logins().await, 20);
            // The dropped calls counted: a caller who hung up five times is limited.
            for _ in 0..5 {
                let mut call = Box::pin(hanging_login("impatient"));
                tokio::select! {
                    biased;
                    _ = &mut call => unreachable!(),
                    () = std::future::ready(()) => {}
                }
            }
            assert!(matches!(
                guarded_login("impatient", true).await,
                Err(LoginError::Limited(_))
            ));
        })
        .await;
}

/// On Redis, receipts are keys: a counted call deletes them (before, each stayed until its
/// TTL, adding to a client-made flood of keys).
#[tokio::test]
async fn counted_calls_leave_no_receipt_keys_in_redis() {
    let (limiter, env) = Env::redis().await;
    let Env::Redis(server) = &env else {
        unreachable!()
    };
    limiter
        .clone()
        .scope(async {
            for i in 0..20 {
                let user = format!("r-{i}");
                assert!(guarded_login(&user, false).await.is_err());
                assert!(guarded_login(&user, true).await.is_ok());
            }
        })
        .await;
    let mut conn = server.connection().await;
    let receipts: Vec<String> = redis::cmd("KEYS")
        .arg("*:r:*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        receipts.is_empty(),
        "{} receipts left: {receipts:?}",
        receipts.len()
    );
    // The failures counted, the successes did not: 4 more failures each, then limited.
    limiter
        .scope(async {
            for _ in 0..4 {
                assert!(matches!(
                    guarded_login("r-0", false).await,
                    Err(LoginError::WrongPassword)
                ));
            }
            assert!(matches!(
                guarded_login("r-0", false).await,
                Err(LoginError::Limited(_))
            ));
        })
        .await;
}

/// Two stacked limits of one scope, which an override makes the same policy: they share a
/// key, and each call used to count twice (5 admitted of 10). Merged, the override holds.
#[rate_limit(num = 10, time = 60, scope = "dyn_plain::stacked_override")]
#[rate_limit(num = 100, time = 3600, scope = "dyn_plain::stacked_override")]
async fn stacked_override() -> Result<(), RateLimitError> {
    Ok(())
}

/// Two stacked limits whose quotas come from arguments, given the same quota.
#[rate_limit(quota = "{a}", key = "q")]
#[rate_limit(quota = "{b}", key = "q")]
async fn two_quotas(a: Quota, b: Quota) -> Result<(), RateLimitError> {
    let _ = (a, b);
    Ok(())
}

async fn run_time_quotas_scenario(limiter: RateLimiter) {
    limiter
        .set_quota(
            "dyn_plain::stacked_override",
            Quota::per_minute(10).unwrap(),
        )
        .unwrap();
    limiter
        .clone()
        .scope(async {
            assert_eq!(count_admitted(15, stacked_override).await, 10);
            let q = Quota::per_minute(6).unwrap();
            assert_eq!(count_admitted(10, || two_quotas(q, q)).await, 6);
        })
        .await;
}

#[tokio::test]
async fn a_run_time_quota_equal_to_a_stacked_limit_counts_once_memory() {
    let (limiter, _env) = Env::memory().await;
    run_time_quotas_scenario(limiter).await;
}

#[tokio::test]
async fn a_run_time_quota_equal_to_a_stacked_limit_counts_once_redis() {
    let (limiter, _env) = Env::redis().await;
    run_time_quotas_scenario(limiter).await;
}

/// A cost from a client's number, multiplied: `n * 1000` with a huge `n` used to wrap in
/// release builds (a tiny cost) and panic in debug ones. The arithmetic is checked.
#[rate_limit(num = 10_000, time = 60, key = "{user}", cost = n * 1000 - discount)]
async fn priced(user: &str, n: u64, discount: u64) -> Result<(), RateLimitError> {
    let _ = (user, n, discount);
    Ok(())
}

#[tokio::test]
async fn a_cost_expression_never_wraps_or_panics() {
    let (limiter, _env) = Env::memory().await;
    limiter
        .scope(async {
            // 2^60 * 1000 wraps a u64 to a small number; it is refused as too large.
            let huge = priced("a", 1 << 60, 0).await.unwrap_err();
            assert!(
                matches!(
                    huge,
                    RateLimitError::CostExceedsCapacity {
                        cost: u64::MAX,
                        capacity: 10_000
                    }
                ),
                "{huge}"
            );
            let err = priced("a", 0, 5).await.unwrap_err();
            assert!(
                matches!(err, RateLimitError::NegativeCost { cost: -5 }),
                "{err}"
            );
            assert!(err.to_string().contains("negative (-5)"), "{err}");
            // Nothing was taken by the refused calls: the whole quota is there.
            assert!(priced("a", 10, 0).await.is_ok());
            assert!(
                priced("a", 1, 1000).await.is_err(),
                "cost 0 counts as 1, and 10,000 are spent"
            );
        })
        .await;
}
