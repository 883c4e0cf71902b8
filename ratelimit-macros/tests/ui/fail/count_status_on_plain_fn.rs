use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(num = 5, time = 60, count = "4xx")]
async fn login() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
