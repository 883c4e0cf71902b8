//! `wait` on plain functions: a free function, a stack, a dynamic limit (`count`), a method of
//! an `#[async_trait]` impl; each form of the duration.
use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(algo = "gcra", num = 10, time = 1, burst = 1, wait = "5s")]
async fn partner() -> Result<u32, RateLimitError> {
    Ok(1)
}

#[rate_limit(num = 10, time = 1, key = "{tenant}", wait = 2)]
#[rate_limit(num = 100, time = "1m", key = "{tenant}")]
async fn stacked(tenant: &str) -> Result<(), RateLimitError> {
    let _ = tenant;
    Ok(())
}

#[rate_limit(num = 3, time = "1m", key = "{user}", count = "err", wait = "500ms")]
async fn counted(user: &str) -> Result<(), RateLimitError> {
    let _ = user;
    Ok(())
}

#[async_trait::async_trait]
trait Partner {
    async fn call(&self, id: u32) -> Result<u32, RateLimitError>;
}

struct Client;

#[async_trait::async_trait]
impl Partner for Client {
    #[rate_limit(num = 10, time = 1, key = "partner:{id}", wait = "1h")]
    async fn call(&self, id: u32) -> Result<u32, RateLimitError> {
        Ok(id)
    }
}

fn main() {
    let _ = (partner(), stacked("a"), counted("b"), Client.call(1));
}
