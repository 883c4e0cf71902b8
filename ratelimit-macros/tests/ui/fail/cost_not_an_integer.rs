use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(algo = "token", num = 10, time = 60, cost = name)]
async fn send(name: &str) -> Result<(), RateLimitError> {
    let _ = name;
    Ok(())
}

fn main() {}
