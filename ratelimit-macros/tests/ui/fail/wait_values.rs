//! `wait` values that cannot work: none (0), a duration that does not read, more than an
//! hour, a value that is not a literal, and two `wait`s on one stack.
use ratelimit_runtime::{RateLimitError, rate_limit};

#[rate_limit(num = 5, time = 1, wait = 0)]
async fn zero() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(num = 5, time = 1, wait = "0ms")]
async fn zero_ms() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(num = 5, time = 1, wait = "5 seconds")]
async fn unreadable() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(num = 5, time = 1, wait = "2h")]
async fn too_long() -> Result<(), RateLimitError> {
    Ok(())
}

const WAIT: u64 = 5;

#[rate_limit(num = 5, time = 1, wait = WAIT)]
async fn not_a_literal() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(num = 5, time = 1, wait = "1s")]
#[rate_limit(num = 50, time = 60, wait = "2s")]
async fn twice() -> Result<(), RateLimitError> {
    Ok(())
}

#[rate_limit(num = 5, time = 1, max_wait = "1s")]
async fn alias() -> Result<(), RateLimitError> {
    Ok(())
}

fn main() {}
