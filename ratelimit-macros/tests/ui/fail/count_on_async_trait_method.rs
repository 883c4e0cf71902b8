//! `count` needs the body's result, which an `#[async_trait]` method's boxed future hides.
use async_trait::async_trait;
use ratelimit_runtime::{RateLimitError, rate_limit};

#[async_trait]
pub trait Service {
    async fn call(&self) -> Result<(), RateLimitError>;
}

pub struct S;

#[async_trait]
impl Service for S {
    #[rate_limit(num = 5, time = 60, count = "err")]
    async fn call(&self) -> Result<(), RateLimitError> {
        Ok(())
    }
}

fn main() {}
