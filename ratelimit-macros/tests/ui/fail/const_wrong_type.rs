use ratelimit_runtime::{RateLimitError, rate_limit};

const ATTEMPTS: u32 = 5;
const WINDOW: u64 = 60;

#[rate_limit(num = ATTEMPTS, time = WINDOW)]
async fn login() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
