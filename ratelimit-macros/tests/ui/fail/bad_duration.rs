use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(num = 5, time = "10 minutes")]
async fn f() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
