//! Inside an `#[async_trait]` impl, an error type without `From<RateLimitError>` is reported
//! at the method's return type, as on a plain `async fn`.
use async_trait::async_trait;
use ratelimit_runtime::rate_limit;

#[async_trait]
pub trait Service {
    async fn send(&self, to: &str) -> Result<u32, String>;
}

pub struct S;

#[async_trait]
impl Service for S {
    #[rate_limit(num = 5, time = 60, key = "{to}")]
    async fn send(&self, to: &str) -> Result<u32, String> {
        Ok(u32::try_from(to.len()).unwrap_or(0))
    }
}

fn main() {}
