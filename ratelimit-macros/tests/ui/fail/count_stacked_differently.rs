use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(num = 5, time = 60, count = "err")]
#[rate_limit(num = 50, time = "1d", count = "ok")]
async fn login() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
