use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(algo = "token", num = 5, time = 1, burst = 8, cost = 9)]
async fn f() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
