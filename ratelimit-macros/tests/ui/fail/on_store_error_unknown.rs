use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(num = 3, time = 60, on_store_error = "closed")]
async fn unknown_value() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(num = 3, time = 60, on_store_error = deny)]
async fn not_a_string() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(num = 3, time = 60, failure_policy = "deny")]
async fn alias() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
