//! Inside an `#[async_trait]` impl the return type checked is the method's own (the `Output`
//! of the future async-trait boxes): it must be a `Result`, and the error points at it (at the
//! parameter list when the method returns nothing). A template reads the pattern-bound names.
use async_trait::async_trait;
use ratelimit_runtime::rate_limit;

#[async_trait]
pub trait Service {
    async fn count(&self) -> Option<u32>;
    async fn nothing(&self);
    async fn missing(&self, to: &str, pair: (u32, u32)) -> Result<u32, String>;
}

pub struct S;

#[async_trait]
impl Service for S {
    #[rate_limit(num = 5, time = 60)]
    async fn count(&self) -> Option<u32> {
        Some(1)
    }

    #[rate_limit(num = 5, time = 60)]
    async fn nothing(&self) {}

    #[rate_limit(num = 5, time = 60, key = "{to}:{missing}")]
    async fn missing(&self, to: &str, (a, b): (u32, u32)) -> Result<u32, String> {
        Ok(u32::try_from(to.len()).unwrap_or(0) + a + b)
    }
}

fn main() {}
