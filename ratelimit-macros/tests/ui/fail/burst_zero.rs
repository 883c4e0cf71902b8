use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(algo = "token", num = 5, time = 1, burst = 0)]
async fn f() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
