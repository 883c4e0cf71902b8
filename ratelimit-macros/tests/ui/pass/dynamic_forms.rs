//! Every run-time form compiles on plain functions and methods and runs: `const` quotas, a
//! quota from an argument, a cost from the arguments, and counting only failures.
#![deny(warnings)]

use std::time::Duration;

use ratelimit_runtime::{Quota, RateLimitError, RateLimiter, rate_limit};

const ATTEMPTS: u64 = 2;
const WINDOW: Duration = Duration::from_secs(60);
const BURST: u64 = 4;
const COST: u64 = 2;

#[rate_limit(num = ATTEMPTS, time = WINDOW)]
async fn consts() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(algo = "token", num = 1, time = 1, burst = BURST, cost = COST)]
async fn bucket_consts() -> Result<(), RateLimitError> {
    Ok(())
}

struct Api {
    plan: Quota,
}

impl Api {
    #[rate_limit(quota = "{self.plan}", key = "{user}")]
    async fn search(&self, user: &str) -> Result<usize, RateLimitError> {
        Ok(user.len())
    }

    #[rate_limit(algo = "gcra", num = 10, time = 1, cost = items.len() * 2)]
    async fn batch(&mut self, items: Vec<u8>) -> Result<usize, RateLimitError> {
        Ok(items.len())
    }
}

#[derive(Debug)]
enum LoginError {
    Wrong,
    Limited,
}

impl From<RateLimitError> for LoginError {
    fn from(_: RateLimitError) -> Self {
        Self::Limited
    }
}

#[rate_limit(num = 1, time = "15m", key = "{user}", count = "err")]
async fn login(user: &str, ok: bool) -> Result<(), LoginError> {
    let _ = user;
    if !ok {
        return Err(LoginError::Wrong);
    }
    let parsed: u32 = "7".parse().map_err(|_| LoginError::Wrong)?;
    assert_eq!(parsed, 7);
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let limiter = RateLimiter::builder().build().await.unwrap();
    limiter
        .scope(async {
            assert!(consts().await.is_ok());
            assert!(consts().await.is_ok());
            assert!(consts().await.is_err());
            assert!(bucket_consts().await.is_ok());
            assert!(bucket_consts().await.is_ok());
            assert!(bucket_consts().await.is_err());
            let api = Api {
                plan: Quota::per_minute(1).unwrap(),
            };
            assert_eq!(api.search("ann").await.unwrap(), 3);
            assert!(api.search("ann").await.is_err());
            let mut api = api;
            assert_eq!(api.batch(vec![1, 2]).await.unwrap(), 2);
            for _ in 0..3 {
                assert!(login("bob", true).await.is_ok());
            }
            assert!(matches!(login("bob", false).await, Err(LoginError::Wrong)));
            assert!(matches!(login("bob", true).await, Err(LoginError::Limited)));
        })
        .await;
}
