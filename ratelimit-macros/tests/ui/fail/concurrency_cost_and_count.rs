use ratelimit_runtime::{RateLimitError, rate_limit};

// A concurrency limit holds one slot per call and releases it whatever the outcome.
#[rate_limit(algo = "concurrency", num = 5, time = 30, cost = 2)]
async fn costly() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(algo = "concurrency", num = 5, time = 30, count = "err")]
async fn counted() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(algo = "concurrency", num = 5, time = 30, burst = 9)]
async fn bursty() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(algo = "concurrency", num = 20000, time = 30)]
async fn huge() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
