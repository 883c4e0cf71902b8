use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(num = 5, time = 1, by = "ip", framework = "axum")]
#[rate_limit(num = 20, time = 60, by = "ip", framework = "actix")]
async fn f() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
