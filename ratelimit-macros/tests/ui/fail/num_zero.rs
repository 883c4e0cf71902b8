use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(num = 0, time = 60)]
async fn f() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
