use ratelimit_runtime::{RateLimitError, rate_limit};

const CAPACITY: u64 = 5;
const COST: u64 = 6;

#[rate_limit(algo = "token", num = 1, time = 1, burst = CAPACITY, cost = COST)]
async fn send() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
