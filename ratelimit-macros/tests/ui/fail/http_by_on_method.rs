use ratelimit_runtime::{RateLimitError, rate_limit};

pub struct Service;

impl Service {
    #[rate_limit(num = 5, time = 60, by = "ip")]
    pub async fn call(&self) -> Result<(), RateLimitError> {
        Ok(())
    }
}

fn main() {}
