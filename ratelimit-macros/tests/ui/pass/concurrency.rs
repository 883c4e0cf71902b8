use ratelimit_runtime::{RateLimitError, rate_limit};

// At most 4 exports at once, each slot leased for 5 minutes; stacked with a rate limit, and
// waiting up to 10 s for a slot.
#[rate_limit(algo = "concurrency", num = 4, time = "5m", wait = "10s")]
#[rate_limit(num = 100, time = "1h")]
async fn export(user: &str) -> Result<usize, RateLimitError> {
    Ok(user.len())
}

fn main() {
    let _ = export("alice");
}
