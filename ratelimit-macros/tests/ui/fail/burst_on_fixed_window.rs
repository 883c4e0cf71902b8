use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(num = 5, time = 1, burst = 10)]
async fn f() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
