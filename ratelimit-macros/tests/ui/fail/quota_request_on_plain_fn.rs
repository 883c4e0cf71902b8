use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(quota = "request")]
async fn search() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
