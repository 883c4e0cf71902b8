use ratelimit_runtime::{RateLimitError, rate_limit};

pub struct Phone(u64);

#[rate_limit(num = 5, time = 60, key = "sms:{phone}")]
async fn f(phone: Phone) -> Result<u64, RateLimitError> {
    Ok(phone.0)
}

fn main() {}
