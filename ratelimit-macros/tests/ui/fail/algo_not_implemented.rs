use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(algo = "gcra", num = 5, time = 60)]
async fn f() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
