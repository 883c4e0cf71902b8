use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(num = 5, time = 1, scope = "sms {v2}")]
async fn f() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
