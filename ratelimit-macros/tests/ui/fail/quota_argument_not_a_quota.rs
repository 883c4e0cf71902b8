use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(quota = "{plan}")]
async fn search(plan: u64) -> Result<(), RateLimitError> {
    let _ = plan;
    Ok(())
}

fn main() {}
