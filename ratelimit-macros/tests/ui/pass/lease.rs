//! `lease` on every algorithm that can take units early, with and without `lease_max`, on a
//! plain function and a method.
use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(num = 100000, time = 60, lease = "100ms")]
async fn fixed() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(algo = "sliding_counter", num = 100000, time = "1m", lease = "50ms", lease_max = 200)]
async fn sliding_counter() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(algo = "token", num = 5000, time = 1, burst = 10000, lease = 1)]
async fn token() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(algo = "leaky", num = 5000, time = 1, lease = "1ms", lease_max = 5)]
async fn leaky() -> Result<(), RateLimitError> {
    Ok(())
}

struct Feed;

impl Feed {
    #[rate_limit(algo = "gcra", num = 50000, time = 1, key = "feed:{tenant}", lease = "100ms")]
    async fn read(&self, tenant: &str) -> Result<usize, RateLimitError> {
        Ok(tenant.len())
    }
}

fn main() {
    let _ = (fixed(), sliding_counter(), token(), leaky(), Feed.read("a"));
}
