use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(algo = "token", num = 10, time = 60, cost = itemz.len())]
async fn send(items: &[u32]) -> Result<(), RateLimitError> {
    let _ = items;
    Ok(())
}

fn main() {}
