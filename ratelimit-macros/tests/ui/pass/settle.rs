//! `settle` on plain functions and methods: a closure over the output (its argument's type
//! inferred), a function path, and "later" with the body's `Reservation`.
use ratelimit_runtime::{RateLimitError, settle::Reservation, rate_limit};

#[derive(Debug)]
struct Reply {
    tokens: u32,
}

#[rate_limit(num = 10_000, time = 60, key = "{user}", cost = max_tokens, settle = |r| r.as_ref().map_or(0, |r| r.tokens))]
async fn closure(user: &str, max_tokens: u32) -> Result<Reply, RateLimitError> {
    let _ = user;
    Ok(Reply { tokens: max_tokens / 2 })
}

fn used(result: &Result<Reply, RateLimitError>) -> u64 {
    result.as_ref().map_or(0, |r| u64::from(r.tokens))
}

#[rate_limit(num = 10_000, time = 60, cost = 1_000, settle = used)]
async fn path() -> Result<Reply, RateLimitError> {
    Ok(Reply { tokens: 10 })
}

#[rate_limit(num = 10_000, time = 60, cost = max_tokens, settle = "later")]
async fn later(max_tokens: u32) -> Result<(), RateLimitError> {
    if let Some(reservation) = Reservation::take() {
        tokio::spawn(reservation.settle(max_tokens / 3));
    }
    Ok(())
}

struct Model;

impl Model {
    #[rate_limit(num = 10_000, time = 60, cost = max_tokens, settle = |r| r.as_ref().map_or(0, |n| *n))]
    async fn method(&self, max_tokens: u64) -> Result<u64, RateLimitError> {
        Ok(max_tokens)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    closure("a", 100).await.unwrap();
    path().await.unwrap();
    later(30).await.unwrap();
    Model.method(5).await.unwrap();
}
