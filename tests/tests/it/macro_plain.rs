//! `#[rate_limit]` on plain async functions and methods, end to end: the attribute expands,
//! the runtime checks the store, and a rejected call returns the error without running the
//! body. Every scenario runs on the memory store (a manual clock, exact numbers) and on a
//! private `redis-server` started by the test (real time: waits are the `retry_after` the
//! store answered, so nothing depends on the machine's speed).
#![allow(
    clippy::duration_suboptimal_units,
    reason = "Duration::from_mins is newer than the workspace's rust-version"
)]

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use ratelimit_runtime::{
    Algorithm, FailurePolicy, Policy, RateLimitError, RateLimiter, key, rate_limit, store::Check,
};
use ratelimit_tests::env::Env;
use ratelimit_tests::redis_server::free_port;
use ratelimit_tests::suite::{Try, until_in_time};

const MS: Duration = Duration::from_millis(1);

/// The fields of a `Limited` error; panics on anything else.
fn limited(result: Result<impl std::fmt::Debug, RateLimitError>) -> (Duration, u64, u64) {
    match result {
        Err(RateLimitError::Limited {
            retry_after,
            limit,
            remaining,
            ..
        }) => (retry_after, limit, remaining),
        other => panic!("expected a Limited error, got {other:?}"),
    }
}

/// `expected` on the memory store (within 1 ms of boundary convention); on Redis, where time
/// runs while the test does, anything in `(0, expected]` (give or take the waits' margins).
fn assert_wait(env: &Env, got: Duration, expected: Duration) {
    if env.exact() {
        assert!(
            got >= expected.saturating_sub(MS) && got <= expected + MS,
            "retry_after {got:?}, expected {expected:?}"
        );
    } else {
        // Plus the 2 ms margins `Env::wait` adds, which can shift later calls.
        assert!(
            got > Duration::ZERO && got <= expected + 5 * MS,
            "retry_after {got:?}, expected at most {expected:?}"
        );
    }
}

// ---------------------------------------------------------------- the card's line

#[rate_limit(algo = "sliding", num = 3, time = 10)]
async fn card_line(user: &str) -> Result<&str, RateLimitError> {
    Ok(user)
}

async fn card_line_scenario(env: &Env) {
    for _ in 0..3 {
        assert_eq!(card_line("ann").await.unwrap(), "ann");
    }
    let (retry, limit, remaining) = limited(card_line("ann").await);
    assert_eq!((limit, remaining), (3, 0));
    assert_wait(env, retry, Duration::from_secs(10));
    if let Env::Memory(clock) = env {
        // Sliding: 4 s later the same three calls still count…
        clock.advance(Duration::from_secs(4));
        let (retry, ..) = limited(card_line("ann").await);
        assert_wait(env, retry, Duration::from_secs(6));
        // …and once they are 10 s old, three more fit.
        clock.advance(Duration::from_secs(6) + MS);
        for _ in 0..3 {
            card_line("ann").await.unwrap();
        }
        limited(card_line("ann").await);
    }
}

#[tokio::test]
async fn card_line_sliding_3_per_10s_on_a_plain_fn_memory() {
    let (limiter, env) = Env::memory().await;
    limiter.scope(card_line_scenario(&env)).await;
}

#[tokio::test]
async fn card_line_sliding_3_per_10s_on_a_plain_fn_redis() {
    let (limiter, env) = Env::redis().await;
    limiter.scope(card_line_scenario(&env)).await;
}

// ---------------------------------------------------------------- each algorithm

#[rate_limit(algo = "sliding", num = 3, time = 1, key = "{user}")]
async fn sliding(user: &str) -> Result<(), RateLimitError> {
    let _ = user;
    Ok(())
}

#[rate_limit(algo = "fixed", num = 2, time = 1, key = "{user}")]
async fn fixed(user: &str) -> Result<(), RateLimitError> {
    let _ = user;
    Ok(())
}

#[rate_limit(algo = "leaky", num = 2, time = 1, burst = 3, key = "{user}")]
async fn leaky(user: &str) -> Result<(), RateLimitError> {
    let _ = user;
    Ok(())
}

#[rate_limit(algo = "token", num = 2, time = 1, burst = 4, cost = 2, key = "{user}")]
async fn token(user: &str) -> Result<(), RateLimitError> {
    let _ = user;
    Ok(())
}

/// Whether the calls since `since` may have outlasted `within`, which the scenario's exact
/// answers need them not to: on Redis (real time) a stalled machine can make them; then the try
/// says nothing and [`until_in_time`] runs it again for a fresh caller. Never on the memory
/// store's manual clock.
fn too_slow(env: &Env, since: Instant, within: Duration) -> bool {
    !env.exact() && since.elapsed() + MS >= within
}

/// One call admitted and the next limited, both within `within` (else too slow to tell).
async fn one_more_then_limited<F, Fut>(env: &Env, within: Duration, call: F) -> Try
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<(), RateLimitError>>,
{
    let start = Instant::now();
    call().await.unwrap();
    let next = call().await;
    if too_slow(env, start, within) {
        return Try::TooSlow;
    }
    limited(next);
    Try::Checked
}

/// sliding: no boundary burst: 1 call, then 2 calls 0.6 s later; at 1 s only the first has
/// left the trailing second, so exactly one more fits.
async fn sliding_try(env: &Env, attempt: u32) -> Try {
    let user = format!("s{attempt}");
    let start = Instant::now();
    sliding(&user).await.unwrap();
    env.wait(Duration::from_millis(600)).await;
    let before_second = Instant::now();
    sliding(&user).await.unwrap();
    // On Redis the store stamped the second call before this instant.
    let second_admitted = Instant::now();
    sliding(&user).await.unwrap();
    let fourth = sliding(&user).await;
    // The first call must still be in the trailing second.
    if too_slow(env, start, Duration::from_secs(1)) {
        return Try::TooSlow;
    }
    let (retry, limit, remaining) = limited(fourth);
    assert_eq!((limit, remaining), (3, 0));
    assert_wait(env, retry, Duration::from_millis(400));
    env.wait(retry).await;
    sliding(&user).await.unwrap();
    let asked = Instant::now();
    let sixth = sliding(&user).await;
    // The second call must still be in the trailing second.
    if too_slow(env, before_second, Duration::from_secs(1)) {
        return Try::TooSlow;
    }
    let (retry, ..) = limited(sixth);
    // The next to leave is the second call, made 0.6 s in. On Redis "0.6 s" is however long
    // the first wait really slept (a loaded machine oversleeps it), so the bound is the
    // second call's stamp plus the interval, counted from when this call was sent.
    let expected = if env.exact() {
        Duration::from_millis(600)
    } else {
        (second_admitted + Duration::from_secs(1)).saturating_duration_since(asked)
    };
    assert_wait(env, retry, expected);
    Try::Checked
}

/// Two calls admitted and a third limited, in one fixed window of 1 s: the third's wait, or
/// `None` when the calls were too slow to tell.
async fn fixed_window_of_two(env: &Env, user: &str) -> Option<Duration> {
    let start = Instant::now();
    let calls = [fixed(user).await, fixed(user).await, fixed(user).await];
    if too_slow(env, start, Duration::from_secs(1)) {
        return None;
    }
    let [first, second, third] = calls;
    first.unwrap();
    second.unwrap();
    let (retry, limit, remaining) = limited(third);
    assert_eq!((limit, remaining), (2, 0));
    assert_wait(env, retry, Duration::from_secs(1));
    Some(retry)
}

/// fixed: the window starts at the first admitted call, not at a clock boundary.
async fn fixed_try(env: &Env, attempt: u32) -> Try {
    let user = format!("f{attempt}");
    env.wait(Duration::from_millis(300)).await;
    let Some(retry) = fixed_window_of_two(env, &user).await else {
        return Try::TooSlow;
    };
    env.wait(retry).await;
    match fixed_window_of_two(env, &user).await {
        Some(_) => Try::Checked,
        None => Try::TooSlow,
    }
}

/// leaky: capacity 3, draining 2 per second: a full bucket takes one more call 0.5 s later.
async fn leaky_try(env: &Env, attempt: u32) -> Try {
    let user = format!("l{attempt}");
    let start = Instant::now();
    for _ in 0..3 {
        leaky(&user).await.unwrap();
    }
    let fourth = leaky(&user).await;
    if too_slow(env, start, Duration::from_millis(500)) {
        return Try::TooSlow;
    }
    let (retry, limit, _) = limited(fourth);
    assert_eq!(limit, 3);
    assert_wait(env, retry, Duration::from_millis(500));
    env.wait(retry).await;
    one_more_then_limited(env, Duration::from_millis(500), || leaky(&user)).await
}

/// token: capacity 4, 2 tokens per second, 2 tokens a call: two calls, then one a second.
async fn token_try(env: &Env, attempt: u32) -> Try {
    let user = format!("t{attempt}");
    let start = Instant::now();
    token(&user).await.unwrap();
    token(&user).await.unwrap();
    let third = token(&user).await;
    if too_slow(env, start, Duration::from_secs(1)) {
        return Try::TooSlow;
    }
    let (retry, limit, _) = limited(third);
    assert_eq!(limit, 4);
    assert_wait(env, retry, Duration::from_secs(1));
    env.wait(retry).await;
    one_more_then_limited(env, Duration::from_secs(1), || token(&user)).await
}

async fn algorithms_scenario(env: &Env) {
    until_in_time("sliding", |attempt| sliding_try(env, attempt)).await;
    until_in_time("fixed", |attempt| fixed_try(env, attempt)).await;
    until_in_time("leaky", |attempt| leaky_try(env, attempt)).await;
    until_in_time("token", |attempt| token_try(env, attempt)).await;

    // Keys: another caller has its own quota in every algorithm.
    sliding("other").await.unwrap();
    fixed("other").await.unwrap();
    leaky("other").await.unwrap();
    token("other").await.unwrap();
}

#[tokio::test]
async fn each_algorithm_on_a_plain_fn_memory() {
    let (limiter, env) = Env::memory().await;
    limiter.scope(algorithms_scenario(&env)).await;
}

#[tokio::test]
async fn each_algorithm_on_a_plain_fn_redis() {
    let (limiter, env) = Env::redis().await;
    limiter.scope(algorithms_scenario(&env)).await;
}

// ---------------------------------------------------------------- exact under concurrency

#[rate_limit(algo = "fixed", num = 10, time = "1h")]
async fn c_fixed() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(algo = "sliding", num = 10, time = "1h")]
async fn c_sliding() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(algo = "leaky", num = 10, time = "1h")]
async fn c_leaky() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(algo = "token", num = 10, time = "1h")]
async fn c_token() -> Result<(), RateLimitError> {
    Ok(())
}

/// 64 tasks on several threads call each function once; exactly 10 get through each.
async fn concurrency_scenario(limiter: &RateLimiter) {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..64 {
        for which in 0..4u8 {
            let call = async move {
                let result = match which {
                    0 => c_fixed().await,
                    1 => c_sliding().await,
                    2 => c_leaky().await,
                    _ => c_token().await,
                };
                (which, result.map_err(|e| e.is_limited()))
            };
            tasks.spawn(limiter.clone().scope(call));
        }
    }
    let mut admitted = [0u32; 4];
    while let Some(joined) = tasks.join_next().await {
        let (which, result) = joined.expect("task");
        match result {
            Ok(()) => admitted[usize::from(which)] += 1,
            Err(is_limited) => assert!(is_limited, "a store failure"),
        }
    }
    assert_eq!(admitted, [10; 4], "fixed, sliding, leaky, token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_num_admissions_under_concurrency_memory() {
    let (limiter, _env) = Env::memory().await;
    concurrency_scenario(&limiter).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_num_admissions_under_concurrency_redis() {
    let (limiter, _env) = Env::redis().await;
    concurrency_scenario(&limiter).await;
}

// ---------------------------------------------------------------- a method with a key template

#[derive(Debug)]
enum MyError {
    TooMany(Duration),
    Unavailable,
}

impl From<RateLimitError> for MyError {
    fn from(e: RateLimitError) -> Self {
        match e.retry_after() {
            Some(wait) => Self::TooMany(wait),
            None => Self::Unavailable,
        }
    }
}

#[derive(Default)]
struct SmsSender {
    sent: AtomicU32,
}

impl SmsSender {
    #[rate_limit(num = 2, time = "1m", key = "sms:{phone}")]
    async fn send(&self, phone: &str) -> Result<(), MyError> {
        let _ = phone;
        self.sent.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

async fn method_scenario() {
    let sms = SmsSender::default();
    sms.send("+15550100").await.unwrap();
    sms.send("+15550100").await.unwrap();
    for _ in 0..5 {
        match sms.send("+15550100").await {
            // Redis expires a key after its expiry millisecond, so a fixed window there lasts
            // up to 1 ms longer than its period, and retry_after says so (never early).
            Err(MyError::TooMany(wait)) => {
                assert!(wait <= Duration::from_millis(60_001), "{wait:?}");
            }
            other => panic!("expected TooMany, got {other:?}"),
        }
    }
    // Another phone has its own quota.
    sms.send("+15550199").await.unwrap();
    sms.send("+15550199").await.unwrap();
    assert!(matches!(
        sms.send("+15550199").await,
        Err(MyError::TooMany(_))
    ));
    // The body ran for the 4 admitted calls only.
    assert_eq!(sms.sent.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn method_key_template_gives_each_phone_its_quota_and_skips_the_body_memory() {
    let (limiter, _env) = Env::memory().await;
    limiter.scope(method_scenario()).await;
}

#[tokio::test]
async fn method_key_template_gives_each_phone_its_quota_and_skips_the_body_redis() {
    let (limiter, _env) = Env::redis().await;
    limiter.scope(method_scenario()).await;
}

// ---------------------------------------------------------------- stacked limits

#[rate_limit(algo = "token", num = 5, time = 1, scope = "stacked")]
#[rate_limit(algo = "fixed", num = 20, time = "1m", scope = "stacked")]
async fn stacked() -> Result<(), RateLimitError> {
    Ok(())
}

fn token_5_per_s() -> Policy {
    Policy::new(Algorithm::Token, 5, Duration::from_secs(1)).expect("policy")
}

fn fixed_20_per_min() -> Policy {
    Policy::new(Algorithm::Fixed, 20, Duration::from_secs(60)).expect("policy")
}

/// What each of `stacked`'s limits has left, read by a check that the other limit rejects
/// (a rejected check takes nothing, and reports what is left now).
async fn remaining(limiter: &RateLimiter) -> (u64, u64) {
    let (token, fixed) = (token_5_per_s(), fixed_20_per_min());
    let prefix = &limiter.settings().prefix;
    let token_key = key::build(prefix, "stacked", &[], &token);
    let fixed_key = key::build(prefix, "stacked", &[], &fixed);
    let verdict = limiter
        .check(&[
            Check::new(&token_key, &token),
            Check::new(&fixed_key, &fixed),
        ])
        .await
        .expect("memory store");
    assert!(
        !verdict.is_admitted(),
        "the probe must be rejected so that it takes nothing"
    );
    let d = verdict.decisions();
    (d[0].remaining, d[1].remaining)
}

#[tokio::test]
async fn stacked_token_and_fixed_all_or_nothing_memory() {
    let (limiter, env) = Env::memory().await;
    let Env::Memory(clock) = &env else {
        unreachable!()
    };
    limiter
        .clone()
        .scope(async {
            // Second 0: 5 admitted, 3 rejected by the token bucket (limit 5).
            for _ in 0..5 {
                stacked().await.unwrap();
            }
            for _ in 0..3 {
                assert_eq!(limited(stacked().await).1, 5);
            }
            // The token rejections took nothing from the fixed window: 15 left of 20.
            assert_eq!(remaining(&limiter).await, (0, 15));
            // Seconds 1..=3: 5 more each, with token rejections in between (the last second
            // ends with both limits spent).
            for second in 1..=3 {
                clock.advance(Duration::from_secs(1));
                for _ in 0..5 {
                    stacked().await.unwrap();
                }
                if second < 3 {
                    assert_eq!(limited(stacked().await).1, 5);
                }
            }
            // 20 admitted within the minute. A second later the bucket is full again, yet
            // the 21st call is rejected, by the fixed window (limit 20).
            clock.advance(Duration::from_secs(1));
            for _ in 0..10 {
                let (retry, limit, remaining) = limited(stacked().await);
                assert_eq!((limit, remaining), (20, 0));
                assert_wait(&env, retry, Duration::from_secs(56));
            }
            // Those rejections took nothing from the token bucket: still 5.
            assert_eq!(remaining(&limiter).await.0, 5);
            // A new window: admitted again.
            clock.advance(Duration::from_secs(56) + MS);
            stacked().await.unwrap();
        })
        .await;
}

#[tokio::test]
async fn stacked_token_and_fixed_all_or_nothing_redis() {
    let (limiter, env) = Env::redis().await;
    limiter
        .scope(async {
            // Bursts of 8 calls until the fixed window says no; the bucket rejects most of
            // each burst. If a call the bucket rejected took from the window, the window
            // would say no before 20 admissions.
            let (mut admitted, mut token_rejections) = (0u32, 0u32);
            let fixed_rejection = loop {
                match stacked().await {
                    Ok(()) => admitted += 1,
                    Err(e) => {
                        let (retry, limit, _) = limited(Err::<(), _>(e));
                        if limit == 20 {
                            break retry;
                        }
                        assert_eq!(limit, 5);
                        token_rejections += 1;
                        env.wait(retry).await;
                    }
                }
                assert!(admitted <= 20, "more than 20 admissions in a minute");
            };
            assert_eq!(admitted, 20);
            assert!(token_rejections > 0);
            assert!(fixed_rejection > Duration::from_secs(40));
            // A second later the bucket has tokens again; the window still rejects.
            env.wait(Duration::from_secs(1)).await;
            assert_eq!(limited(stacked().await).1, 20);
        })
        .await;
}

// ---------------------------------------------------------------- limited vs unavailable

#[rate_limit(num = 1, time = "1m")]
async fn once_a_minute() -> Result<u8, RateLimitError> {
    Ok(7)
}

#[tokio::test]
async fn error_tells_limited_from_store_unavailable() {
    let (limiter, _env) = Env::memory().await;
    limiter
        .scope(async {
            assert_eq!(once_a_minute().await.unwrap(), 7);
            let err = once_a_minute().await.unwrap_err();
            assert!(err.is_limited() && !err.is_store_unavailable());
            let (retry, limit, remaining) = limited(Err::<(), _>(err));
            // The window's key expires after 60 s; it is gone the millisecond after.
            assert_eq!(
                (retry, limit, remaining),
                (Duration::from_millis(60_001), 1, 0)
            );
        })
        .await;

    // Nothing listens on this port: with the deny policy the call fails as unavailable…
    let dead = format!("redis://127.0.0.1:{}", free_port().expect("port"));
    let deny = RateLimiter::builder()
        .redis_url(&dead)
        .failure_policy(FailurePolicy::Deny)
        .timeout(Duration::from_millis(200))
        .build_lazy()
        .expect("a well-formed URL");
    let err = deny.clone().scope(once_a_minute()).await.unwrap_err();
    assert!(err.is_store_unavailable() && !err.is_limited(), "{err}");
    assert_eq!(err.retry_after(), None);
    // …and through a user error type it is told apart too.
    let sms = SmsSender::default();
    assert!(matches!(
        deny.scope(sms.send("+15550100")).await,
        Err(MyError::Unavailable)
    ));
    assert_eq!(sms.sent.load(Ordering::SeqCst), 0);

    // With the default policy (local) the same dead store checks the limit in this process:
    // the first call is admitted, the second limited, neither unavailable.
    let local = RateLimiter::builder()
        .redis_url(&dead)
        .timeout(Duration::from_millis(200))
        .build_lazy()
        .expect("a well-formed URL");
    assert_eq!(local.clone().scope(once_a_minute()).await.unwrap(), 7);
    let err = local.clone().scope(once_a_minute()).await.unwrap_err();
    assert!(err.is_limited() && !err.is_store_unavailable(), "{err}");
    // `allow`, chosen by name, lets every call through.
    let allow = RateLimiter::builder()
        .redis_url(&dead)
        .timeout(Duration::from_millis(200))
        .failure_policy(FailurePolicy::Allow)
        .build_lazy()
        .expect("a well-formed URL");
    for _ in 0..2 {
        assert_eq!(allow.clone().scope(once_a_minute()).await.unwrap(), 7);
    }
}
