//! Stacked limits (bare and path-qualified), the user's attributes and docs kept, `mut` and raw
//! identifiers in parameters, inner attributes in the body.
#![deny(warnings)]

use ratelimit_runtime::{RateLimitError, rate_limit};

/// Sends a code.
#[rate_limit(algo = "token", num = 5, time = 1, key = "{type}")]
#[must_use = "a future does nothing unless awaited"]
#[ratelimit_runtime::rate_limit(num = 20, time = "1m")]
#[rate_limit(algo = "sliding", num = 100, time = "1d", key = "{r#type}", scope = "daily")]
pub async fn send(r#type: &str, mut count: u32) -> Result<u32, RateLimitError> {
    #![allow(clippy::needless_return)]
    count += 1;
    let _ = r#type;
    return Ok(count);
}

fn main() {
    drop(send("sms", 1));
}
