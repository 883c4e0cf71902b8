use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(algo = "sliding", num = 3, time = 10, by = "ip")]
async fn f() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
