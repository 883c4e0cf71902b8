use ratelimit_runtime::{RateLimitError, rate_limit};

// A sliding log keeps one entry per admitted call: 10,000 is its bound, and the message points
// at the algorithms whose state does not grow with `num`.
#[rate_limit(algo = "sliding", num = 10000, time = "1d")]
async fn at_the_bound() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(algo = "sliding", num = 70000, time = "1d")]
async fn seventy_thousand_a_day() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
