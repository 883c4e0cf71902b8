use ratelimit_runtime::{RateLimitError, rate_limit};

// Two stacked limits with the same bucket would count every call twice.
#[rate_limit(num = 5, time = 60, key = "sms:{phone}")]
#[rate_limit(num = 5, time = "1m", key = "sms:{phone}", cost = 2)]
async fn send(phone: &str) -> Result<(), RateLimitError> {
    let _ = phone;
    Ok(())
}

fn main() {}
