//! Inside an `#[async_trait]` impl, `#[rate_limit]` works in plain mode only.
use async_trait::async_trait;
use ratelimit_runtime::{RateLimitError, rate_limit};

#[async_trait]
pub trait Service {
    async fn call(&self) -> Result<(), RateLimitError>;
    async fn make() -> Result<(), RateLimitError>;
}

pub struct S;

#[async_trait]
impl Service for S {
    #[rate_limit(num = 5, time = 60, by = "ip")]
    async fn call(&self) -> Result<(), RateLimitError> {
        Ok(())
    }

    #[rate_limit(num = 5, time = 60, framework = "axum")]
    async fn make() -> Result<(), RateLimitError> {
        Ok(())
    }
}

fn main() {}
