//! `settle` mistakes, each refused at its own token: no estimate to settle, a value that is
//! neither a closure, a function path nor "later", two settles in one stack, `settle` beside
//! `count` on a handler, and `settle` on a plain `#[async_trait]` method.
use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(num = 10_000, time = 60, settle = |r| r.as_ref().map_or(0, |n| *n))]
async fn no_estimate() -> Result<u64, RateLimitError> {
    Ok(1)
}

#[rate_limit(num = 10_000, time = 60, cost = 100, settle = "soon")]
async fn unknown_word() -> Result<u64, RateLimitError> {
    Ok(1)
}

#[rate_limit(num = 10_000, time = 60, cost = 100, settle = 5)]
async fn a_number() -> Result<u64, RateLimitError> {
    Ok(1)
}

#[rate_limit(num = 10_000, time = 60, cost = 100, settle = "later")]
#[rate_limit(num = 100_000, time = "1d", cost = 100, settle = "later")]
async fn twice() -> Result<u64, RateLimitError> {
    Ok(1)
}

#[rate_limit(num = 10, time = 60, by = "ip", framework = "axum", cost = 2, count = "5xx", settle = "later")]
async fn handler() -> &'static str {
    "ok"
}

struct Client;

#[async_trait::async_trait]
trait Complete {
    async fn complete(&self, max_tokens: u64) -> Result<u64, RateLimitError>;
}

#[async_trait::async_trait]
impl Complete for Client {
    #[rate_limit(num = 10_000, time = 60, cost = max_tokens, settle = "later")]
    async fn complete(&self, max_tokens: u64) -> Result<u64, RateLimitError> {
        Ok(max_tokens)
    }
}

fn main() {}
