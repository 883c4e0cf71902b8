use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(num = 5, time = 1)]
#[rate_limit(num = 20, time = "1 day")]
async fn f() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
