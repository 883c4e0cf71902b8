use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(num = 5, time = 1, shadow = "yes")]
async fn quoted() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(num = 5, time = 1, shadow = 1)]
async fn number() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(num = 5, time = 1, dry_run = true)]
async fn alias() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
