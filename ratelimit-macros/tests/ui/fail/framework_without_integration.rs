use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(num = 3, time = 10, framework = "axum")]
async fn f() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
