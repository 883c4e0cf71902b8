use ratelimit_runtime::{Quota, RateLimitError, rate_limit};

#[rate_limit(quota = "{plan}")]
async fn search(quota: &Quota) -> Result<(), RateLimitError> {
    let _ = quota;
    Ok(())
}

#[rate_limit(quota = "plan")]
async fn unknown_form(quota: &Quota) -> Result<(), RateLimitError> {
    let _ = quota;
    Ok(())
}

fn main() {}
