use ratelimit_runtime::{Quota, RateLimitError, rate_limit};

#[rate_limit(quota = "{plan}", num = 5, time = 60)]
async fn search(plan: &Quota) -> Result<(), RateLimitError> {
    let _ = plan;
    Ok(())
}

fn main() {}
