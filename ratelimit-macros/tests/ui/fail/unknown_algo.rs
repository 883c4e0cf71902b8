use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(algo = "bucket", num = 5, time = 60)]
async fn f() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
