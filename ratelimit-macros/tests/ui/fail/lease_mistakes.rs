//! `lease` where it cannot work: on the sliding log (it stamps each call) and a concurrency
//! limit, a life of 0 or past a second, `lease_max` of 0 or without `lease`, beside `count`,
//! `settle` or `shadow`, and on one of stacked limits.
use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(algo = "sliding", num = 5, time = 1, lease = "100ms")]
async fn sliding_log() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(algo = "concurrency", num = 5, time = 1, lease = "100ms")]
async fn concurrency() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(num = 5, time = 1, lease = "0ms")]
async fn no_life() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(num = 5, time = 1, lease = "2s")]
async fn too_long() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(num = 5, time = 1, lease = "100ms", lease_max = 0)]
async fn takes_nothing() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(num = 5, time = 1, lease_max = 10)]
async fn max_alone() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(num = 5, time = 1, lease = "100ms", count = "err")]
async fn counted() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(num = 5, time = 1, lease = "100ms", shadow = true)]
async fn shadow() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(num = 5, time = 1, lease = "100ms")]
#[rate_limit(num = 50, time = 60)]
async fn stacked() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(num = 5, time = 1, prefetch = "100ms")]
async fn alias() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
