use std::time::Duration;

use ratelimit_runtime::{RateLimitError, rate_limit};

const ATTEMPTS: u64 = 0;
const WINDOW: Duration = Duration::from_secs(60);

#[rate_limit(num = ATTEMPTS, time = WINDOW)]
async fn login() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
