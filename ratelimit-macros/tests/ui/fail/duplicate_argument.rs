use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(num = 5, time = 60, num = 6)]
async fn f() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
